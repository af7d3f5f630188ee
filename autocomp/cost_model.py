"""Predicted cost of a layer choice: local compression work and time on the link.

The controller weighs, per layer, the wire time a compressor saves against the compute it
adds. :class:`CostModel` predicts both:

- **comm**: the alpha-beta model of :mod:`autocomp.link_model` with the latest
  :class:`~autocomp.link_model.LinkEstimate` (a 1 Gbit/s, 50 us prior before the first one);
- **compression**: the local work the hook adds for one layer in one step (compress, the
  error-feedback decompress, decoding what arrives, write-back, commit). It starts from an
  analytic prior per compressor (:mod:`autocomp.cost_prior`, measured on a CPU) and learns a
  multiplicative correction online from the hook's measurements.

Why the correction is a gradient-boosted tree ensemble on log(measured / prior):
the prior already carries the scaling with size, so what is left is a machine factor plus
effects that are non-linear and compressor-specific (cache sizes, thread pools kicking in,
the cost of ``topk`` selection at different ratios). Shallow trees capture that without
hand-made interaction terms; trees never extrapolate, so far outside the sizes seen the
prediction stays prior x (a correction actually observed), which keeps it sane; and
scikit-learn's ``GradientBoostingRegressor`` is deterministic with a fixed ``random_state``
and single-threaded, so refitting neither competes for the training job's thread pool nor
changes results between a run and its resume. A linear model (Ridge) on the same target was
the alternative; it extrapolates the correction as a power of size, which is exactly the
failure the prior is there to prevent.

The training set stays small and robust: measurements are grouped by (spec, shape, world
size); each group keeps its most recent ``per_key`` measurements and contributes one row, their
median, weighted by their count. Refits happen at most every ``refit_every`` new samples.
Nothing is pickled: saving writes the measurements and the exact rows of the current fit as
JSON, and loading refits from those rows, which reproduces the predictions exactly.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import statistics
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autocomp.compressors import (
    Collective,
    Compressor,
    available_compressors,
    build_compressor,
)
from autocomp.compressors.powersgd import matrix_shape
from autocomp.compressors.sparse import kept
from autocomp.cost_prior import (
    CostSample,
    effective_rank,
    payload_count,
    prior_seconds,
    selected_share,
)
from autocomp.link_model import LinkEstimate, latency_hops, link_bytes

__all__ = [
    "FORMAT_VERSION",
    "HALF_DTYPES",
    "MAX_CONTENTION_RATE",
    "CostModel",
    "load_regressor",
]

logger = logging.getLogger(__name__)

FORMAT = "autocomp.cost_model"
"""Marker in saved files, so a stray JSON file is recognised as not ours."""
FORMAT_VERSION = 1
"""Version of the saved format; files of another version are refused."""
HALF_DTYPES = (torch.float16, torch.bfloat16)
"""The half-precision types whose all-reduce sums the cost model prices apart, in the order
the opening measures them (``probe_runner.ProbeRunner.half_sums``)."""
HALF_DTYPES_BY_NAME = {str(dtype).removeprefix("torch."): dtype for dtype in HALF_DTYPES}
"""The same by name (``"float16"``), as files store them (the advisor's profile)."""
MAX_CONTENTION_RATE = 0.9
"""Cap of :meth:`CostModel.contention_rate`: the probe measures a share of the stretched
compute, below 1 by construction; a link estimate that later reads faster than the probed
link must not scale it past that."""

_KINDS = ("compress", "comm")


# ---- features ----------------------------------------------------------------------------------


def _log(value: float) -> float:
    return math.log(value) if value > 0 else 0.0


class _Features:
    """Fixed feature layout: compressor one-hot, its parameters, sizes, and the prior."""

    def __init__(self, names: Iterable[str]) -> None:
        # Only compressors present in the training rows: fewer columns, faster fits. Others
        # get an all-zero one-hot, i.e. the correction shared by everything seen.
        registry = available_compressors()
        self.names = sorted(set(names))
        self.params: list[tuple[str, str]] = [
            (name, param.name)
            for name in self.names
            if name in registry
            for param in registry[name].params
        ]
        self.width = len(self.names) + len(self.params) + 8

    def row(
        self, compressor: Compressor, shape: torch.Size, world_size: int, prior: float
    ) -> list[float]:
        """``prior``: the analytic prior's seconds for this layer (``prior_seconds``)."""
        out = [1.0 if compressor.name == name else 0.0 for name in self.names]
        for name, param in self.params:
            value = compressor.config.get(param) if compressor.name == name else None
            if value is None or isinstance(value, bool):
                out.append(float(bool(value)))
            else:
                out.append(_log(float(value)))
        numel = shape.numel()
        rows, cols = matrix_shape(shape)
        rank = effective_rank(compressor, shape)
        ratio = compressor.config.get("ratio")
        kept_elements = kept(numel, float(ratio)) if isinstance(ratio, float) else 0
        out += [
            _log(numel),
            _log(rows),
            _log(cols),
            _log(payload_count(compressor, world_size)),
            _log(kept_elements),
            _log(rank * (rows + cols)),
            _log(rank * numel),
            _log(prior),
        ]
        return out


_Key = tuple[str, tuple[int, ...], int]
"""(spec, shape, world size): the unit the training set is grouped by."""
_CacheKey = tuple[str, tuple[int, ...], int, float]
"""A key and the gradient's nonzero share: a cached prediction."""


@dataclass(frozen=True, slots=True)
class _Row:
    key: _Key
    seconds: float
    """Median of the group's recent measurements (the regression target, before the log)."""
    weight: int
    """How many measurements that median summarises."""
    nonzero_share: float = 1.0
    """The gradient's nonzero share when the group was last measured (top-k's prior)."""


# ---- the model ---------------------------------------------------------------------------------


class CostModel:
    """Predicts hook compression time per layer and collective time on the current link.

    Not thread-safe. Refits run inside :meth:`add_sample` every ``refit_every`` samples (about
    0.1-0.3 s for 1024 groups on a 2-vCPU Xeon), so call it from the controller between steps,
    not from the hook, or set ``auto_refit=False`` and call :meth:`fit` when convenient.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Tuning of :class:`CostModel`."""

        world_size: int = 2
        """Ranks of the job: an all-gather compressor decodes this many payloads per step."""
        prior_bandwidth_bytes_per_s: float = 125e6
        """Link bandwidth assumed before the first estimate (1 Gbit/s)."""
        prior_latency_s: float = 50e-6
        """Latency per hop assumed before the first estimate."""
        refit_every: int = 256
        """New samples between automatic refits of the correction (a refit: ~0.1-0.3 s)."""
        auto_refit: bool = True
        """Refit inside add_sample; False: only when :meth:`refit_if_due` or :meth:`fit` is
        called (e.g. once per batch of samples, before deciding)."""
        min_fit_samples: int = 16
        """Samples needed before the first fit (until then: the prior alone)."""
        max_keys: int = 1024
        """Distinct (spec, shape, world size) groups kept; the least recently updated go first."""
        per_key: int = 9
        """Recent measurements kept per group; their median is the group's training target."""
        error_window: int = 256
        """Recent (predicted, measured) pairs kept per kind for :meth:`prediction_error`."""
        n_estimators: int = 100
        """Boosting rounds of the correction model."""
        max_depth: int = 3
        """Depth of each tree (3: interactions of up to three features)."""
        learning_rate: float = 0.1
        """Shrinkage of each tree's contribution."""
        max_correction: float = 1000.0
        """Bound on the predicted measured/prior ratio, either way (GPUs may be ~100x off)."""
        device_type: str = "cpu"
        """Where the hook computes: on the CPU top-k selects among a sparse gradient's
        nonzeros, elsewhere over every element (``sparse.largest_indices``)."""

        def __post_init__(self) -> None:
            if self.world_size < 1:
                raise ValueError(f"world_size must be >= 1, got {self.world_size}")
            if self.prior_bandwidth_bytes_per_s <= 0 or self.prior_latency_s < 0:
                raise ValueError("prior bandwidth must be > 0 and prior latency >= 0")
            if min(self.refit_every, self.min_fit_samples, self.max_keys, self.per_key) < 1:
                raise ValueError("refit_every, min_fit_samples, max_keys and per_key must be >= 1")
            if self.max_correction < 1:
                raise ValueError(f"max_correction must be >= 1, got {self.max_correction}")
            # Checked here, once: the fit skips scikit-learn's own parameter validation.
            if isinstance(self.n_estimators, bool) or not isinstance(self.n_estimators, int):
                raise ValueError(f"n_estimators must be an int, got {self.n_estimators!r}")
            if isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int):
                raise ValueError(f"max_depth must be an int, got {self.max_depth!r}")
            if self.n_estimators < 1 or self.max_depth < 1:
                raise ValueError("n_estimators and max_depth must be >= 1")
            if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
                raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or CostModel.Config()
        self._link: LinkEstimate | None = None
        self._contention = 0.0
        self._half_sum: dict[torch.dtype, float] = {}
        self._groups: OrderedDict[_Key, deque[float]] = OrderedDict()
        self._shares: dict[_Key, float] = {}
        self._since_fit = 0
        self._fit_rows: list[_Row] | None = None
        self._regressor: Any | None = None
        self._features: _Features | None = None
        self._cache: dict[_CacheKey, float] = {}
        self._prior_scale: dict[str, list[tuple[int, float]]] = {}
        """(elements, factor on the prior) calibrated here, by size: per spec, and per family
        (the family's latest calibrations, for its specs not timed)."""
        self._compressors: dict[str, Compressor] = {}
        self._errors: dict[str, deque[tuple[float, float]]] = {
            kind: deque(maxlen=self.config.error_window) for kind in _KINDS
        }

    # ---- communication ------------------------------------------------------------------------

    @property
    def link(self) -> LinkEstimate:
        """The link estimate in use (the Config prior until :meth:`update_link`)."""
        if self._link is not None:
            return self._link
        return LinkEstimate(
            latency_s=self.config.prior_latency_s,
            bandwidth_bytes_per_s=self.config.prior_bandwidth_bytes_per_s,
            samples=0,
            rel_residual=0.0,
        )

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        """Measured link bandwidth, or None while only the prior is known."""
        return None if self._link is None else self._link.bandwidth_bytes_per_s

    def update_link(self, estimate: LinkEstimate | None) -> None:
        """Use ``estimate`` (e.g. ``BandwidthMeter.end_window()``) from now on; None: the prior."""
        self._link = estimate

    def comm_seconds(self, collective: Collective, payload_bytes: int, world_size: int) -> float:
        """Predicted service time of one collective carrying ``payload_bytes`` per rank."""
        return self.link.seconds(collective, payload_bytes, world_size)

    @property
    def contention_seconds_per_byte(self) -> float:
        """Compute seconds a transfer takes from the backward per byte this rank sends (0 until
        measured: :meth:`update_contention`)."""
        return self._contention

    def update_contention(self, seconds_per_byte: float) -> None:
        """Use a measured transfer contention (``probe_runner.ProbeRunner.contention``)."""
        if not math.isfinite(seconds_per_byte) or seconds_per_byte < 0:
            raise ValueError(f"contention must be finite and >= 0, got {seconds_per_byte!r}")
        self._contention = float(seconds_per_byte)

    def half_sum_seconds_per_element(self, dtype: torch.dtype) -> float:
        """What an all-reduce of ``dtype`` elements costs per element beyond its bytes (the
        CPU's sum of halves; 0 for other dtypes and until measured)."""
        return self._half_sum.get(dtype, 0.0)

    def update_half_sum(self, dtype: torch.dtype, seconds_per_element: float) -> None:
        """Use a measured half-precision sum cost (``probe_runner.ProbeRunner.half_sums``)."""
        if dtype not in HALF_DTYPES:
            raise ValueError(f"half-precision sum costs are for {HALF_DTYPES}, got {dtype}")
        if not math.isfinite(seconds_per_element) or seconds_per_element < 0:
            raise ValueError(f"half sum cost must be finite and >= 0, got {seconds_per_element}")
        self._half_sum[dtype] = float(seconds_per_element)

    def contention_rate(self) -> float:
        """The share of the backward's time lost while the link is busy beside it
        (``exposure.simulate``): the contention per byte times the link's bytes per second,
        at most ``MAX_CONTENTION_RATE``; 0 while either is unknown."""
        return self.contention_rate_at(self.bandwidth_bytes_per_s)

    def contention_rate_at(self, bandwidth_bytes_per_s: float | None) -> float:
        """:meth:`contention_rate` on a link of that bandwidth (the advisor's what-if links)."""
        if bandwidth_bytes_per_s is None or not bandwidth_bytes_per_s > 0:
            return 0.0
        return min(MAX_CONTENTION_RATE, self._contention * bandwidth_bytes_per_s)

    def add_comm_sample(
        self, collective: Collective, payload_bytes: int, world_size: int, seconds: float
    ) -> None:
        """Record a measured collective against its prediction (for :meth:`prediction_error`).

        This does not learn the link: feed the same measurement to a
        :class:`~autocomp.link_model.BandwidthMeter` and pass its estimate to
        :meth:`update_link`. Collectives that move nothing (one rank) are ignored.
        """
        if not (math.isfinite(seconds) and seconds > 0):
            return
        if link_bytes(collective, payload_bytes, world_size) <= 0:
            return
        if latency_hops(collective, world_size) == 0:
            return
        predicted = self.comm_seconds(collective, payload_bytes, world_size)
        self._errors["comm"].append((predicted, float(seconds)))

    # ---- compression --------------------------------------------------------------------------

    def _compressor(self, spec: str | Compressor) -> Compressor:
        if isinstance(spec, Compressor):
            return spec
        compressor = self._compressors.get(spec)
        if compressor is None:
            compressor = self._compressors[spec] = build_compressor(spec)
        return compressor

    def _priced_share(self, compressor: Compressor, shape: torch.Size, share: float) -> float:
        """``share`` as the prior reads it: 1 where it does not change the price (every dense
        path), else to two significant digits, so that a share smoothed anew each window
        does not make a new cache entry each time."""
        numel = shape.numel()
        if selected_share(compressor, numel, share, self.config.device_type) is None:
            return 1.0
        return float(f"{share:.2g}")

    def _unscaled_prior(
        self, compressor: Compressor, shape: torch.Size, world_size: int, share: float
    ) -> float:
        return prior_seconds(compressor, shape, world_size, share, self.config.device_type)

    def _prior(
        self, compressor: Compressor, shape: torch.Size, world_size: int, share: float = 1.0
    ) -> float:
        return self._unscaled_prior(compressor, shape, world_size, share) * self.prior_scale(
            compressor, shape.numel()
        )

    def prior_scale(self, compressor: Compressor | str, numel: int) -> float:
        """The calibration's factor on ``compressor``'s prior for a tensor of ``numel``
        elements: its own spec's calibration, else its family's latest (a spec the
        calibration did not time, such as a pinned PowerSGD rank 2), else 1.

        One calibrated size scales every size alike. With two or more (``calibration.calibrate``
        times the largest layer too) the factor is interpolated in log size between them and
        held flat outside: per element, a compressor's work grows once its tensors outgrow
        the caches, which the prior's per-element constants do not know (on a 2-core EPYC
        fp16 cost 2.0x per element on 8.4M elements what it cost on 1M, int8 5.9x)."""
        compressor = self._compressor(compressor)
        points = self._prior_scale.get(compressor.spec) or self._prior_scale.get(compressor.name)
        if not points:
            return 1.0
        if numel <= points[0][0]:
            return points[0][1]
        for (low, low_factor), (high, high_factor) in itertools.pairwise(points):
            if numel <= high:
                at = (math.log(numel) - math.log(low)) / (math.log(high) - math.log(low))
                return math.exp(
                    math.log(low_factor) + at * (math.log(high_factor) - math.log(low_factor))
                )
        return points[-1][1]

    def calibrate(self, compressor: Compressor | str, shape: torch.Size, seconds: float) -> float:
        """Scale ``compressor``'s prior so it predicts ``seconds`` on ``shape`` (its spec's
        factor, and its family's for the family's specs not calibrated).

        One measurement on this machine, at this thread count, corrects the cold-start prior by
        a factor (the constants were measured elsewhere); returns the factor. A measurement on
        another size adds a point of :meth:`prior_scale`; one on a size already calibrated
        replaces it.
        """
        compressor = self._compressor(compressor)
        shape = torch.Size(shape)
        base = prior_seconds(compressor, shape, self.config.world_size)
        if base <= 0 or not (math.isfinite(seconds) and seconds > 0):
            return 1.0
        factor = min(
            max(seconds / base, 1.0 / self.config.max_correction), self.config.max_correction
        )
        numel = max(1, shape.numel())
        for key in (compressor.spec, compressor.name):
            points = [p for p in self._prior_scale.get(key, []) if p[0] != numel]
            self._prior_scale[key] = sorted([*points, (numel, factor)])
        self._cache.clear()
        if self._fit_rows:
            self._fit_on(self._fit_rows)  # the correction is relative to the prior: refit
        return factor

    def compress_seconds(
        self, compressor: Compressor | str, shape: torch.Size, nonzero_share: float = 1.0
    ) -> float:
        """Predicted local hook work per step for a layer of ``shape`` using ``compressor``,
        whose gradient has ``nonzero_share`` of its elements nonzero."""
        return self.compress_seconds_many([(compressor, shape)], [nonzero_share])[0]

    def compress_seconds_many(
        self,
        items: Sequence[tuple[Compressor | str, torch.Size | Sequence[int]]],
        nonzero_shares: Sequence[float] | None = None,
    ) -> list[float]:
        """:meth:`compress_seconds` for many (compressor, shape) pairs in one model call
        (``nonzero_shares``: one per pair; None: dense gradients)."""
        world = self.config.world_size
        resolved = [(self._compressor(c), torch.Size(shape)) for c, shape in items]
        given = [1.0] * len(resolved) if nonzero_shares is None else list(nonzero_shares)
        if len(given) != len(resolved):
            raise ValueError(f"{len(given)} nonzero shares for {len(resolved)} items")
        shares = [self._priced_share(c, s, d) for (c, s), d in zip(resolved, given, strict=True)]
        out: list[float] = [0.0] * len(resolved)
        missing: list[int] = []
        for i, (compressor, shape) in enumerate(resolved):
            prior = self._prior(compressor, shape, world, shares[i])
            measured = self._groups.get((compressor.spec, tuple(shape), world))
            if prior > 0 and measured:
                # Direct evidence for this exact layer and compressor beats any model.
                out[i] = statistics.median(measured)
                continue
            if prior <= 0:
                out[i] = prior
                continue
            if self._regressor is None:
                out[i] = prior * self._interim_scale(world)
                continue
            cached = self._cache.get((compressor.spec, tuple(shape), world, shares[i]))
            if cached is None:
                missing.append(i)
            else:
                out[i] = cached
        if missing:
            assert self._features is not None and self._regressor is not None
            rows = []
            for i in missing:
                compressor, shape = resolved[i]
                prior = self._unscaled_prior(compressor, shape, world, shares[i])
                rows.append(self._features.row(compressor, shape, world, prior))
            matrix = np.array(rows, dtype=np.float64)
            limit = math.log(self.config.max_correction)
            with _without_parameter_checks():
                predicted = self._regressor.predict(matrix)
            corrections = np.clip(predicted, -limit, limit)
            for i, correction in zip(missing, corrections, strict=True):
                compressor, shape = resolved[i]
                value = self._prior(compressor, shape, world, shares[i]) * math.exp(
                    float(correction)
                )
                self._cache[(compressor.spec, tuple(shape), world, shares[i])] = value
                out[i] = value
        return out

    def _interim_scale(self, world_size: int) -> float:
        """measured/prior over the measured groups, a geometric mean weighted by each group's
        prior seconds: until the regressor has enough samples, what carries the slowdown seen
        in training (compression competing with the backward and the communication threads
        for the cores, 3-5x the calibrated prior on a busy 2-vCPU machine) to the options not
        measured yet. 1 without measurements.

        Weighted, because a small tensor's measured time is mostly the hook's per-call
        overhead, which a scale cannot carry: on the MLP LM at 1 Gbit/s fp16 measured 66x its
        prior on a 16K-element tensor and 4.5-4.8x on the 1-2M-element matrices, and the
        unweighted mean (12.3x) priced PowerSGD rank 4 on fc1 at 32.6 ms where the runs that
        ran it measured 8.1 ms (3.4x its prior). The run kept fp16 (0.095 s a step, loss
        2.2567) over the PowerSGD plan (0.063 s, 2.2135; docs/benchmarks-history.md,
        thirty-fourth session)."""
        cached = self._cache.get(("*", (), world_size, 1.0))
        if cached is not None:
            return cached
        logs: list[float] = []
        weights: list[float] = []
        for key, group in self._groups.items():
            spec, shape, world = key
            if world != world_size or not group:
                continue
            share = self._shares.get(key, 1.0)
            prior = self._prior(self._compressor(spec), torch.Size(shape), world, share)
            if prior > 0:
                logs.append(math.log(statistics.median(group) / prior))
                weights.append(prior)
        limit = math.log(self.config.max_correction)
        scale = 1.0
        if logs:
            mean = math.fsum(w * v for w, v in zip(weights, logs, strict=True)) / math.fsum(weights)
            scale = math.exp(max(-limit, min(limit, mean)))
        self._cache[("*", (), world_size, 1.0)] = scale
        return scale

    def add_sample(
        self,
        compressor: Compressor | str,
        shape: torch.Size | Sequence[int],
        seconds: float,
        nonzero_share: float = 1.0,
    ) -> None:
        """Record a measured hook cost (on a gradient with ``nonzero_share`` of its elements
        nonzero); refits when ``refit_every`` samples have accumulated.

        The prediction is recorded first (for :meth:`prediction_error`), so the error is always
        out of sample. ``none`` (which costs nothing by definition), a compressor on a tensor it
        sends whole (the hook runs it as ``none``; its prior is 0, so it has no correction to
        learn) and non-positive or non-finite times are ignored.
        """
        compressor = self._compressor(compressor)
        shape = torch.Size(shape)
        if compressor.sends_as_is(shape) or not (math.isfinite(seconds) and seconds > 0):
            return
        share = self._priced_share(compressor, shape, _checked_share(nonzero_share))
        predicted = self.compress_seconds(compressor, shape, share)
        self._errors["compress"].append((predicted, float(seconds)))
        key = (compressor.spec, tuple(shape), self.config.world_size)
        self._shares[key] = share
        self._store(key, float(seconds))
        if self._regressor is None:
            self._cache.clear()  # the interim scale moved
        if self.config.auto_refit:
            self.refit_if_due()

    def refit_if_due(self) -> bool:
        """Refit once ``refit_every`` samples have come since the last fit (and at least
        ``min_fit_samples`` are held); True if it did.

        With ``auto_refit=False`` the caller adds a batch of samples and calls this once: the
        planner adds one sample per compressed layer a window, and a refit costs 30-90 ms, so
        inside :meth:`add_sample` a window of a 196-tensor ViT refit once or twice mid-batch
        (21 fits in 13 decisions, a third of their time)."""
        due = self._since_fit >= self.config.refit_every
        if not (due and self.samples >= self.config.min_fit_samples):
            return False
        self.fit()
        return True

    def _store(self, key: _Key, seconds: float) -> None:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = deque(maxlen=self.config.per_key)
            while len(self._groups) > self.config.max_keys:
                evicted, _ = self._groups.popitem(last=False)
                self._shares.pop(evicted, None)
        else:
            self._groups.move_to_end(key)
        group.append(seconds)
        self._since_fit += 1

    @property
    def samples(self) -> int:
        """Measurements currently held (at most ``max_keys * per_key``)."""
        return sum(len(group) for group in self._groups.values())

    @property
    def fitted(self) -> bool:
        """True once a correction model is in use (before that: the prior alone)."""
        return self._regressor is not None

    def warm_start(self, samples: Iterable[CostSample | Mapping[str, Any]]) -> int:
        """Add offline measurements (e.g. :func:`samples_from_bench`) and refit; returns the count.

        Warm-start samples do not count towards :meth:`prediction_error`.
        """
        count = 0
        for sample in samples:
            if not isinstance(sample, CostSample):
                sample = CostSample.from_dict(sample)
            compressor = self._compressor(sample.spec)
            if compressor.sends_as_is(torch.Size(sample.shape)):
                continue  # as in add_sample
            if not (math.isfinite(sample.seconds) and sample.seconds > 0):
                continue
            self._store((compressor.spec, tuple(sample.shape), sample.world_size), sample.seconds)
            count += 1
        if count:
            self.fit()
        return count

    def fit(self) -> None:
        """Refit the correction on the current groups now (normally automatic)."""
        rows = [
            _Row(key, statistics.median(group), len(group), self._shares.get(key, 1.0))
            for key, group in self._groups.items()
            if group
        ]
        self._fit_on(rows)

    def _fit_on(self, rows: list[_Row]) -> None:
        self._since_fit = 0
        self._cache.clear()
        if len(rows) < 2:
            self._regressor = self._features = None
            self._fit_rows = rows or None
            return
        GradientBoostingRegressor = load_regressor()

        features = _Features(self._compressor(row.key[0]).name for row in rows)
        matrix = np.empty((len(rows), features.width), dtype=np.float64)
        target = np.empty(len(rows), dtype=np.float64)
        weight = np.empty(len(rows), dtype=np.float64)
        for i, row in enumerate(rows):
            spec, shape, world = row.key
            compressor, size = self._compressor(spec), torch.Size(shape)
            prior = self._unscaled_prior(compressor, size, world, row.nonzero_share)
            matrix[i] = features.row(compressor, size, world, prior)
            target[i] = math.log(
                row.seconds / self._prior(compressor, size, world, row.nonzero_share)
            )
            weight[i] = row.weight
        regressor = GradientBoostingRegressor(
            n_estimators=self.config.n_estimators,
            max_depth=self.config.max_depth,
            learning_rate=self.config.learning_rate,
            subsample=1.0,
            random_state=0,
        )
        with _without_parameter_checks():
            regressor.fit(matrix, target, sample_weight=weight)
        self._regressor, self._features, self._fit_rows = regressor, features, rows
        logger.debug("cost model refitted on %d groups (%d samples)", len(rows), weight.sum())

    # ---- accuracy -----------------------------------------------------------------------------

    def prediction_error(self) -> dict[str, dict[str, float | int | None]]:
        """Absolute percentage error of recent out-of-sample predictions, per kind.

        Returns ``{"compress": {...}, "comm": {...}}``, each with ``samples`` (pairs in the
        window), ``median_ape_pct`` and ``mean_ape_pct`` (100 * |predicted - measured| /
        measured; None when there are no samples).
        """
        report: dict[str, dict[str, float | int | None]] = {}
        for kind in _KINDS:
            pairs = self._errors[kind]
            errors = [100.0 * abs(p - m) / m for p, m in pairs]
            report[kind] = {
                "samples": len(errors),
                "median_ape_pct": statistics.median(errors) if errors else None,
                "mean_ape_pct": statistics.fmean(errors) if errors else None,
            }
        return report

    # ---- persistence --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state: config, link, measurements, the current fit's rows, error windows."""
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "config": asdict(self.config),
            "link": None if self._link is None else self._link.to_dict(),
            "contention_seconds_per_byte": self._contention,
            "half_sum_seconds_per_element": {
                str(dtype).removeprefix("torch."): value for dtype, value in self._half_sum.items()
            },
            "groups": [
                {
                    "spec": k[0],
                    "shape": list(k[1]),
                    "world_size": k[2],
                    "seconds": list(v),
                    "nonzero_share": self._shares.get(k, 1.0),
                }
                for k, v in self._groups.items()
            ],
            "since_fit": self._since_fit,
            "fit_rows": None
            if self._fit_rows is None
            else [
                {
                    "spec": r.key[0],
                    "shape": list(r.key[1]),
                    "world_size": r.key[2],
                    "seconds": r.seconds,
                    "weight": r.weight,
                    "nonzero_share": r.nonzero_share,
                }
                for r in self._fit_rows
            ],
            "errors": {kind: [list(pair) for pair in self._errors[kind]] for kind in _KINDS},
            "prior_scale": {
                name: [list(point) for point in points]
                for name, points in self._prior_scale.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (this model's config is kept).

        Raises ValueError for another format or version, or malformed content.
        """
        _check_header(state)
        try:
            link = state["link"]
            groups: OrderedDict[_Key, deque[float]] = OrderedDict()
            shares: dict[_Key, float] = {}
            for entry in state["groups"]:
                key = _key(entry)
                # Unknown compressors fail here, not later. A state saved before 279adbe may
                # hold PowerSGD's own timings of 1-D tensors, now run as 'none': dropped.
                if self._compressor(key[0]).sends_as_is(torch.Size(key[1])):
                    continue
                values = [float(s) for s in entry["seconds"]]
                groups[key] = deque(values[-self.config.per_key :], maxlen=self.config.per_key)
                shares[key] = _checked_share(entry.get("nonzero_share", 1.0))
            fit_rows = None
            if state["fit_rows"] is not None:
                fit_rows = [
                    _Row(
                        _key(r),
                        float(r["seconds"]),
                        int(r["weight"]),
                        _checked_share(r.get("nonzero_share", 1.0)),
                    )
                    for r in state["fit_rows"]
                ]
                fit_rows = [
                    row
                    for row in fit_rows
                    if not self._compressor(row.key[0]).sends_as_is(torch.Size(row.key[1]))
                ]
                for row in fit_rows:
                    if not row.seconds > 0:
                        raise ValueError(f"non-positive time in fit row {row}")
            errors = {
                kind: [(float(p), float(m)) for p, m in state["errors"][kind]] for kind in _KINDS
            }
            since_fit = int(state["since_fit"])
            prior_scale = {
                str(name): _scale_points(value)
                for name, value in state.get("prior_scale", {}).items()
            }
            link_estimate = None if link is None else LinkEstimate.from_dict(link)
            contention = float(state.get("contention_seconds_per_byte", 0.0))
            if not math.isfinite(contention) or contention < 0:
                raise ValueError(f"contention {contention!r}")
            half_sum = {}
            for name, value in state.get("half_sum_seconds_per_element", {}).items():
                dtype = getattr(torch, str(name), None)
                if dtype not in HALF_DTYPES or not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"half sum cost {name}: {value!r}")
                half_sum[dtype] = float(value)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed cost model state: {err}") from None
        self._link = link_estimate
        self._contention = contention
        self._half_sum = half_sum
        self._groups = groups
        self._shares = shares
        self._prior_scale = prior_scale
        for kind in _KINDS:
            self._errors[kind] = deque(errors[kind], maxlen=self.config.error_window)
        if fit_rows is None:
            self._regressor = self._features = None
            self._fit_rows = None
            self._cache.clear()
        else:
            self._fit_on(fit_rows)
        self._since_fit = since_fit

    def save(self, path: str | Path) -> None:
        """Write the model as JSON (no pickle); :meth:`load` reproduces its predictions."""
        Path(path).write_text(json.dumps(self.state_dict(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path, config: Config | None = None) -> CostModel:
        """A model from :meth:`save` output; ``config`` overrides the saved one.

        Raises ValueError naming the file if it is unreadable, corrupt, or of another version.
        """
        try:
            state = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a readable cost model file ({err})") from None
        try:
            _check_header(state)
            if config is None:
                config = _config_from(state["config"])
            model = cls(config)
            model.load_state_dict(state)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from None
        return model


def load_regressor() -> type:
    """The correction's regressor class. Importing scikit-learn takes 1-2 s on a small CPU, so
    it is deferred until a model needs it: the adaptive loop loads it at set-up on the
    deciding rank, since at the first fit mid-training it stalled every rank at that boundary
    (1.0-1.2 s on the GPT LM at step 200 of a 0.12 s/step run, 2 CPU cores)."""
    from sklearn.ensemble import GradientBoostingRegressor

    return GradientBoostingRegressor


def _without_parameter_checks() -> contextlib.AbstractContextManager[Any]:
    """scikit-learn without its per-call parameter validation (the estimator's settings are
    checked once, in :class:`CostModel.Config`; the data's finiteness still is): it validated
    each of a fit's 100 trees, about 30% of the fit (41 against 28.5 ms, 40 rows)."""
    import sklearn

    return sklearn.config_context(skip_parameter_validation=True)


def _check_header(state: Any) -> None:
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        raise ValueError(f"not a cost model (expected format {FORMAT!r})")
    version = state.get("version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"cost model format version {version!r} is not supported (expected {FORMAT_VERSION})"
        )


def _scale_points(value: Any) -> list[tuple[int, float]]:
    """A family's calibration points as saved: ``[[elements, factor], ...]``, or one factor
    (files from before calibrations by size, where one factor scaled every size)."""
    raw = [[1, value]] if isinstance(value, (int, float)) else value
    points = sorted((int(numel), float(factor)) for numel, factor in raw)
    for numel, factor in points:
        if numel < 1 or not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"calibration point ({numel}, {factor})")
    if not points or len({numel for numel, _ in points}) != len(points):
        raise ValueError(f"calibration points {points}")
    return points


def _checked_share(value: Any) -> float:
    share = float(value)
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"nonzero_share must be in [0, 1], got {value!r}")
    return share


def _key(entry: Mapping[str, Any]) -> _Key:
    world = int(entry["world_size"])
    if world < 1:
        raise ValueError(f"world_size must be >= 1, got {world}")
    return (str(entry["spec"]), tuple(int(d) for d in entry["shape"]), world)


def _config_from(saved: Mapping[str, Any]) -> CostModel.Config:
    known = {f.name for f in fields(CostModel.Config)}
    unknown = sorted(set(saved) - known)
    if unknown:
        logger.debug("ignoring unknown cost model config fields %s", unknown)
    return CostModel.Config(**{k: v for k, v in saved.items() if k in known})
