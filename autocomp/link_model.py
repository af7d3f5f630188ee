"""How long collectives take on the link, learned from the collectives themselves.

The controller needs to know, for the link the job runs on *right now*, what a payload of a
given size costs on the wire. This module provides:

- :func:`link_bytes` and :func:`latency_hops`: the bytes each rank puts on its link and the
  number of sequential message latencies of a ring collective (the alpha-beta model of
  Hockney, as used for ring all-reduce by Thakur et al. 2005 and Patarasuk & Yuan 2009);
- :class:`LinkEstimate`: latency (alpha) and bandwidth (1/beta) with ``seconds()``;
- :class:`BandwidthMeter`: fits alpha and beta per window of measured collectives with a robust
  regression, smooths across windows, and adopts abrupt rate changes at once.

When the plan's own transfers are too small to show the bandwidth, :mod:`autocomp.link_probe`
sizes an active probe for the meter; :mod:`autocomp.nic_counters` cross-checks the meter
against the kernel's byte counters.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from autocomp.compressors.base import Collective

__all__ = [
    "BandwidthMeter",
    "LinkEstimate",
    "bandwidth_moved",
    "latency_hops",
    "link_bytes",
]

logger = logging.getLogger(__name__)

STATE_DICT_VERSION = 1
_MAD_TO_SIGMA = 1.4826
"""Scale factor from the median absolute deviation to a normal standard deviation."""


# ---- the alpha-beta model ----------------------------------------------------------------------


def link_bytes(collective: Collective, payload_bytes: int, world_size: int) -> float:
    """Bytes each rank sends on its link for one collective over ``payload_bytes`` per rank.

    A ring all-reduce sends 2(N-1)/N of the buffer (reduce-scatter, then all-gather); an
    all-gather forwards the N-1 payloads of the other ranks. One rank alone sends nothing.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if payload_bytes < 0:
        raise ValueError(f"payload_bytes must be >= 0, got {payload_bytes}")
    n = world_size
    if n == 1:
        return 0.0
    if collective is Collective.ALL_REDUCE:
        return 2.0 * (n - 1) / n * payload_bytes
    if collective is Collective.ALL_GATHER:
        return float((n - 1) * payload_bytes)
    raise ValueError(f"unknown collective {collective!r}")


def bandwidth_moved(a: float, b: float, ratio: float) -> bool:
    """Whether two bandwidth readings differ by ``ratio`` or more either way (what the
    policy's "the link moved" means: dwell locks, payoff baselines, the idle link)."""
    return max(a, b) / max(min(a, b), 1e-30) >= ratio


def latency_hops(collective: Collective, world_size: int) -> int:
    """Sequential message steps of a ring collective, each paying the link latency once."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    n = world_size
    if collective is Collective.ALL_REDUCE:
        return 2 * (n - 1)
    if collective is Collective.ALL_GATHER:
        return n - 1
    raise ValueError(f"unknown collective {collective!r}")


@dataclass(frozen=True, slots=True)
class LinkEstimate:
    """Latency and bandwidth of the link, with how much evidence backs them."""

    latency_s: float
    """Alpha: seconds per message step (hop), >= 0."""
    bandwidth_bytes_per_s: float
    """1 / beta: bytes per second one rank can push through its link, > 0."""
    samples: int
    """Collectives behind this estimate (since the last reset or adopted rate change)."""
    rel_residual: float
    """Fit quality: median |measured - predicted| / measured in a window (EWMA across them)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"latency_s must be finite and >= 0, got {self.latency_s}")
        bandwidth = self.bandwidth_bytes_per_s
        if not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ValueError(f"bandwidth_bytes_per_s must be finite and > 0, got {bandwidth}")

    def seconds(self, collective: Collective, payload_bytes: int, world_size: int) -> float:
        """Predicted service time: hops * latency + link bytes / bandwidth."""
        hops = latency_hops(collective, world_size)
        sent = link_bytes(collective, payload_bytes, world_size)
        return hops * self.latency_s + sent / self.bandwidth_bytes_per_s

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LinkEstimate:
        """Inverse of :meth:`to_dict`; raises ValueError on missing or invalid fields."""
        try:
            return cls(
                latency_s=float(data["latency_s"]),
                bandwidth_bytes_per_s=float(data["bandwidth_bytes_per_s"]),
                samples=int(data["samples"]),
                rel_residual=float(data["rel_residual"]),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a LinkEstimate: {data!r} ({err!r})") from None

    def describe(self) -> str:
        return (
            f"{self.bandwidth_bytes_per_s * 8 / 1e6:.1f} Mbit/s, "
            f"{self.latency_s * 1e6:.1f} us/hop ({self.samples} samples, "
            f"residual {self.rel_residual:.1%})"
        )


# ---- robust fitting ----------------------------------------------------------------------------


def _nnls2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares for two non-negative coefficients (exact: check the faces of the orthant)."""
    best: np.ndarray | None = None
    best_cost = math.inf
    full, *_ = np.linalg.lstsq(a, b, rcond=None)
    candidates = [full] if np.all(full >= 0) else []
    for j in range(2):
        column = a[:, j]
        norm = float(column @ column)
        if norm > 0:
            coef = np.zeros(2)
            coef[j] = max(0.0, float(column @ b) / norm)
            candidates.append(coef)
    for coef in candidates:
        cost = float(np.sum((a @ coef - b) ** 2))
        if cost < best_cost:
            best, best_cost = coef, cost
    return best if best is not None else np.zeros(2)


@dataclass(frozen=True, slots=True)
class _Fit:
    latency_s: float
    seconds_per_byte: float
    rel_residual: float
    method: str


def _robust_sigma(residuals: np.ndarray) -> float:
    return max(_MAD_TO_SIGMA * float(np.median(np.abs(residuals))), 1e-9)


def _huber_fit(
    hops: np.ndarray, sent: np.ndarray, seconds: np.ndarray, huber_k: float, outlier_sigmas: float
) -> tuple[float, float] | None:
    """Fit seconds = hops * alpha + sent * u (alpha, u >= 0) on *relative* residuals.

    Timing noise grows with the duration, so every sample is divided by its own duration
    (the residual becomes (y - pred) / y); Huber weights (IRLS) then limit the pull of
    outliers, and samples beyond ``outlier_sigmas`` robust sigmas are dropped before a final
    pass, so a few collectives that queued behind something else cannot bend the fit.
    """
    design = np.column_stack([hops / seconds, sent / seconds])
    scale = np.median(design, axis=0)
    if np.any(scale <= 0):
        return None
    design = design / scale  # columns of order one: a well-conditioned solve
    target = np.ones(len(seconds))
    keep = np.ones(len(seconds), dtype=bool)
    coef = np.zeros(2)
    for _pass in range(2):
        a, b = design[keep], target[keep]
        weights = np.ones(len(b))
        for _ in range(30):
            root = np.sqrt(weights)[:, None]
            new = _nnls2(a * root, b * root[:, 0])
            residual = b - a @ new
            sigma = _robust_sigma(residual)
            weights = np.minimum(1.0, huber_k * sigma / np.maximum(np.abs(residual), 1e-300))
            converged = np.allclose(new, coef, rtol=1e-9, atol=1e-12)
            coef = new
            if converged:
                break
        residual_all = target - design @ coef
        sigma = _robust_sigma(residual_all[keep])
        inliers = np.abs(residual_all) <= outlier_sigmas * sigma
        if inliers.sum() < 2 or np.array_equal(inliers, keep):
            break
        keep = inliers
    latency, per_byte = coef / scale
    return float(latency), float(per_byte)


def _ratio_fit(
    hops: np.ndarray, sent: np.ndarray, seconds: np.ndarray, prior_latency: float
) -> tuple[float, float]:
    """Latency and seconds per byte when sizes are too similar to separate the two.

    The latency is the prior, capped so that it explains at most half of the typical duration
    (a prior from another link must not leave nothing for the bytes); the median ratio of the
    remaining time to the bytes is the bandwidth.
    """
    latency = min(prior_latency, 0.5 * float(np.median(seconds / hops)))
    transfer = np.maximum(seconds - hops * latency, 0.05 * seconds)
    return latency, float(np.median(transfer / sent))


# ---- the meter ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Sample:
    hops: int
    sent: float
    seconds: float
    probe: bool = False
    """An active probe: sized to reveal the bandwidth, so identifiable whatever its size."""


class BandwidthMeter:
    """Estimates latency and bandwidth from the service times of real collectives.

    Feed every measured collective with :meth:`add`, close a window (e.g. every few steps) with
    :meth:`end_window`. Each window is fitted on its own; the fits are smoothed by an EWMA, but
    a window whose bandwidth differs from the smoothed one by more than ``change_factor`` is
    adopted as it is, because real links change rate abruptly (a 1000 -> 50 Mbit/s step must
    not take ten windows to show up). Not thread-safe: call it from one thread.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Tuning of :class:`BandwidthMeter`."""

        ewma_weight: float = 0.3
        """Weight of a new window in the smoothed estimate (1 = no smoothing)."""
        max_samples: int = 512
        """Samples kept per window; older ones are dropped first."""
        min_samples: int = 8
        """Samples a window needs to be fitted; smaller windows stay open for the next call."""
        change_factor: float = 2.0
        """Bandwidth ratio beyond which a window replaces the estimate instead of blending."""
        min_size_spread: float = 3.0
        """Spread (90th / 10th percentile) of bytes per hop needed to fit alpha and beta both."""
        huber_k: float = 1.345
        """Huber threshold in robust sigmas (1.345: 95% efficiency on clean Gaussian noise)."""
        outlier_sigmas: float = 4.0
        """Samples further than this many robust sigmas from the fit are dropped and refitted."""
        prior_latency_s: float = 50e-6
        """Latency per hop assumed when a window cannot separate latency from bandwidth."""
        envelope_quantile: float = 0.3
        """Per size class (factor-2 bins), fit only samples at or below this time quantile."""
        identifiable_bytes: float = 1e6
        """A period moving at least this many link bytes per rank can reveal the bandwidth."""
        identifiable_seconds: float = 0.05
        """So can a period this long moving at least 64 kB (slow links, small models)."""

        def __post_init__(self) -> None:
            if not 0 < self.ewma_weight <= 1:
                raise ValueError(f"ewma_weight must be in (0, 1], got {self.ewma_weight}")
            if self.min_samples < 2 or self.max_samples < self.min_samples:
                raise ValueError("need 2 <= min_samples <= max_samples")
            if self.change_factor <= 1 or self.min_size_spread < 1:
                raise ValueError("change_factor must be > 1 and min_size_spread >= 1")

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or BandwidthMeter.Config()
        self._window: deque[_Sample] = deque(maxlen=self.config.max_samples)
        self._estimate: LinkEstimate | None = None
        self._last_window: LinkEstimate | None = None
        self._rate_changed = False
        self._blind = False
        self._latency_memory: float | None = None
        self._ignored = 0
        self._windows_closed = 0

    # ---- input --------------------------------------------------------------------------------

    def add(
        self, collective: Collective, payload_bytes: int, world_size: int, seconds: float
    ) -> None:
        """Record one collective: per-rank payload and its *service* time in seconds.

        Service time runs from when the collective could start on the wire (its launch, or the
        end of the previous collective on the same process group, whichever is later) to its
        completion; queueing behind earlier collectives must not count. Collectives that move
        nothing (one rank, empty payload) and non-positive times are ignored.
        """
        hops = latency_hops(collective, world_size)
        sent = link_bytes(collective, payload_bytes, world_size)
        self.add_period(hops, sent, seconds)

    def add_period(self, hops: int, sent_bytes: float, seconds: float) -> None:
        """Record a busy period of the link: ``sent_bytes`` per rank in ``seconds``.

        Gloo and NCCL may run several collectives of a step at once, so per-collective times
        overlap and each looks faster than the link; the busy period of a whole step (the
        union of its collectives' service intervals, with their summed hops and bytes) is
        the sample that reflects the link.
        """
        if hops <= 0 or sent_bytes <= 0 or not (math.isfinite(seconds) and seconds > 0):
            self._ignored += 1
            return
        self._window.append(_Sample(hops, float(sent_bytes), float(seconds)))

    def add_probe(self, hops: int, sent_bytes: float, seconds: float) -> None:
        """Record an active probe: one collective moving ``sent_bytes`` per rank, alone on the link.

        Unlike a step's busy period it counts as identifiable whatever its size (the prober
        sized it to stand clear of the latency), and when the window's own periods are too
        small to show the bandwidth, the probes alone are fitted.
        """
        if hops <= 0 or sent_bytes <= 0 or not (math.isfinite(seconds) and seconds > 0):
            self._ignored += 1
            return
        self._window.append(_Sample(hops, float(sent_bytes), float(seconds), probe=True))

    @property
    def pending(self) -> int:
        """Samples in the open window."""
        return len(self._window)

    @property
    def ignored(self) -> int:
        """Samples dropped by :meth:`add` since construction (nothing moved, or bad time)."""
        return self._ignored

    # ---- output -------------------------------------------------------------------------------

    @property
    def estimate(self) -> LinkEstimate | None:
        """Smoothed estimate, or None before the first fitted window."""
        return self._estimate

    @property
    def last_window(self) -> LinkEstimate | None:
        """Unsmoothed fit of the most recent window (diagnostics)."""
        return self._last_window

    @property
    def rate_changed(self) -> bool:
        """True when the last fitted window was adopted as a rate change (not blended)."""
        return self._rate_changed

    @property
    def windows_closed(self) -> int:
        """Windows :meth:`end_window` has closed (its samples taken, fitted or found blind);
        a call that left the window open for more samples does not count."""
        return self._windows_closed

    @property
    def blind(self) -> bool:
        """True when the last closed window's own periods were too small to show the bandwidth.

        Probes do not count: this says whether the traffic itself measures the link, i.e.
        whether an active probe is needed to notice a rate change.
        """
        return self._blind

    def end_window(self, min_samples: int | None = None) -> LinkEstimate | None:
        """Fit the open window, fold it into the estimate and return the estimate.

        With fewer than ``min_samples`` samples (default: the config's) and no probe nothing
        is fitted: the samples stay for the next window and the current estimate (possibly
        None) is returned unchanged. The adaptive loop's early looks ask for fewer, to act on
        a slow link after a step or two (one sample is fitted as a ratio with the prior
        latency: on a link slow enough to act on, latency is a rounding error).
        """
        has_probe = any(s.probe for s in self._window)
        needed = self.config.min_samples if min_samples is None else max(1, min_samples)
        if len(self._window) < needed and not has_probe:
            return self._estimate
        samples = list(self._window)
        self._window.clear()
        self._windows_closed += 1
        own = sum(1 for s in samples if not s.probe and self._identifiable(s))
        self._blind = own < (1 if needed == 1 else max(2, needed // 2))
        if self._blind:
            # Only small transfers: their time is latency and per-call overhead, so fitting
            # them would read a fast link as slow, compress more, shrink transfers further and
            # lock in. Keep the estimate until large transfers are seen again. (With enough
            # large ones, the small ones stay in the fit: they pin down the latency.) Probes
            # are exactly such large transfers: when there are some, they alone are fitted.
            if not has_probe:
                logger.debug("link window: too few identifiable periods; estimate kept")
                return self._estimate
            samples = [s for s in samples if s.probe]
            logger.debug("link window: own periods too small; fitting %d probe(s)", len(samples))
        else:
            samples = self._latest_regime(samples)
        fit = self._fit(samples)
        count = len(samples)
        if fit is None:
            return self._estimate
        window = LinkEstimate(
            latency_s=fit.latency_s,
            bandwidth_bytes_per_s=1.0 / fit.seconds_per_byte,
            samples=count,
            rel_residual=fit.rel_residual,
        )
        self._last_window = window
        self._latency_memory = window.latency_s
        self._estimate = self._blend(window, fit.method)
        return self._estimate

    def _latest_regime(self, samples: list[_Sample]) -> list[_Sample]:
        """The window's second half alone when the link changed rate inside the window.

        Without this the lower envelope would keep the fast samples from before a rate drop,
        and the drop would only be seen one window later.
        """
        half = len(samples) // 2
        early = [s for s in samples[:half] if self._identifiable(s)]
        late = [s for s in samples[half:] if self._identifiable(s)]
        if len(early) < 1 or len(late) < 2:
            return samples
        early_rate = statistics.median(s.sent / s.seconds for s in early)
        late_rate = statistics.median(s.sent / s.seconds for s in late)
        ratio = max(early_rate / late_rate, late_rate / early_rate)
        if ratio > self.config.change_factor:
            logger.debug("link rate changed within the window (x%.1f): fitting its end", ratio)
            return samples[half:]
        return samples

    def _identifiable(self, sample: _Sample) -> bool:
        cfg = self.config
        return (
            sample.probe
            or sample.sent >= cfg.identifiable_bytes
            or (sample.sent >= 64e3 and sample.seconds >= cfg.identifiable_seconds)
        )

    def _lower_envelope(self, samples: list[_Sample]) -> list[_Sample]:
        """The fast edge of each size class.

        A collective's time on one rank includes waiting for the slowest peer to arrive, which
        only ever adds time: the noise is one-sided, and a fit through all samples would read
        compute skew between ranks as a slow link (on a fast link, badly so). Within each
        factor-2 size class only the samples at or below ``envelope_quantile`` are kept.
        """
        classes: dict[int, list[_Sample]] = {}
        for sample in samples:
            size_class = int(math.log2(max(sample.sent / sample.hops, 1.0)))
            classes.setdefault(size_class, []).append(sample)
        kept: list[_Sample] = []
        for members in classes.values():
            cutoff = float(np.quantile([m.seconds for m in members], self.config.envelope_quantile))
            kept.extend(m for m in members if m.seconds <= cutoff)
        return kept

    def _fit(self, samples: list[_Sample]) -> _Fit | None:
        samples = self._lower_envelope(samples)
        hops = np.array([s.hops for s in samples], dtype=np.float64)
        sent = np.array([s.sent for s in samples], dtype=np.float64)
        seconds = np.array([s.seconds for s in samples], dtype=np.float64)
        per_hop = sent / hops
        low, high = np.quantile(per_hop, [0.1, 0.9])
        cfg = self.config
        result: tuple[float, float] | None = None
        method = "ratio"
        if low > 0 and high / low >= cfg.min_size_spread:
            result = _huber_fit(hops, sent, seconds, cfg.huber_k, cfg.outlier_sigmas)
            method = "huber"
        if result is None or result[1] <= 0:
            result = _ratio_fit(hops, sent, seconds, self._prior_latency())
            method = "ratio"
        latency, per_byte = result
        if not (per_byte > 0 and math.isfinite(per_byte)):
            logger.debug("link window of %d samples could not be fitted", len(samples))
            return None
        predicted = hops * latency + sent * per_byte
        residual = float(np.median(np.abs(seconds - predicted) / seconds))
        return _Fit(latency, per_byte, residual, method)

    def _prior_latency(self) -> float:
        if self._estimate is not None:
            return self._estimate.latency_s
        if self._latency_memory is not None:
            return self._latency_memory
        return self.config.prior_latency_s

    def _blend(self, window: LinkEstimate, method: str) -> LinkEstimate:
        old = self._estimate
        self._rate_changed = False
        if old is None:
            logger.debug("link estimate from first window (%s fit): %s", method, window.describe())
            return window
        ratio = window.bandwidth_bytes_per_s / old.bandwidth_bytes_per_s
        factor = max(ratio, 1.0 / ratio)
        if factor > self.config.change_factor:
            self._rate_changed = True
            logger.debug(
                "link rate change detected: %.1f -> %.1f Mbit/s (factor %.2f > %.2f); adopting "
                "the new window (%s fit) without smoothing",
                old.bandwidth_bytes_per_s * 8 / 1e6,
                window.bandwidth_bytes_per_s * 8 / 1e6,
                factor,
                self.config.change_factor,
                method,
            )
            return window
        w = self.config.ewma_weight
        # Blend seconds per byte, not bytes per second: predictions are linear in it.
        per_byte = (1 - w) / old.bandwidth_bytes_per_s + w / window.bandwidth_bytes_per_s
        return LinkEstimate(
            latency_s=(1 - w) * old.latency_s + w * window.latency_s,
            bandwidth_bytes_per_s=1.0 / per_byte,
            samples=old.samples + window.samples,
            rel_residual=(1 - w) * old.rel_residual + w * window.rel_residual,
        )

    # ---- lifecycle ----------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the estimate and the open window (e.g. after a rate change seen elsewhere).

        The last fitted latency is remembered only as the prior for windows whose sizes are too
        similar to fit it, since a rate change rarely changes the latency much.
        """
        self._window.clear()
        self._estimate = None
        self._last_window = None
        self._rate_changed = False
        self._blind = False

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: estimate, last window and open window (JSON-safe)."""
        return {
            "version": STATE_DICT_VERSION,
            "estimate": None if self._estimate is None else self._estimate.to_dict(),
            "last_window": None if self._last_window is None else self._last_window.to_dict(),
            "latency_memory": self._latency_memory,
            "rate_changed": self._rate_changed,
            "blind": self._blind,
            "window": [[s.hops, s.sent, s.seconds, s.probe] for s in self._window],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output; raises ValueError on another version or bad data."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_DICT_VERSION:
            version = state.get("version") if isinstance(state, Mapping) else None
            raise ValueError(
                f"bandwidth meter state version {version!r}; expected {STATE_DICT_VERSION}"
            )
        try:
            estimate = state["estimate"]
            last = state["last_window"]
            memory = state["latency_memory"]
            window = [_sample_from_list(entry) for entry in state["window"]]
            rate_changed = bool(state["rate_changed"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"bad bandwidth meter state: {err!r}") from None
        self._estimate = None if estimate is None else LinkEstimate.from_dict(estimate)
        self._last_window = None if last is None else LinkEstimate.from_dict(last)
        self._latency_memory = None if memory is None else float(memory)
        self._rate_changed = rate_changed
        self._blind = bool(state.get("blind", False))
        self._window.clear()
        self._window.extend(window)


def _sample_from_list(entry: Any) -> _Sample:
    """[hops, bytes, seconds] or, since probes were added, [hops, bytes, seconds, probe]."""
    if not isinstance(entry, (list, tuple)) or len(entry) not in (3, 4):
        raise ValueError(f"window entry {entry!r}")
    probe = bool(entry[3]) if len(entry) == 4 else False
    return _Sample(int(entry[0]), float(entry[1]), float(entry[2]), probe)
