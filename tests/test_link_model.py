"""Tier 1: pure unit, no processes.

:mod:`autocomp.link_model`: the ring-collective byte and hop formulas; the bandwidth meter
recovering alpha and beta from noisy synthetic service times with 10% outliers, adopting an
abrupt rate drop (125 MB/s -> 6.25 MB/s) within one window while smoothing small changes,
falling back to a ratio estimate when sizes are all alike, and round-tripping its state; the NIC
counters (:mod:`autocomp.nic_counters`) resolving ``lo`` and measuring a real loopback transfer
made by the test itself (a TCP connection on 127.0.0.1 inside this process: nothing leaves the
host). The active probe (:mod:`autocomp.link_probe`): its size and frequency against the budget
and headroom, the confirming probe after a switch (skipped where the last probe's reading vouches
for the switch's rate), and the meter fitting probe samples when its own periods are blind, so a
link that got faster is adopted in one window.
"""

from __future__ import annotations

import json
import logging
import socket
import threading

import numpy as np
import pytest

from autocomp.compressors import Collective
from autocomp.link_model import BandwidthMeter, LinkEstimate, latency_hops, link_bytes
from autocomp.link_probe import BOUNDARY_PROBE_PASSES, LinkProbe
from autocomp.nic_counters import (
    NicCounters,
    NicSample,
    local_address_for,
    rate_between,
    resolve_interface,
)

AR, AG = Collective.ALL_REDUCE, Collective.ALL_GATHER


# ---- formulas ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64])
def test_link_bytes_and_hops(n: int) -> None:
    b = 1_000_000
    assert link_bytes(AR, b, n) == pytest.approx(2 * (n - 1) / n * b)
    assert link_bytes(AG, b, n) == (n - 1) * b
    assert latency_hops(AR, n) == 2 * (n - 1)
    assert latency_hops(AG, n) == n - 1


def test_single_rank_moves_nothing() -> None:
    for collective in Collective:
        assert link_bytes(collective, 123, 1) == 0
        assert latency_hops(collective, 1) == 0
    estimate = LinkEstimate(1e-4, 1e6, 10, 0.01)
    assert estimate.seconds(AR, 10**6, 1) == 0


def test_estimate_seconds_and_dict_round_trip() -> None:
    estimate = LinkEstimate(
        latency_s=50e-6, bandwidth_bytes_per_s=125e6, samples=7, rel_residual=0.1
    )
    expected = 2 * 50e-6 + 1e6 / 125e6  # N=2 all-reduce: 2 hops, 2*(1/2)*1 MB on the link
    assert estimate.seconds(AR, 1_000_000, 2) == pytest.approx(expected)
    assert LinkEstimate.from_dict(json.loads(json.dumps(estimate.to_dict()))) == estimate
    with pytest.raises(ValueError):
        LinkEstimate.from_dict({"latency_s": 1.0})
    with pytest.raises(ValueError):
        LinkEstimate(latency_s=0.0, bandwidth_bytes_per_s=0.0, samples=0, rel_residual=0.0)


# ---- the meter ---------------------------------------------------------------------------------


def feed(
    meter: BandwidthMeter,
    rng: np.random.Generator,
    *,
    latency: float,
    bandwidth: float,
    count: int = 64,
    outliers: float = 0.0,
    world: int = 4,
    log10_bytes: tuple[float, float] = (3.0, 7.0),
    noise: float = 0.05,
) -> None:
    """Synthetic service times of a mix of all-reduces and all-gathers."""
    for i in range(count):
        collective = AG if i % 3 == 0 else AR
        payload = int(10 ** rng.uniform(*log10_bytes))
        seconds = latency_hops(collective, world) * latency
        seconds += link_bytes(collective, payload, world) / bandwidth
        seconds *= rng.lognormal(0.0, noise)
        if rng.random() < outliers:
            seconds *= rng.uniform(2.0, 10.0)  # queued behind something, preempted, ...
        meter.add(collective, payload, world, seconds)


def test_meter_recovers_alpha_and_beta_despite_outliers() -> None:
    rng = np.random.default_rng(1)
    meter = BandwidthMeter()
    feed(meter, rng, latency=80e-6, bandwidth=125e6, count=200, outliers=0.1)
    estimate = meter.end_window()
    assert estimate is not None
    assert estimate.bandwidth_bytes_per_s == pytest.approx(125e6, rel=0.10)
    assert estimate.latency_s == pytest.approx(80e-6, rel=0.10)
    assert estimate.samples == 200
    assert estimate.rel_residual < 0.1


def test_meter_without_robustness_would_be_fooled() -> None:
    """The same data through plain least squares misses by more: the robust fit matters."""
    rng = np.random.default_rng(1)
    sizes, times, hops = [], [], []
    for i in range(200):
        collective = AG if i % 3 == 0 else AR
        payload = int(10 ** rng.uniform(3, 7))
        t = latency_hops(collective, 4) * 80e-6 + link_bytes(collective, payload, 4) / 125e6
        t *= rng.lognormal(0, 0.05)
        if rng.random() < 0.1:
            t *= rng.uniform(2.0, 10.0)
        sizes.append(link_bytes(collective, payload, 4))
        times.append(t)
        hops.append(latency_hops(collective, 4))
    coef, *_ = np.linalg.lstsq(np.column_stack([hops, sizes]), np.array(times), rcond=None)
    assert abs(1 / coef[1] / 125e6 - 1) > 0.2


def test_abrupt_rate_change_adopted_within_one_window(caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(2)
    meter = BandwidthMeter()
    for _ in range(3):
        feed(meter, rng, latency=50e-6, bandwidth=125e6, outliers=0.1)
        meter.end_window()
    assert meter.estimate is not None and not meter.rate_changed
    feed(meter, rng, latency=50e-6, bandwidth=6.25e6, outliers=0.1)
    with caplog.at_level(logging.DEBUG, logger="autocomp.link_model"):
        estimate = meter.end_window()
    assert estimate is not None
    assert estimate.bandwidth_bytes_per_s == pytest.approx(6.25e6, rel=0.10)
    assert meter.rate_changed
    assert estimate.samples == 64  # the old windows no longer count
    assert any("rate change" in r.getMessage() for r in caplog.records)
    # and back up again, just as fast
    feed(meter, rng, latency=50e-6, bandwidth=125e6, outliers=0.1)
    assert meter.end_window().bandwidth_bytes_per_s == pytest.approx(125e6, rel=0.10)


def test_small_changes_are_smoothed() -> None:
    rng = np.random.default_rng(3)
    config = BandwidthMeter.Config(ewma_weight=0.3)
    meter = BandwidthMeter(config)
    feed(meter, rng, latency=50e-6, bandwidth=100e6, noise=0.01)
    first = meter.end_window()
    feed(meter, rng, latency=50e-6, bandwidth=150e6, noise=0.01)  # x1.5 < change_factor 2
    blended = meter.end_window()
    window = meter.last_window
    assert first is not None and blended is not None and window is not None
    assert not meter.rate_changed
    assert window.bandwidth_bytes_per_s == pytest.approx(150e6, rel=0.05)
    # EWMA of seconds per byte: 0.7 / first + 0.3 / window
    expected = 1 / (0.7 / first.bandwidth_bytes_per_s + 0.3 / window.bandwidth_bytes_per_s)
    assert blended.bandwidth_bytes_per_s == pytest.approx(expected)
    assert first.bandwidth_bytes_per_s < blended.bandwidth_bytes_per_s < 150e6
    assert blended.samples == first.samples + window.samples


def test_similar_sizes_fall_back_to_ratio_with_prior_latency() -> None:
    rng = np.random.default_rng(4)
    meter = BandwidthMeter(BandwidthMeter.Config(prior_latency_s=50e-6))
    feed(meter, rng, latency=50e-6, bandwidth=40e6, log10_bytes=(6.0, 6.1), world=2)
    estimate = meter.end_window()
    assert estimate is not None
    assert estimate.latency_s == pytest.approx(50e-6)  # from the prior: not identifiable here
    assert estimate.bandwidth_bytes_per_s == pytest.approx(40e6, rel=0.05)


def test_small_window_stays_open() -> None:
    rng = np.random.default_rng(5)
    meter = BandwidthMeter(BandwidthMeter.Config(min_samples=8))
    feed(meter, rng, latency=50e-6, bandwidth=125e6, count=5)
    assert meter.end_window() is None and meter.pending == 5
    feed(meter, rng, latency=50e-6, bandwidth=125e6, count=5)
    assert meter.end_window() is not None and meter.pending == 0
    meter.add(AR, 1000, 1, 0.1)  # one rank: nothing to learn
    meter.add(AR, 1000, 2, 0.0)  # no time: ignored
    assert meter.pending == 0
    assert meter.ignored == 2


def test_state_dict_round_trip_and_reset() -> None:
    rng = np.random.default_rng(6)
    meter = BandwidthMeter()
    feed(meter, rng, latency=50e-6, bandwidth=125e6)
    meter.end_window()
    feed(meter, rng, latency=50e-6, bandwidth=125e6, count=5)  # an open window too
    state = json.loads(json.dumps(meter.state_dict()))
    clone = BandwidthMeter()
    clone.load_state_dict(state)
    assert clone.estimate == meter.estimate and clone.pending == 5
    feed(meter, np.random.default_rng(7), latency=50e-6, bandwidth=90e6)
    feed(clone, np.random.default_rng(7), latency=50e-6, bandwidth=90e6)
    assert clone.end_window() == meter.end_window()
    with pytest.raises(ValueError, match="version"):
        clone.load_state_dict({**state, "version": 99})
    clone.reset()
    assert clone.estimate is None and clone.pending == 0


# ---- NIC counters ------------------------------------------------------------------------------


def test_resolve_interface_from_environment() -> None:
    assert resolve_interface({"GLOO_SOCKET_IFNAME": "lo"}) == "lo"
    assert resolve_interface({"NCCL_SOCKET_IFNAME": "lo,eth0"}) == "lo"
    assert resolve_interface({"NCCL_SOCKET_IFNAME": "=lo"}) == "lo"
    assert resolve_interface({"MASTER_ADDR": "127.0.0.1"}) == "lo"
    assert resolve_interface({"MASTER_ADDR": "localhost"}) == "lo"
    assert resolve_interface({"NCCL_SOCKET_IFNAME": "^docker"}) is None  # exclusion list
    assert resolve_interface({"MASTER_ADDR": "some-host-name"}) is None  # no DNS lookups
    assert resolve_interface({}) is None
    assert local_address_for("127.0.0.1") == "127.0.0.1"


def _loopback_transfer(total: int) -> None:
    """Send ``total`` bytes over a TCP connection on 127.0.0.1 and receive them all."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        received = 0

        def drain() -> None:
            nonlocal received
            connection, _ = server.accept()
            with connection:
                while chunk := connection.recv(1 << 16):
                    received += len(chunk)

        thread = threading.Thread(target=drain)
        thread.start()
        with socket.create_connection(server.getsockname()) as client:
            client.sendall(b"\0" * total)
        thread.join(timeout=10)
        assert received == total


def test_nic_counters_measure_loopback_transfer() -> None:
    counters = NicCounters(environ={"GLOO_SOCKET_IFNAME": "lo"})
    assert counters.interface == "lo"
    before = counters.sample()
    assert before is not None
    total = 4 << 20
    _loopback_transfer(total)
    after = counters.sample()
    assert after is not None
    assert after.bytes_sent - before.bytes_sent >= total
    assert after.bytes_recv - before.bytes_recv >= total
    rate = counters.rate_since(before)
    assert rate is not None and rate > 0
    assert rate_between(before, after, "max") == pytest.approx(
        max(after.bytes_sent - before.bytes_sent, after.bytes_recv - before.bytes_recv)
        / (after.time_s - before.time_s)
    )


def test_nic_counters_missing_interface(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="autocomp.nic_counters"):
        counters = NicCounters("no-such-nic0")
        assert counters.interface is None
        assert counters.sample() is None
        assert counters.rate_since(NicSample("lo", 0, 0, 0.0)) is None
    assert len(caplog.records) == 1


def test_rate_between_rejects_nonsense() -> None:
    a = NicSample("lo", 100, 100, 1.0)
    assert rate_between(a, a) is None  # no time passed
    assert rate_between(a, NicSample("lo", 50, 100, 2.0)) is None  # counter reset
    assert rate_between(a, NicSample("eth0", 200, 100, 2.0)) is None  # other interface
    assert rate_between(a, NicSample("lo", 300, 100, 3.0)) == 100.0


def test_rate_drop_inside_a_window_is_seen_at_its_end() -> None:
    """A drop in the middle of a window must not hide behind the window's fast early samples."""
    meter = BandwidthMeter(BandwidthMeter.Config(min_samples=4))
    for seconds in (0.53, 0.54, 0.53, 0.55, 0.53):  # 66 MB per step at ~1 Gbit/s
        meter.add_period(2, 66e6, seconds)
    before = meter.end_window()
    assert before is not None and before.bandwidth_bytes_per_s == pytest.approx(125e6, rel=0.1)
    for seconds in (0.54, 0.53, 10.6, 10.7, 10.6):  # the link drops to 50 Mbit/s mid-window
        meter.add_period(2, 66e6, seconds)
    after = meter.end_window()
    assert after is not None and after.bandwidth_bytes_per_s == pytest.approx(6.25e6, rel=0.1)
    assert meter.rate_changed


def test_small_transfers_do_not_move_the_bandwidth_estimate() -> None:
    """Latency-dominated periods (a compressed plan) must not read as a slow link."""
    meter = BandwidthMeter(BandwidthMeter.Config(min_samples=4))
    for _ in range(5):
        meter.add_period(2, 66e6, 0.053)  # ~10 Gbit/s
    fast = meter.end_window()
    assert fast is not None
    for _ in range(5):
        meter.add_period(2, 20e3, 0.004)  # 20 kB in 4 ms: overhead, not bandwidth
    assert meter.end_window() == fast


# ---- the active probe --------------------------------------------------------------------------

SLOW_50MBIT = LinkEstimate(
    latency_s=100e-6, bandwidth_bytes_per_s=50e6 / 8, samples=8, rel_residual=0
)


def _next_window(probe: LinkProbe, blind: bool) -> int:
    """``probe.next_window`` for a 1 s window at ``SLOW_50MBIT`` on 2 ranks."""
    return probe.next_window(blind=blind, estimate=SLOW_50MBIT, world_size=2, window_seconds=1.0)


def test_probe_fills_the_budget_when_that_is_informative() -> None:
    probe = LinkProbe(LinkProbe.Config(budget=0.01, headroom=20.0, min_seconds=4e-3))
    # A 60 s window: 1% of it pays four passes each above the informative size.
    plan = probe.size(SLOW_50MBIT, world_size=2, window_seconds=60.0)
    assert plan is not None and plan.every_windows == 1
    assert plan.seconds == pytest.approx(0.01 * 60.0, rel=1e-4)  # all of the budget, no more
    assert plan.payload_bytes % 4 == 0
    # At 20x the estimate the timed pass is still >= min_seconds of transfer.
    assert plan.payload_bytes / (20 * SLOW_50MBIT.bandwidth_bytes_per_s) >= 4e-3
    # Bigger groups: an all-reduce sends 2(N-1)/N per payload byte, so the payload shrinks.
    wide = probe.size(SLOW_50MBIT, world_size=8, window_seconds=60.0)
    assert wide is not None and wide.payload_bytes < plan.payload_bytes
    assert wide.seconds == pytest.approx(0.6, rel=1e-3)


def test_probe_runs_less_often_rather_than_smaller_when_the_budget_is_short() -> None:
    probe = LinkProbe(LinkProbe.Config(budget=0.01, headroom=20.0, min_seconds=4e-3))
    plan = probe.size(SLOW_50MBIT, world_size=2, window_seconds=1.0)
    assert plan is not None
    informative = 4e-3 * 20 * SLOW_50MBIT.bandwidth_bytes_per_s  # N=2: 1 link byte per byte
    assert plan.payload_bytes == pytest.approx(informative, abs=4)
    expected = BOUNDARY_PROBE_PASSES * (
        2 * 100e-6 + plan.payload_bytes / SLOW_50MBIT.bandwidth_bytes_per_s
    )
    assert plan.seconds == pytest.approx(expected)
    # Average cost within the budget, and not rarer than needed.
    allowed = 0.01 * 1.0
    assert plan.seconds / plan.every_windows <= allowed
    assert plan.seconds / (plan.every_windows - 1) > allowed
    # A long latency raises the floor: the transfer must stand 4 latency terms clear.
    laggy = LinkEstimate(latency_s=5e-3, bandwidth_bytes_per_s=50e6 / 8, samples=8, rel_residual=0)
    far = probe.size(laggy, world_size=2, window_seconds=1.0)
    assert far is not None
    assert far.payload_bytes / (20 * laggy.bandwidth_bytes_per_s) >= 4 * 2 * 5e-3 * 0.999
    # The payload cap wins over informativeness; no group, no window time: no probe.
    capped = LinkProbe(LinkProbe.Config(max_bytes=1 << 16)).size(SLOW_50MBIT, 2, 1.0)
    assert capped is not None and capped.payload_bytes == 1 << 16
    assert probe.size(SLOW_50MBIT, world_size=1, window_seconds=1.0) is None
    assert probe.size(SLOW_50MBIT, world_size=2, window_seconds=0.0) is None


def test_probe_schedule_follows_blindness() -> None:
    probe = LinkProbe(LinkProbe.Config(budget=0.01))
    every = probe.size(SLOW_50MBIT, 2, 1.0)
    assert every is not None and every.every_windows > 2

    def step(blind: bool, estimate: LinkEstimate | None = SLOW_50MBIT, seconds: float = 1.0) -> int:
        return probe.next_window(
            blind=blind, estimate=estimate, world_size=2, window_seconds=seconds
        )

    assert step(blind=False) == 0  # informative traffic: never a probe
    fired = [step(blind=True) for _ in range(3 * every.every_windows)]
    assert [i for i, b in enumerate(fired) if b] == [
        every.every_windows - 1,
        2 * every.every_windows - 1,
        3 * every.every_windows - 1,
    ]
    assert set(fired) == {0, every.payload_bytes}
    # An informative window resets the count; a budget that buys it runs one every window.
    step(blind=True)
    assert step(blind=False) == 0 and step(blind=True) == 0
    assert all(step(blind=True, seconds=100.0) > 0 for _ in range(3))
    assert step(blind=True, estimate=None) == 0  # nothing to size it by
    off = LinkProbe(LinkProbe.Config(budget=0.0))
    assert off.next_window(blind=True, estimate=SLOW_50MBIT, world_size=2, window_seconds=1e3) == 0
    state = probe.state_dict()
    clone = LinkProbe(probe.config)
    clone.load_state_dict(state)
    assert clone.state_dict() == state
    with pytest.raises(ValueError, match="budget"):
        LinkProbe.Config(budget=-1.0)
    with pytest.raises(ValueError, match="headroom"):
        LinkProbe.Config(headroom=0.5)


def test_the_rationed_probe_counts_blind_seconds_not_windows() -> None:
    """Windows differ in length (a settled plan's stretch, the looks, a payoff baseline): the
    probe runs once ``budget`` of the blind time since the last one pays for it. Counted as
    windows against the last window's length, a stretched window after short ones brought
    the probe forward (the digits ResNet at 100 Mbit/s: 12 blind windows, 17 s, 1.9% instead
    of 1%)."""
    probe = LinkProbe(LinkProbe.Config(budget=0.01))
    short = probe.size(SLOW_50MBIT, 2, 1.0)
    long = probe.size(SLOW_50MBIT, 2, 3.0)
    assert short is not None and long is not None
    assert short.seconds == long.seconds  # informative size: the budget buys it less often
    due = short.seconds / 0.01  # seconds of blind windows that pay for one probe

    def step(seconds: float) -> int:
        return probe.next_window(
            blind=True, estimate=SLOW_50MBIT, world_size=2, window_seconds=seconds
        )

    # Ten windows of 1 s, then windows of 3 s: the probe comes once the blind time reaches
    # ``due``, not at the count the last window's length would give.
    lengths = [1.0] * 10 + [3.0] * 20
    fired = [step(seconds) for seconds in lengths]
    first = fired.index(short.payload_bytes)
    elapsed = sum(lengths[: first + 1])
    assert elapsed >= due * (1 - 1e-9) and elapsed - lengths[first] < due
    assert first + 1 > long.every_windows  # the old count would have fired here or earlier
    # Non-finite window times add nothing; the state round-trips.
    assert step(float("nan")) == 0
    clone = LinkProbe(probe.config)
    clone.load_state_dict(probe.state_dict())
    assert clone.state_dict() == probe.state_dict()
    # An old checkpoint's window count starts the schedule again.
    clone.load_state_dict({"blind_windows": 7, "unconfirmed": 0, "probed": 1})
    assert clone.state_dict()["blind_seconds"] == 0.0


def test_a_switch_is_probed_at_its_first_blind_window_once() -> None:
    probe = LinkProbe(LinkProbe.Config(budget=0.01))
    every = probe.size(SLOW_50MBIT, 2, 1.0)
    assert every is not None and every.every_windows > 3

    def step(blind: bool, warming: bool = False) -> int:
        return probe.next_window(
            blind=blind, estimate=SLOW_50MBIT, world_size=2, window_seconds=1.0, warming=warming
        )

    # Rationed: nothing until the schedule's count. A switch: its first blind window at once,
    # then the schedule again from zero.
    assert [step(blind=True) for _ in range(every.every_windows - 1)] == [0] * (
        every.every_windows - 1
    )
    probe.plan_changed()
    assert step(blind=True) == every.payload_bytes
    assert [step(blind=True) for _ in range(every.every_windows - 1)] == [0] * (
        every.every_windows - 1
    )
    assert step(blind=True) == every.payload_bytes
    # A switch whose first window measures the link needs no probe, nor does a later one.
    probe.plan_changed()
    assert step(blind=False) == 0 and step(blind=True) == 0
    # In the warm-up only the confirming probe runs.
    probe.plan_changed()
    assert step(blind=True, warming=True) == every.payload_bytes
    assert all(step(blind=True, warming=True) == 0 for _ in range(3 * every.every_windows))
    # A window the meter left open for more samples (its ``blind`` is the last closed one's)
    # keeps the confirmation pending until one is closed. (The traffic reads the link first:
    # a switch while the link is still out of view since the probe above is not confirmed.)
    assert step(blind=False) == 0
    probe.plan_changed()
    assert (
        probe.next_window(
            blind=False, estimate=SLOW_50MBIT, world_size=2, window_seconds=1.0, measured=False
        )
        == 0
    )
    assert step(blind=True) == every.payload_bytes
    meter = BandwidthMeter(BandwidthMeter.Config(min_samples=4))
    meter.add_period(2, 4e6, 0.64)
    meter.end_window()
    assert meter.windows_closed == 0  # one sample of four: the window stays open
    for _ in range(3):
        meter.add_period(2, 4e6, 0.64)
    meter.end_window()
    assert meter.windows_closed == 1
    # The pending confirmation survives a checkpoint; a budget of 0 turns it off too.
    assert step(blind=False) == 0
    probe.plan_changed()
    clone = LinkProbe(probe.config)
    clone.load_state_dict(probe.state_dict())
    assert _next_window(clone, blind=True) == every.payload_bytes
    off = LinkProbe(LinkProbe.Config(budget=0.0))
    off.plan_changed()
    assert off.next_window(blind=True, estimate=SLOW_50MBIT, world_size=2, window_seconds=1.0) == 0


def test_a_switch_after_a_probe_of_the_blind_link_is_not_probed_again() -> None:
    """The first switch that takes the link out of view rests on the traffic's reading and is
    confirmed; the switches after it, while the link stays out of view, rest on that probe's
    reading, so only the rationed schedule probes again, until the traffic reads the link."""
    probe = LinkProbe(LinkProbe.Config(budget=0.01))
    every = probe.size(SLOW_50MBIT, 2, 1.0)
    assert every is not None and every.every_windows > 3

    def step(blind: bool) -> int:
        return _next_window(probe, blind)

    assert step(blind=False) == 0
    probe.plan_changed()  # compressed on the traffic's reading: confirmed
    assert step(blind=True) == every.payload_bytes
    probe.plan_changed()  # a move between compressed options, the link still out of view
    assert [step(blind=True) for _ in range(every.every_windows - 1)] == [0] * (
        every.every_windows - 1
    )
    assert step(blind=True) == every.payload_bytes  # the rationed schedule still runs
    # Across a checkpoint too.
    clone = LinkProbe(probe.config)
    clone.load_state_dict(probe.state_dict())
    clone.plan_changed()
    assert _next_window(clone, blind=True) == 0
    # Once the traffic reads the link again, a switch is confirmed again.
    assert step(blind=False) == 0
    probe.plan_changed()
    assert step(blind=True) == every.payload_bytes


def test_a_switch_priced_at_a_probes_reading_is_not_probed_again() -> None:
    """The opening's probe reads the link before the first switch; a switch priced at about
    that rate rests on it, so its first blind window is not probed (on the GPT LM at
    50 Mbit/s that confirmation cost 0.6-1.5 s of a 30 s run, every pass sized by the
    per-call latency). A switch priced well below the reading (an early step's one-off costs
    read as a slow link) is still confirmed, as is one with no reading to go by."""
    rate = SLOW_50MBIT.bandwidth_bytes_per_s
    probe = LinkProbe(LinkProbe.Config(budget=0.01))
    every = probe.size(SLOW_50MBIT, 2, 1.0)
    assert every is not None and every.every_windows > 3

    def step(blind: bool) -> int:
        return _next_window(probe, blind)

    probe.plan_changed(rate)  # no probe has read the link yet: confirmed
    assert step(blind=True) == every.payload_bytes
    assert step(blind=False) == 0  # the traffic reads the link again
    probe.note_reading(rate * 0.97)  # the probe's reading includes its latency
    for priced in (rate, rate * 4, rate * 0.97 / 1.2):
        probe.plan_changed(priced)
        assert step(blind=True) == 0, priced
        assert step(blind=False) == 0
    # Too far below the reading, or priced at no measured rate: the first blind window probes.
    for priced in (rate * 0.97 / 1.3, None):
        probe.plan_changed(priced)
        assert step(blind=True) == every.payload_bytes, priced
        assert step(blind=False) == 0
    # The reading survives a checkpoint (and an old checkpoint has none).
    clone = LinkProbe(probe.config)
    clone.load_state_dict(probe.state_dict())
    clone.plan_changed(rate)
    assert _next_window(clone, blind=True) == 0
    clone.load_state_dict({"blind_seconds": 0.0, "unconfirmed": 0, "probed": 0})
    clone.plan_changed(rate)
    assert _next_window(clone, blind=True) == every.payload_bytes
    # A later probe's reading replaces the opening's: one that read a faster link no longer
    # vouches for the old rate.
    probe.note_reading(rate * 3)
    probe.plan_changed(rate)
    assert step(blind=True) == every.payload_bytes
    with pytest.raises(ValueError, match="vouched_within"):
        LinkProbe.Config(vouched_within=0.5)


def _compressed_window(meter: BandwidthMeter, steps: int = 6) -> None:
    for _ in range(steps):
        meter.add_period(2, 20e3, 0.004)  # 20 kB in 4 ms: latency and overhead, not bandwidth


def test_probe_reveals_a_faster_link_while_steps_are_blind() -> None:
    meter = BandwidthMeter(BandwidthMeter.Config(min_samples=4))
    for _ in range(5):
        meter.add_period(2, 4e6, 4e6 / 6.25e6)  # uncompressed warm-up at 50 Mbit/s
    slow = meter.end_window()
    assert slow is not None and slow.bandwidth_bytes_per_s == pytest.approx(6.25e6, rel=0.05)
    assert not meter.blind
    _compressed_window(meter)
    assert meter.end_window() == slow and meter.blind  # compressed: the estimate is stuck
    # The link rises to 1000 Mbit/s; the probe's timed pass (500 kB) sees it.
    _compressed_window(meter)
    meter.add_probe(2, 500e3, 2 * 50e-6 + 500e3 / 125e6)
    fast = meter.end_window()
    assert fast is not None and fast.bandwidth_bytes_per_s == pytest.approx(125e6, rel=0.05)
    assert meter.rate_changed and meter.blind  # adopted at once, and still blind by itself
    assert fast.samples == 1
    # A probe agreeing with the estimate is blended like any window.
    _compressed_window(meter)
    meter.add_probe(2, 500e3, 2 * 50e-6 + 500e3 / 110e6)
    blended = meter.end_window()
    assert blended is not None and not meter.rate_changed
    assert 110e6 < blended.bandwidth_bytes_per_s < fast.bandwidth_bytes_per_s
    # Back to a slow link: the probe says so too (no one-sided trust in fast readings).
    _compressed_window(meter)
    meter.add_probe(2, 500e3, 2 * 50e-6 + 500e3 / 6.25e6)
    assert meter.end_window().bandwidth_bytes_per_s == pytest.approx(6.25e6, rel=0.05)
    assert meter.rate_changed


def test_probe_alone_closes_a_short_window_and_joins_an_informative_one() -> None:
    meter = BandwidthMeter(BandwidthMeter.Config(min_samples=8))
    meter.add_period(2, 20e3, 0.004)
    meter.add_probe(2, 1e6, 2 * 50e-6 + 1e6 / 100e6)  # fewer than min_samples, but a probe
    estimate = meter.end_window()
    assert estimate is not None and estimate.bandwidth_bytes_per_s == pytest.approx(100e6, rel=0.05)
    assert meter.pending == 0
    # In an informative window the probe is one more sample, not a replacement.
    for _ in range(8):
        meter.add_period(2, 8e6, 8e6 / 100e6 + 1e-4)
    meter.add_probe(2, 1e6, 0.5)  # a probe that queued behind something: an outlier
    after = meter.end_window()
    assert after is not None and not meter.blind
    assert after.bandwidth_bytes_per_s == pytest.approx(100e6, rel=0.05)
    meter.add_probe(2, 1e6, 0.0)  # no time: ignored like any sample
    assert meter.pending == 0 and meter.ignored == 1


def test_probe_samples_survive_a_state_dict_round_trip() -> None:
    meter = BandwidthMeter(BandwidthMeter.Config(min_samples=4))
    _compressed_window(meter, steps=2)
    meter.add_probe(2, 1e6, 0.01)
    state = json.loads(json.dumps(meter.state_dict()))
    clone = BandwidthMeter(BandwidthMeter.Config(min_samples=4))
    clone.load_state_dict(state)
    assert clone.end_window() == meter.end_window()
    assert clone.blind == meter.blind
    old = {**state, "window": [[2, 20e3, 0.004]] * 4}  # saved before probes existed
    old.pop("blind")
    clone.load_state_dict(old)
    assert clone.pending == 4 and not clone.blind


def test_a_bandwidth_move_is_a_ratio_either_way() -> None:
    """One definition of "the link moved" for the dwell, the payoff check and the idle link:
    a ratio of ``ratio`` or more, up or down (exactly the ratio counts)."""
    from autocomp.link_model import bandwidth_moved

    assert bandwidth_moved(100.0, 200.0, 2.0) and bandwidth_moved(200.0, 100.0, 2.0)
    assert not bandwidth_moved(100.0, 199.0, 2.0) and not bandwidth_moved(199.0, 100.0, 2.0)
    assert bandwidth_moved(0.0, 1.0, 2.0)  # a zero reading is a move, not a division error
