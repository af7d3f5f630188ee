"""The one exposure model: what gradient communication adds to a step, measured or predicted.

Used by the profiler (measured), the adaptive loop (its window records), the policy engine
(predicted, per plan) and the advisor's what-if model (predicted, per link and world size), so
the plan the engine optimizes is scored by the same arithmetic everywhere.

Definitions (docs/policy.md has the long form), for one step on one rank:

- the backward is split into *groups* of gradient buckets that become ready together, in the
  order DDP hands them to the comm hook; ``hideable_s`` of a group is the backward compute
  left once it is ready (0 for the last group);
- a group's ``comm_s`` is the service time of its collectives on the link (bandwidth term,
  latency, and the decode that follows them), ``work_s`` the compression work the hook does
  for it on the backward's thread (which delays everything after it);
- the link serves groups in ready order, one at a time, and a group's collectives in launch
  order (NCCL's one stream does; gloo runs them side by side, so the hook launches the last
  group's other collectives only once its first round is done:
  :func:`autocomp.hook.launch_bucket`).

Then, with groups indexed in ready order, ``W_{<=g}`` the work of groups up to g and
``C_{>=g}`` the communication of g and every group after it::

    added   = max over g of (W_{<=g} + C_{>=g} - hideable_g)     (>= the total work W)
    exposed = added - W          (communication still running when the backward ends)
    overlap = 1 - exposed / (C + W)                               (1 when C + W == 0)
    step    = compute-only step + added

(:func:`added_seconds`). Two-round compressors (PowerSGD) add a dependency the closed form
does not have: the hook launches group g's first round ahead of its other collectives, and
group g+1's hook call waits for it, computes g's final round from it and launches that round
with its own first one. When the link is behind, that wait stalls the backward. The last
group's hook call waits for its own first round and computes its final round after the wait,
and its decode comes after its last collective: that work sits on the step's tail, and a first
round queued behind earlier traffic delays it (the MLP LM at 200 Mbit/s: an fp16 layer's
500 kB ahead of the last bucket's PowerSGD rounds measured 4.7 ms more exposed than a model
that placed all the work before the launches predicted). ``final_work_s`` and ``decode_s``
of a group say which part of its work runs where (:meth:`Compressor.work_shares`).
A transfer is not free for the backward beside it either: on
CPU its sockets, copies and gloo's threads share the backward's cores (on 2 cores at 50 Mbit/s
a hidden 300 kB all-gather stretched the GPT LM's backward by ~20 ms). The opening measures
that contention (``probe_runner.ProbeRunner.contention``), and the replay stretches the backward
by it while the link is busy. :func:`simulate` replays all of it event by event and is what
the policy and the advisor use; it equals the closed form when no group has a second round,
the last group decodes nothing, and the contention is 0. :class:`PrefixReplay` is the same
replay kept resumable, for the plan search's moves, which change one group at a time.
The measured counterpart is :func:`measured_exposed` (the profiler's timestamps, the stalls
included) and :func:`overlap`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

_CONTENTION_ITERATIONS = 60
"""Bound on the fixed-point steps of one stretch (at 0.25 it converges in about 15)."""

__all__ = [
    "Group",
    "PrefixReplay",
    "Timeline",
    "added_seconds",
    "compute_seconds",
    "measured_exposed",
    "overlap",
    "simulate",
]


@dataclass(frozen=True, slots=True)
class Group:
    """Buckets that become ready together, with what they cost (seconds)."""

    hideable_s: float
    """Backward compute left once this group is ready (0 for the last group)."""
    comm_s: float = 0.0
    """Collective service time, latency and decode included."""
    work_s: float = 0.0
    """Compression work on the backward's thread (delays the groups after it)."""
    first_round_s: float = 0.0
    """Of ``comm_s``: the first round of two-round layers, launched first; the next group's
    hook call waits for it."""
    second_round_s: float = 0.0
    """Of ``comm_s``: their second round, launched by the next group's hook call (the last
    group's at once, after waiting for its own first round)."""
    final_work_s: float = 0.0
    """Of ``work_s``: computing the second round's payload from the summed first round, done
    after the wait for it (by the next group's hook call; the last group's own)."""
    decode_s: float = 0.0
    """Of ``work_s``: decoding once the group's collectives are done. The last group's comes
    after its last collective (on the tail); an earlier group's overlaps the backward but
    shares its cores, and is counted at its hook call."""

    def __post_init__(self) -> None:
        if self.final_work_s + self.decode_s > self.work_s * (1 + 1e-9) + 1e-12:
            raise ValueError(
                f"final_work_s + decode_s ({self.final_work_s} + {self.decode_s}) are parts of "
                f"work_s ({self.work_s})"
            )


@dataclass(frozen=True, slots=True)
class Timeline:
    """Outcome of one step's communication (seconds, counted from the first group ready)."""

    added_s: float
    """What communication adds to the compute-only step: work, contention and exposed time."""
    exposed_s: float
    """Communication still running after the backward (work included) has ended."""
    work_s: float
    """Compression work, all of it on the critical path."""
    comm_s: float
    """Sum of the groups' communication time."""
    stall_s: float = 0.0
    """Time hook calls blocked the backward waiting for a first round (part of exposed)."""
    contention_s: float = 0.0
    """Backward compute lost to the transfers running beside it (part of added, not of
    exposed: see :func:`simulate`'s ``contention``)."""

    @property
    def overlap(self) -> float:
        """1 - exposed / (comm + work); 1.0 when there is nothing to hide."""
        return overlap(self.exposed_s, self.comm_s, self.work_s)


def overlap(exposed_s: float, comm_s: float, work_s: float = 0.0) -> float:
    """Fraction of communication (and compression work) hidden behind backward compute."""
    total = comm_s + work_s
    if total <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - exposed_s / total))


def added_seconds(groups: Sequence[Group]) -> float:
    """Closed form of :func:`simulate`'s ``added_s`` (groups in ready order)."""
    if not groups:
        return 0.0
    comm_after = [0.0] * (len(groups) + 1)
    for index in range(len(groups) - 1, -1, -1):
        comm_after[index] = comm_after[index + 1] + groups[index].comm_s
    worst = -math.inf
    work = 0.0
    for index, group in enumerate(groups):
        work += group.work_s
        worst = max(worst, work + comm_after[index] - group.hideable_s)
    return max(worst, work)


def simulate(groups: Sequence[Group], contention: float = 0.0) -> Timeline:
    """Replay the groups in ready order on one link (see the module docstring).

    Group g's hook call comes at ``first hideable - hideable_g`` on the compute clock, delayed
    by the work, the stalls and the contention before it. It waits for the previous group's
    first round if there is one (a stall), computes that group's final round, encodes its own
    layers, and launches the previous final round with its own first round (one all-reduce),
    then the rest of its collectives; each starts when the link is free. The last group's hook
    call then waits for its own first round, computes and launches its final round; its decode
    follows its last collective. Exposed time is what runs past the end of the backward, plus
    the stalls (time the backward stood still for the link). ``hideable_s`` must not increase
    along ``groups``. A last group with hideable time left (one group standing for a whole
    backward, before the profiler has a bucket timeline) counts all its work at its hook call
    and launches its final round as soon as its first is done, beside that backward.

    ``contention`` (in [0, 1)): the share of the backward's wall time lost while the link is
    busy beside it (the transfer's own CPU work on the same cores: sockets, copies, gloo's
    threads), as the opening's probe measures it: slowdown over the stretched compute. The
    backward between two hook calls is stretched by ``contention`` x the link's busy time in
    that stretched interval, which delays every later hook call like compression work does;
    traffic after the backward's end costs nothing more. 0 (a transfer that costs the
    backward nothing) gives the closed form of :func:`added_seconds` when no group has a
    second round and the last decodes nothing.
    """
    _check(groups, contention)
    if not groups:
        return Timeline(0.0, 0.0, 0.0, 0.0)
    replay = _Replay(groups[0].hideable_s, contention)
    tail = groups[-1].hideable_s <= 0.0
    for index, group in enumerate(groups):
        replay.feed(group, index == len(groups) - 1, tail)
    return replay.finish(groups, tail)


class PrefixReplay:
    """:func:`simulate` of groups that change one at a time, kept resumable.

    The replay's state before a group depends only on the groups ready before it, so this
    keeps that state for every group, and a trial that changes group ``index`` replays from
    there: the groups after it only. The plan search prices every option of every layer this
    way, and a layer's option changes one group's load, never its place (its hideable time).
    Every float is computed by the same operations in the same order as :func:`simulate` on
    the changed list, so the timelines are identical, not close.
    """

    __slots__ = ("_before", "_tail", "contention", "groups", "timeline")

    def __init__(self, groups: Sequence[Group], contention: float = 0.0) -> None:
        _check(groups, contention)
        if not groups:
            raise ValueError("a prefix replay needs at least one group")
        self.groups = tuple(groups)
        self.contention = contention
        self._tail = self.groups[-1].hideable_s <= 0.0
        self._before: list[_Replay] = []
        self.timeline = self._replay_from(_Replay(self.groups[0].hideable_s, contention), 0)

    def _replay_from(self, replay: _Replay, index: int) -> Timeline:
        """Feed the groups from ``index`` on, keeping the state before each; the timeline."""
        last = len(self.groups) - 1
        for at in range(index, last + 1):
            self._before.append(replay.copy())
            replay.feed(self.groups[at], at == last, self._tail)
        return replay.finish(self.groups, self._tail)

    def _changed(self, index: int, group: Group) -> tuple[Group, ...]:
        old = self.groups[index]
        if group.hideable_s != old.hideable_s:
            raise ValueError(
                f"group {index} keeps its place: hideable {group.hideable_s!r} given, "
                f"{old.hideable_s!r} replayed"
            )
        return (*self.groups[:index], group, *self.groups[index + 1 :])

    def trial(self, index: int, group: Group) -> Timeline:
        """The timeline with group ``index`` (ready order) replaced by ``group``."""
        groups = self._changed(index, group)
        replay = self._before[index].copy()
        last = len(groups) - 1
        for at in range(index, last + 1):
            replay.feed(groups[at], at == last, self._tail)
        return replay.finish(groups, self._tail)

    def replaced(self, index: int, group: Group) -> PrefixReplay:
        """A replay of the groups with group ``index`` replaced by ``group``; the states
        before it are shared with this one."""
        changed = PrefixReplay.__new__(PrefixReplay)
        changed.groups = self._changed(index, group)
        changed.contention = self.contention
        changed._tail = self._tail
        changed._before = self._before[:index]
        changed.timeline = changed._replay_from(self._before[index].copy(), index)
        return changed


def _check(groups: Sequence[Group], contention: float) -> None:
    if any(b.hideable_s > a.hideable_s + 1e-12 for a, b in itertools.pairwise(groups)):
        raise ValueError("groups must be in ready order (hideable time not increasing)")
    if not 0.0 <= contention < 1.0:
        raise ValueError(f"contention must be in [0, 1), got {contention!r}")


class _Replay:
    """The state of :func:`simulate`'s replay between two hook calls, fed one group at a
    time; copies are independent, so a replay can be resumed from any group."""

    __slots__ = (
        "busy",
        "contention",
        "link_free",
        "lost",
        "now",
        "previous_hideable",
        "stalls",
        "waiting",
    )

    def __init__(self, first_hideable: float, contention: float) -> None:
        self.contention = contention
        self.stalls = 0.0
        self.lost = 0.0  # contention so far
        self.link_free = -math.inf
        self.busy: list[tuple[float, float]] = []  # the link's service intervals, in order
        # The previous group's pending final round: (first round done, its seconds, its work).
        self.waiting: tuple[float, float, float] | None = None
        self.now = 0.0  # the latest hook call (compute clock)
        self.previous_hideable = first_hideable

    def copy(self) -> _Replay:
        other = _Replay.__new__(_Replay)
        other.contention = self.contention
        other.stalls = self.stalls
        other.lost = self.lost
        other.link_free = self.link_free
        other.busy = list(self.busy)
        other.waiting = self.waiting
        other.now = self.now
        other.previous_hideable = self.previous_hideable
        return other

    def occupy(self, start: float, seconds: float) -> float:
        """Serve ``seconds`` on the link from ``start`` (or when it frees); the end time."""
        begin = max(self.link_free, start)
        self.link_free = begin + seconds
        if seconds > 0:
            self.busy.append((begin, self.link_free))
        return self.link_free

    def compute_from(self, now: float, seconds: float) -> float:
        """When ``seconds`` of backward compute started at ``now`` end, the contention of the
        link's traffic beside them included."""
        contention = self.contention
        if contention > 0 and seconds > 0:
            # The stretch is itself beside the link: extra = contention x busy time within
            # [now, now + seconds + extra] (a fixed point, reached from below). An interval
            # over by ``now`` adds exactly 0 to the (correctly rounded) sum, so it is left out.
            busy = [(s, e) for s, e in self.busy if e > now]
            extra = 0.0
            for _ in range(_CONTENTION_ITERATIONS):
                end = now + seconds + extra
                again = contention * math.fsum(max(0.0, min(e, end) - max(s, now)) for s, e in busy)
                if again - extra <= 1e-9 * seconds:
                    extra = again
                    break
                extra = again
            self.lost += extra
            seconds += extra
        return now + seconds

    def feed(self, group: Group, is_last: bool, tail: bool) -> None:
        """One hook call: ``group``'s, the last one's when ``is_last``. ``tail``: the last
        group has no hideable time left (see :func:`simulate`)."""
        now = self.compute_from(self.now, self.previous_hideable - group.hideable_s)
        self.previous_hideable = group.hideable_s
        carried = 0.0
        if self.waiting is not None:
            done, carried, final_work = self.waiting
            self.waiting = None
            if done > now:
                self.stalls += done - now
                now = done
            now += final_work
        if not is_last:
            late = group.final_work_s
        else:
            late = group.final_work_s + group.decode_s if tail else 0.0
        now += max(0.0, group.work_s - late)
        rest = max(0.0, group.comm_s - group.first_round_s - group.second_round_s)
        if is_last and tail:
            # The last bucket sends its plain parts in its first round's all-reduce.
            first_done = self.occupy(now, carried + group.first_round_s + rest)
            rest = 0.0
        else:
            first_done = self.occupy(now, carried + group.first_round_s)
        if group.first_round_s > 0 or group.second_round_s > 0:
            # Its final-round work waits for the first round, unless a stand-in last group
            # counted it at its hook call.
            carried_work = group.final_work_s if not is_last or tail else 0.0
            self.waiting = (first_done, group.second_round_s, carried_work)
        self.occupy(now, rest)
        self.now = now

    def finish(self, groups: Sequence[Group], tail: bool) -> Timeline:
        """The step's end once every group in ``groups`` has been fed."""
        last = groups[-1]
        hook_done = self.now
        backward_end = self.compute_from(self.now, last.hideable_s)
        if self.waiting is not None:
            # The last hook call waits for its own first round (no backward is left to stall
            # once its hideable time is 0), computes the final round and launches it.
            done, second, final_work = self.waiting
            self.occupy(max(done, hook_done) + final_work, second)
        finish = max(backward_end, self.link_free + (last.decode_s if tail else 0.0))
        work = math.fsum(g.work_s for g in groups)
        comm = math.fsum(g.comm_s for g in groups)
        added = finish - groups[0].hideable_s
        return Timeline(
            added_s=added,
            exposed_s=max(0.0, added - work - self.lost),
            work_s=work,
            comm_s=comm,
            stall_s=self.stalls,
            contention_s=self.lost,
        )


def measured_exposed(
    backward_end: float, finished: Sequence[float], waited_s: float = 0.0
) -> float:
    """Exposed time of a measured step: the last collective or decode to finish after the
    backward ended (the last hook call returned), plus the time hook calls blocked the
    backward waiting for an earlier collective (two-round compressors)."""
    tail = max(0.0, max(finished) - backward_end) if finished else 0.0
    return tail + max(0.0, waited_s)


def compute_seconds(step_s: float, exposed_s: float, work_s: float, backward_s: float) -> float:
    """The compute-only step implied by a measured step: what is left once communication's
    additions are taken out (never below the backward itself)."""
    return max(backward_s, step_s - max(0.0, exposed_s) - max(0.0, work_s))
