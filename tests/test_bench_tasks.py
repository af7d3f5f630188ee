"""Tier 1 (pure unit, one process): every benchmark task builds, trains a step and validates.

The time-to-accuracy and held-out comparisons rest on two properties of a task: its batches
are a pure function of (rank, step, seed), so every method sees the same data, and one
optimizer step on it gives finite numbers. A task that breaks either would make a benchmark
cell compare methods on different data or fail minutes into a run.
"""

from __future__ import annotations

import math

import pytest
import torch

from autocomp_bench.tasks import TASKS, build_task


@pytest.mark.parametrize("name", TASKS)
def test_task_batches_are_reproducible_and_one_step_is_finite(name: str) -> None:
    task = build_task(name)
    torch.manual_seed(0)
    model = task.build_model()
    optimizer = task.make_optimizer(model.parameters())

    inputs, targets = task.batch(1, 3, 0)
    again_inputs, again_targets = task.batch(1, 3, 0)
    assert torch.equal(inputs, again_inputs) and torch.equal(targets, again_targets)
    other_rank, _ = task.batch(0, 3, 0)
    assert not torch.equal(inputs, other_rank), "each rank must see its own shard"

    loss = task.loss(model(inputs), targets)
    assert math.isfinite(float(loss))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    optimizer.step()

    metrics = task.evaluate(model)
    assert math.isfinite(metrics["valid_loss"])
    assert task.metric in metrics
    assert model.training, "evaluate must leave the model in training mode"


def test_unknown_task_names_the_choices() -> None:
    with pytest.raises(ValueError, match="lstm-lm"):
        build_task("no-such-task")
