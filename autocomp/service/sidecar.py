"""``autocomp-sidecar``: serve one run directory over HTTP, as a process of its own.

The sidecar runs beside the trainer rather than inside it: an HTTP server in the trainer would
share its GIL and steal time from the steps it is meant to observe, and a crash or a kill of
the server must never take training down. It only reads the run log and writes overrides
through short transactions, so it can be started late, restarted or killed at any time.

This module needs only the standard library until :func:`main` actually serves, so the
trainer can import :func:`start_sidecar_process` without the web stack loaded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from autocomp.env import AUTOCOMP_TOKEN

logger = logging.getLogger(__name__)

__all__ = [
    "AUTOCOMP_TOKEN",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "LOG_NAME",
    "SidecarError",
    "main",
    "sidecar_url",
    "start_sidecar_process",
    "stop_sidecar_process",
    "wait_until_healthy",
]


DEFAULT_HOST = "127.0.0.1"
"""Loopback by default: the dashboard shows the model's layer names to whoever can reach it."""
DEFAULT_PORT = 8765
LOG_NAME = "sidecar.log"
"""File in the run directory that receives a launched sidecar's stdout and stderr."""

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


class SidecarError(RuntimeError):
    """The sidecar did not come up; the message includes the end of its log when known."""


def sidecar_url(host: str, port: int) -> str:
    """Base URL for ``host``/``port`` (IPv6 literals in brackets)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="autocomp-sidecar",
        description="Serve an autocomp run directory: dashboard at /policy, JSON API under "
        "/api, Prometheus metrics at /metrics, liveness at /healthz.",
    )
    parser.add_argument(
        "--run-dir",
        required=True,
        type=Path,
        help="run directory written by the controller (it may not exist yet)",
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind (default {DEFAULT_HOST}; see service/README.md before changing)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to bind")
    parser.add_argument(
        "--token",
        default=None,
        help=f"bearer token for POST /api/overrides (default: ${AUTOCOMP_TOKEN.name}, "
        "else a generated one, printed at start)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default info)",
    )
    parser.add_argument(
        "--access-log", action="store_true", help="log every request (the dashboard polls)"
    )
    parser.add_argument(
        "--exit-with-parent",
        type=int,
        default=None,
        metavar="PID",
        help="exit when process PID is no longer this process's parent (set by the trainer)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    return args


def _watch_parent(pid: int, server: Any) -> None:
    """Stop serving once the trainer that launched us is gone (no orphaned sidecars)."""
    while not server.should_exit:
        if os.getppid() != pid:
            logger.warning("parent process %d exited; stopping the sidecar", pid)
            server.should_exit = True
            return
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``autocomp-sidecar``; returns the process exit code."""
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    token = args.token or AUTOCOMP_TOKEN.get()
    generated = not token
    if generated:
        token = secrets.token_urlsafe(24)

    # The web stack is imported only here, so launching needs nothing but the stdlib.
    import uvicorn

    from autocomp.service.app import create_app

    run_dir = args.run_dir.expanduser().resolve()
    if not run_dir.exists():
        logger.warning(
            "run directory %s does not exist yet; serving an error page until it does", run_dir
        )
    app = create_app(run_dir, token=token)
    url = sidecar_url(args.host, args.port)
    print(f"autocomp sidecar: serving {run_dir} at {url}/policy", flush=True)
    if generated:
        print(
            f"autocomp sidecar: token for POST /api/overrides: {token} "
            f"(generated; set --token or ${AUTOCOMP_TOKEN.name} to choose one)",
            flush=True,
        )
    if args.host not in _LOOPBACK:
        logger.warning(
            "binding %s: anyone who can reach this port can read the dashboard and API "
            "(overrides still need the token); prefer 127.0.0.1 behind a TLS reverse proxy",
            args.host,
        )

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        lifespan="off",
        # Our logging setup stays in charge; uvicorn's loggers propagate to it.
        log_config=None,
    )
    server = uvicorn.Server(config)
    if args.exit_with_parent is not None:
        threading.Thread(
            target=_watch_parent,
            args=(args.exit_with_parent, server),
            name="autocomp-sidecar-parent-watch",
            daemon=True,
        ).start()
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits this way when it cannot bind
        code = exc.code if isinstance(exc.code, int) else 1
        return code or 1
    return 0 if server.started else 1


def start_sidecar_process(
    run_dir: Path, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, token: str
) -> subprocess.Popen[bytes]:
    """Launch ``autocomp-sidecar`` for ``run_dir`` as a separate process and return at once.

    Its stdout and stderr are appended to ``run_dir/sidecar.log``. The token travels in the
    child's environment, not on its command line, where other local users could read it with
    ``ps``. The child runs in its own session (a Ctrl-C meant for the trainer does not hit it
    halfway through a request) and exits by itself when this process goes away. Pair with
    :func:`wait_until_healthy` and :func:`stop_sidecar_process`.
    """
    if not token:
        raise ValueError("start_sidecar_process needs a non-empty token")
    run_dir = Path(run_dir).expanduser().resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env[AUTOCOMP_TOKEN.name] = token
    env["PYTHONUNBUFFERED"] = "1"
    # The sidecar computes nothing: keep torch's thread pools from competing with training.
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    # Make this very autocomp importable in the child even if it came from a source tree.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    command = [
        sys.executable,
        "-m",
        "autocomp.service.sidecar",
        "--run-dir",
        str(run_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--exit-with-parent",
        str(os.getpid()),
    ]
    with open(run_dir / LOG_NAME, "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    logger.info(
        "started autocomp sidecar (pid %d) at %s/policy, log %s",
        process.pid,
        sidecar_url(host, port),
        run_dir / LOG_NAME,
    )
    return process


def _log_tail(process: subprocess.Popen[Any] | None, lines: int = 20) -> str:
    if process is None or not isinstance(process.args, list) or "--run-dir" not in process.args:
        return ""
    run_dir = Path(process.args[process.args.index("--run-dir") + 1])
    try:
        text = (run_dir / LOG_NAME).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    tail = "\n".join(text.splitlines()[-lines:])
    return f"\nlast lines of {run_dir / LOG_NAME}:\n{tail}" if tail else ""


def wait_until_healthy(
    url: str,
    timeout: float = 30.0,
    *,
    process: subprocess.Popen[Any] | None = None,
    interval: float = 0.1,
) -> dict[str, Any]:
    """Poll ``url`` (a base URL, or its ``/healthz``) until it answers 200; return the JSON.

    Raises :class:`SidecarError` after ``timeout`` seconds, or as soon as ``process`` (the
    sidecar, if given) has exited, e.g. because the port was taken.
    """
    health = url if url.rstrip("/").endswith("/healthz") else url.rstrip("/") + "/healthz"
    # Never route a loopback health check through an http_proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while True:
        if process is not None and process.poll() is not None:
            raise SidecarError(
                f"sidecar exited with code {process.returncode} before {health} answered"
                + _log_tail(process)
            )
        try:
            with opener.open(health, timeout=max(0.5, min(5.0, timeout))) as response:
                if response.status == 200:
                    return json.loads(response.read().decode("utf-8"))
                last_error = f"HTTP {response.status}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last_error = str(exc)
        if time.monotonic() >= deadline:
            raise SidecarError(
                f"{health} not healthy after {timeout:g} s ({last_error})" + _log_tail(process)
            )
        time.sleep(interval)


def stop_sidecar_process(process: subprocess.Popen[Any], timeout: float = 5.0) -> int | None:
    """Stop a sidecar from :func:`start_sidecar_process`: SIGTERM, then SIGKILL; reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
