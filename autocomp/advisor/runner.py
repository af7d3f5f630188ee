"""``autocomp-advisor profile``: run the user's script as one rank (or spawn N), then profile.

One rank's run: the script runs unmodified under :class:`~autocomp.advisor.session.CaptureSession`
until enough steps were captured (or it ends, or fails). Then, on all ranks, the link is
measured (:mod:`autocomp.advisor.linkprobe`), rank 0 measures the compressors on the captured
gradients (:mod:`autocomp.advisor.costs`) and writes the profile
(:mod:`autocomp.advisor.profile`). A script that catches the stop anyway (a bare ``except:``)
and then exits or raises still counts as stopped: its steps were all captured. A script that
fails leaves a partial profile when at least one step was captured, and its error is shown
as the script's own (the runner's frames hidden).

Launching: under ``torchrun ... -m autocomp.advisor profile`` (``RANK`` in the environment)
each process profiles itself. Otherwise the advisor plays torchrun
(:mod:`autocomp.advisor.launch`): it starts ``--nproc`` local processes with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1`` and a free ``MASTER_PORT`` set, over
loopback (gloo).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import platform
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autocomp.advisor.costs import CostMeter
from autocomp.advisor.launch import (
    ENV_RUNDIR,
    ENV_SPAWNED,
    free_port,
    report_failure,
    say,
    show_failures,
    spawned_rundir,
    wait_all,
)
from autocomp.advisor.linkprobe import measure_link
from autocomp.advisor.profile import LinkMeasurement, Profile, ScriptInfo
from autocomp.advisor.session import CaptureSession, _StopScript
from autocomp.policy.rules import PolicyRules, available_policies, load_policy

logger = logging.getLogger(__name__)

__all__ = ["NO_DDP_MESSAGE", "ProfileRunner"]

NO_DDP_MESSAGE = """\
the script built no torch.nn.parallel.DistributedDataParallel model, so there is nothing to
profile. Wrap the model in DDP once torch.distributed is initialized, for example:

    dist.init_process_group("gloo")          # "nccl" on GPUs; the advisor sets the env
    model = torch.nn.parallel.DistributedDataParallel(model)
    loss = model(batch).mean(); loss.backward(); optimizer.step()
"""


@dataclass(frozen=True, slots=True)
class _Outcome:
    kind: str
    """'stopped' (enough steps), 'finished' (the script ended), 'error' (it raised)."""
    detail: str = ""
    """What went wrong, in full (the partial profile's status)."""
    reason: str = ""
    """What went wrong, short, for one line on the terminal."""
    note: str = ""
    """Something the profile's reader should know about how the script ended."""


def _script_traceback(err: BaseException, script: Path) -> str:
    """The exception's traceback from the script's first frame on (the runner's hidden)."""
    target = os.path.realpath(script)
    tb = err.__traceback__
    cursor = tb
    while cursor is not None and os.path.realpath(cursor.tb_frame.f_code.co_filename) != target:
        cursor = cursor.tb_next
    if cursor is None and isinstance(err, SyntaxError):
        # The script did not compile: no frame of it ran, and the runner's frames (runpy)
        # are noise. The exception itself names the file, line and caret, as Python shows it.
        return "".join(traceback.format_exception_only(type(err), err))
    return "".join(traceback.format_exception(type(err), err, cursor or tb))


def _exit_outcome(code: object) -> tuple[str, str, str]:
    """(detail, reason, text to print) for ``sys.exit(code)`` with a failing code.

    As Python does: an integer is the exit status, anything else is printed to stderr and
    the status is 1.
    """
    if isinstance(code, int):
        reason = f"the script exited with status {code}"
        return reason, reason, ""
    reason = "the script exited with status 1"
    return f"{reason}: {code}", reason, f"{code}\n"


_PEER_LOST_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker crash",
    "socket closed",
    "connection refused",
    "timed out",
)
"""Error texts of a collective whose peer died or stopped answering (gloo, NCCL, store)."""


def _peer_lost(err: BaseException) -> bool:
    """Whether ``err`` is a collective or connection error: likely a consequence elsewhere."""
    kinds = tuple(
        getattr(dist, name)
        for name in ("DistBackendError", "DistNetworkError")
        if hasattr(dist, name)
    )
    seen: BaseException | None = err
    for _ in range(5):  # the error and what it was raised from
        if seen is None:
            break
        if isinstance(seen, kinds) or any(m in str(seen).lower() for m in _PEER_LOST_MARKERS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _after_stop(what: str) -> _Outcome:
    """The script caught the advisor's stop (a bare ``except:``) and then ``what``."""
    note = (
        f"the script caught the advisor's stop (a bare 'except:'?) and then {what}; "
        "all steps were captured, so this counts as stopped"
    )
    logger.debug("autocomp-advisor: %s", note)
    return _Outcome("stopped", note=note)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def smallest_preset_min_numel() -> int:
    """The least ``min_numel`` over the shipped presets (the default preset's if none)."""
    names = available_policies()
    if not names:
        return PolicyRules().min_numel
    return min(load_policy(name).min_numel for name in names)


class ProfileRunner:
    """``autocomp-advisor profile``: one rank in place, or N spawned local ranks."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """What to profile and how long to spend on it."""

        script: Path
        """The user's training script, run unmodified."""
        script_args: tuple[str, ...] = ()
        """Its command-line arguments (what followed ``--``)."""
        steps: int = 20
        """Optimizer steps to capture before the script is stopped."""
        nproc: int = 2
        """Local ranks to spawn when not launched by torchrun."""
        out: Path = Path("profile.json")
        """Where rank 0 writes the profile."""
        compressor_budget_s: float = 20.0
        """Wall-clock budget for timing compressors on rank 0."""
        link_budget_s: float = 5.0
        """Wall-clock budget for the all-reduce link probe."""
        timeout_s: float = 1800.0
        """Spawned ranks still running after this long are killed."""
        min_numel: int = field(default_factory=smallest_preset_min_numel)
        """Layers smaller than this (or 1-D) are not timed. By default the smallest
        ``min_numel`` of the shipped presets: ``recommend --policy`` may name any of them,
        and a layer it weighs without a measurement falls back on the priors."""

        def __post_init__(self) -> None:
            if self.steps < 1 or self.nproc < 1:
                raise ValueError("steps and nproc must be >= 1")
            if self.compressor_budget_s < 0 or self.link_budget_s < 0 or self.timeout_s <= 0:
                raise ValueError("budgets must be >= 0 and the timeout > 0")

    def __init__(self, config: Config) -> None:
        self.config = config

    # ---- spawn mode --------------------------------------------------------------------------

    def spawn(self) -> int:
        """Start ``nproc`` ranks of this command with torchrun's environment, on loopback."""
        cfg = self.config
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="autocomp-advisor-") as rundir:
            procs = []
            for rank in range(cfg.nproc):
                env = dict(os.environ)
                env.update(
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(cfg.nproc),
                    LOCAL_WORLD_SIZE=str(cfg.nproc),
                    GROUP_RANK="0",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    TORCHELASTIC_RUN_ID="autocomp-advisor",
                )
                env[ENV_SPAWNED] = "1"
                env[ENV_RUNDIR] = rundir
                if cfg.nproc > 1:
                    env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does
                if sys.platform.startswith("linux"):
                    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
                procs.append(subprocess.Popen(self._child_command(), env=env))
            codes = wait_all(procs, cfg.timeout_s)
            if codes is None:
                say(f"profiling timed out after {cfg.timeout_s:g} s; the ranks were stopped")
                show_failures(Path(rundir), [1] * cfg.nproc)
                return 1
            show_failures(Path(rundir), codes)
            failing = [c for c in codes if c]
            return codes[0] or (failing[0] if failing else 0)

    def _child_command(self) -> list[str]:
        cfg = self.config
        command = [
            sys.executable,
            "-m",
            "autocomp.advisor",
            "profile",
            str(cfg.script),
            "--steps",
            str(cfg.steps),
            "--out",
            str(cfg.out.resolve()),
            "--compressor-budget",
            str(cfg.compressor_budget_s),
            "--link-budget",
            str(cfg.link_budget_s),
        ]
        return [*command, "--", *cfg.script_args]

    # ---- rank mode ---------------------------------------------------------------------------

    def run_rank(self) -> int:
        """Profile the script in this process, one rank of a launched job."""
        cfg = self.config
        rank = int(os.environ.get("RANK", "0"))
        session = CaptureSession(
            steps=cfg.steps, rank=rank, min_numel=cfg.min_numel, progress=rank == 0
        )
        started = time.time()
        try:
            outcome = self._run_script(session, rank)
        finally:
            session.progress.stop()
            session.finish()  # a script that ended by itself: close its last steps
        if not session.models:
            if outcome.kind != "error":
                session.destroy_process_group()
            if rank == 0 and outcome.kind == "error":
                say(f"{outcome.reason} before it built a DDP model; no profile was written")
            elif rank == 0:
                say(NO_DDP_MESSAGE)
            return 1
        steps = session.steps_done
        if steps == 0:
            if outcome.kind != "error":
                # Before returning: a gloo group left up at exit aborts the process
                # ("terminate called without an active exception").
                session.destroy_process_group()
            untimed = [m for m in session.models if not m.hook_timed and m.hook_note]
            if rank == 0 and untimed:
                for capture in untimed:
                    say(
                        f"no step was captured: model {capture.index} ({capture.module_class}): "
                        f"{capture.hook_note}"
                    )
            elif rank == 0 and outcome.kind != "error":
                say(
                    "the script built a DDP model but no backward went through it, so no step "
                    "was captured; does it train (loss.backward()) with gradients enabled?"
                )
            elif rank == 0:
                say(f"{outcome.reason} before a step was captured; no profile was written")
            return 1

        link: LinkMeasurement | None = None
        rank_steps: list[tuple[float, ...]] = [() for _ in session.models]
        notes: list[str] = []
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if outcome.kind != "error" and world > 1:
            try:
                local = [m.local_step_seconds() for m in session.models]
                gathered: list[Any] = [None] * world
                dist.all_gather_object(gathered, local)
                rank_steps = [
                    tuple(float(g[i]) for g in gathered) for i in range(len(session.models))
                ]
                if rank == 0:
                    say(f"captured {steps} steps; measuring the link between {world} ranks")
                link = measure_link(device=_device_of(session), budget_s=cfg.link_budget_s)
            except Exception as err:
                notes.append(f"link not measured: {type(err).__name__}: {err}")
                logger.warning("autocomp-advisor: link measurement failed: %s", err)
        if dist.is_available() and dist.is_initialized():
            with contextlib.suppress(Exception):
                session.backend = str(dist.get_backend())
        if outcome.kind != "error":
            session.destroy_process_group()
        if rank != 0:
            return 1 if outcome.kind == "error" else 0
        return self._write(session, outcome, link, rank_steps, notes, world, started)

    def _run_script(self, session: CaptureSession, rank: int) -> _Outcome:
        cfg = self.config
        script = str(cfg.script)
        saved_argv, saved_path = sys.argv, list(sys.path)
        sys.argv = [script, *cfg.script_args]
        sys.path.insert(0, str(cfg.script.resolve().parent))
        try:
            with session.patched():
                runpy.run_path(script, run_name="__main__")
            outcome = _Outcome("finished")
        except _StopScript:
            return _Outcome("stopped")
        except SystemExit as exit_:
            code = exit_.code
            if session.stop_raised:
                outcome = _after_stop("exited" if code in (None, 0) else f"exited with {code!r}")
            elif code in (None, 0):
                outcome = _Outcome("finished")
            else:
                detail, reason, text = _exit_outcome(code)
                outcome = self._failed(detail, reason, rank, text, peer_lost=False)
        except Exception as err:
            if session.stop_raised:
                outcome = _after_stop(f"raised {type(err).__name__}: {err}")
            else:
                text = _script_traceback(err, cfg.script)
                reason = f"the script raised {type(err).__name__}"
                outcome = self._failed(
                    f"{reason}: {err}", reason, rank, text, peer_lost=_peer_lost(err)
                )
        finally:
            sys.argv = saved_argv
            sys.path[:] = saved_path
        if outcome.kind == "finished" and session.stop_raised:
            return _after_stop("went on to its end")
        return outcome

    def _failed(
        self, detail: str, reason: str, rank: int, text: str, *, peer_lost: bool
    ) -> _Outcome:
        """Show (rank 0) or hand to the spawning parent (other ranks) what went wrong."""
        rundir = spawned_rundir()
        spawned = rundir is not None
        if rundir is not None:
            # The parent decides which of the other ranks' errors to show, and labels them;
            # rank 0's is shown here, as it happens, and only its kind is needed there.
            report_failure(rundir, rank, text or detail + "\n", peer_lost=peer_lost)
        if text and (rank == 0 or not spawned):
            if rank != 0:
                print(f"--- rank {rank} ---", file=sys.stderr)
            print(text, file=sys.stderr, end="", flush=True)
        return _Outcome("error", detail, reason)

    def _write(
        self,
        session: CaptureSession,
        outcome: _Outcome,
        link: LinkMeasurement | None,
        rank_steps: list[tuple[float, ...]],
        notes: list[str],
        world: int,
        started: float,
    ) -> int:
        cfg = self.config
        models = []
        for capture, ranks in zip(session.models, rank_steps, strict=True):
            model, model_notes = capture.profile(ranks)
            notes.extend(model_notes)
            if model is not None:
                models.append(model)
            else:
                why = f": {capture.hook_note}" if capture.hook_note else ""
                notes.append(
                    f"model {capture.index} ({capture.module_class}) never completed a step{why}"
                )
        if outcome.note:
            notes.append(outcome.note)
        grads: dict[tuple[int, ...], torch.Tensor] = {}
        for capture in session.models:
            for shape, grad in capture.samples.items():
                grads.setdefault(shape, grad)
        meter = CostMeter(CostMeter.Config(budget_s=cfg.compressor_budget_s))
        if grads and cfg.compressor_budget_s > 0:
            say(
                f"timing {len(meter.config.specs)} compressors on {len(grads)} layer shapes "
                f"(budget {cfg.compressor_budget_s:g} s)"
            )
        measured = meter.measure(grads) if cfg.compressor_budget_s > 0 else []
        if session.steps_done < cfg.steps and outcome.kind == "finished":
            notes.append(
                f"the script finished after {session.steps_done} of the {cfg.steps} steps asked"
            )
        complete = outcome.kind != "error"
        status = {
            "stopped": f"stopped after {session.steps_done} steps",
            "finished": f"the script finished after {session.steps_done} steps",
        }.get(outcome.kind, f"partial: {outcome.detail}")
        profile = Profile(
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            complete=complete,
            status=status,
            notes=tuple(notes),
            script=ScriptInfo(
                path=str(cfg.script),
                args=cfg.script_args,
                steps_requested=cfg.steps,
                steps_captured=session.steps_done,
            ),
            environment=_environment(session, world, time.time() - started),
            world_size=world,
            models=tuple(models),
            link=link,
            compressors=tuple(measured),
            compressor_budget_s=cfg.compressor_budget_s,
            compressor_threads=torch.get_num_threads(),
            skipped=tuple(meter.skipped),
        )
        if not models:
            say("no model completed a step, so no profile was written")
            return 1
        profile.save(cfg.out)
        if not complete:
            say(
                f"{outcome.reason}; kept the partial profile of the {session.steps_done} step(s) "
                f"captured before that in {cfg.out}"
            )
            return 1
        link_text = (
            "link not measured (one rank)"
            if link is None
            else f"link {link.bandwidth_bytes_per_s * 8 / 1e9:.3g} Gbit/s, "
            f"{link.latency_s * 1e6:.0f} us/hop"
        )
        model = profile.model()
        say(
            f"wrote {cfg.out}: {session.steps_done} steps, {len(model.layers)} layers in "
            f"{len(model.buckets)} buckets, step {model.timing.step_s * 1e3:.1f} ms, {link_text}"
        )
        for note in notes:
            say(f"note: {note}")
        return 0


def _device_of(session: CaptureSession) -> torch.device:
    for capture in session.models:
        for _, param in capture.params:
            return param.device
    return torch.device("cpu")


def _environment(session: CaptureSession, world: int, seconds: float) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "backend": session.backend,
        "device": str(_device_of(session)),
        "launcher": "autocomp-advisor (spawn)" if os.environ.get(ENV_SPAWNED) else "external",
        "world_size": world,
        "profile_seconds": round(seconds, 3),
        "argv": json.dumps(sys.argv),
    }
