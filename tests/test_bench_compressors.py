"""Tier 1: the compressor benchmark runs end to end on a tiny tensor and writes sane JSON.

Speed is not checked (it is a benchmark, not a test); only the report's shape and the values
that follow from the math: fp16 halves the bytes, ``none`` is exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autocomp_bench import cli
from autocomp_bench.compressor_cost import parse_shape
from autocomp_bench.compressors import main

RESULT_KEYS = {
    "tensor",
    "shape",
    "numel",
    "spec",
    "collective",
    "error_feedback",
    "raw_bytes",
    "wire_bytes",
    "ratio",
    "compress_ms",
    "decompress_ms",
    "hook_ms",
    "hook_ms_min",
    "compress_ms_per_mb",
    "decompress_ms_per_mb",
    "hook_ms_per_mb",
    "hook_parts_ms",
    "rel_error",
    "break_even_gbps",
    "wire_bytes_mismatches",
}


def test_tiny_run_writes_json_and_markdown(tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    argv = ["--sizes", "4K", "--conv", "none", "--specs", "none", "fp16"]
    argv += ["--repeats", "1", "--warmup", "0", "--json", str(out_json), "--markdown", str(out_md)]
    assert main(argv) == 0

    report = json.loads(out_json.read_text())
    assert {"command", "machine", "settings", "results"} <= set(report)
    assert {"cpu", "torch", "torch_threads"} <= set(report["machine"])
    results = {r["spec"]: r for r in report["results"]}
    assert set(results) == {"none", "fp16:ef=true"}
    for r in results.values():
        assert set(r) >= RESULT_KEYS
        assert r["shape"] == [64, 64] and r["numel"] == 4096 and r["raw_bytes"] == 4 * 4096
        assert r["compress_ms"] >= 0 and r["hook_ms"] >= 0 and r["wire_bytes_mismatches"] == []

    none, fp16 = results["none"], results["fp16:ef=true"]
    assert none["rel_error"] == pytest.approx(0.0, abs=1e-12)
    assert none["ratio"] == pytest.approx(1.0) and none["break_even_gbps"] is None
    assert fp16["collective"] == "all_reduce" and fp16["error_feedback"] is True
    assert fp16["wire_bytes"] == 2 * 4096 and fp16["ratio"] == pytest.approx(2.0)
    assert 0 < fp16["rel_error"] < 1e-2
    assert fp16["hook_ms"] > 0 and fp16["break_even_gbps"] > 0
    assert "fp16:ef=true" in out_md.read_text()


def test_parse_shape() -> None:
    assert list(parse_shape("1M")) == [1024, 1024]
    assert list(parse_shape("4M")) == [2048, 2048]
    assert list(parse_shape("2M")) == [1024, 2048]
    assert list(parse_shape("256x256x3x3")) == [256, 256, 3, 3]
    with pytest.raises(ValueError):
        parse_shape("0")


def test_cli_rejects_unknown_command() -> None:
    with pytest.raises(SystemExit):
        cli.main(["no-such-benchmark"])
