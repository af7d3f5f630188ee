"""Tier 1: pure unit, no processes.

Covers the plan search's single-layer moves (``autocomp.policy.search.PlanMoves``): a move
is priced by summing only the moved layer's bucket group again, and the load and timeline
it predicts must be the very floats the whole plan summed again gives. Taking one option's
load off and putting another's on is not: a group's two-round traffic then reads 1e-19
where it was 0, and the exposure model times a second round that is not there (found on
a 400-parameter model, where it changed the fastest plan).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autocomp.policy.optimizer import LayerOption
from autocomp.policy.search import BucketGroups, GroupLoad, Pending, _Group, _Problem
from autocomp.policy.types import LayerProfile

_seconds = st.floats(min_value=0.0, max_value=0.05, allow_nan=False)


@st.composite
def _option(draw: st.DrawFn, key: str) -> LayerOption:
    work = draw(_seconds)
    comm = draw(_seconds)
    two_round = key.startswith("powersgd")
    first = draw(st.floats(min_value=0.0, max_value=1.0)) * comm if two_round else 0.0
    final = draw(st.floats(min_value=0.0, max_value=1.0)) * work if two_round else 0.0
    return LayerOption(
        key,
        comm + work,
        draw(st.floats(min_value=0.0, max_value=10.0)),
        1000,
        work=work,
        first_round=first,
        second_round=comm - first if two_round else 0.0,
        final_work=final,
        decode=draw(st.floats(min_value=0.0, max_value=1.0)) * (work - final),
    )


@st.composite
def _problem(draw: st.DrawFn) -> _Problem:
    groups = draw(st.integers(min_value=1, max_value=4))
    layers = draw(st.integers(min_value=1, max_value=12))
    pending = []
    group_of = []
    for index in range(layers):
        keys = ["none", "fp16", "powersgd:rank=4", "powersgd:rank=16", "topk"]
        options = [
            LayerOption("none", draw(_seconds), 0.0, 4000),
            *(draw(_option(key)) for key in keys[1:]),
        ]
        layer = LayerProfile(
            name=f"l{index}",
            shape=torch.Size([32, 32]),
            dtype=torch.float32,
            grad_norm=1.0,
            rel_error={},
            bucket=None,
        )
        pending.append(Pending(index, layer, options, {}, ""))
        group_of.append(draw(st.integers(min_value=0, max_value=groups - 1)))
    hideable = sorted(draw(st.lists(_seconds, min_size=groups, max_size=groups)))
    buckets = BucketGroups(tuple(_Group(h, 1) for h in hideable), tuple(group_of), contention=0.1)
    fixed = GroupLoad.empty(groups)
    for g in range(groups):
        fixed.comm[g] = draw(_seconds)
    return _Problem(pending, buckets, fixed)


@settings(max_examples=200, deadline=None)
@given(problem=_problem(), data=st.data())
def test_a_move_is_priced_as_the_whole_plan_summed_again(
    problem: _Problem, data: st.DataObject
) -> None:
    chosen = [data.draw(st.sampled_from(item.options)) for item in problem.pending]
    plan = problem.moves(chosen)
    for _ in range(8):
        index = data.draw(st.integers(min_value=0, max_value=len(chosen) - 1))
        option = data.draw(st.sampled_from(problem.pending[index].options))
        load, timeline = plan.trial(index, option)
        moved = [*plan.chosen[:index], option, *plan.chosen[index + 1 :]]
        assert load.fields() == problem.totals(moved).fields()
        assert timeline == problem.timeline(moved)
        if data.draw(st.booleans()):
            plan.move(index, option, (load, timeline))
            assert plan.chosen == moved
            assert plan.compressed == sum(o.key != "none" for o in moved)
            assert abs(plan.error - sum(o.error for o in moved)) <= 1e-9 * max(1.0, plan.error)
