"""The active link probe on real ranks.

Tier 2 (local gloo, loopback): a heavily compressed plan on a small model never moves enough
bytes to show the link, and rank 0's estimate starts stuck at 10 Mbit/s. Once the first
compressed window comes back blind, every boundary runs the same probe on every rank (the
histories agree on step and size, the plans and parameters stay identical), the probe sees
the real loopback speed, the estimate rises by orders of magnitude and the policy's fast-link
rule lifts the compression on its own.

Tier 2 also: the opening's contention probe agrees on one reading on every rank, and a reading
of none on every rank rests on a second batch of pairs (scripted loop times); its sums of
halves (scripted pass times, one rank) keep each half's least excess at a resolvable size,
and its small all-reduce is kept for the latency fit only where the probe's pass took 20 ms
beyond it (scripted pass times).
Tier 1: on a link too slow for it to matter, the opening does not time sums of halves at all;
a boundary probe reads the fastest of its timed passes (scripted pass times). Tier 2: a
boundary probe whose priming pass overran its estimate 3x on every rank stops there on every
rank (scripted pass times).

Tier 3 (root + iproute2, skipped otherwise; ~20 s): two ranks on a tbf-shaped veth start at
50 Mbit/s, where the policy compresses with PowerSGD and the steps fall below what the meter
can identify; the test raises the link to 1000 Mbit/s mid-window, and the next probe makes
the estimate jump and the plan go uncompressed within the following boundary or two. And at
1 Gbit/s the opening's sums of halves read no cost from tbf's token bucket.
"""

from __future__ import annotations

import datetime
import gc
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp.adaptive import WindowRecord
from autocomp.link_model import LinkEstimate
from autocomp.link_probe import LinkProbe
from autocomp.probe_runner import (
    LATENCY_PROBE_BYTES,
    OPENING_PROBE_SECONDS,
    OPENING_PROBE_START_BYTES,
)
from autocomp_bench.shaped_link import ShapedLink, shaped_link_unavailable_reason
from tests.models import MultiBucketNet, classification_batch
from tests.multirank import run_ranks

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 4
WARMUP = 4
POLICY = """
version = 1
[policy]
description = "test: heavy compression below the fast-link threshold"
warmup_steps = 4
min_numel = 64
compress_1d = false
fast_link_gbit = 0.5
candidates = ["none", "powersgd:rank=2"]
[guards]
loss_spike_ratio = 1.5
loss_window = 8
accordion_threshold = 1000.0
residual_factor = 1000.0
backoff_recovery_steps = 400
max_backoff_levels = 3
"""
STUCK = LinkEstimate(latency_s=1e-3, bandwidth_bytes_per_s=10e6 / 8, samples=16, rel_residual=0)
PROBE_BYTES = 1 << 20
# The steps here take milliseconds, so 1% of a window buys no informative probe; a large
# budget with a payload cap makes every blind window probe, always with PROBE_BYTES.
GENEROUS = LinkProbe.Config(budget=1000.0, max_bytes=PROBE_BYTES)
# The default budget, which at the stuck estimate buys one probe in hundreds of windows: only
# the probe that confirms a switch runs.
RATIONED = LinkProbe.Config(max_bytes=PROBE_BYTES)


def _stuck_slow(
    rank: int, world_size: int, policy_path: str, probe: str = "generous"
) -> dict[str, Any]:
    torch.manual_seed(0)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=0.02)
    # No early look: the warm-up (4 steps) ends at the first boundary, as the test expects;
    # no opening either, whose step-0 probe would read the link before the estimate sticks.
    config = autocomp.AutocompConfig(
        target_overlap=0.9,
        policy=policy_path,
        window=WINDOW,
        first_look_steps=WARMUP,
        opening=False,
        quiet_window_seconds=0.0,  # a boundary every window: the probes' schedule is per window
    )
    ctl = autocomp.wrap(ddp, config=config)
    loop = ctl.adaptive
    assert loop is not None
    loop.probe = LinkProbe(GENEROUS if probe == "generous" else RATIONED)
    # Rank 0's meter believes in a slow link it measured earlier; this model's transfers are
    # too small to ever correct that by themselves.
    state = loop.meter.state_dict()
    state["estimate"] = STUCK.to_dict()
    loop.meter.load_state_dict(state)
    loop.cost_model.update_link(STUCK)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    plans = {}
    for step in range(8 * WINDOW):
        x, y = classification_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        plans[ctl.step] = dict(ctl.plan)
    return {
        "plans": plans,
        "records": [r.to_dict() for r in ctl.history],
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        "blind": loop.meter.blind,
    }


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_the_first_blind_window_after_a_switch_is_probed_whatever_the_budget(
    tmp_path: Path,
) -> None:
    """At the default 1% budget these millisecond steps buy a probe every few hundred
    windows, so before the confirmation probe the stuck estimate held the compressed plan for
    the whole run (the digits CNN on loopback held fp16 for 1,400 steps that way). Now the
    first window after the switch at the end of the warm-up (steps 4-7) comes back blind, so
    the boundary at step 8 asks for a probe, which runs at the next one (step 12, as every
    probe runs a boundary after it is asked for) and lifts the estimate there. The switch
    back to ``none`` rests on that probe's reading (this model's steps are blind even
    uncompressed, so the link stayed out of the traffic's view), so it is not probed again:
    after the one confirmation the budget rations the probes."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    ranks = run_ranks(_stuck_slow, 2, tmp_path / "ranks", str(policy), "rationed")
    zero, one = ranks
    probes = [[(r["step"], r["probe_bytes"]) for r in rank["records"]] for rank in ranks]
    assert probes[0] == probes[1]
    assert zero["plans"] == one["plans"] and torch.equal(zero["params"], one["params"])
    fired = [s for s, b in probes[0] if b]
    assert fired == [WARMUP + 2 * WINDOW], probes[0]
    by_step = {r["step"]: r for r in zero["records"]}
    assert by_step[WARMUP + WINDOW]["bandwidth_bytes_per_s"] == STUCK.bandwidth_bytes_per_s
    lifted = by_step[WARMUP + 2 * WINDOW]
    assert lifted["bandwidth_bytes_per_s"] > 20 * STUCK.bandwidth_bytes_per_s, lifted
    plans = zero["plans"]
    for step in range(WARMUP + 1, WARMUP + 2 * WINDOW + 1):
        assert any(spec != "none" for spec in plans[step].values()), (step, plans[step])
    assert set(plans[WARMUP + 2 * WINDOW + 1].values()) == {"none"}
    assert set(plans[max(plans)].values()) == {"none"}


def test_a_boundary_probe_reads_its_fastest_timed_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's scheduling hiccup only adds time, so one slow pass must not read the link slow:
    the priming pass is not timed, and of the timed ones the fastest counts."""
    import autocomp.probe_runner as probe_runner
    from autocomp.link_probe import BOUNDARY_PROBE_PASSES
    from autocomp.probe_runner import ProbeRunner

    passes = iter([9.0, 4.0, 1.0, 3.5])  # priming (its drain of a shaper's bucket), then timed
    calls: list[int] = []

    def scripted(tensor: torch.Tensor, group: object) -> float:
        calls.append(tensor.numel())
        return next(passes)

    monkeypatch.setattr(probe_runner, "_pass_seconds", scripted)
    seconds = ProbeRunner().fastest_all_reduce(
        1 << 20, torch.device("cpu"), None, BOUNDARY_PROBE_PASSES - 1
    )
    assert seconds == 1.0
    assert calls == [(1 << 20) // 4] * BOUNDARY_PROBE_PASSES


def _scripted_overrun(rank: int, world: int, script: list[list[float]], expected: float) -> dict:
    """``ProbeRunner.fastest_all_reduce`` on one rank with its passes timed by ``script``
    (the agreement on the priming pass is a real all-reduce)."""
    import autocomp.probe_runner as probe_runner
    from autocomp.link_probe import BOUNDARY_PROBE_PASSES

    passes = iter(script[rank])
    calls = {"passes": 0}

    def scripted(tensor: torch.Tensor, group: object) -> float:
        calls["passes"] += 1
        return next(passes)

    probe_runner._pass_seconds = scripted
    seconds = probe_runner.ProbeRunner().fastest_all_reduce(
        1 << 16,
        torch.device("cpu"),
        None,
        BOUNDARY_PROBE_PASSES - 1,
        expected_pass_seconds=expected,
    )
    return {"seconds": seconds, "passes": calls["passes"]}


@pytest.mark.multirank
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("script", "expected", "seconds", "passes"),
    [
        # Both priming passes 10x the expected 80 ms: every rank stops after it.
        ([[0.8, 0.1, 0.1, 0.1], [0.82, 0.1, 0.1, 0.1]], 0.08, [0.8, 0.82], 1),
        # One rank's priming pass overran (it waited for the other), the fastest did not:
        # the link is as expected, and every rank runs every pass.
        ([[0.8, 0.09, 0.08, 0.085], [0.1, 0.08, 0.09, 0.081]], 0.08, [0.08, 0.08], 4),
        # 4 ms expected, 20 ms priming: 5x, but under the 50 ms floor: a fast link's hiccup.
        ([[0.02, 0.004, 0.004, 0.004], [0.021, 0.004, 0.005, 0.004]], 0.004, [0.004, 0.004], 4),
    ],
)
def test_a_boundary_probe_stops_after_a_priming_pass_that_overran_its_estimate(
    script: list[list[float]],
    expected: float,
    seconds: list[float],
    passes: int,
    tmp_path: Path,
) -> None:
    """A probe is sized at the link estimate; where the link is several times slower (an
    opening that misread it, a link that dropped while the plan kept it out of view), its
    passes cost that many times their budget: 3.5 s of a 30 s run on the digits CNN at
    10 Mbit/s. The ranks agree on the priming pass's least and, where even that overran
    ``PROBE_OVERRUN_FACTOR`` x the expected pass, all stop there together."""
    ranks = run_ranks(_scripted_overrun, 2, tmp_path / "ranks", script, expected)
    assert [r["seconds"] for r in ranks] == seconds
    assert [r["passes"] for r in ranks] == [passes, passes]


@pytest.mark.parametrize("mbit", [10.0, 200.0])
def test_no_sum_of_halves_is_timed_on_a_slow_link(mbit: float) -> None:
    """At 10-200 Mbit/s a half's transfer dwarfs gloo's CPU sum, so the opening returns zeros
    without a collective (there is no process group here: one would raise)."""
    from autocomp.probe_runner import HALF_SUM_MAX_LINK_SECONDS_PER_ELEMENT, ProbeRunner

    payload = 1 << 20
    float_seconds = payload / (mbit * 1e6 / 8)  # one float32 pass at that rate
    assert float_seconds > HALF_SUM_MAX_LINK_SECONDS_PER_ELEMENT * (payload // 4)
    halves = ProbeRunner().half_sums(payload, float_seconds, torch.device("cpu"), None)
    assert halves == (0.0, 0.0)


HALF_SCRIPTS = {
    "a slow half pass": {
        torch.float32: [2.0, 2.0, 2.0, 2.0, 2.1, 2.2],
        torch.float16: [3.0, 9.0, 1.5, 1.6, 1.7, 1.6],  # one pass met an empty token bucket
        torch.bfloat16: [3.0, 1.1, 9.0, 1.05, 1.2, 1.1],  # within 20% of its bytes at best
    },
    # Compared with the float32 pass beside it, round 2's fp16 pass read 1.5 - 3.2 / 2 < 0,
    # and the least excess over the rounds called fp16 free (4 of 8 openings on loopback).
    "a slow float32 pass": {
        torch.float32: [2.0, 2.0, 3.2, 2.0, 2.2, 2.1],
        torch.float16: [3.0, 1.7, 1.5, 1.8, 1.6, 1.7],
        torch.bfloat16: [3.0, 1.1, 1.9, 1.05, 1.1, 1.2],
    },
    # Three rounds of slow float32 passes (a descheduled stretch): with three rounds the
    # fastest float32 pass was 3.0 ms and fp16 read 1.5 - 3.0 / 2 = 0, free (7 of 100 probes
    # on loopback); the fourth and fifth rounds see the link as it is.
    "three slow float32 passes": {
        torch.float32: [2.0, 3.0, 3.1, 3.0, 2.0, 2.1],
        torch.float16: [3.0, 1.6, 1.5, 1.7, 1.6, 1.5],
        torch.bfloat16: [3.0, 1.1, 1.2, 1.05, 1.1, 1.2],
    },
}


def _scripted_half_sums(rank: int, world: int, float_seconds: float, case: str) -> dict[str, Any]:
    """``half_sums`` on one rank with scripted pass times (ms) per type, first the primes;
    ``float_seconds``: the opening probe's 64 KB pass."""
    import autocomp.probe_runner as probe_runner

    script = {dtype: iter(times) for dtype, times in HALF_SCRIPTS[case].items()}
    sizes: set[int] = set()

    def scripted(tensor: torch.Tensor, group: Any) -> float:
        sizes.add(tensor.numel())
        return next(script[tensor.dtype]) / 1e3

    probe_runner._pass_seconds = scripted
    halves = probe_runner.ProbeRunner().half_sums(
        1 << 16, float_seconds, torch.device("cpu"), None, None, 8 << 20
    )
    return {"halves": halves, "sizes": sorted(sizes)}


@pytest.mark.multirank
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("float_seconds", "numel"),
    [(1e-4, 1 << 19), (5e-4, 327_680)],  # 6 ns an element: the cap; 30 ns: 10 ms of float32
)
@pytest.mark.parametrize("case", sorted(HALF_SCRIPTS))
def test_sum_of_halves_compares_each_types_fastest_pass_at_a_resolvable_size(
    float_seconds: float, numel: int, case: str, tmp_path: Path
) -> None:
    """The opening's probe may stop at 64 KB, where a pass that meets an empty token bucket
    dwarfs gloo's cost of summing halves. The sums are timed at ``HALF_SUM_PROBE_ELEMENTS``
    (the gradients are larger), or at what a float32 pass moves in ``HALF_SUM_PROBE_SECONDS``
    on a slower link, and each half's fastest pass is compared with the fastest float32 one:
    one slow pass of either type is not a CPU cost (nor a saving), and a half within 20% of
    its bytes reads 0."""
    from autocomp.probe_runner import (
        HALF_SUM_PROBE_ELEMENTS,
        HALF_SUM_PROBE_SECONDS,
        HALF_SUM_ROUNDS,
    )

    assert HALF_SUM_ROUNDS == 5  # the scripts above have a prime and five rounds
    assert numel == min(
        HALF_SUM_PROBE_ELEMENTS, int(HALF_SUM_PROBE_SECONDS * 16384 / float_seconds)
    )
    (result,) = run_ranks(_scripted_half_sums, 1, tmp_path / "ranks", float_seconds, case)
    assert result["sizes"] == [numel]
    float16, bfloat16 = result["halves"]
    assert float16 == pytest.approx(0.5e-3 / numel)  # 1.5 - 2.0 / 2 ms
    assert bfloat16 == 0.0


def _half_sums_on_a_shaped_link(rank: int, world: int, first_pass_ms: list[float]) -> dict:
    """``half_sums`` after an opening pass that read 1 ns an element (a shaper's bucket),
    with this rank's first float32 pass of the sums scripted at ``first_pass_ms[rank]``."""
    import autocomp.probe_runner as probe_runner

    passes: list[torch.dtype] = []
    float32 = iter([5.0, first_pass_ms[rank], 2.0, 2.0, 2.0, 2.0])

    def scripted(tensor: torch.Tensor, group: Any) -> float:
        passes.append(tensor.dtype)
        return (next(float32) if tensor.dtype == torch.float32 else 1.5) / 1e3

    probe_runner._pass_seconds = scripted
    halves = probe_runner.ProbeRunner().half_sums(
        1 << 16, 16e-6, torch.device("cpu"), None, None, 8 << 20
    )
    return {"halves": halves, "passes": [str(dtype) for dtype in passes]}


@pytest.mark.multirank
@pytest.mark.timeout(60)
def test_sums_of_halves_stop_when_their_own_float32_pass_reads_a_slow_link(
    tmp_path: Path,
) -> None:
    """On a 500 Mbit/s tbf link the opening's 64 KB pass rode the shaper's 250 kB bucket and
    read 1.2-1.45 Gbit/s; the sums of halves, sized for that rate, then took 0.22-0.31 s of
    step 0 to read zeros. Their own float32 pass after a prime reads the link: agreed as the
    fastest rank's, a slow one stops the probe on every rank before any half is sent, and
    a fast one on any rank lets every rank go on (the same collectives everywhere)."""
    from autocomp.probe_runner import HALF_SUM_MAX_LINK_SECONDS_PER_ELEMENT, HALF_SUM_PROBE_ELEMENTS

    numel = HALF_SUM_PROBE_ELEMENTS  # 0.01 s at 1 ns an element is more than the cap
    slow_ms = 1.2e3 * HALF_SUM_MAX_LINK_SECONDS_PER_ELEMENT * numel  # 20% over the bound
    # Both ranks read the link slow: both stop after the prime and the one timed pass.
    for result in run_ranks(_half_sums_on_a_shaped_link, 2, tmp_path / "slow", [slow_ms] * 2):
        assert result == {"halves": (0.0, 0.0), "passes": ["torch.float32"] * 2}
    # One rank's pass met a slow moment, the other read the link fast: the fastest agrees.
    results = run_ranks(_half_sums_on_a_shaped_link, 2, tmp_path / "mixed", [slow_ms, 2.0])
    for result in results:
        float16, bfloat16 = result["halves"]
        assert float16 == pytest.approx(0.5e-3 / numel)  # 1.5 - 2.0 / 2 ms
        assert bfloat16 == pytest.approx(0.5e-3 / numel)
        assert result["passes"].count("torch.float32") == 6  # a prime and five rounds
        assert result["passes"].count("torch.float16") == 6


def _opening(rank: int, world: int) -> dict[str, Any]:
    from autocomp.probe_runner import ProbeRunner

    runner = ProbeRunner()
    before = torch.random.get_rng_state()
    agreed = runner.opening(8 << 20, 0.01, torch.device("cpu"), None)
    return {
        "probe": agreed,
        "rng_untouched": torch.equal(before, torch.random.get_rng_state()),
        "after": runner.time_all_reduce(1 << 16, torch.device("cpu"), None) > 0,
    }


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_the_opening_agrees_on_one_contention_reading(tmp_path: Path) -> None:
    """The opening's contention probe (compute timed alone and beside the probe's
    all-reduce) and its timed sums of halves issue the same collectives on every rank, end
    with every rank holding the same readings, and leave the training RNG alone; the ranks
    stay in step afterwards."""
    zero, one = run_ranks(_opening, 2, tmp_path / "ranks")
    assert zero["probe"] == one["probe"]
    contention = zero["probe"].contention_seconds_per_byte
    assert math.isfinite(contention) and contention >= 0.0
    halves = zero["probe"].half_sum_seconds_per_element
    assert len(halves) == 2 and all(math.isfinite(h) and h >= 0.0 for h in halves)
    # The small all-reduce that gives the link model its latency: one agreed reading, kept
    # where the probe's pass resolves it (on loopback the probe may stop at 8 MB before).
    if zero["probe"].latency_probe is not None:
        small_bytes, small_seconds = zero["probe"].latency_probe
        assert small_bytes == LATENCY_PROBE_BYTES < zero["probe"].payload_bytes
        assert math.isfinite(small_seconds) and small_seconds > 0.0
        assert zero["probe"].seconds - small_seconds >= OPENING_PROBE_SECONDS
    assert zero["rng_untouched"] and one["rng_untouched"]
    assert zero["after"] and one["after"]


def _scripted_latency_opening(
    rank: int,
    world: int,
    hop_s: float,
    mbit: float,
    raw_bytes: int,
    burst_bytes: int = 0,
    hiccup: tuple[int, float] | None = None,
) -> dict[str, Any]:
    """``ProbeRunner.opening`` with every pass timed as 2 hops of ``hop_s`` plus its bytes
    at ``mbit``, or at 10 Gbit/s for a pass of at most ``burst_bytes`` (a token bucket's
    burst); ``hiccup`` = (n, seconds): this rank's n-th pass takes that long instead (other
    load on the machine). The contention and half-sum probes left out. Returns the agreed
    probe."""
    import autocomp.probe_runner as probe_runner

    passes = {"n": 0}

    def scripted(tensor: torch.Tensor, group: Any) -> float:
        passes["n"] += 1
        if hiccup is not None and passes["n"] == hiccup[0]:
            return hiccup[1]
        sent = tensor.numel() * 4
        return 2 * hop_s + sent / ((10_000 if sent <= burst_bytes else mbit) * 1e6 / 8)

    probe_runner._pass_seconds = scripted
    runner = probe_runner.ProbeRunner()
    runner.contention = lambda *args, **kwargs: probe_runner.ContentionReading(0.0, 0.0)  # type: ignore[method-assign]
    runner.half_sums = lambda *args, **kwargs: (0.0, 0.0)  # type: ignore[method-assign]
    agreed = runner.opening(raw_bytes, 0.01, torch.device("cpu"), None)
    return {
        "payload": agreed.payload_bytes,
        "seconds": agreed.seconds,
        "small": agreed.latency_probe,
    }


@pytest.mark.multirank
@pytest.mark.timeout(60)
def test_the_opening_reads_latency_only_where_the_probe_resolves_it(tmp_path: Path) -> None:
    """On a 20 ms round trip the probe grows until its bytes take 20 ms beyond the small
    all-reduce (a 64 KB pass alone is 40 ms of latency and 5 ms of bytes), and the small
    one is kept for the latency fit. A probe capped at a small model's gradients, a few ms
    beside the small pass, keeps none: the link model then prices the latency at its prior,
    as before. So does a small pass that a shaper's burst made faster per byte than the
    probe's."""

    far = run_ranks(_scripted_latency_opening, 2, tmp_path / "far", 10e-3, 100.0, 8 << 20)
    assert far[0] == far[1]
    small_seconds = 2 * 10e-3 + LATENCY_PROBE_BYTES / (100e6 / 8)
    assert far[0]["small"] == (LATENCY_PROBE_BYTES, pytest.approx(small_seconds))
    assert far[0]["payload"] == 4 * OPENING_PROBE_START_BYTES  # 64 KB: 25 ms, 256 KB: 41 ms
    assert far[0]["seconds"] - small_seconds >= OPENING_PROBE_SECONDS

    capped = run_ranks(_scripted_latency_opening, 2, tmp_path / "capped", 1e-3, 100.0, 170_000)
    assert capped[0]["payload"] == 170_000 and capped[0]["small"] is None

    # A shaper's bucket lets the small passes through at line rate and the 64 KB one at
    # 10 Mbit/s: faster per byte than the probe, so no latency line can pass through both
    # (fitted anyway, the link read 55 Mbit/s). None is kept; the probe alone reads 10.
    burst = run_ranks(
        _scripted_latency_opening, 2, tmp_path / "burst", 0.0, 10.0, 1_135_144, 16 << 10
    )
    assert burst[0]["payload"] == OPENING_PROBE_START_BYTES and burst[0]["small"] is None
    assert burst[0]["payload"] * 8 / burst[0]["seconds"] / 1e6 == pytest.approx(10.0)


@pytest.mark.multirank
@pytest.mark.timeout(60)
def test_the_openings_probe_does_not_stop_on_one_slow_pass(tmp_path: Path) -> None:
    """A burst of other load made both ranks' first timed 64 KB pass take 36 ms on loopback,
    which stopped the growth there and read the link as 14.7 Mbit/s: the opening compressed
    the digits CNN on loopback until step 100. The stop rests on the least of three passes
    at its size, so the probe grows on, as without the burst, and reads the link's rate.
    The passes: 8 of the small all-reduce, then the 64 KB priming and timed ones (10th)."""
    calm = run_ranks(_scripted_latency_opening, 2, tmp_path / "calm", 0.0, 5000.0, 8 << 20)
    loaded = run_ranks(
        _scripted_latency_opening, 2, tmp_path / "loaded", 0.0, 5000.0, 8 << 20, 0, (10, 0.036)
    )
    assert loaded[0] == loaded[1]
    assert loaded[0]["payload"] == calm[0]["payload"] > OPENING_PROBE_START_BYTES
    mbit = loaded[0]["payload"] * 8 / loaded[0]["seconds"] / 1e6
    assert mbit == pytest.approx(5000.0)


def _scripted_contention(rank: int, world: int, script: list[list[float]]) -> dict[str, Any]:
    """``ProbeRunner.contention`` on one rank, each batch's loops scripted as (alone, beside)
    seconds, the same for every pair of the batch; the real all-reduces run beside them."""
    import autocomp.probe_runner as probe_runner

    batches = iter(script[rank])
    pairs: list[float] = []
    calls = {"loops": 0}

    def scripted(matrix: torch.Tensor, reps: int) -> float:
        calls["loops"] += 1
        if calls["loops"] <= 2:  # the warm-up and the 4-product timing
            return 1e-3 * reps
        if not pairs:
            alone, beside = next(batches), next(batches)
            pairs.extend([alone, beside] * probe_runner.CONTENTION_PAIRS)
        return pairs.pop(0)

    probe_runner._compute_seconds = scripted
    reading = probe_runner.ProbeRunner().contention(1 << 16, 0.02, torch.device("cpu"), None)
    loops = calls["loops"] - 2
    return {
        "reading": reading.seconds_per_byte,
        "slowdown": reading.slowdown,
        "settled": reading.settled,
        "batches": loops // (2 * probe_runner.CONTENTION_PAIRS),
    }


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("script", "batches", "slowdown", "settled"),
    [
        # Rank 1's first batch shows contention: one batch on both ranks, its reading agreed.
        ([[0.020, 0.0202], [0.020, 0.024]], 1, 0.004, True),
        # Both first batches read under the cut; rank 1's second shows it: pooled, both
        # batches' medians meet half-way.
        ([[0.020, 0.0202, 0.020, 0.0202], [0.020, 0.0202, 0.020, 0.024]], 2, 0.0021, True),
        # Quiet in both batches on both ranks: no contention, after the second batch.
        ([[0.020, 0.0202, 0.020, 0.0201], [0.020, 0.0203, 0.020, 0.0202]], 2, 0.0, False),
        # Rank 0 reads 5% (over the 3% cut, under twice it): a reading, but not a settled one.
        ([[0.020, 0.021], [0.020, 0.0205]], 1, 0.001, False),
    ],
)
def test_a_contention_reading_of_zero_rests_on_a_second_batch(
    script: list[list[float]], batches: int, slowdown: float, settled: bool, tmp_path: Path
) -> None:
    """A zero prices every hidden transfer as free (on the held-out 12-layer GPT it put five
    first-bucket matrices uncompressed), and one batch of pairs read under the cut on a rank
    of a 2-core pair in 4 of 12 tries. So when every rank's first batch reads none, every
    rank times a second and judges all pairs together; when any rank reads contention, none
    times more. Every rank ends with the same reading and the same collectives, and the same
    verdict on whether it cleared twice the cut (``settled``)."""
    from autocomp.compressors import Collective
    from autocomp.link_model import link_bytes

    zero, one = run_ranks(_scripted_contention, 2, tmp_path / "ranks", script)
    assert zero == one
    assert zero["batches"] == batches
    sent = link_bytes(Collective.ALL_REDUCE, 1 << 16, 2)
    assert zero["reading"] == pytest.approx(slowdown / sent)
    assert zero["settled"] is settled
    if batches == 1:  # the slowdown agreed is the larger rank's, as a share of its quiet loop
        shares = [(beside - alone) / alone for alone, beside in (pairs[:2] for pairs in script)]
        assert zero["slowdown"] == pytest.approx(max(shares))


def _opening_sizes(rank: int, world: int) -> list[int]:
    from autocomp.probe_runner import ProbeRunner

    runner = ProbeRunner()
    cpu = torch.device("cpu")
    # A 10 s forward: even a 64 KB pass's rate puts 8 MB far under 5x that compute.
    plainly_fast = runner.opening(8 << 20, 10.0, cpu, None, opening_ratio=5.0)
    no_ratio = runner.opening(8 << 20, 10.0, cpu, None)
    # One rank without a forward time: nothing to weigh the link against, no early stop.
    blind = runner.opening(8 << 20, None if rank == 1 else 10.0, cpu, None, opening_ratio=5.0)
    return [plainly_fast.payload_bytes, no_ratio.payload_bytes, blind.payload_bytes]


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_the_opening_probe_stops_growing_on_a_plainly_fast_link(tmp_path: Path) -> None:
    """On loopback a 64 KB pass already shows the gradients' all-reduce far under the
    opening's threshold: the probe stops there, on every rank alike, instead of growing to
    megabytes (0.36 s of the n-gram model's 0.75 s opening). Without the threshold, or
    with a rank that has no forward time, it grows as before."""

    zero, one = run_ranks(_opening_sizes, 2, tmp_path / "ranks")
    assert zero == one
    fast, grown, blind = zero
    assert fast == OPENING_PROBE_START_BYTES
    assert grown > OPENING_PROBE_START_BYTES and blind > OPENING_PROBE_START_BYTES


def _opening_on_two_nodes(rank: int, world: int) -> dict[str, Any]:
    """Two nodes of two ranks: cross-node groups {0, 2} and {1, 3}, nodes {0, 1} and {2, 3}.
    The first group's ranks report a long forward (its pass alone says "plainly fast"), the
    second's a very short one (grow on)."""
    import torch.distributed as dist

    from autocomp.probe_runner import ProbeRunner

    cross = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    nodes = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group, node = cross[rank % 2], nodes[rank // 2]
    forward = 10.0 if rank % 2 == 0 else 1e-6
    cpu = torch.device("cpu")
    alone = ProbeRunner().opening(8 << 20, forward, cpu, group, opening_ratio=5.0)
    together = ProbeRunner().opening(8 << 20, forward, cpu, group, opening_ratio=5.0, node=node)
    return {"alone": alone.payload_bytes, "together": together}


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_the_opening_of_a_hierarchy_agrees_across_the_node(tmp_path: Path) -> None:
    """With a hierarchy each rank probes over its cross-node group, and the node's groups
    share one link. Agreed within each group alone, the groups stopped at different rounds
    (one at 64 KB, one grown on), and rank 0 read its group's flow, not the node's. With the
    node's agreement every rank ends with the same probe: the same size, the node's slowest
    flow, the slowest forward, and the same contention and half-sum readings."""

    ranks = run_ranks(_opening_on_two_nodes, 4, tmp_path / "ranks")
    alone = [r["alone"] for r in ranks]
    assert alone[0] == alone[2] == OPENING_PROBE_START_BYTES
    assert alone[1] == alone[3] > OPENING_PROBE_START_BYTES
    together = [r["together"] for r in ranks]
    assert all(t == together[0] for t in together), together
    assert together[0].slowest_forward_seconds == 10.0
    assert together[0].payload_bytes == OPENING_PROBE_START_BYTES


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_probe_lifts_a_stuck_slow_estimate_on_every_rank_alike(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    ranks = run_ranks(_stuck_slow, 2, tmp_path / "ranks", str(policy))
    zero, one = ranks
    probes = [[(r["step"], r["probe_bytes"]) for r in rank["records"]] for rank in ranks]
    assert probes[0] == probes[1]  # same collectives in the same order, or it would hang
    assert zero["plans"] == one["plans"] and torch.equal(zero["params"], one["params"])
    for a, b in zip(zero["records"], one["records"], strict=True):
        assert a["probe_seconds"] == b["probe_seconds"]  # the MIN over ranks, on both
    by_step = {r["step"]: r for r in zero["records"]}
    # No probe in warm-up; the first compressed window (steps 4-7) comes back blind, so the
    # boundary at step 8 probes, and then every boundary while the meter stays blind.
    assert [s for s, b in probes[0] if b] == list(range(WARMUP + WINDOW, 8 * WINDOW, WINDOW))
    assert all(b == PROBE_BYTES for _, b in probes[0] if b)
    assert zero["blind"]
    assert by_step[WARMUP]["bandwidth_bytes_per_s"] == STUCK.bandwidth_bytes_per_s
    first = by_step[WARMUP + WINDOW]
    assert first["probe_bytes_per_s"] > 20 * STUCK.bandwidth_bytes_per_s, first
    assert first["bandwidth_bytes_per_s"] > 20 * STUCK.bandwidth_bytes_per_s, first
    assert "probe 1,049 kB" in _summary(first)
    # Compressed while the estimate was stuck, uncompressed once the probe showed the link.
    plans = zero["plans"]
    assert any(spec != "none" for spec in plans[WARMUP + 1].values()), plans[WARMUP + 1]
    assert set(plans[WARMUP + WINDOW + 1].values()) == {"none"}
    assert set(plans[max(plans)].values()) == {"none"}


def _summary(record: dict[str, Any]) -> str:
    return WindowRecord(**record).summary()


# ---- tier 3: a real link that gets faster --------------------------------------------------

_UNAVAILABLE = shaped_link_unavailable_reason()
SHAPED_POLICY = POLICY.replace('"test:', '"test shaped:')
SLOW_MBIT, FAST_MBIT = 50.0, 1000.0
RAISE_STEP = 13  # inside the window of steps 12-15
SHAPED_STEPS = 6 * WINDOW
SHAPED_PROBE_BYTES = 1 << 20


def shaped_worker(policy_path: str, out_dir: str) -> None:
    """One rank on its namespace: train, pause at RAISE_STEP while the link is raised."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = torch.distributed.get_rank()
    out = Path(out_dir)
    torch.manual_seed(0)
    model = torch.nn.Sequential(  # 1.1M parameters: 4.4 MB per uncompressed step
        torch.nn.Linear(64, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )
    ddp = DDP(model, bucket_cap_mb=1)
    config = autocomp.AutocompConfig(
        policy=policy_path,
        window=WINDOW,
        run_dir=False,
        first_look_steps=WARMUP,
        quiet_window_seconds=0.0,  # a boundary every window: the probes' schedule is per window
    )
    ctl = autocomp.wrap(ddp, config=config)
    assert ctl.adaptive is not None
    # Compressed steps take tens of ms here, so 1% of a window buys no informative probe: a
    # large budget (capped payload) probes every blind window, as a long window would.
    ctl.adaptive.probe = LinkProbe(LinkProbe.Config(budget=5.0, max_bytes=SHAPED_PROBE_BYTES))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    plans = {}
    for step in range(SHAPED_STEPS):
        if step == RAISE_STEP and rank == 0:
            (out / "reached").write_text(str(step))
            deadline = time.monotonic() + 30
            while not (out / "raised").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the link was not raised")
                time.sleep(0.02)
        x = torch.randn(64, 64, generator=generator)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        plans[ctl.step] = dict(ctl.plan)
    result = {
        "plans": plans,
        "records": [{k: v for k, v in r.to_dict().items() if k != "decision"} for r in ctl.history],
        "summaries": [r.summary() for r in ctl.history],
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    ctl.close()
    torch.distributed.destroy_process_group()
    # Collect DDP's reducer (reference cycles) while the interpreter is alive: left to its
    # shutdown, gloo's threads can touch Python objects and abort the process.
    del ctl, ddp, opt
    gc.collect()


@pytest.mark.shaped
@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"ShapedLink unavailable: {_UNAVAILABLE}")
def test_shaped_link_getting_faster_lightens_the_plan(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(SHAPED_POLICY)
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
        "from tests.test_link_probe import shaped_worker; shaped_worker(sys.argv[1], sys.argv[2])"
    )
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=SLOW_MBIT)) as link:
        procs = _launch_pair(link, [sys.executable, "-c", code, str(policy), str(tmp_path)], logs)
        deadline = time.monotonic() + 90
        while not (tmp_path / "reached").exists():
            failed = [p.returncode for p in procs if p.poll() not in (None, 0)]
            assert not failed and time.monotonic() < deadline, _logs(logs)
            time.sleep(0.02)
        link.set_rate(FAST_MBIT)
        (tmp_path / "raised").write_text("raised")
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    assert [p.returncode for p in procs] == [0, 0], _logs(logs)
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    print("\n".join(zero["summaries"]))
    assert zero["plans"] == one["plans"]
    assert [(r["step"], r["probe_bytes"]) for r in zero["records"]] == [
        (r["step"], r["probe_bytes"]) for r in one["records"]
    ]
    by_step = {r["step"]: r for r in zero["records"]}
    plans = {int(step): plan for step, plan in zero["plans"].items()}
    # At 50 Mbit/s the warm-up measures the link and the policy compresses.
    slow = by_step[WARMUP]["bandwidth_bytes_per_s"] * 8 / 1e6
    assert 0.5 * SLOW_MBIT < slow < 1.5 * SLOW_MBIT, slow
    assert any(spec != "none" for spec in plans[RAISE_STEP].values()), plans[RAISE_STEP]
    # A probe ran before the raise (the meter was blind) and read the slow link.
    before = [r for s, r in by_step.items() if s <= RAISE_STEP and r["probe_bytes"]]
    assert before and before[-1]["probe_bytes_per_s"] * 8 / 1e6 < 2 * SLOW_MBIT, before
    # By the second boundary after the raise the estimate is fast and the plan uncompressed.
    boundary = (RAISE_STEP // WINDOW + 1) * WINDOW
    fast = [
        r
        for s, r in sorted(by_step.items())
        if s > RAISE_STEP
        and r["bandwidth_bytes_per_s"]
        and r["bandwidth_bytes_per_s"] * 8 / 1e6 > 0.5 * FAST_MBIT
    ]
    assert fast and fast[0]["step"] <= boundary + WINDOW, zero["summaries"]
    assert set(plans[fast[0]["step"] + 1].values()) == {"none"}, plans[fast[0]["step"] + 1]
    assert set(plans[max(plans)].values()) == {"none"}


def _launch_pair(
    link: ShapedLink, argv: list[str], logs: list[Path]
) -> list[subprocess.Popen[Any]]:
    """One rank in each of the link's two namespaces, each writing its own log."""
    procs = []
    for host in range(2):
        with logs[host].open("w") as log:
            procs.append(
                link.popen(
                    host,
                    argv,
                    env=link.rank_env(host, world_size=2, master_port=29500),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                )
            )
    return procs


def _logs(paths: list[Path]) -> str:
    return "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}" for p in paths if p.exists())


_HALF_SUMS_ACROSS_NAMESPACES = """
import datetime, json, sys
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed as dist
from autocomp.probe_runner import ProbeRunner
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
readings = []
for _ in range(3):
    # A 30 ms forward with the opening's ratio: the probe stops at 64-256 KB on this link.
    probe = ProbeRunner().opening(5_600_000, 0.03, torch.device("cpu"), None, opening_ratio=5.0)
    readings.append([probe.payload_bytes, *probe.half_sum_seconds_per_element])
print("result " + json.dumps(readings), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.shaped
@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"ShapedLink unavailable: {_UNAVAILABLE}")
def test_sum_of_halves_reads_no_token_bucket_at_1_gbit(tmp_path: Path) -> None:
    """At 1 Gbit/s a half's bytes take 16 ns an element and gloo's CPU sum adds about 1 ns,
    under the 20% that counts, so the opening reads 0 or a few ns. Timed at the opening
    probe's 16K elements, with one pass per type, it read 10-210 ns (2026-11-27), and the
    policy priced fp16 above sending nothing on the GPT LM."""
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=FAST_MBIT)) as link:
        procs = _launch_pair(
            link, [sys.executable, "-c", _HALF_SUMS_ACROSS_NAMESPACES, str(ROOT)], logs
        )
        for proc in procs:
            proc.wait(timeout=90)
    assert [p.returncode for p in procs] == [0, 0], _logs(logs)
    results = [
        json.loads(line.removeprefix("result "))
        for path in logs
        for line in path.read_text().splitlines()
        if line.startswith("result ")
    ]
    assert len(results) == 2 and results[0] == results[1], results  # agreed on every rank
    for _payload, float16, bfloat16 in results[0]:
        assert 0.0 <= float16 < 8e-9 and 0.0 <= bfloat16 < 8e-9, results[0]
