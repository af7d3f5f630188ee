"""Tier 1: pure unit, no processes.

The one exposure model (``autocomp.exposure``): the event-by-event simulation equals the closed
form when no group has a second round (random timelines), hand-made timelines give the
documented numbers, PowerSGD's first round stalls the next bucket's hook call only when the
link is behind, the last bucket's final-round work and decode wait for a link that is behind
(and cost nothing extra on an idle one), transfers beside the backward stretch it by the
contention (and nothing once it has ended), the resumable replay the plan search prices its
moves with gives exactly :func:`simulate`'s floats, and the measured counterparts (exposed
time, overlap, compute-only step) follow the same definitions.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autocomp.exposure import (
    Group,
    PrefixReplay,
    added_seconds,
    compute_seconds,
    measured_exposed,
    overlap,
    simulate,
)

_seconds = st.floats(min_value=0.0, max_value=2.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_seconds, _seconds, _seconds), min_size=1, max_size=8))
def test_simulation_equals_the_closed_form_without_second_rounds(
    raw: list[tuple[float, float, float]],
) -> None:
    hideable = sorted((h for h, _, _ in raw), reverse=True)
    hideable[-1] = 0.0
    groups = [Group(h, c, w) for h, (_, c, w) in zip(hideable, raw, strict=True)]
    timeline = simulate(groups)
    assert timeline.added_s == pytest.approx(added_seconds(groups), abs=1e-9)
    assert timeline.added_s == pytest.approx(timeline.work_s + timeline.exposed_s)
    assert timeline.work_s >= 0 and timeline.exposed_s >= 0 and timeline.stall_s == 0


@st.composite
def _group_loads(draw: st.DrawFn) -> tuple[float, float, float, float, float, float]:
    """(comm, work, first round, second round, final work, decode), consistent."""
    comm, work = draw(_seconds), draw(_seconds)
    first = draw(st.sampled_from([0.0, 0.25, 0.5])) * comm
    second = draw(st.sampled_from([0.0, 0.25, 0.5])) * comm
    final_work = draw(st.sampled_from([0.0, 0.5])) * work
    decode = draw(st.sampled_from([0.0, 0.5])) * work
    return comm, work, first, second, final_work, decode


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_seconds, _group_loads()), min_size=1, max_size=8),
    st.sampled_from([0.0, 0.2, 0.6]),
    st.booleans(),
    st.data(),
)
def test_a_prefix_replay_gives_simulates_floats_for_every_changed_group(
    raw: list[tuple[float, tuple[float, ...]]],
    contention: float,
    stand_in_last: bool,
    data: st.DataObject,
) -> None:
    # The plan search prices a move by replaying from the moved group on: the result must be
    # the very float simulate() gives on the changed list, or plans would depend on the path.
    hideable = sorted((h for h, _ in raw), reverse=True)
    if not stand_in_last:
        hideable[-1] = 0.0
    groups = [Group(h, *load) for h, (_, load) in zip(hideable, raw, strict=True)]
    replay = PrefixReplay(groups, contention)
    assert replay.timeline == simulate(groups, contention)
    for _ in range(3):
        index = data.draw(st.integers(0, len(groups) - 1))
        changed = Group(groups[index].hideable_s, *data.draw(_group_loads()))
        expected = simulate([*groups[:index], changed, *groups[index + 1 :]], contention)
        assert replay.trial(index, changed) == expected
        replay = replay.replaced(index, changed)
        groups[index] = changed
        assert replay.timeline == expected
        assert replay.trial(index, changed) == expected  # a resumed state is not consumed
    with pytest.raises(ValueError, match="keeps its place"):
        replay.trial(0, Group(groups[0].hideable_s + 1.0))


def test_hand_made_timeline() -> None:
    # Three groups ready at 0, 1, 2 s (hideable 2, 1, 0), 1.5 s of link each: back to back,
    # 0-1.5, 1.5-3, 3-4.5, while the backward ends at 2.
    timeline = simulate([Group(2.0, 1.5), Group(1.0, 1.5), Group(0.0, 1.5)])
    assert timeline.exposed_s == pytest.approx(2.5)
    assert timeline.overlap == pytest.approx(1 - 2.5 / 4.5)
    # Work delays the backward (same thread) and everything after it.
    worked = simulate([Group(1.0, 0.6, 0.2), Group(0.0, 0.6, 0.2)])
    assert (worked.work_s, worked.exposed_s, worked.added_s) == pytest.approx((0.4, 0.6, 1.0))
    with pytest.raises(ValueError, match="ready order"):
        simulate([Group(0.0, 1.0), Group(1.0, 1.0)])


def test_contention_stretches_the_backward_only_while_the_link_is_busy_beside_it() -> None:
    """Group 0 (ready 1 s before the end) sends 0.4 s; at a contention of 0.5 the backward
    loses 0.2 s while it runs (the link is idle after 0.4 s, so the stretch is not busy),
    group 1's hook call and the backward's end come 0.2 s late, and group 1's 0.3 s is
    exposed from there. Traffic after the backward costs nothing."""
    groups = [Group(1.0, 0.4), Group(0.0, 0.3)]
    quiet = simulate(groups)
    assert (quiet.exposed_s, quiet.contention_s, quiet.added_s) == pytest.approx((0.3, 0, 0.3))
    busy = simulate(groups, contention=0.5)
    assert busy.contention_s == pytest.approx(0.2, rel=1e-6)
    assert busy.exposed_s == pytest.approx(0.3)
    assert busy.added_s == pytest.approx(0.5, rel=1e-6)
    # The same bytes after the backward: exposed either way, no contention.
    late = simulate([Group(1.0, 0.0), Group(0.0, 0.7)], contention=0.5)
    assert (late.contention_s, late.added_s) == pytest.approx((0.0, 0.7))
    # A transfer outlasting the backward: the stretch is busy too, so 1 s of compute takes
    # 2 s at 0.5 (what the opening's probe reads: slowdown over the stretched compute).
    long = simulate([Group(1.0, 3.0), Group(0.0, 0.0)], contention=0.5)
    assert long.contention_s == pytest.approx(1.0, rel=1e-6)
    assert long.exposed_s == pytest.approx(3.0 - 2.0, rel=1e-6)
    assert long.added_s == pytest.approx(long.contention_s + long.exposed_s)
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="contention"):
            simulate(groups, contention=bad)


def test_first_round_ahead_of_bulk_traffic_does_not_stall() -> None:
    """Group 0 launches its small first round before its 60 ms of other traffic; group 1's
    hook call 100 ms later finds it done: no stall, only the last group's rounds are exposed."""
    groups = [
        Group(0.1, comm_s=0.062, first_round_s=0.001, second_round_s=0.001),
        Group(0.0, comm_s=0.002, first_round_s=0.001, second_round_s=0.001),
    ]
    timeline = simulate(groups)
    assert timeline.stall_s == 0.0
    assert timeline.exposed_s == pytest.approx(0.003)  # Q_0, P_1, Q_1 after the backward


def test_a_first_round_behind_a_backlog_stalls_the_next_hook_call() -> None:
    """Group 0's bulk traffic (200 ms) queues ahead of group 1's first round; group 2's hook
    call must wait for it: the backward stands still, and the stall counts as exposed."""
    groups = [
        Group(0.2, comm_s=0.2),
        Group(0.1, comm_s=0.002, first_round_s=0.001, second_round_s=0.001),
        Group(0.0, comm_s=0.0),
    ]
    timeline = simulate(groups)
    # P_1 launched at 0.1 behind 0.2 s of traffic: done at 0.201; hook 2 due at 0.2.
    assert timeline.stall_s == pytest.approx(0.001)
    assert timeline.exposed_s >= timeline.stall_s
    assert timeline.added_s == pytest.approx(timeline.work_s + timeline.exposed_s)


def test_the_last_buckets_late_work_waits_for_a_link_that_is_behind() -> None:
    """Group 0 sends 20 ms (an fp16 layer) from the start; the backward ends 10 ms later and
    the last group encodes for 3.5 ms, then its one all-reduce (first round and plain parts,
    2 ms) queues behind group 0's until 22 ms. Only then can its final round be computed
    (3 ms) and sent (1 ms), and its decode (1.5 ms) follow: done at 27.5 ms. A model with
    all the work ahead of the launches hid that 4.5 ms behind the link (the MLP LM at
    200 Mbit/s measured 4.7 ms more exposed than it predicted)."""
    last = Group(
        0.0,
        comm_s=0.003,
        work_s=0.008,
        first_round_s=0.001,
        second_round_s=0.001,
        final_work_s=0.003,
        decode_s=0.0015,
    )
    behind = simulate([Group(0.01, comm_s=0.02), last])
    assert behind.added_s == pytest.approx(0.0275 - 0.01)
    assert behind.work_s == pytest.approx(0.008)
    assert behind.exposed_s == pytest.approx(0.0175 - 0.008)
    assert behind.stall_s == 0.0
    upfront = Group(0.0, comm_s=0.003, work_s=0.008, first_round_s=0.001, second_round_s=0.001)
    assert simulate([Group(0.01, comm_s=0.02), upfront]).added_s == pytest.approx(0.013)
    # On an idle link the same work is serial either way: work plus communication.
    idle = simulate([Group(0.01), last])
    assert idle.added_s == pytest.approx(0.008 + 0.003)
    assert simulate([Group(0.01), upfront]).added_s == pytest.approx(idle.added_s)
    # One group standing for a whole backward (hideable time left): its buckets' late work
    # overlaps that backward, as before the split.
    whole = Group(0.05, comm_s=0.003, work_s=0.008, final_work_s=0.003, decode_s=0.0015)
    assert simulate([whole]).added_s == pytest.approx(0.008)
    # An earlier group's final-round work delays its final round, whatever the last group
    # stands for: encoded by 1 ms, first round 1-2 ms, the next hook call at 100 ms computes
    # the final round (3 ms) and sends it (50 ms): done at 153 ms.
    early = Group(
        0.1,
        comm_s=0.051,
        work_s=0.004,
        first_round_s=0.001,
        second_round_s=0.05,
        final_work_s=0.003,
    )
    assert simulate([early, Group(0.001)]).added_s == pytest.approx(0.053)
    with pytest.raises(ValueError, match="parts of work_s"):
        Group(0.0, work_s=0.001, final_work_s=0.001, decode_s=0.001)


def test_measured_counterparts() -> None:
    assert measured_exposed(1.0, [0.8, 1.3, 1.1]) == pytest.approx(0.3)
    assert measured_exposed(1.0, [0.5], waited_s=0.2) == pytest.approx(0.2)
    assert measured_exposed(1.0, []) == 0.0
    assert overlap(0.0, 0.0) == 1.0
    assert overlap(0.5, 1.0, 1.0) == pytest.approx(0.75)
    assert overlap(3.0, 1.0) == 0.0  # clamped
    # The compute-only step: the step without what communication added, never below B.
    assert compute_seconds(1.0, 0.6, 0.1, 0.2) == pytest.approx(0.3)
    assert compute_seconds(1.0, 0.95, 0.1, 0.2) == pytest.approx(0.2)
