"""The nemesis's network faults really cut traffic, heal restores it, and nothing is left behind.

Real namespaces, veths and sockets (root with iproute2; skipped otherwise, with the reason).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from tests.chaos.netns import OWNERS_DIR, NamespaceNetwork, namespaces_unavailable_reason, remove_stale_runs

_REASON = namespaces_unavailable_reason()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_REASON is not None, reason=f"network namespaces unavailable: {_REASON}")]

PORT = 9999
CONNECT_TIMEOUT_S = 2.0

_SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16); print("ready", flush=True)
    while True:
        c, _ = s.accept(); c.sendall(b"hi"); c.close()
""")
_CLIENT = textwrap.dedent("""
    import socket, sys
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
        sys.exit(0 if c.recv(2) == b"hi" else 1)
    except OSError:
        sys.exit(1)
""")


def _ns_reaches(net: NamespaceNetwork, src: int, dst: int) -> bool:
    cmd = [*net.command_prefix(src), sys.executable, "-c", _CLIENT, net.node_ip(dst), str(PORT),
           str(CONNECT_TIMEOUT_S)]
    return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0


def _host_reaches(net: NamespaceNetwork, dst: int) -> bool:
    try:
        with socket.create_connection((net.node_ip(dst), PORT), timeout=CONNECT_TIMEOUT_S) as c:
            return c.recv(2) == b"hi"
    except OSError:
        return False


@pytest.fixture
def net() -> Iterator[NamespaceNetwork]:
    network = NamespaceNetwork([1, 2, 3])
    servers = []
    try:
        for n in (1, 2):
            p = subprocess.Popen([*network.command_prefix(n), sys.executable, "-c", _SERVER, network.node_ip(n),
                                  str(PORT)], stdout=subprocess.PIPE, text=True)
            servers.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield network
    finally:
        for p in servers:
            p.kill()
            p.wait(timeout=10)
        network.close()


def test_cut_drops_one_pair_and_heal_restores_it(net: NamespaceNetwork) -> None:
    assert _ns_reaches(net, 2, 1) and _ns_reaches(net, 3, 1) and _host_reaches(net, 1)
    net.cut(1, 2)
    net.cut(2, 1)  # overlapping faults may cut the same pair twice
    assert not _ns_reaches(net, 2, 1) and not _ns_reaches(net, 1, 2)
    assert _ns_reaches(net, 3, 1) and _ns_reaches(net, 3, 2) and _host_reaches(net, 1)  # only the pair is cut
    net.heal()
    wait_for(lambda: _ns_reaches(net, 2, 1), 20, "node 2 reaching node 1 after the heal")


def test_isolate_silences_a_node_for_everyone_until_healed(net: NamespaceNetwork) -> None:
    net.isolate(1)
    assert not _host_reaches(net, 1) and not _ns_reaches(net, 3, 1) and not _ns_reaches(net, 1, 2)
    assert _ns_reaches(net, 3, 2) and _host_reaches(net, 2)
    net.heal()
    wait_for(lambda: _host_reaches(net, 1) and _ns_reaches(net, 3, 1), 20, "node 1 reachable after the heal")


def _listed() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout


def test_close_and_stale_cleanup_remove_every_namespace() -> None:
    closed = NamespaceNetwork([1])
    closed.close()
    assert closed.prefix not in _listed()
    crashed = NamespaceNetwork([1])  # as if its harness were SIGKILLed: owner file names a dead pid
    dead = subprocess.Popen(["true"])
    dead.wait()
    (OWNERS_DIR / crashed.prefix).write_text(f"{dead.pid}\n")
    frozen = subprocess.Popen([*crashed.command_prefix(1), "sleep", "600"])  # a SIGSTOPped node of that run
    wait_for(lambda: Path(f"/proc/{frozen.pid}/cmdline").read_bytes().startswith(b"sleep"), 20,
             "the process to be inside the namespace")  # `ip netns exec` has done setns and exec
    frozen.send_signal(signal.SIGSTOP)
    assert crashed.prefix in _listed()
    try:
        assert crashed.prefix in remove_stale_runs()
        assert crashed.prefix not in _listed()
        assert frozen.wait(timeout=20) == -signal.SIGKILL
    finally:
        frozen.kill()
        crashed.close()
