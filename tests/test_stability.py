"""Tier 1: pure unit, no processes.

Plan stability on a recorded measurement sequence: ``tests/data/windows_gpt_50mbit.jsonl``
holds every window measurement rank 0's planner received during a real run (the GPT-style
byte LM of ``autocomp-bench``, 2 ranks on a 50 Mbit/s shaped link, ``window=5``), recorded
with ``AUTOCOMP_RECORD_WINDOWS``. Replaying it through a fresh planner (the plan it decides
is the plan in use for the next window), with a steady link every layer changes compressor at
most once in any 5 consecutive windows after the first decision. The same holds when the
recorded errors and timings are perturbed with seeded noise (errors +-30%, step timings
+-15%): noise must not move the plan.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from autocomp.planner import WindowPlanner
from autocomp.policy.rules import load_policy
from autocomp.window import WindowMeasurement

RECORDING = Path(__file__).parent / "data" / "windows_gpt_50mbit.jsonl"
WINDOW = 5
SPAN = 5
"""At most one change per layer in any SPAN consecutive windows."""


def _shape_of(name: str, recording: list[dict]) -> torch.Size:
    return torch.Size(recording[0]["shapes"][name])


def _load() -> tuple[list[WindowMeasurement], dict[str, torch.Size]]:
    lines = [json.loads(line) for line in RECORDING.read_text().splitlines() if line.strip()]
    shapes = {name: torch.Size(shape) for name, shape in lines[0]["shapes"].items()}
    return [WindowMeasurement.from_dict(line["measurement"]) for line in lines], shapes


def _replay(noise: random.Random | None) -> list[dict[str, str]]:
    measurements, shapes = _load()
    names = list(shapes)
    planner = WindowPlanner(
        load_policy("default"),
        names,
        shapes,
        dict.fromkeys(names, torch.float32),
        [],
        WindowPlanner.Config(window=WINDOW, warmup_steps=100),
        world_size=measurements[0].world_size,
    )
    current = dict.fromkeys(names, "none")
    plans = []
    for m in measurements:
        if noise is not None:
            for layer in m.layers.values():
                if layer.rel_error is not None:
                    layer.rel_error *= noise.uniform(0.7, 1.3)
            for key in ("step_seconds", "backward_seconds", "hideable_seconds"):
                m.timings[key] *= noise.uniform(0.85, 1.15)
        update = planner.decide(m, current)
        current = dict(zip(names, update.plan, strict=True))
        plans.append(current)
    return plans


def _changes(plans: list[dict[str, str]]) -> dict[str, list[int]]:
    """Per layer, the window indices at which its compressor changed (after the first
    decision that compressed anything)."""
    first = next(i for i, plan in enumerate(plans) if any(s != "none" for s in plan.values()))
    out: dict[str, list[int]] = {}
    for i in range(first + 1, len(plans)):
        for name, spec in plans[i].items():
            if spec != plans[i - 1][name]:
                out.setdefault(name, []).append(i)
    return out


@pytest.mark.parametrize("seed", [None, 0, 1, 2])
def test_a_layer_changes_at_most_once_in_five_windows(seed: int | None) -> None:
    plans = _replay(None if seed is None else random.Random(seed))
    assert len(plans) >= 20
    assert any(s != "none" for s in plans[-1].values()), "the slow link must be compressed"
    for name, windows in _changes(plans).items():
        for a, b in zip(windows, windows[1:], strict=False):
            assert b - a >= SPAN, (name, windows)


def test_the_recording_is_a_steady_slow_link() -> None:
    measurements, _ = _load()
    rates = [
        sum(m.busy_min) / len(m.busy_min) for m in measurements if m.busy_min
    ]
    assert len(measurements) >= 20 and rates
