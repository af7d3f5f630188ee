"""Tier 1: the GPU cost-table script (``autocomp_bench.gpu_check``) without a GPU.

Without CUDA it must say so in one clear line and exit with its own status, not a traceback
(``make gpu-check`` relies on that); ``--device cpu`` runs the same measurement on the CPU,
which checks the script's replay, table and markdown here, where no GPU is available.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autocomp_bench.gpu_check import NO_CUDA_EXIT, main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present here")
def test_without_cuda_it_says_so_instead_of_a_traceback(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    markdown = tmp_path / "costs.md"
    command = [sys.executable, "-m", "autocomp_bench.gpu_check", "--markdown", str(markdown)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == NO_CUDA_EXIT, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("gpu_check: no CUDA device is available"), proc.stderr
    assert "--device cpu" in proc.stderr and proc.stdout == ""
    assert not markdown.exists()


def test_dry_run_on_cpu_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    markdown = tmp_path / "costs.md"
    specs = ["fp16", "topk:ratio=0.1", "powersgd:rank=2"]
    argv = ["--device", "cpu", "--sizes", "64x32", "--conv", "8x4x3x3", "--specs", *specs]
    assert main([*argv, "--repeats", "2", "--warmup", "1", "--markdown", str(markdown)]) == 0
    printed = capsys.readouterr().out
    assert "dry run, not a GPU" in printed
    text = markdown.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == 2 * len(specs)
    assert "| tensor | spec | collective | ratio | encode ms |" in text
    fp16 = next(row for row in rows if "linear 64x32" in row and "`fp16" in row)
    cells = [cell.strip() for cell in fp16.strip("|").split("|")]
    assert cells[2] == "all-reduce" and cells[3] == "2.0x"
    assert float(cells[4]) > 0 and float(cells[6]) >= float(cells[4])


def test_a_missing_device_index_is_reported(capsys: pytest.CaptureFixture) -> None:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert main(["--device", f"cuda:{count}", "--sizes", "8x8", "--conv", "none"]) == NO_CUDA_EXIT
    assert "gpu_check: " in capsys.readouterr().err
