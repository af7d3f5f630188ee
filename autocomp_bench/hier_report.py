"""``autocomp-bench hier``'s arithmetic and report: per-method rows, the checks, text, markdown.

Pure functions of every rank's results and the link counters (no processes), so they are
tested on synthetic numbers and re-run on a saved document (``--from-json``). The topology
(nodes x ranks per node, default 2 x 2) comes from the document's ``settings``.

* **median step**: the median training seconds per step after the first
  :data:`~autocomp_bench.tta_analysis.SKIP_STEPS` steps, on rank 0's agreed clock (every rank
  stops at the same step);
* **valid loss**: rank 0's validation loss at the end of the budget (DDP ranks hold the same
  model; under HSDP rank 0 evaluates replica 0, all-gathering the shards of its node);
* **link bytes**: what each node's veth end sent and received while the method's processes
  lived (start-up and the gloo rendezvous included, a few hundred KB), from the kernel's
  counters in each namespace; with two nodes, per direction of their one veth pair;
* **bit-identical**: every rank's final parameters hash alike (DDP methods: all ranks;
  HSDP: the replicas of each shard, one per node).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from typing import Any

from autocomp_bench.report import (
    MB,
    Check,
    check_from_dict,
    markdown_table,
    other_share,
    plain_table,
)
from autocomp_bench.tta_analysis import median_step

logger = logging.getLogger(__name__)

__all__ = [
    "COLUMNS",
    "PEER_HOOKS",
    "columns",
    "count_word",
    "detail_lines",
    "hier_checks",
    "link_delta",
    "plan_line",
    "render_markdown",
    "replicas_identical",
    "summarize_method",
    "text_report",
]

COLUMNS = (
    "method",
    "steps",
    "median s/step",
    "valid loss",
    "link MB 0->1",
    "link MB 1->0",
    "link MB/step",
    "bit-identical",
    "other CPU",
)
"""The table's columns with two nodes: one veth pair, a column per direction."""

WIDE_COLUMNS = (
    "method",
    "steps",
    "median s/step",
    "valid loss",
    "link MB sent by node",
    "link MB total",
    "link MB/step",
    "bit-identical",
    "other CPU",
)
"""The table's columns with more nodes: each node's sent MB in one cell (``0/1/2``), so the
table keeps its width whatever the number of nodes."""

_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def count_word(n: int) -> str:
    """``two`` for 2 (up to ten), else the digits: the report's prose reads as it did for 2x2."""
    return _WORDS[n] if 0 <= n < len(_WORDS) else str(n)


def columns(nodes: int) -> tuple[str, ...]:
    """The table's columns for ``nodes`` nodes (:data:`COLUMNS` for two)."""
    return COLUMNS if nodes == 2 else WIDE_COLUMNS


def link_delta(before: list[dict[str, int]], after: list[dict[str, int]]) -> dict[str, Any]:
    """Bytes the shaped link carried between two readings of every node's veth end counters.

    ``before[i]``/``after[i]``: ``{"tx_bytes", "rx_bytes"}`` of node ``i``'s veth end.
    ``sent_by_node``/``received_by_node`` hold each node's deltas and ``total`` what all nodes
    sent (through a hub each byte also crosses the hub's port, counted once here). With two
    nodes the per-direction keys of the 2-node documents are added: node 0's sent bytes went
    to node 1 and the other way round; received bytes are a cross-check (they should agree to
    within packets in flight).
    """
    if len(before) != len(after) or len(before) < 2:
        raise ValueError(
            "need the counters of every node's veth end, at least 2 nodes and as many after "
            f"as before (both readings); got {len(before)} and {len(after)}"
        )
    nodes = range(len(before))
    tx = [after[i]["tx_bytes"] - before[i]["tx_bytes"] for i in nodes]
    rx = [after[i]["rx_bytes"] - before[i]["rx_bytes"] for i in nodes]
    if min(tx + rx) < 0:
        raise ValueError(f"link counters went backwards: tx {tx}, rx {rx}")
    if len(before) != 2:
        return {"total": sum(tx), "sent_by_node": tx, "received_by_node": rx}
    return {
        "node0_to_node1": tx[0],
        "node1_to_node0": tx[1],
        "total": sum(tx),
        "received_by_node1": rx[1],
        "received_by_node0": rx[0],
        "sent_by_node": tx,
        "received_by_node": rx,
    }


def replicas_identical(results: Sequence[dict[str, Any]]) -> tuple[bool, str]:
    """(all replicas bit-identical, a short description) from each rank's ``parameter_digest``.

    ``digest_scope`` ``full`` (DDP): every rank must match; ``shard`` (HSDP): the ranks with the
    same ``local_rank`` (the same shard, one per node) must match.
    """
    scope = results[0]["digest_scope"]
    if scope == "full":
        digests = {r["parameter_digest"] for r in results}
        n = len(results)
        if len(digests) == 1:
            return True, f"all {n} ranks"
        return False, f"{len(digests)} different parameter sets on {n} ranks"
    groups: dict[int, set[str]] = {}
    for r in results:
        groups.setdefault(r["local_rank"], set()).add(r["parameter_digest"])
    bad = sorted(shard for shard, digests in groups.items() if len(digests) > 1)
    if not bad:
        return True, f"replicas of all {len(groups)} shards"
    return False, f"replicas differ on shard(s) {', '.join(map(str, bad))} of {len(groups)}"


def summarize_method(
    method: str, description: str, outcome: dict[str, Any], world_size: int
) -> dict[str, Any]:
    """One report row from a method's outcome (every rank's result, link bytes, wall time)."""
    row: dict[str, Any] = {"method": method, "description": description}
    if "skipped" in outcome:
        return {**row, "skipped": outcome["skipped"]}
    for key in ("wall_seconds", "other_cpu_share", "load_after"):
        row[key] = outcome.get(key)
    if "link" in outcome:
        row["link"] = outcome["link"]
    if "error" in outcome:
        return {**row, "error": outcome["error"], "log_tail": outcome.get("log_tail", "")}
    results = sorted(outcome["results"], key=lambda r: r["rank"])
    if len(results) != world_size:
        return {**row, "error": f"{len(results)} rank results, expected {world_size}"}
    first = results[0]
    steps = [r["steps"] for r in results]
    identical, identical_detail = replicas_identical(results)
    final = first["curve"][-1]
    link = outcome["link"]
    return {
        **row,
        "task": first["task"],
        "numel": first["numel"],
        "steps": first["steps"],
        "steps_per_rank": steps,
        "median_step_s": median_step(first["step_times"]),
        "mean_step_s": statistics.fmean(first["step_times"]) if first["step_times"] else None,
        "train_seconds": first["train_seconds"],
        "eval_seconds": first["eval_seconds"],
        "valid_loss": final["valid_loss"],
        "curve": first["curve"],
        "link_bytes_per_step": link["total"] / first["steps"] if first["steps"] else None,
        "controller_bytes_per_step": first["bytes_per_step"],
        "identical": identical,
        "identical_detail": identical_detail,
        "digest_scope": first["digest_scope"],
        "info": first.get("info") or {},
    }


def _ok(row: dict[str, Any] | None) -> bool:
    return row is not None and "error" not in row and "skipped" not in row


def _lower_loss(rows: dict[str, dict[str, Any]], a: str, b: str) -> Check:
    name = f"{a}: lower validation loss than {b} at equal wall-clock"
    ra, rb = rows.get(a), rows.get(b)
    if not (_ok(ra) and _ok(rb)):
        missing = [m for m, r in ((a, ra), (b, rb)) if not _ok(r)]
        return Check(name, None, f"{', '.join(missing)} did not run or failed")
    assert ra is not None and rb is not None
    la, lb = ra["valid_loss"], rb["valid_loss"]
    return Check(name, la < lb, f"{la:.4f} vs {lb:.4f} ({la - lb:+.4f})")


PEER_HOOKS: tuple[str, ...] = ("fp16", "powersgd")
"""The fixed alternatives a user could type instead: PyTorch's own DDP comm hooks."""


def _best_peer(rows: dict[str, dict[str, Any]], method: str) -> Check:
    """``method`` at most the best PyTorch hook's validation loss (issue 12's peer target);
    judged on the hooks that ran, None when none did."""
    name = f"{method}: validation loss no worse than the best PyTorch hook's"
    row = rows.get(method)
    peers = {p: rows[p] for p in PEER_HOOKS if _ok(rows.get(p))}
    if not _ok(row) or not peers:
        missing = method if not _ok(row) else " and ".join(PEER_HOOKS)
        return Check(name, None, f"{missing} did not run or failed")
    assert row is not None
    best = min(peers, key=lambda p: peers[p]["valid_loss"])
    loss, peer_loss = row["valid_loss"], peers[best]["valid_loss"]
    return Check(
        name, loss <= peer_loss, f"{loss:.4f} vs {best} {peer_loss:.4f} ({loss - peer_loss:+.4f})"
    )


def hier_checks(rows: list[dict[str, Any]], world_size: int = 4) -> list[Check]:
    """The issue's targets: hierarchical autocomp below flat autocomp and plain all-reduce
    with all ``world_size`` ranks bit-identical; compressed HSDP below plain HSDP. When
    PyTorch's hooks ran, both autocomp methods at most the better hook's loss."""
    by_method = {row["method"]: row for row in rows}
    checks = [
        _lower_loss(by_method, "hier", "flat"),
        _lower_loss(by_method, "hier", "allreduce"),
    ]
    if any(p in by_method for p in PEER_HOOKS):
        checks += [_best_peer(by_method, m) for m in ("flat", "hier") if m in by_method]
    hier = by_method.get("hier")
    name = f"hier: the {world_size} ranks' final parameters bit-identical"
    if _ok(hier):
        assert hier is not None
        checks.append(Check(name, bool(hier["identical"]), hier["identical_detail"]))
    else:
        checks.append(Check(name, None, "hier did not run or failed"))
    checks.append(_lower_loss(by_method, "hsdp-autocomp", "hsdp"))
    if "hsdp-adaptive" in by_method:
        checks.append(_lower_loss(by_method, "hsdp-adaptive", "hsdp"))
    return checks


def _link_cells(link: dict[str, Any], nodes: int) -> list[str]:
    """The two link cells: per direction (two nodes), else each node's sent MB and the total."""
    if nodes == 2:
        return [f"{link['node0_to_node1'] / MB:.1f}", f"{link['node1_to_node0'] / MB:.1f}"]
    sent = link.get("sent_by_node")
    per_node = "/".join(f"{b / MB:.1f}" for b in sent) if sent else "-"
    return [per_node, f"{link['total'] / MB:.1f}"]


def _row_cells(row: dict[str, Any], nodes: int = 2) -> list[str]:
    width = len(columns(nodes))
    if "skipped" in row:
        return [row["method"], "SKIPPED", *["-"] * (width - 3), row["skipped"]]
    if "error" in row:
        return [row["method"], "FAILED", *["-"] * (width - 3), str(row["error"])]
    return [
        row["method"],
        str(row["steps"]),
        f"{row['median_step_s']:.4f}",
        f"{row['valid_loss']:.4f}",
        *_link_cells(row["link"], nodes),
        f"{row['link_bytes_per_step'] / MB:.3f}",
        ("yes, " if row["identical"] else "NO, ") + row["identical_detail"],
        other_share(row),
    ]


def plan_line(plan: dict[str, str]) -> str:
    """``18 of 40 parameters compressed (powersgd:rank=4,ef=true 18, none 22)``."""
    counts: dict[str, int] = {}
    for spec in plan.values():
        counts[spec] = counts.get(spec, 0) + 1
    compressed = sum(n for spec, n in counts.items() if spec != "none")
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return (
        f"{compressed} of {len(plan)} parameters compressed ("
        + ", ".join(f"{spec} {n}" for spec, n in ordered)
        + ")"
    )


def detail_lines(row: dict[str, Any]) -> list[str]:
    """The validation curve and (autocomp methods) the final plan of one method."""
    if "curve" not in row:
        return []
    points = ", ".join(f"{p['valid_loss']:.3f} @{p['train_seconds']:.1f}s" for p in row["curve"])
    lines = [f"validation loss: {points}"]
    info = row.get("info") or {}
    if info.get("plan"):
        plan = plan_line(info["plan"])
        if "decisions" in info:
            plan += f"; {info['decisions']} decisions, first at step {info['first_decision_step']}"
        lines.append(f"final plan: {plan}")
    return lines


def _checks(document: dict[str, Any]) -> list[Check]:
    return [check_from_dict(c) if isinstance(c, dict) else c for c in document["checks"]]


def _topology(document: dict[str, Any]) -> tuple[int, int]:
    """(nodes, ranks per node) of a document; 2 x 2 for documents from before the options."""
    s = document["settings"]
    return int(s.get("nodes", 2)), int(s.get("ranks_per_node", 2))


def _table(document: dict[str, Any]) -> tuple[tuple[str, ...], list[list[str]]]:
    nodes, _ = _topology(document)
    return columns(nodes), [_row_cells(r, nodes) for r in document["rows"]]


def _setup_prose(document: dict[str, Any]) -> str:
    """The markdown's setup sentences after the settings; word for word the 2x2 text there."""
    nodes, per_node = _topology(document)
    machine = document.get("machine", {})
    ranks = "rank" if per_node == 1 else "ranks"
    text = (
        f'{count_word(nodes).capitalize()} network namespaces ("nodes") of '
        f"{count_word(per_node)} gloo {ranks} each, started with torchrun's environment (RANK, "
        f"WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE={per_node}, GROUP_RANK, MASTER_ADDR/PORT); "
    )
    if per_node > 1:
        text += (
            f"the {count_word(per_node)} ranks of a node talk over the namespace's loopback, "
            "the nodes over "
        )
    else:
        text += "the nodes talk over "
    if nodes == 2:
        text += "one veth pair with `tc tbf` on both ends. "
    else:
        text += "veth pairs to a bridge in a hub namespace, `tc tbf` on both ends of each. "
    return text + (
        f"Machine: {machine.get('cpu', '?')}, {machine.get('logical_cpus', '?')} logical CPUs "
        f"for all {count_word(nodes * per_node)} ranks, torch {machine.get('torch', '?')}."
    )


def _settings_line(document: dict[str, Any]) -> str:
    s = document["settings"]
    return (
        f"task {s['task']}, {s['nodes']} nodes x {s['ranks_per_node']} ranks, link "
        f"{s['rate']}, {s['budget_s']:g} s of training per method, {s['threads']} torch "
        f"thread(s) per rank"
    )


def text_report(document: dict[str, Any]) -> list[str]:
    rows = document["rows"]
    lines = [f"== autocomp-bench hier: {_settings_line(document)}", ""]
    lines += plain_table(*_table(document))
    lines.append("")
    for row in rows:
        details = detail_lines(row)
        if details:
            lines += [f"{row['method']}:", *(f"  {line}" for line in details)]
    lines.append("")
    for row in rows:
        if "error" in row and row.get("log_tail"):
            lines += [f"-- {row['method']} (rank 0 log tail):", row["log_tail"], ""]
    lines += [check.line() for check in _checks(document)]
    return lines


def render_markdown(document: dict[str, Any]) -> str:
    """A section for docs/benchmarks.md: the command, the machine, the table, the checks."""
    rows = document["rows"]
    nodes, _ = _topology(document)
    if nodes == 2:
        link_prose = "link MB are the bytes the veth carried in each direction"
    else:
        link_prose = (
            "link MB sent by node are the bytes each node's veth sent to the hub (nodes "
            "0/1/... in order) and link MB total their sum,"
        )
    out = [
        f"## {count_word(nodes).capitalize()} nodes: hierarchical autocomp and HSDP "
        "(`autocomp-bench hier`)",
        "",
        f"Run: `{document['command']}` (code digest `{document.get('code_digest', '?')}`, "
        f"{document.get('runtime_s', 0) / 60:.1f} min).",
        "",
        f"Setup: {_settings_line(document)}. {_setup_prose(document)}",
        "",
        "Methods:",
        "",
    ]
    out += [f"- `{row['method']}`: {row['description']}" for row in rows]
    out += [
        "",
        f"Validation loss at the end of the budget (lower is better); {link_prose} while the "
        "method's processes ran (kernel counters); bit-identical compares every rank's final "
        f"parameters (HSDP: the {count_word(nodes)} replicas of each shard):",
        "",
    ]
    out += markdown_table(*_table(document))
    out += [
        "",
        "Per method, the validation curve (loss @ training seconds) and the final plan:",
        "",
    ]
    for row in rows:
        details = detail_lines(row)
        if details:
            out.append(f"- `{row['method']}`: " + "; ".join(details))
    out += ["", "Checks (the issue's targets):", ""]
    out += [f"- {check.line()}" for check in _checks(document)]
    out.append("")
    return "\n".join(out)
