# Forces the opening's contention reading to none (the state one opening in eight reaches on
# its own), to check what the boundary re-read does with it. Loads the held-out GPT's
# registration too. PYTHONPATH=docs/benchmarks-contention-2026-11-28/zero-opening:<repo>
import importlib.util
import pathlib

_here = pathlib.Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "heldout_gpt12", _here.parent.parent / "benchmarks-heldout-gpt12-2026-11-26" / "sitecustomize.py"
)
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))

from autocomp import opening  # noqa: E402

_real = opening.ProbeRunner.contention
_calls = {"n": 0}


def _first_reads_none(self, *args, **kwargs):
    reading = _real(self, *args, **kwargs)  # the same collectives on every rank
    _calls["n"] += 1
    return 0.0 if _calls["n"] == 1 else reading


opening.ProbeRunner.contention = _first_reads_none
