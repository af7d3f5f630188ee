"""The two-node benchmark (``autocomp-bench hier``).

Tier 1 (no root, no processes): option parsing, torchrun's environment per rank, the worker
configs, the link counters' arithmetic, the bit-identity verdict, the rows, checks and reports
(live and after a JSON round trip), the parameter digest; the default 2 x 2 topology and
others (3 nodes x 2 ranks, 2 x 3, 2 x 1).

Tier 3 (root and iproute2; skipped elsewhere, saying why; about 40 s): the benchmark end to
end on a 1 s budget with one method: four ranks in two namespaces train, stop at the same
step, end bit-identical, the veth counts traffic both ways, and no namespace is left behind.
"""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from autocomp_bench import cli, hier
from autocomp_bench.hier_report import (
    detail_lines,
    hier_checks,
    link_delta,
    plan_line,
    render_markdown,
    replicas_identical,
    summarize_method,
    text_report,
)
from autocomp_bench.hier_worker import parameter_digest
from autocomp_bench.report import jsonable
from autocomp_bench.shaped_link import shaped_link_unavailable_reason

# ---- tier 1: options and environment ---------------------------------------------------------


def test_defaults() -> None:
    args, config = hier.parse_config([])
    assert config.task == "gpt" and config.rate_mbit == 200.0 and config.budget_s == 40.0
    assert config.methods == [
        "allreduce",
        "fp16",
        "powersgd",
        "flat",
        "hier",
        "hsdp",
        "hsdp-autocomp",
        "hsdp-adaptive",
    ]
    assert args.json is None and args.from_json is None


def test_options() -> None:
    _, config = hier.parse_config(
        ["--task", "mlp-lm", "--rate", "50Mbit/s", "--budget-s", "7", "--methods", "hier,flat"]
    )
    assert (config.task, config.rate, config.rate_mbit, config.budget_s) == (
        "mlp-lm",
        "50Mbit/s",
        50.0,
        7.0,
    )
    assert config.methods == ["hier", "flat"]  # the order given is the order run
    _, unshaped = hier.parse_config(["--rate", "unshaped"])
    assert unshaped.rate_mbit is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--task", "resnet"],
        ["--methods", "allreduce,zip"],
        ["--methods", ","],
        ["--methods", "hier,hier"],
        ["--rate", "200mbps"],
        ["--budget-s", "0"],
        ["--budget-s", "nan"],
        ["--threads", "0"],
        ["--evals", "-1"],
        ["--nodes", "1"],
        ["--nodes", "0"],
        ["--ranks-per-node", "0"],
        ["--ranks-per-node", "1", "--methods", "hier"],  # it could only be skipped
    ],
)
def test_bad_options_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        hier.parse_config(argv)
    assert exit_info.value.code == 2


def test_topology_options() -> None:
    _, default = hier.parse_config([])
    assert (default.nodes, default.ranks_per_node) == (2, 2)
    _, config = hier.parse_config(["--nodes", "3", "--ranks-per-node", "2"])
    assert (config.nodes, config.ranks_per_node) == (3, 2)
    assert _bench(nodes=3, ranks_per_node=2).world_size == 6
    # One rank per node: every method but hier runs (hier is skipped, not a usage error).
    _, single = hier.parse_config(["--ranks-per-node", "1", "--methods", "allreduce,hier"])
    assert (single.ranks_per_node, single.methods) == (1, ["allreduce", "hier"])


def test_one_rank_per_node_skips_hier_with_a_reason() -> None:
    if "hier" in hier.method_problems():
        pytest.skip(f"hier: {hier.method_problems()['hier']}")
    problems = hier.method_problems(ranks_per_node=1)
    assert "ranks per node" in problems["hier"] and "--ranks-per-node 1" in problems["hier"]
    # HSDP runs on the (nodes, 1) mesh; flat still says hierarchy=False explicitly.
    assert not {"allreduce", "flat", "hsdp", "hsdp-autocomp"} & set(problems)
    flat = _bench(ranks_per_node=1).worker_config("flat")
    assert flat["adaptive_kwargs"]["hierarchy"] is False


def test_method_descriptions_name_the_topology() -> None:
    assert hier.method_descriptions() == hier.METHODS
    assert "all 4 ranks" in hier.METHODS["allreduce"] and "2x2" in hier.METHODS["hsdp"]
    wide = hier.method_descriptions(3, 2)
    assert set(wide) == set(hier.METHODS)
    assert "all 6 ranks" in wide["allreduce"] and "the 3x2 (replicate, shard)" in wide["hsdp"]


def test_registered_in_the_cli() -> None:
    assert cli.COMMANDS["hier"][0] == "autocomp_bench.hier"


def test_rank_env_is_torchruns_two_nodes_of_two() -> None:
    addresses, interfaces = ["10.77.0.1", "10.77.0.2"], ["ac-h0", "ac-h1"]
    envs = [hier.rank_env(r, addresses, interfaces, 29501) for r in range(4)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
        ("0", "0", "0"),
        ("1", "1", "0"),
        ("2", "0", "1"),
        ("3", "1", "1"),
    ]
    for env in envs:
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "10.77.0.1" and env["MASTER_PORT"] == "29501"
    # gloo binds each rank to its own namespace's veth (node 0's ranks reach each other on
    # that address, which Linux routes over the namespace's loopback).
    assert [e["GLOO_SOCKET_IFNAME"] for e in envs] == ["ac-h0", "ac-h0", "ac-h1", "ac-h1"]
    with pytest.raises(ValueError, match="rank"):
        hier.rank_env(4, addresses, interfaces, 29501)
    with pytest.raises(ValueError, match="port"):
        hier.rank_env(0, addresses, interfaces, 0)
    with pytest.raises(ValueError, match="addresses"):
        hier.rank_env(0, addresses[:1], interfaces, 29501)
    with pytest.raises(ValueError, match="at least 2 nodes"):
        hier.rank_env(0, addresses[:1], interfaces[:1], 29501)
    with pytest.raises(ValueError, match="ranks_per_node"):
        hier.rank_env(0, addresses, interfaces, 29501, ranks_per_node=0)


@pytest.mark.parametrize(
    ("nodes", "per_node", "expected"),
    [
        # (RANK, LOCAL_RANK, GROUP_RANK) per rank: node-major, as torchrun numbers them.
        (3, 2, [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1), (4, 0, 2), (5, 1, 2)]),
        (2, 3, [(0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 0, 1), (4, 1, 1), (5, 2, 1)]),
        (3, 1, [(0, 0, 0), (1, 0, 1), (2, 0, 2)]),
    ],
)
def test_rank_env_other_topologies(
    nodes: int, per_node: int, expected: list[tuple[int, int, int]]
) -> None:
    addresses = [f"10.77.0.{n + 1}" for n in range(nodes)]
    interfaces = [f"ac-h{n}" for n in range(nodes)]
    world = nodes * per_node
    envs = [hier.rank_env(r, addresses, interfaces, 29502, per_node) for r in range(world)]
    got = [(int(e["RANK"]), int(e["LOCAL_RANK"]), int(e["GROUP_RANK"])) for e in envs]
    assert got == expected
    for (rank, _, node), env in zip(expected, envs, strict=True):
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == str(world)
        assert env["LOCAL_WORLD_SIZE"] == str(per_node)
        assert env["GROUP_WORLD_SIZE"] == str(nodes)
        assert env["ROLE_RANK"] == str(rank)
        assert env["GLOO_SOCKET_IFNAME"] == f"ac-h{node}"  # its own namespace's veth
        assert env["MASTER_ADDR"] == "10.77.0.1" and env["MASTER_PORT"] == "29502"
    with pytest.raises(ValueError, match="rank"):
        hier.rank_env(world, addresses, interfaces, 29502, per_node)
    with pytest.raises(ValueError, match="as many addresses as interfaces"):
        hier.rank_env(0, addresses, interfaces[:-1], 29502, per_node)


def _bench(**overrides: Any) -> hier.HierBenchmark:
    config = hier.HierBenchmark.Config(**overrides)
    return hier.HierBenchmark(config, link=None, root=Path("/nonexistent"), code_dir=None)  # type: ignore[arg-type]


def test_worker_configs() -> None:
    bench = _bench(budget_s=3.0, evals=2, task="mlp-lm")
    plain = bench.worker_config("allreduce")
    assert plain["loop"] == "hier-budget" and plain["method"] == "allreduce"
    assert (plain["task"], plain["budget_s"], plain["evals"]) == ("mlp-lm", 3.0, 2)
    flat, hier_cfg = bench.worker_config("flat"), bench.worker_config("hier")
    assert flat["method"] == hier_cfg["method"] == "adaptive"
    assert hier_cfg["adaptive_kwargs"] == {"target_overlap": 0.9, "hierarchy": True}
    assert flat["adaptive_kwargs"]["target_overlap"] == 0.9
    assert flat["adaptive_kwargs"].get("hierarchy", False) is False
    assert bench.worker_config("hsdp")["method"] == "hsdp"
    assert bench.worker_config("hsdp-autocomp")["method"] == "hsdp-autocomp"


def test_timeout_covers_budget_and_slow_steps() -> None:
    fast = _bench(budget_s=10.0, rate_mbit=None).timeout_s(4_000_000)
    slow = _bench(budget_s=10.0, rate_mbit=10.0).timeout_s(4_000_000)
    assert fast > 10.0 + hier.STARTUP_S
    # two 4 MB all-reduces crossing 10 Mbit/s with 1.5x the gradient: ~5.3 s each
    assert slow - fast == pytest.approx(1.5 * 2 * 1.5 * 4e6 * 8 / 10e6 / 0.9)


def test_timeout_scales_with_the_world() -> None:
    def timeout(nodes: int, per_node: int, rate_mbit: float | None) -> float:
        bench = _bench(budget_s=10.0, rate_mbit=rate_mbit, nodes=nodes, ranks_per_node=per_node)
        return bench.timeout_s(4_000_000)

    # Start-up: never below STARTUP_S, then per rank (they share the CPUs).
    assert timeout(2, 1, None) == timeout(2, 2, None)
    assert timeout(3, 2, None) - timeout(2, 2, None) == pytest.approx(2 * hier.STARTUP_PER_RANK_S)
    # The ring over 6 ranks crosses each uplink with 2 * 5/6 of the gradient.
    slow = timeout(3, 2, 10.0) - timeout(3, 2, None)
    assert slow == pytest.approx(1.5 * 2 * (10 / 6) * 4e6 * 8 / 10e6 / 0.9)


def test_method_problems_names_only_known_methods() -> None:
    assert set(hier.method_problems()) <= set(hier.METHODS)


# ---- tier 1: counters, identity, rows --------------------------------------------------------


def test_parse_link_stats() -> None:
    text = json.dumps(
        [{"ifname": "ac-h0", "stats64": {"rx": {"bytes": 7, "packets": 1}, "tx": {"bytes": 9}}}]
    )
    assert hier.parse_link_stats(text) == {"tx_bytes": 9, "rx_bytes": 7}


def test_link_delta() -> None:
    before = [{"tx_bytes": 100, "rx_bytes": 50}, {"tx_bytes": 60, "rx_bytes": 90}]
    after = [{"tx_bytes": 1100, "rx_bytes": 350}, {"tx_bytes": 360, "rx_bytes": 1090}]
    assert link_delta(before, after) == {
        "node0_to_node1": 1000,
        "node1_to_node0": 300,
        "total": 1300,
        "received_by_node1": 1000,
        "received_by_node0": 300,
        "sent_by_node": [1000, 300],
        "received_by_node": [300, 1000],
    }
    with pytest.raises(ValueError, match="backwards"):
        link_delta(after, before)
    with pytest.raises(ValueError, match="both"):
        link_delta(before[:1], after[:1])
    with pytest.raises(ValueError, match="as many after"):
        link_delta(before, after[:1])


def test_link_delta_three_nodes() -> None:
    before = [{"tx_bytes": 10 * i, "rx_bytes": 20 * i} for i in range(3)]
    after = [
        {"tx_bytes": 1000, "rx_bytes": 700},
        {"tx_bytes": 510, "rx_bytes": 820},
        {"tx_bytes": 320, "rx_bytes": 340},
    ]
    assert link_delta(before, after) == {
        "total": 1000 + 500 + 300,
        "sent_by_node": [1000, 500, 300],
        "received_by_node": [700, 800, 300],
    }
    # No per-pair keys: through the hub a node's bytes go to both others.
    assert "node0_to_node1" not in link_delta(before, after)


def _rank(
    rank: int, digest: str, scope: str = "full", steps: int = 10, per_node: int = 2
) -> dict[str, Any]:
    return {
        "rank": rank,
        "local_rank": rank % per_node,
        "node": rank // per_node,
        "task": "gpt",
        "numel": 1000,
        "steps": steps,
        "step_times": [0.5, 0.4, 0.3, *([0.2] * (steps - 3))],
        "train_seconds": 2.5,
        "eval_seconds": 0.1,
        "bytes_per_step": 4000.0,
        "curve": [{"step": steps, "train_seconds": 2.5, "train_loss": 3.0, "valid_loss": 2.9}],
        "parameter_digest": digest,
        "digest_scope": scope,
        "info": {},
    }


def test_replicas_identical() -> None:
    same = [_rank(r, "a") for r in range(4)]
    assert replicas_identical(same) == (True, "all 4 ranks")
    one_off = [*same[:3], _rank(3, "b")]
    assert replicas_identical(one_off) == (False, "2 different parameter sets on 4 ranks")
    # HSDP: shard 0 lives on ranks 0 and 2, shard 1 on ranks 1 and 3; shards differ.
    shards = [_rank(r, f"s{r % 2}", "shard") for r in range(4)]
    assert replicas_identical(shards) == (True, "replicas of all 2 shards")
    shards[3] = _rank(3, "x", "shard")
    assert replicas_identical(shards) == (False, "replicas differ on shard(s) 1 of 2")


LINK = {
    "node0_to_node1": 5_000_000,
    "node1_to_node0": 5_000_000,
    "total": 10_000_000,
    "received_by_node1": 5_000_000,
    "received_by_node0": 5_000_000,
}


def _outcome(loss: float, digests: str = "aaaa", scope: str = "full") -> dict[str, Any]:
    results = [_rank(r, digests[r], scope) for r in range(4)]
    for r in results:
        r["curve"][-1]["valid_loss"] = loss
    return {"results": results, "link": LINK, "wall_seconds": 30.0, "load_after": [1, 1, 1]}


def _rows(hier_loss: float = 2.5, hier_digests: str = "aaaa") -> list[dict[str, Any]]:
    outcomes = {
        "allreduce": _outcome(3.0),
        "flat": _outcome(2.7),
        "hier": _outcome(hier_loss, hier_digests),
        "hsdp": _outcome(3.1, "abab", "shard"),
        "hsdp-autocomp": _outcome(2.8, "abab", "shard"),
    }
    return [summarize_method(m, hier.METHODS[m], o, 4) for m, o in outcomes.items()]


def test_summarize_method() -> None:
    row = summarize_method("hier", "desc", _outcome(2.5), 4)
    assert row["steps"] == 10 and row["steps_per_rank"] == [10] * 4
    assert row["median_step_s"] == 0.2  # the first 3 steps are skipped
    assert row["valid_loss"] == 2.5 and row["identical"] is True
    assert row["link_bytes_per_step"] == 1_000_000
    failed = summarize_method("hsdp", "d", {"error": "rank 2 exited with 1", "link": LINK}, 4)
    assert failed["error"] == "rank 2 exited with 1" and "steps" not in failed
    skipped = summarize_method("hier", "d", {"skipped": "no hierarchy keyword"}, 4)
    assert skipped == {"method": "hier", "description": "d", "skipped": "no hierarchy keyword"}
    short = _outcome(2.5)
    short["results"] = short["results"][:3]
    assert "3 rank results" in summarize_method("hier", "d", short, 4)["error"]


def test_checks() -> None:
    passed = {c.name: c.passed for c in hier_checks(_rows())}
    assert passed == {
        "hier: lower validation loss than flat at equal wall-clock": True,
        "hier: lower validation loss than allreduce at equal wall-clock": True,
        "hier: the 4 ranks' final parameters bit-identical": True,
        "hsdp-autocomp: lower validation loss than hsdp at equal wall-clock": True,
    }
    worse = {c.name: c.passed for c in hier_checks(_rows(hier_loss=2.8, hier_digests="aaab"))}
    assert list(worse.values()) == [False, True, False, True]
    rows = [r for r in _rows() if r["method"] != "flat"]
    rows.append(summarize_method("flat", "d", {"error": "timed out", "link": LINK}, 4))
    first = hier_checks(rows)[0]
    assert first.passed is None and "flat" in first.detail


def test_checks_against_pytorchs_hooks() -> None:
    """With PyTorch's hooks in the run, flat and hier are held to the better hook's loss."""
    rows = [
        *_rows(),
        summarize_method("fp16", hier.METHODS["fp16"], _outcome(2.6), 4),
        summarize_method("powersgd", hier.METHODS["powersgd"], _outcome(2.55), 4),
    ]
    checks = {c.name: c for c in hier_checks(rows)}
    flat = checks["flat: validation loss no worse than the best PyTorch hook's"]
    hier_peer = checks["hier: validation loss no worse than the best PyTorch hook's"]
    assert flat.passed is False and "powersgd 2.5500" in flat.detail and "+0.1500" in flat.detail
    assert hier_peer.passed is True and "-0.0500" in hier_peer.detail
    # A hook that failed is left out of the best; with none left, the check cannot judge.
    failed = summarize_method("powersgd", "d", {"error": "timed out", "link": LINK}, 4)
    rows[-1] = failed
    checks = {c.name: c for c in hier_checks(rows)}
    assert (
        "fp16 2.6000"
        in checks["hier: validation loss no worse than the best PyTorch hook's"].detail
    )
    rows[-2] = summarize_method("fp16", "d", {"skipped": "not asked"}, 4)
    unjudged = [c for c in hier_checks(rows) if "PyTorch hook" in c.name]
    assert [c.passed for c in unjudged] == [None, None]
    assert all("did not run" in c.detail for c in unjudged)
    # Without the hooks in the run, the checks are the ones before.
    assert not any("PyTorch hook" in c.name for c in hier_checks(_rows()))


def _document(rows: list[dict[str, Any]]) -> dict[str, Any]:
    config = hier.HierBenchmark.Config(budget_s=40.0)
    settings = {**asdict(config), "nodes": 2, "ranks_per_node": 2}
    return {
        "command": "autocomp-bench hier --budget-s 40",
        "code_digest": "abc",
        "runtime_s": 300.0,
        "machine": {"cpu": "Test CPU", "logical_cpus": 2, "torch": "2.x"},
        "settings": settings,
        "rows": rows,
        "checks": hier_checks(rows),
    }


def test_reports_live_and_after_a_json_round_trip() -> None:
    rows = _rows()
    rows[3] = summarize_method("hsdp", "d", {"skipped": "no FSDP2"}, 4)
    live = _document(rows)
    saved = json.loads(json.dumps(jsonable(copy.deepcopy(live))))
    for document in (live, saved):
        text = "\n".join(text_report(document))
        assert "hsdp           SKIPPED" in text
        assert "PASS: hier: lower validation loss than flat" in text
        markdown = render_markdown(document)
        assert "`autocomp-bench hier --budget-s 40`" in markdown
        assert "| hier | 10 | 0.2000 | 2.5000 | 5.0 | 5.0 | 1.000 | yes, all 4 ranks | n/a |" in (
            markdown
        )
        assert "- `hier`: validation loss: 2.500 @2.5s" in markdown
        assert "| hsdp | SKIPPED |" in markdown
        assert "- FAIL (not evaluated): hsdp-autocomp" in markdown


def _wide_document(nodes: int, per_node: int) -> dict[str, Any]:
    """A synthetic document of ``nodes`` x ``per_node`` ranks, link bytes from link_delta."""
    world = nodes * per_node
    before = [{"tx_bytes": 0, "rx_bytes": 0}] * nodes
    after = [{"tx_bytes": (n + 1) * 1_000_000, "rx_bytes": 2_000_000} for n in range(nodes)]
    link = link_delta(before, after)
    descriptions = hier.method_descriptions(nodes, per_node)

    def outcome(loss: float, scope: str = "full") -> dict[str, Any]:
        digests = [f"s{r % per_node}" if scope == "shard" else "a" for r in range(world)]
        results = [_rank(r, digests[r], scope, per_node=per_node) for r in range(world)]
        for r in results:
            r["curve"][-1]["valid_loss"] = loss
        return {"results": results, "link": link, "wall_seconds": 30.0, "load_after": [1, 1, 1]}

    outcomes: dict[str, dict[str, Any]] = {
        "allreduce": outcome(3.0),
        "flat": outcome(2.7),
        "hier": outcome(2.5) if per_node > 1 else {"skipped": "needs 2 ranks per node"},
        "hsdp": outcome(3.1, "shard"),
        "hsdp-autocomp": {"error": "rank 4 exited with 1", "link": link},
    }
    rows = [summarize_method(m, descriptions[m], o, world) for m, o in outcomes.items()]
    config = hier.HierBenchmark.Config(budget_s=40.0, nodes=nodes, ranks_per_node=per_node)
    return {
        "command": f"autocomp-bench hier --nodes {nodes} --ranks-per-node {per_node}",
        "machine": {"cpu": "Test CPU", "logical_cpus": 2, "torch": "2.x"},
        "settings": {**asdict(config), "target_overlap": hier.TARGET_OVERLAP},
        "rows": rows,
        "checks": hier_checks(rows, world),
    }


def test_report_of_three_nodes() -> None:
    live = _wide_document(3, 2)
    saved = json.loads(json.dumps(jsonable(copy.deepcopy(live))))
    for document in (live, saved):
        text = "\n".join(text_report(document))
        assert "3 nodes x 2 ranks" in text
        assert "link MB sent by node" in text and "link MB total" in text
        assert " 1.0/2.0/3.0 " in text  # each node's sent MB
        assert "PASS: hier: the 6 ranks' final parameters bit-identical: all 6 ranks" in text
        markdown = render_markdown(document)
        assert markdown.startswith("## Three nodes: hierarchical autocomp and HSDP")
        assert 'Three network namespaces ("nodes") of two gloo ranks each' in markdown
        assert "LOCAL_WORLD_SIZE=2" in markdown and "for all six ranks" in markdown
        assert "a bridge in a hub namespace" in markdown
        assert "HSDP: the three replicas of each shard" in markdown
        assert "| hier | 10 | 0.2000 | 2.5000 | 1.0/2.0/3.0 | 6.0 | 0.600 | yes, all 6 ranks |" in (
            markdown
        )
        assert "| hsdp | 10 |" in markdown and "replicas of all 2 shards" in markdown
        assert "| hsdp-autocomp | FAILED |" in markdown
        assert "the 3x2 (replicate, shard) mesh" in markdown


def test_report_of_one_rank_per_node(tmp_path: Path) -> None:
    """2 x 1: hier skipped with its reason, the rest rendered; --from-json re-renders it."""
    document = _wide_document(2, 1)
    text = "\n".join(text_report(document))
    assert "2 nodes x 1 ranks" in text and "link MB 0->1" in text
    assert "needs 2 ranks per node" in text
    assert "FAIL (not evaluated): hier: the 2 ranks' final parameters bit-identical" in text
    markdown = render_markdown(document)
    assert 'Two network namespaces ("nodes") of one gloo rank each' in markdown
    assert "the nodes talk over one veth pair" in markdown
    saved = tmp_path / "hier.json"
    saved.write_text(json.dumps(jsonable(document)), encoding="utf-8")
    assert hier.main(["--from-json", str(saved), "--markdown", str(tmp_path / "hier.md")]) == 1


def test_old_documents_render_as_before() -> None:
    """A saved 2 x 2 document (the link without the per-node lists) renders its table."""
    rows = _rows()
    for row in rows:
        row["link"] = dict(LINK)  # the keys of documents from before --nodes
    text = "\n".join(text_report(_document(rows)))
    assert "link MB 0->1  link MB 1->0" in text and "sent by node" not in text


def test_plan_line_and_details() -> None:
    plan = {"a": "none", "b": "powersgd:rank=4", "c": "powersgd:rank=4", "d": "fp16"}
    assert plan_line(plan) == "3 of 4 parameters compressed (powersgd:rank=4 2, fp16 1, none 1)"
    row = summarize_method("flat", "d", _outcome(2.7), 4)
    row["info"] = {"plan": plan, "decisions": 3, "first_decision_step": 1}
    assert detail_lines(row) == [
        "validation loss: 2.700 @2.5s",
        "final plan: 3 of 4 parameters compressed (powersgd:rank=4 2, fp16 1, none 1); "
        "3 decisions, first at step 1",
    ]
    assert detail_lines({"method": "hier", "skipped": "x"}) == []


def test_main_rerenders_a_saved_document(tmp_path: Path) -> None:
    saved = tmp_path / "hier.json"
    saved.write_text(json.dumps(jsonable(_document(_rows()))), encoding="utf-8")
    markdown = tmp_path / "hier.md"
    assert hier.main(["--from-json", str(saved), "--markdown", str(markdown)]) == 0
    assert "| allreduce | 10 |" in markdown.read_text(encoding="utf-8")


def test_parameter_digest_is_bitwise() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    twin = copy.deepcopy(model)
    assert parameter_digest(model) == parameter_digest(twin)
    with torch.no_grad():
        twin.bias[0] = torch.nextafter(twin.bias[0], torch.tensor(1.0))  # one ulp
    assert parameter_digest(model) != parameter_digest(twin)


# ---- tier 3: end to end on the shaped link ---------------------------------------------------

_UNAVAILABLE = shaped_link_unavailable_reason()


@pytest.mark.shaped
@pytest.mark.timeout(90)
@pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"shaped link: {_UNAVAILABLE}")
def test_hier_smoke_on_the_shaped_link(tmp_path: Path) -> None:
    if "hier" in hier.method_problems():
        pytest.skip(f"hier: {hier.method_problems()['hier']}")
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out = tmp_path / "hier.json"
    status = hier.main(
        [
            "--task",
            "gpt-small",
            "--methods",
            "hier",
            "--budget-s",
            "1",
            "--evals",
            "0",
            "--json",
            str(out),
            "--markdown",
            str(tmp_path / "hier.md"),
        ]
    )
    assert status in (0, 1)  # 1: checks comparing with methods that did not run
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert after == before  # every namespace the run made is gone
    document = json.loads(out.read_text(encoding="utf-8"))
    (row,) = document["rows"]
    assert "error" not in row, (row.get("error"), row.get("log_tail"))
    assert row["steps"] >= 1 and row["steps_per_rank"] == [row["steps"]] * 4
    assert row["identical"] is True, row["identical_detail"]
    # Traffic crossed between the nodes both ways, and each end received what the other sent.
    link = row["link"]
    assert link["node0_to_node1"] > 0 and link["node1_to_node0"] > 0
    assert link["received_by_node1"] == pytest.approx(link["node0_to_node1"], rel=0.1)
    assert link["received_by_node0"] == pytest.approx(link["node1_to_node0"], rel=0.1)
    assert "| hier |" in (tmp_path / "hier.md").read_text(encoding="utf-8")
