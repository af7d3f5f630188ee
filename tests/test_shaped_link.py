"""Tests for autocomp_bench.shaped_link.

Tier 3: needs root + iproute2; skipped with the reason otherwise. The
parse_rate tests are pure unit tests and always run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from autocomp_bench import shaped_link
from autocomp_bench.shaped_link import ShapedLink, parse_rate, shaped_link_unavailable_reason

_UNAVAILABLE = shaped_link_unavailable_reason()


def needs_shaped_link(test: Callable[..., None]) -> Callable[..., None]:
    """Mark ``test`` as a shaped-link test and skip it (with the reason) when unusable."""
    skip = pytest.mark.skipif(
        _UNAVAILABLE is not None, reason=f"ShapedLink unavailable: {_UNAVAILABLE}"
    )
    return pytest.mark.shaped(skip(test))


# The emulated network is private, so a fixed port cannot clash with anything.
_PORT = 5201

_RECEIVER = """
import json, socket, sys, time
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
conn, _ = server.accept()
start = time.perf_counter()
received = 0
while chunk := conn.recv(1 << 20):
    received += len(chunk)
elapsed = time.perf_counter() - start
conn.sendall(b"k")
print(json.dumps({"bytes": received, "seconds": elapsed}), flush=True)
"""

_SENDER = """
import socket, sys
payload = b"x" * int(sys.argv[3])
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
conn.sendall(payload)
conn.shutdown(socket.SHUT_WR)
assert conn.recv(1) == b"k"
"""

_ALL_REDUCE = """
import datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
tensor = torch.full((4096,), float(rank + 1))
dist.all_reduce(tensor)
expected = world * (world + 1) / 2
assert bool((tensor == expected).all()), (rank, tensor[:4])
dist.destroy_process_group()
print("ok", rank, flush=True)
"""


def _our_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    names = {line.split()[0] for line in out.splitlines() if line.strip()}
    return {name for name in names if name.startswith(f"ac{os.getpid()}n")}


@pytest.fixture
def two_hosts() -> Iterator[ShapedLink]:
    link = ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=50.0))
    try:
        link.start()
        yield link
    finally:
        link.close()


def _measure_flows(link: ShapedLink, flows: list[tuple[int, int]], nbytes: int) -> list[float]:
    """Send ``nbytes`` over TCP for each (src, dst) flow at once; return each flow's seconds."""
    receivers: list[subprocess.Popen[str]] = []
    try:
        for i, (_, dst) in enumerate(flows):
            argv = [sys.executable, "-c", _RECEIVER, link.addresses[dst], str(_PORT + i)]
            receivers.append(link.popen(dst, argv, stdout=subprocess.PIPE, text=True))
        for receiver in receivers:
            assert receiver.stdout is not None
            assert receiver.stdout.readline().strip() == "ready"
        senders = [
            link.popen(
                src,
                [sys.executable, "-c", _SENDER, link.addresses[dst], str(_PORT + i), str(nbytes)],
            )
            for i, (src, dst) in enumerate(flows)
        ]
        for sender in senders:
            assert sender.wait(timeout=20) == 0
        outputs = [receiver.communicate(timeout=20)[0] for receiver in receivers]
    finally:
        for receiver in receivers:
            receiver.kill()
    seconds = []
    for receiver, out in zip(receivers, outputs, strict=True):
        assert receiver.returncode == 0
        result = json.loads(out)
        assert result["bytes"] == nbytes
        seconds.append(result["seconds"])
    return seconds


def _measure_mbit(link: ShapedLink, src: int, dst: int, nbytes: int) -> float:
    """Send ``nbytes`` over TCP from host ``src`` to host ``dst``; return goodput in Mbit/s."""
    (seconds,) = _measure_flows(link, [(src, dst)], nbytes)
    return nbytes * 8 / seconds / 1e6


# -- parse_rate (pure unit tests) ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("200mbit", 200.0),
        ("1gbit", 1000.0),
        ("50Mbit/s", 50.0),
        ("12.5mbit", 12.5),
        ("800kbit", 0.8),
        ("1000000bit", 1.0),
        (" 2 Gbits/s ", 2000.0),
        (".5gbit", 500.0),
        ("unshaped", None),
        ("None", None),
        ("off", None),
    ],
)
def test_parse_rate_valid(text: str, expected: float | None) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "fast",
        "100",
        "100mb",
        "100mbps",
        "100MB/s",
        "-5mbit",
        "0mbit",
        "1e3mbit",
        "mbit",
        "5 xbit",
    ],
)
def test_parse_rate_invalid(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected e\.g\."):
        parse_rate(text)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="hosts"):
        ShapedLink(ShapedLink.Config(hosts=1))
    with pytest.raises(ValueError, match=r"10\.0\.0\.0/8"):
        ShapedLink(ShapedLink.Config(subnet="192.168.5.0/24"))
    with pytest.raises(ValueError, match="host addresses"):
        ShapedLink(ShapedLink.Config(hosts=3, subnet="10.1.2.0/30"))
    with pytest.raises(ValueError, match="rate_mbit"):
        ShapedLink(ShapedLink.Config(rate_mbit=0.0))
    with pytest.raises(ValueError, match="burst_bytes"):
        ShapedLink(ShapedLink.Config(rate_mbit=10.0, burst_bytes=1000))


# -- namespaces (root) --------------------------------------------------------


@needs_shaped_link
@pytest.mark.timeout(20)
def test_namespaces_created_and_removed() -> None:
    before = _our_namespaces()
    with ShapedLink(ShapedLink.Config(hosts=2)) as a, ShapedLink(ShapedLink.Config(hosts=3)) as b:
        # Same default subnet twice: fine, each network is isolated.
        assert a.addresses == ["10.77.0.1", "10.77.0.2"]
        assert b.addresses == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
        assert len(b.interfaces) == 3
        assert set(a.namespaces).isdisjoint(b.namespaces)
        # The hub namespace of the 3-host link is ours too.
        assert a.hub_namespace is None
        assert b.hub_namespace in _our_namespaces()
        assert len(_our_namespaces() - before) == 2 + 3 + 1
        assert set(a.namespaces) | set(b.namespaces) <= _our_namespaces()
        env = b.rank_env(2, world_size=3, master_port=29500)
        assert env["MASTER_ADDR"] == "10.77.0.1"
        assert (env["RANK"], env["WORLD_SIZE"], env["GLOO_SOCKET_IFNAME"]) == (
            "2",
            "3",
            b.interfaces[2],
        )
    assert _our_namespaces() == before
    a.close()  # idempotent
    with pytest.raises(RuntimeError, match="not running"):
        a.set_rate(10.0)


@needs_shaped_link
@pytest.mark.timeout(20)
def test_namespaces_removed_after_exception() -> None:
    before = _our_namespaces()
    with pytest.raises(KeyError), ShapedLink(ShapedLink.Config(hosts=3, rate_mbit=10.0)) as link:
        assert set(link.namespaces) <= _our_namespaces()
        raise KeyError("boom")
    assert _our_namespaces() == before


@needs_shaped_link
@pytest.mark.timeout(20)
@pytest.mark.parametrize("hosts", [2, 3])
def test_failed_start_cleans_up(monkeypatch: pytest.MonkeyPatch, hosts: int) -> None:
    before = _our_namespaces()
    real_run = shaped_link._run

    def failing_run(cmd: list[str]) -> str:
        if "addr" in cmd:  # halfway: namespaces and veths already exist
            raise RuntimeError("injected failure")
        return real_run(cmd)

    monkeypatch.setattr(shaped_link, "_run", failing_run)
    link = ShapedLink(ShapedLink.Config(hosts=hosts, rate_mbit=10.0))
    with pytest.raises(RuntimeError, match="injected failure"):
        link.start()
    assert _our_namespaces() == before


@needs_shaped_link
@pytest.mark.timeout(10)
def test_command_error_includes_command_and_stderr() -> None:
    missing = f"ac{os.getpid()}missing"
    with pytest.raises(RuntimeError, match=rf"ip netns delete {missing}: .*No such file"):
        shaped_link._run(["ip", "netns", "delete", missing])


# -- traffic (root) -----------------------------------------------------------


@needs_shaped_link
@pytest.mark.timeout(30)
def test_throughput_follows_rate(two_hosts: ShapedLink) -> None:
    slow = _measure_mbit(two_hosts, 0, 1, 3_000_000)
    back = _measure_mbit(two_hosts, 1, 0, 3_000_000)
    two_hosts.set_rate(200.0)
    fast = _measure_mbit(two_hosts, 0, 1, 10_000_000)
    two_hosts.set_rate(None)
    unshaped = _measure_mbit(two_hosts, 0, 1, 10_000_000)
    print(f"goodput Mbit/s: 50->{slow:.1f} (reverse {back:.1f}), 200->{fast:.1f}")
    print(f"goodput Mbit/s: unshaped->{unshaped:.1f}")
    assert 0.6 * 50 <= slow <= 1.15 * 50
    assert 0.6 * 50 <= back <= 1.15 * 50
    assert 0.6 * 200 <= fast <= 1.15 * 200
    assert 2.5 <= fast / slow <= 5.0
    assert unshaped > 2 * fast


@needs_shaped_link
@pytest.mark.timeout(30)
def test_throughput_through_hub() -> None:
    with ShapedLink(ShapedLink.Config(hosts=3, rate_mbit=50.0)) as link:
        goodput = _measure_mbit(link, 2, 1, 3_000_000)
        # Two senders into one host share that host's 50 Mbit/s downlink.
        seconds = _measure_flows(link, [(1, 0), (2, 0)], 1_500_000)
    aggregate = 2 * 1_500_000 * 8 / max(seconds) / 1e6
    print(f"hub goodput at 50 Mbit/s: {goodput:.1f}, two flows into one host: {aggregate:.1f}")
    assert 0.6 * 50 <= goodput <= 1.15 * 50
    assert 0.6 * 50 <= aggregate <= 1.15 * 50


@needs_shaped_link
@pytest.mark.multirank
@pytest.mark.timeout(60)
@pytest.mark.parametrize("hosts", [2, 3])
def test_gloo_all_reduce_across_namespaces(hosts: int) -> None:
    with ShapedLink(ShapedLink.Config(hosts=hosts, rate_mbit=100.0)) as link:
        procs = [
            link.popen(
                host,
                [sys.executable, "-c", _ALL_REDUCE],
                env=link.rank_env(host, world_size=hosts, master_port=29500),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for host in range(hosts)
        ]
        outputs = [proc.communicate(timeout=45)[0] for proc in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, out
        assert f"ok {rank}" in out
