"""What the machine is and how busy it was: every benchmark records both next to its numbers.

On a shared 2-vCPU machine other work moves step times by tens of percent, so each report
carries the CPU model, the load average before and after, and (for runs that start worker
processes) the share of the CPUs that something other than the run kept busy.
"""

from __future__ import annotations

import logging
import os
import platform
import resource
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "cpu_model",
    "load_average",
    "machine_busy_seconds",
    "machine_info",
    "own_cpu_seconds",
    "tail",
]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "Hardware", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict[str, Any]:
    import torch

    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(affinity(0)) if affinity else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": "cpu",
        "load_average_before": load_average(),
    }


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: a sign of other work competing for the CPUs."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine_busy_seconds() -> float | None:
    """CPU seconds all CPUs spent busy since boot (/proc/stat), or None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (the workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a worker's log, for error reports."""
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
