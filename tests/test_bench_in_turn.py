"""The in-turn step-time benchmark (``autocomp-bench in-turn``).

Tier 1 (pure unit): the rotation of the step order, the summary's medians and ratios, the
unshaped target's verdict, and option errors raised before any process starts.

Tier 2 (2 gloo ranks, about 10 s each): the benchmark end to end on the digits MLP. On
loopback, plain DDP, the two hook floors and adaptive stepped in turn: every timed step of
every method is reported and the verdict follows the ratio. On a tbf-shaped link (root and
iproute2; skipped without): the rate is set, and no unshaped verdict is given.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from autocomp_bench import in_turn
from autocomp_bench.in_turn import (
    STEP_RATIO_TARGET,
    check,
    combine,
    main,
    step_order,
    summarize,
)
from autocomp_bench.shaped_link import shaped_link_unavailable_reason

# ---- tier 1 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("methods", [1, 2, 3, 5])
def test_over_twice_the_methods_steps_every_method_takes_every_position_twice(
    methods: int,
) -> None:
    orders = [step_order(methods, step) for step in range(2 * methods)]
    assert all(sorted(order) == list(range(methods)) for order in orders)
    positions = Counter(
        (index, position) for order in orders for position, index in enumerate(order)
    )
    assert set(positions.values()) == {2}
    assert len(positions) == methods * methods
    # A method runs right after another as often as right before it; with three methods or
    # fewer that is every method after every other equally often (none always in the middle).
    follows = Counter(pair for order in orders for pair in itertools.pairwise(order))
    assert all(follows[(a, b)] == follows[(b, a)] for a, b in follows)
    if 1 < methods <= 3:
        assert len(follows) == methods * (methods - 1)
        assert len(set(follows.values())) == 1


def test_a_bad_step_order_request_is_an_error() -> None:
    with pytest.raises(ValueError, match="methods >= 1"):
        step_order(0, 3)
    with pytest.raises(ValueError, match="step >= 0"):
        step_order(2, -1)


def test_the_summary_compares_each_median_with_plain_ddps() -> None:
    summary = summarize(
        {
            "allreduce": [0.100, 0.102, 0.098, 0.300],  # one slow step: the median ignores it
            "adaptive": [0.104, 0.101, 0.103, 0.900],
        }
    )
    ddp, adaptive = summary["methods"]["allreduce"], summary["methods"]["adaptive"]
    assert summary["reference"] == "allreduce"
    assert ddp["median_step_s"] == pytest.approx(0.101)
    assert adaptive["median_step_s"] == pytest.approx(0.1035)
    assert adaptive["median_ratio"] == pytest.approx(0.1035 / 0.101)
    assert adaptive["mean_step_s"] == pytest.approx((0.104 + 0.101 + 0.103 + 0.900) / 4)
    assert adaptive["excess_s"] == pytest.approx((0.104 - 0.1035) + (0.900 - 0.1035))
    assert adaptive["steps"] == 4
    passed, line = check(summary)  # type: ignore[misc]
    assert passed and line.startswith("PASS") and "1.025x" in line


def test_the_verdict_fails_over_the_target_and_needs_both_methods() -> None:
    slow = summarize({"allreduce": [0.100], "adaptive": [0.100 * (STEP_RATIO_TARGET + 0.01)]})
    passed, line = check(slow)  # type: ignore[misc]
    assert not passed and line.startswith("FAIL")
    assert check(summarize({"allreduce": [0.1], "fp16": [0.09]})) is None
    without_reference = summarize({"adaptive": [0.1], "fp16": [0.09]})
    assert without_reference["reference"] is None
    assert without_reference["methods"]["fp16"]["median_ratio"] is None
    assert check(without_reference) is None
    with pytest.raises(ValueError, match="at least one timed step"):
        summarize({"allreduce": [0.1], "adaptive": []})


def test_runs_combine_by_the_mean_of_their_own_ratios() -> None:
    # Run 2 drifted 20% slower for both methods: each run's ratio is taken within the run.
    first = summarize({"allreduce": [0.100, 0.100], "adaptive": [0.102, 0.102]})
    second = summarize({"allreduce": [0.120, 0.120], "adaptive": [0.126, 0.126]})
    combined = combine([first, second])
    adaptive = combined["methods"]["adaptive"]
    assert combined["runs"] == 2 and combined["reference"] == "allreduce"
    assert adaptive["median_ratios"] == pytest.approx([1.02, 1.05])
    assert adaptive["median_ratio"] == pytest.approx(1.035)
    assert adaptive["median_step_s"] == pytest.approx(0.114)
    assert adaptive["steps"] == 4
    passed, line = check(combined)  # type: ignore[misc]
    assert not passed and "1.035x" in line and "mean of 2 runs" in line
    assert combine([first])["methods"]["adaptive"]["median_ratio"] == pytest.approx(1.02)
    alone = combine([summarize({"adaptive": [0.1]})])
    assert alone["methods"]["adaptive"]["median_ratio"] is None and check(alone) is None
    with pytest.raises(ValueError, match="no runs"):
        combine([])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--task", "no-such-task"], "unknown --task"),
        (["--methods", "allreduce,oracle"], "oracle"),
        (["--methods", "adaptive,adaptive"], "each method once"),
        (["--steps", "0"], "--steps >= 1"),
        (["--seeds", "0,x"], "integers"),
        (["--seeds", "1,1"], "each once"),
        (["--adaptive-kwargs", "{not json"], "not JSON"),
        (["--adaptive-kwargs", "[1]"], "JSON object"),
        (["--rate", "50mbit,10mbit"], "one rate"),
        (["--rate", "50mbit", "--network", "loopback"], "needs the shaped link"),
    ],
)
def test_bad_options_are_usage_errors_before_any_process_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    assert message in capsys.readouterr().err


# ---- tier 2 ----------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_plain_ddp_the_hook_floors_and_adaptive_stepped_in_turn_on_loopback(
    tmp_path: Path,
) -> None:
    out = tmp_path / "in-turn.json"
    methods = ["allreduce", "torch-hook", "autocomp-none", "adaptive"]
    argv = ["--task", "digits-mlp", "--methods", ",".join(methods), "--network", "loopback"]
    options = ["--steps", "6", "--warm", "1", "--seeds", "0,1", "--timeout", "150"]
    code = main([*argv, *options, "--json", str(out)])
    document = json.loads(out.read_text())
    assert document["benchmark"] == in_turn.__name__
    assert document["rate"] == "unshaped" and document["rate_mbit"] is None
    assert [run["seed"] for run in document["runs"]] == [0, 1]
    for run in document["runs"]:
        assert {m: len(t) for m, t in run["times"].items()} == dict.fromkeys(methods, 6)
        assert all(t > 0 for times in run["times"].values() for t in times)
        entry = run["summary"]["methods"]
        assert entry["adaptive"]["median_ratio"] == pytest.approx(
            entry["adaptive"]["median_step_s"] / entry["allreduce"]["median_step_s"]
        )
        # autocomp's two controllers report their plans; the floor's sends every layer whole.
        assert set(run["plans"]) == {"autocomp-none", "adaptive"}
        assert set(run["plans"]["autocomp-none"].values()) == {"none"}
        # Every model trained on the same batches from the same initial weights: the three
        # that send every gradient whole end on the same loss.
        losses = run["last_train_loss"]
        assert set(losses) == set(methods)
        assert losses["torch-hook"] == pytest.approx(losses["allreduce"], rel=1e-4)
        assert losses["autocomp-none"] == pytest.approx(losses["allreduce"], rel=1e-4)
    # The seeds train different models on different batches.
    first, second = (run["last_train_loss"]["allreduce"] for run in document["runs"])
    assert first != second
    ratio = document["summary"]["methods"]["adaptive"]["median_ratio"]
    per_run = [run["summary"]["methods"]["adaptive"]["median_ratio"] for run in document["runs"]]
    assert ratio == pytest.approx(sum(per_run) / 2)
    assert code == (0 if ratio <= STEP_RATIO_TARGET else 1)


@pytest.mark.timeout(180)
@pytest.mark.skipif(shaped_link_unavailable_reason() is not None, reason="no shaped link here")
def test_on_a_shaped_link_the_ratios_come_without_the_unshaped_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "in-turn.json"
    argv = ["--task", "digits-mlp", "--methods", "allreduce,adaptive", "--rate", "200mbit"]
    code = main([*argv, "--network", "shaped", "--steps", "4", "--warm", "1", "--json", str(out)])
    document = json.loads(out.read_text())
    assert code == 0
    assert document["rate_mbit"] == 200.0
    (run,) = document["runs"]
    assert {m: len(t) for m, t in run["times"].items()} == {"allreduce": 4, "adaptive": 4}
    assert document["summary"]["methods"]["adaptive"]["median_ratio"] is not None
    printed = capsys.readouterr().out
    assert "tbf at 200mbit" in printed
    assert "PASS" not in printed and "FAIL" not in printed
