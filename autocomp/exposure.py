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
that contention (``opening.ProbeRunner.contention``), and the replay stretches the backward
by it while the link is busy. :func:`simulate` replays all of it event by event and is what
the policy and the advisor use; it equals the closed form when no group has a second round,
the last group decodes nothing, and the contention is 0.
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
    if any(b.hideable_s > a.hideable_s + 1e-12 for a, b in itertools.pairwise(groups)):
        raise ValueError("groups must be in ready order (hideable time not increasing)")
    if not 0.0 <= contention < 1.0:
        raise ValueError(f"contention must be in [0, 1), got {contention!r}")
    if not groups:
        return Timeline(0.0, 0.0, 0.0, 0.0)
    stalls = 0.0
    lost = 0.0  # contention so far
    link_free = -math.inf
    busy: list[tuple[float, float]] = []  # the link's service intervals, in order
    # The previous group's pending final round: (first round done, its seconds, its work).
    waiting: tuple[float, float, float] | None = None

    def occupy(start: float, seconds: float) -> float:
        """Serve ``seconds`` on the link from ``start`` (or when it frees); the end time."""
        nonlocal link_free
        begin = max(link_free, start)
        link_free = begin + seconds
        if seconds > 0:
            busy.append((begin, link_free))
        return link_free

    def busy_within(start: float, end: float) -> float:
        return math.fsum(max(0.0, min(e, end) - max(s, start)) for s, e in busy)

    def compute_from(now: float, seconds: float) -> float:
        """When ``seconds`` of backward compute started at ``now`` end, the contention of
        the link's traffic beside them included."""
        nonlocal lost
        if contention > 0 and seconds > 0:
            # The stretch is itself beside the link: extra = contention x busy time within
            # [now, now + seconds + extra] (a fixed point, reached from below).
            extra = 0.0
            for _ in range(_CONTENTION_ITERATIONS):
                again = contention * busy_within(now, now + seconds + extra)
                if again - extra <= 1e-9 * seconds:
                    extra = again
                    break
                extra = again
            lost += extra
            seconds += extra
        return now + seconds

    last = groups[-1]
    # A last group with hideable time left stands for a whole backward (no per-bucket
    # timeline): its buckets' late work overlaps that backward, so it all counts at the hook
    # call and the final round follows the first at once.
    tail = last.hideable_s <= 0.0
    now = 0.0  # the latest hook call (compute clock)
    previous_hideable = groups[0].hideable_s
    for index, group in enumerate(groups):
        is_last = index == len(groups) - 1
        now = compute_from(now, previous_hideable - group.hideable_s)
        previous_hideable = group.hideable_s
        carried = 0.0
        if waiting is not None:
            done, carried, final_work = waiting
            waiting = None
            if done > now:
                stalls += done - now
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
            first_done = occupy(now, carried + group.first_round_s + rest)
            rest = 0.0
        else:
            first_done = occupy(now, carried + group.first_round_s)
        if group.first_round_s > 0 or group.second_round_s > 0:
            # Its final-round work waits for the first round, unless a stand-in last group
            # counted it at its hook call.
            carried_work = group.final_work_s if not is_last or tail else 0.0
            waiting = (first_done, group.second_round_s, carried_work)
        occupy(now, rest)
    hook_done = now
    backward_end = compute_from(now, last.hideable_s)
    if waiting is not None:
        # The last hook call waits for its own first round (no backward is left to stall
        # once its hideable time is 0), computes the final round and launches it.
        done, second, final_work = waiting
        occupy(max(done, hook_done) + final_work, second)
    finish = max(backward_end, link_free + (last.decode_s if tail else 0.0))
    work = math.fsum(g.work_s for g in groups)
    comm = math.fsum(g.comm_s for g in groups)
    added = finish - groups[0].hideable_s
    return Timeline(
        added_s=added,
        exposed_s=max(0.0, added - work - lost),
        work_s=work,
        comm_s=comm,
        stall_s=stalls,
        contention_s=lost,
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
