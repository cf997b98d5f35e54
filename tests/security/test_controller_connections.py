"""The controller's gRPC port bounds its connections (max.connections, at most an eighth of the
descriptor limit), as the broker's port does.

Before, it had no bound: each connection that never shook hands was kept 10 s (the handshake timeout),
a plaintext HTTP/2 one left idle for connections.max.idle.ms, each with a descriptor and ~45 KiB of
the process; 3,000 from one address took 3,000 descriptors and 140 MB of a combined node, whose
partition logs and broker port need the same descriptors. One real node process, the flood from
127.0.0.2.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sockets import ATTACKER, accept_backlog, connect_from
from waiting import wait_for

from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

LIMIT = 8
FLOOD = 80


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_a_connection_flood_on_the_controller_port_takes_at_most_max_connections(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", nodes=1, tls=True, overrides={"max.connections": str(LIMIT)}) as cluster:
        pid = cluster.pid(1)
        assert pid is not None
        port = cluster.spec(1).controller_port
        before = open_fds(pid)
        flood: list[socket.socket] = []
        try:
            for _ in range(FLOOD):
                flood.append(connect_from(ATTACKER, port))
            wait_for(lambda: accept_backlog(port) == 0, 30, f"port {port} to accept the flood")
            # Accepted: the connections past the bound are closed at accept, the others wait for
            # their handshake (held 10 s before; the node's own connections are among the bound's).
            grown = open_fds(pid) - before
            assert grown <= LIMIT + 4, f"{FLOOD} connections to the controller port hold {grown} more descriptors"
        finally:
            for s in flood:
                s.close()
        # And once the flood is gone the node serves on: its broker registered, its quorum led.
        wait_for(lambda: cluster.probe(1, "/readyz", timeout_s=10)[0] == 200, 60, "the node to be ready")
