"""What a plan puts on each bucket group, summed exactly, and the moves the searches price.

The plan search (:mod:`autocomp.policy.search`) tries every option of every layer against
the exact exposure model (:mod:`autocomp.exposure`), and the progress climb
(:mod:`autocomp.policy.progress`) does again. A trial changes one layer, so only that
layer's bucket group changes; its load is the group's sum with one term swapped.

Floating-point sums depend on their order, and a swap done in floats is not the sum done
again: a group's two-round traffic read 1e-19 where it was 0 after one option came off and
another went on, and the exposure model timed a second round that was not there (found on a
400-parameter model, where it changed the fastest plan). The sums were therefore taken again
in full for every trial, so a trial cost the size of its group. Here every sum is kept
exactly, as an integer count of the smallest float (2**-1074, of which every finite float is
a whole multiple), and rounded once when read. An exact sum does not depend on its order, so
a swap costs two integer operations per field and is the very float the whole sum taken
again gives: the correctly rounded sum of the terms, what :func:`math.fsum` returns. On a
synthetic model in 8 buckets (``docs/benchmarks-decide-2026-11-26/decide_bench.py``) that
cut a decision at 400 and 800 parameters by 23-32%, with every plan the same
(docs/benchmarks-history.md, fifty-fourth session).

The exposure model is the rest of a trial's cost, and it too is resumed rather than run
again: the replay's state before a group depends only on the groups ready before it, so a
trial replays from the moved group on (:class:`~autocomp.exposure.PrefixReplay`), with the
same floats as a full run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from autocomp.exposure import Group, PrefixReplay, Timeline, simulate
from autocomp.policy.optimizer import LayerOption
from autocomp.policy.types import NONE_SPEC, LayerProfile, StepTiming

__all__ = [
    "BucketGroup",
    "BucketGroups",
    "GroupLoad",
    "LoadTerms",
    "OwnCollective",
    "PlanMoves",
    "SearchProblem",
    "Trial",
    "exact",
    "rounded",
]

_SCALE_BITS = 1074
_ONE = 1 << _SCALE_BITS
"""1.0 in units of 2**-1074, the smallest positive float."""

_FIELDS = 6
"""Summed per group: communication, work, first round, second round, final work, decode."""


def exact(value: float) -> int:
    """``value`` as a whole number of 2**-1074 (exact for every finite float)."""
    numerator, denominator = float(value).as_integer_ratio()
    return numerator << (_SCALE_BITS + 1 - denominator.bit_length())


def rounded(total: int) -> float:
    """The float nearest an exact sum (Python's integer division rounds correctly)."""
    return total / _ONE


@dataclass(frozen=True, slots=True)
class LoadTerms:
    """One option's terms of its group's sums, exact, and its own collective."""

    parts: tuple[int, ...]
    """Communication (seconds - work), work, first round, second round, final work, decode."""
    own_collective: str
    own_latency: float
    own_charged: int

    @classmethod
    def of(cls, option: LayerOption) -> LoadTerms:
        seconds, work = exact(option.seconds), exact(option.work)
        return cls(
            (
                seconds - work,
                work,
                exact(option.first_round),
                exact(option.second_round),
                exact(option.final_work),
                exact(option.decode),
            ),
            option.own_collective,
            option.own_latency,
            exact(option.own_charged),
        )

    @classmethod
    def of_seconds(
        cls,
        *,
        comm: float = 0.0,
        work: float = 0.0,
        first: float = 0.0,
        second: float = 0.0,
        final_work: float = 0.0,
        decode: float = 0.0,
    ) -> LoadTerms:
        """Load that is not a searched option (a bucket's latency, a rule's layer)."""
        terms = (comm, work, first, second, final_work, decode)
        return cls(tuple(exact(t) for t in terms), "", 0.0, 0)


@dataclass(frozen=True, slots=True)
class OwnCollective:
    """The options of one bucket that add one collective of their own: their latencies
    (value -> how many; the collective costs the largest) and their charged shares, summed
    exactly. Immutable, so loads copied from one another can share it."""

    latencies: dict[float, int]
    charged: int

    def uncharged(self) -> int:
        """The collective's latency beyond the shares charged (exact, >= 0)."""
        return max(0, exact(max(self.latencies)) - self.charged)

    def changed(self, terms: LoadTerms, sign: int) -> OwnCollective | None:
        """This collective with ``terms`` added (``sign`` 1) or taken off (-1); None once no
        option is left."""
        count = self.latencies.get(terms.own_latency, 0) + sign
        if count < 0:
            raise ValueError(f"no {terms.own_collective!r} option to take off")
        latencies = dict(self.latencies)
        if count:
            latencies[terms.own_latency] = count
        else:
            del latencies[terms.own_latency]
        if not latencies:
            return None
        return OwnCollective(latencies, self.charged + sign * terms.own_charged)


_NO_COLLECTIVE = OwnCollective({}, 0)


class GroupLoad:
    """Per bucket group (reverse ready order): communication, work, two-round traffic, and
    the work that runs after a collective (final-round payloads and decodes, parts of
    ``work``), each an exact sum read as a float.

    ``own``, per group: (bucket, collective) -> the options that add that collective of
    their own to their bucket (``LayerOption.own_collective``). The hook issues one such
    collective per bucket, so the group's communication is short by its latency less the
    shares the options charged (``own_uncharged``): a layer that takes a kind alone pays all
    of it. A group's dictionary is replaced, never changed, so copies share the rest.
    """

    __slots__ = (
        "_sums",
        "comm",
        "decode",
        "final_work",
        "first",
        "own",
        "own_uncharged",
        "second",
        "work",
    )

    def __init__(self, groups: int) -> None:
        self._sums = [[0] * groups for _ in range(_FIELDS)]
        self.comm = [0.0] * groups
        self.work = [0.0] * groups
        self.first = [0.0] * groups
        self.second = [0.0] * groups
        self.final_work = [0.0] * groups
        self.decode = [0.0] * groups
        self.own: list[dict[tuple[int | None, str], OwnCollective]] = [{} for _ in range(groups)]
        self.own_uncharged = [0.0] * groups
        """Per group: the latency of its own collectives beyond the shares charged."""

    @classmethod
    def empty(cls, groups: int) -> GroupLoad:
        return cls(groups)

    def copy(self) -> GroupLoad:
        load = GroupLoad.__new__(GroupLoad)
        load._sums = [list(sums) for sums in self._sums]
        load.comm = list(self.comm)
        load.work = list(self.work)
        load.first = list(self.first)
        load.second = list(self.second)
        load.final_work = list(self.final_work)
        load.decode = list(self.decode)
        load.own = list(self.own)
        load.own_uncharged = list(self.own_uncharged)
        return load

    def fields(self) -> tuple[list[float], ...]:
        return (self.comm, self.work, self.first, self.second, self.final_work, self.decode)

    def add_seconds(self, group: int, **seconds: float) -> None:
        """Add load that is not a searched option (:meth:`LoadTerms.of_seconds`)."""
        self.add_all(((group, LoadTerms.of_seconds(**seconds), None),))

    def add(self, group: int, option: LayerOption, bucket: int | None = None) -> None:
        """Add ``option`` of a layer in ``bucket``; without bucket indices the group counts
        as one bucket."""
        self.add_all(((group, LoadTerms.of(option), bucket),))

    def add_all(self, entries: Iterable[tuple[int, LoadTerms, int | None]]) -> None:
        """Add every (group, terms, bucket), rounding each group's sums once at the end."""
        touched: set[int] = set()
        owning: set[int] = set()
        for group, terms, bucket in entries:
            for sums, part in zip(self._sums, terms.parts, strict=True):
                if part:
                    sums[group] += part
            touched.add(group)
            if terms.own_collective:
                if group not in owning:
                    self.own[group] = dict(self.own[group])  # copies may share the old one
                    owning.add(group)
                self._count_own(self.own[group], terms, bucket, 1)
        for group in touched:
            self._round(group)
        for group in owning:
            self._round_own(group)

    def note_own(self, group: int, option: LayerOption, bucket: int | None) -> None:
        """Record ``option``'s own collective in ``bucket``, its seconds already counted."""
        terms = LoadTerms.of(option)
        if terms.own_collective:
            self.own[group] = dict(self.own[group])
            self._count_own(self.own[group], terms, bucket, 1)
            self._round_own(group)

    def own_seconds(self, group: int) -> float:
        """The latency of ``group``'s own collectives beyond the shares already charged."""
        return self.own_uncharged[group]

    def swapped(self, group: int, bucket: int | None, old: LoadTerms, new: LoadTerms) -> GroupLoad:
        """A copy with ``old`` (a term of ``group``, in ``bucket``) replaced by ``new``."""
        load = self.copy()
        for sums, floats, plus, minus in zip(
            load._sums, load.fields(), new.parts, old.parts, strict=True
        ):
            if plus != minus:
                sums[group] += plus - minus
                floats[group] = rounded(sums[group])
        if old.own_collective or new.own_collective:
            kinds = load.own[group] = dict(load.own[group])
            self._count_own(kinds, old, bucket, -1)
            self._count_own(kinds, new, bucket, 1)
            load._round_own(group)
        return load

    def _round(self, group: int) -> None:
        for sums, floats in zip(self._sums, self.fields(), strict=True):
            floats[group] = rounded(sums[group])

    def _round_own(self, group: int) -> None:
        uncharged = sum(c.uncharged() for c in self.own[group].values())
        self.own_uncharged[group] = rounded(uncharged)

    @staticmethod
    def _count_own(
        kinds: dict[tuple[int | None, str], OwnCollective],
        terms: LoadTerms,
        bucket: int | None,
        sign: int,
    ) -> None:
        """Add (``sign`` 1) or take off (-1) ``terms``' own collective in ``kinds``, a
        dictionary this load owns."""
        if not terms.own_collective:
            return
        key = (bucket, terms.own_collective)
        changed = kinds.get(key, _NO_COLLECTIVE).changed(terms, sign)
        if changed is None:
            del kinds[key]
        else:
            kinds[key] = changed


@dataclass(frozen=True, slots=True)
class BucketGroup:
    """Buckets that become ready together, and the backward time left after them."""

    hideable: float
    buckets: int


@dataclass(frozen=True, slots=True)
class BucketGroups:
    """Layers grouped by bucket, in reverse ready order (the last bucket DDP hands over first).

    Buckets ready together (equal measured hideable time) share a group.
    """

    groups: tuple[BucketGroup, ...]
    group_of: tuple[int, ...]
    """Group index of every layer, in the order given to the engine."""
    contention: float = 0.0
    """Backward seconds lost per second of link traffic beside it (``exposure.simulate``)."""

    @staticmethod
    def build(
        layers: Sequence[LayerProfile], timing: StepTiming, contention: float = 0.0
    ) -> BucketGroups:
        hideable = timing.hideable_seconds
        by_bucket = timing.bucket_hideable_seconds
        known = bool(layers) and all(
            layer.bucket is not None and layer.bucket in by_bucket for layer in layers
        )
        if not known:
            # No per-bucket timeline: one group, everything ready when the first bucket is.
            count = len({layer.bucket for layer in layers}) if layers else 0
            if any(layer.bucket is None for layer in layers):
                count = 0  # the engine estimates bucket latency from sizes then
            return BucketGroups((BucketGroup(hideable, count),), (0,) * len(layers), contention)
        used = sorted({layer.bucket for layer in layers}, key=lambda b: (by_bucket[b], b))  # type: ignore[index]
        values = [min(by_bucket[b], hideable) for b in used]  # type: ignore[index]
        values[-1] = hideable  # the first bucket ready has the whole H by definition
        groups: list[BucketGroup] = []
        index_of: dict[int, int] = {}
        for bucket, value in zip(used, values, strict=True):
            if groups and math.isclose(groups[-1].hideable, value, rel_tol=1e-9, abs_tol=1e-9):
                groups[-1] = BucketGroup(groups[-1].hideable, groups[-1].buckets + 1)
            else:
                groups.append(BucketGroup(value, 1))
            index_of[bucket] = len(groups) - 1  # type: ignore[index]
        return BucketGroups(
            tuple(groups),
            tuple(index_of[layer.bucket] for layer in layers),  # type: ignore[index]
            contention,
        )

    def group(self, load: GroupLoad, index: int) -> Group:
        """Group ``index`` (reverse ready order) of ``load`` as the exposure model takes it."""
        work = load.work[index]
        final_work = min(load.final_work[index], work)
        return Group(
            hideable_s=self.groups[index].hideable,
            comm_s=load.comm[index] + load.own_uncharged[index],
            work_s=work,
            first_round_s=load.first[index],
            second_round_s=load.second[index],
            final_work_s=final_work,
            decode_s=min(load.decode[index], max(0.0, work - final_work)),
        )

    def ready_order(self, load: GroupLoad) -> list[Group]:
        """Every group of ``load`` as the exposure model takes it, in ready order."""
        if len(load.comm) != len(self.groups):
            raise ValueError(f"a load of {len(load.comm)} groups for {len(self.groups)} groups")
        return [self.group(load, index) for index in range(len(self.groups) - 1, -1, -1)]

    def timeline(self, load: GroupLoad) -> Timeline:
        """The exposure model's prediction for a per-group load (reverse ready order)."""
        return simulate(self.ready_order(load), self.contention)

    def replay(self, load: GroupLoad) -> PrefixReplay:
        """:meth:`timeline`, kept resumable for trials that change one group."""
        return PrefixReplay(self.ready_order(load), self.contention)


class _Pending(Protocol):
    """What this module needs of a search layer (``autocomp.policy.search.Pending``)."""

    index: int
    layer: LayerProfile
    options: list[LayerOption]


class SearchProblem:
    """The pending layers of one search, their groups, and the load the rest of the plan
    puts on each group (``fixed``)."""

    __slots__ = ("_terms", "fixed", "groups", "pending")

    def __init__(self, pending: Sequence[_Pending], groups: BucketGroups, fixed: GroupLoad):
        self.pending = pending
        self.groups = groups
        self.fixed = fixed
        self._terms: dict[int, tuple[LayerOption, LoadTerms]] = {}
        """Per option (by identity, the option kept alive beside its terms)."""

    @property
    def fixed_comm(self) -> list[float]:
        return self.fixed.comm

    @property
    def fixed_work(self) -> list[float]:
        return self.fixed.work

    def terms(self, option: LayerOption) -> LoadTerms:
        """``option``'s exact terms, computed once per search."""
        cached = self._terms.get(id(option))
        if cached is None or cached[0] is not option:
            cached = self._terms[id(option)] = (option, LoadTerms.of(option))
        return cached[1]

    def totals(self, chosen: Sequence[LayerOption]) -> GroupLoad:
        load = self.fixed.copy()
        group_of = self.groups.group_of
        load.add_all(
            (group_of[item.index], self.terms(option), item.layer.bucket)
            for item, option in zip(self.pending, chosen, strict=True)
        )
        return load

    def timeline(self, chosen: Sequence[LayerOption]) -> Timeline:
        return self.groups.timeline(self.totals(chosen))

    def moves(self, chosen: Sequence[LayerOption]) -> PlanMoves:
        return PlanMoves(self, chosen)


@dataclass(frozen=True, slots=True)
class Trial:
    """One priced single-layer move (:meth:`PlanMoves.trial`)."""

    load: GroupLoad
    timeline: Timeline
    ready_index: int
    """The changed group's place in ready order."""
    group: Group
    """The changed group."""


class PlanMoves:
    """One plan with its per-group load, for the searches' single-layer moves: a trial swaps
    the moved layer's terms in its group's exact sums (see the module docstring) and replays
    the exposure model from that group on (:class:`~autocomp.exposure.PrefixReplay`), and the
    plan's error and count of compressed layers are carried along."""

    __slots__ = ("_problem", "_replay", "chosen", "compressed", "error", "load", "timeline")

    def __init__(self, problem: SearchProblem, chosen: Sequence[LayerOption]) -> None:
        self._problem = problem
        self.chosen = list(chosen)
        self.load = problem.totals(self.chosen)
        self._replay = problem.groups.replay(self.load)
        self.timeline = self._replay.timeline
        self.error = math.fsum(o.error for o in self.chosen)
        """Summed option error of the plan."""
        self.compressed = sum(o.key != NONE_SPEC for o in self.chosen)
        """Layers not on ``none``."""

    def trial(self, index: int, option: LayerOption) -> Trial:
        """The load and timeline with pending layer ``index`` on ``option``."""
        problem = self._problem
        groups = problem.groups
        item = problem.pending[index]
        group = groups.group_of[item.index]
        load = self.load.swapped(
            group, item.layer.bucket, problem.terms(self.chosen[index]), problem.terms(option)
        )
        ready_index = len(groups.groups) - 1 - group
        changed = groups.group(load, group)
        return Trial(load, self._replay.trial(ready_index, changed), ready_index, changed)

    def move(self, index: int, option: LayerOption, tried: Trial) -> None:
        """Take the move ``tried`` (what :meth:`trial` returned for it)."""
        self.error = self.error_after(index, option)
        self.compressed = self.compressed_after(index, option)
        self.chosen[index] = option
        self.load = tried.load
        self._replay = self._replay.replaced(tried.ready_index, tried.group)
        self.timeline = self._replay.timeline

    def error_after(self, index: int, option: LayerOption) -> float:
        """The plan's summed error once layer ``index`` moves to ``option``."""
        return self.error - self.chosen[index].error + option.error

    def compressed_after(self, index: int, option: LayerOption) -> int:
        """Layers not on ``none`` once layer ``index`` moves to ``option``."""
        old = self.chosen[index]
        return self.compressed + (option.key != NONE_SPEC) - (old.key != NONE_SPEC)
