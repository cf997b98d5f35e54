"""A node's HTTP ports (metrics, health probes, console) keep answering whoever else connects, and
its gRPC ports do not keep a connection that never shakes hands.

Before, the HTTPS /metrics server (prometheus_client's) shook hands inside its accept loop: one TCP
connection that never sent a ClientHello held the port for good. Its plaintext server started a
thread per connection with no timeout: idle connections piled up threads and file descriptors.
The health server took one connection at a time, so a client trickling its request held every
probe off it (an orchestrator then restarts the node). All three now use broker/http_serving.py.

One real node process with the local cluster's TLS (HTTPS metrics, HTTPS console, plain health);
the attacker connects from 127.0.0.2, the legitimate scraper, probe and browser from 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sockets import ATTACKER, accept_backlog, connect_from
from waiting import wait_for

from broker.health import PER_ADDRESS as HEALTH_PER_ADDRESS
from broker.health import REQUEST_TIMEOUT_S as HEALTH_DEADLINE_S
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

ANSWER_S = 5.0  # what a scrape or probe may take while the attack runs: generous, not a speed assert
FLOOD = 150  # idle connections per port


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("http-ports"), nodes=1, tls=True) as cluster:
        yield cluster


def ports(node: LocalCluster) -> dict[str, int]:
    spec = node.spec(1)
    return {"metrics": spec.metrics_port, "health": spec.health_port, "console": spec.console_port}


@contextlib.contextmanager
def idle_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections from the attacker's address that send nothing."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(connect_from(ATTACKER, port))
        # Accepted, and then queued or closed (before, an HTTPS server shook hands with the first in
        # its accept loop and never took the others).
        wait_for(lambda: accept_backlog(port) == 0, ANSWER_S, f"port {port} to accept its connections")
        yield socks
    finally:
        for s in socks:
            s.close()


def proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def console_answers(node: LocalCluster) -> int:
    """The console's HTTP status for its page (with the cluster's client certificate)."""
    c = node.client_cert()
    ctx = ssl.create_default_context(cafile=str(c.ca))
    ctx.load_cert_chain(str(c.cert), str(c.key))
    ctx.check_hostname = False
    with urllib.request.urlopen(node.console_url(1), timeout=ANSWER_S, context=ctx) as r:
        return int(r.status)


def test_a_client_that_never_shakes_hands_does_not_hold_the_https_metrics_port(node: LocalCluster) -> None:
    with idle_connections(ports(node)["metrics"], 3):
        started = time.monotonic()
        page = node.read_metrics(1, timeout_s=ANSWER_S)
        assert "brook_node_info" in page, page[:300]
        assert time.monotonic() - started < ANSWER_S


def test_idle_connections_take_neither_threads_nor_descriptors_and_others_are_answered(node: LocalCluster) -> None:
    pid = node.pid(1)
    assert pid is not None
    threads_before, fds_before = proc_status(pid, "Threads"), open_fds(pid)
    with contextlib.ExitStack() as stack:
        for port in ports(node).values():
            stack.enter_context(idle_connections(port, FLOOD))
        threads, fds = proc_status(pid, "Threads"), open_fds(pid)
        # Before, the plaintext metrics server started a thread for each (150) and kept its socket.
        assert threads - threads_before <= 40, f"{threads - threads_before} more threads with {3 * FLOOD} idle connections"
        assert fds - fds_before <= 100, f"{fds - fds_before} more descriptors with {3 * FLOOD} idle connections"
        assert "brook_node_info" in node.read_metrics(1, timeout_s=ANSWER_S)
        status, body = node.probe(1, "/livez", timeout_s=ANSWER_S)
        assert status == 200, body
        assert console_answers(node) == 200


def test_a_request_trickled_a_byte_at_a_time_is_cut_at_the_deadline(node: LocalCluster) -> None:
    # A slowloris: each byte in time for the per-read timeout, the request never finished. It is cut
    # once the connection's deadline has passed, and while it lasts, probes from elsewhere are answered.
    port = ports(node)["health"]
    trickling: list[socket.socket] = []
    try:
        for _ in range(HEALTH_PER_ADDRESS + 2):  # past the address's share: the extra ones are closed at once
            s = connect_from(ATTACKER, port)
            s.sendall(b"G")
            trickling.append(s)
        started = time.monotonic()
        status, body = node.probe(1, "/readyz", timeout_s=ANSWER_S)
        assert status == 200, body

        def cut() -> bool:
            for s in list(trickling):
                try:
                    s.sendall(b"E")
                except OSError:
                    trickling.remove(s)  # the broker closed it
            return not trickling
        wait_for(cut, HEALTH_DEADLINE_S + ANSWER_S, lambda: f"{len(trickling)} trickling connections still open "
                 f"{time.monotonic() - started:.1f} s after they started", poll_s=0.3)
    finally:
        for s in trickling:
            s.close()


def test_a_grpc_connection_that_never_shakes_hands_is_closed(node: LocalCluster) -> None:
    # gRPC's default lets a TLS handshake take 120 s: a client that connects and sends nothing held
    # one of max.connections that long. Both gRPC ports (broker, controller) now close it after 10 s.
    from broker.tls import HANDSHAKE_TIMEOUT_MS

    spec = node.spec(1)
    silent: dict[str, socket.socket] = {}
    try:
        for name, port in (("broker", spec.broker_port), ("controller", spec.controller_port)):
            s = connect_from(ATTACKER, port)
            s.setblocking(False)
            silent[name] = s
        started = time.monotonic()

        def closed() -> bool:
            for name, s in list(silent.items()):
                try:
                    if s.recv(1) == b"":
                        del silent[name]
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    del silent[name]
            return not silent
        wait_for(closed, HANDSHAKE_TIMEOUT_MS / 1000 + 2 * ANSWER_S,
                 lambda: f"{sorted(silent)} still open {time.monotonic() - started:.1f} s after connecting",
                 poll_s=0.2)
    finally:
        for s in silent.values():
            s.close()
