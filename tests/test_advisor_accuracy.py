"""The advisor's step-time predictions against real runs on the shaped link.

Tier 1: the comparison and check logic of ``autocomp-bench advisor`` on hand-made numbers.

Tier 3 (needs root and iproute2, skipped with the reason otherwise; about a minute): the
benchmark's own phases on a reduced budget. ``autocomp-advisor profile`` runs the link
benchmark's LM script on the unshaped veth, the what-if model predicts 200 Mbit/s, and the
link benchmark's worker measures plain DDP and the advisor's PowerSGD rank-4 plan there.

What this tier holds is the pipeline and the decision, not the accuracy figure: every phase
runs, every prediction is within a factor of two of its run (a unit slip such as bits for
bytes, or a cost term left out, is off by far more), and compression wins by several times at
200 Mbit/s, predicted and measured. Subtler costing errors (timing the unfused compressor
path was +55%) are the benchmark's to catch. The accuracy target (20% of the
measured step) is the benchmark's, ``autocomp-bench advisor``, on a quiet machine
(docs/advisor.md): the profile and the runs are minutes apart, and on this shared 2-vCPU
machine a load change between them moved the same static PowerSGD prediction from -3% of its
run (quiet, 2026-11-23: 0.204 s predicted, 0.209 s measured) to +48% (CI, the same day:
0.308 s, 0.209 s) and, once, +74%. A timed test cannot hold a 20% or 45% bound across that.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from autocomp_bench import advisor_accuracy as acc
from autocomp_bench.harness import Rate, Runner, ShapedNetwork, snapshot_code
from autocomp_bench.shaped_link import ShapedLink, shaped_link_unavailable_reason

GROSS_FACTOR = 2.0
"""A prediction further than this factor from its run is a modelling slip, not load."""
_UNAVAILABLE = shaped_link_unavailable_reason()


def test_comparison_rows_pair_each_option_with_its_run() -> None:
    predicted = {"none": 3.0, "fp16": 1.6, "powersgd-r4": 0.40, "adaptive": 0.39}
    measured = {
        "none": {"median_interval_s": 3.2},
        "fp16": {"median_interval_s": 1.9, "info": {"plan": {"w": "fp16", "b": "none"}}},
        "powersgd-r4": {"error": "rank 1 exited with 1"},
        acc.LIVE: {"median_interval_s": 0.6, "info": {"plan": {"w": "int8"}}},
    }
    rows = acc.compare("200mbit", predicted, measured)
    by_option = {row.option: row for row in rows}
    assert list(by_option) == ["none", "fp16", "powersgd-r4", acc.LIVE]
    assert by_option["none"].rel_error == pytest.approx((3.0 - 3.2) / 3.2)
    assert by_option["none"].within and by_option["fp16"].within
    # A failed run is never "within", and the live controller is compared with the adaptive
    # prediction but does not gate (its plan is its own).
    assert by_option["powersgd-r4"].measured_s is None and not by_option["powersgd-r4"].within
    assert by_option[acc.LIVE].predicted_s == 0.39 and not by_option[acc.LIVE].gated
    assert "fp16: w" in by_option["fp16"].measured_plan
    passed, line = acc.check_line(rows)
    assert not passed and "powersgd-r4@200mbit" in line
    passed, line = acc.check_line([r for r in rows if r.option != "powersgd-r4"])
    assert passed and line.startswith("PASS") and "worst 16%" in line
    markdown = acc.table_lines(rows, markdown=True)
    assert markdown[0].startswith("| rate | option") and len(markdown) == 2 + len(rows)


@pytest.mark.shaped
@pytest.mark.multirank
@pytest.mark.timeout(600)
@pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"ShapedLink unavailable: {_UNAVAILABLE}")
def test_predictions_track_the_shaped_link_and_order_the_options() -> None:
    rate = Rate("200mbit", 200.0)
    with tempfile.TemporaryDirectory(prefix="autocomp-acc-test-") as tmp:
        root = Path(tmp)
        code_dir, _ = snapshot_code(root)
        with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=None)) as link:
            network = ShapedNetwork(link)
            runner = Runner(network, root, Runner.Config(gloo_timeout_s=120.0, code_dir=code_dir))
            profile = acc.profile_workload(
                network, root, code_dir, steps=5, threads=1, compressor_budget_s=10.0
            )
            predicted, plans = acc.predict(profile, rate.mbit or 0.0)
            network.set_rate(rate.mbit)
            measured = acc.measure(
                runner, rate, plans, steps=3, warmup_steps=2, rows=("none", "powersgd-r4")
            )
    rows = acc.compare(rate.label, predicted, measured)
    assert [row.option for row in rows] == ["none", "powersgd-r4"]
    for row in rows:
        assert row.error is None, row
        assert row.predicted_s is not None and row.measured_s is not None, row
        ratio = row.predicted_s / row.measured_s
        assert 1 / GROSS_FACTOR <= ratio <= GROSS_FACTOR, row
    none, powersgd = rows
    assert none.measured_s is not None and powersgd.measured_s is not None
    assert none.measured_s > 3 * powersgd.measured_s
    assert none.predicted_s > 3 * powersgd.predicted_s
