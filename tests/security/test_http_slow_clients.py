"""A node's HTTP ports (health probes, /metrics, console) answer while slow clients hold connections.

Before, a worker of the port's small pool read each request itself, TLS handshake included, until the
connection's deadline: a client address sending part of a request (or of a ClientHello) on as many
connections as it was allowed (``per_address``, above ``workers`` on every port) held every worker,
and a probe from elsewhere waited behind it; reconnecting as each was cut kept the port from every
probe (an orchestrator then restarts a healthy node), scrape and viewer. And once the port's
``workers + max_pending`` connections were open (a few addresses' shares), every new connection was
closed unread. Now a connection gets a worker only once its request head has arrived, and a full
port closes its oldest connection not being handled to take a new one (broker/http_serving.py).

One real node process with the local cluster's TLS; the slow clients connect from 127.0.0.2 and up,
the probe, scraper and browser from 127.0.0.1. Nothing here waits on a clock: each check is about
order (answered while the slow connections are all still open) or about being answered at all.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from sockets import accept_backlog
from waiting import wait_for

from broker import console, health, metrics
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

ANSWER_S = 30.0  # only so that a broken port fails the test instead of hanging it
# The start of a request that never ends: a request line without its blank line (plain HTTP), the
# header of a 16 KiB TLS handshake record without its body (HTTPS).
PARTIAL_HTTP = b"GET /livez HTTP/1.0\r\nHost: 127.0.0.1\r\n"
PARTIAL_TLS = b"\x16\x03\x01\x40\x00"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("http-slow"), nodes=1, tls=True) as cluster:
        yield cluster


def console_status(node: LocalCluster) -> int:
    c = node.client_cert()
    ctx = ssl.create_default_context(cafile=str(c.ca))
    ctx.load_cert_chain(str(c.cert), str(c.key))
    ctx.check_hostname = False
    with urllib.request.urlopen(node.console_url(1) + "api/throughput", timeout=ANSWER_S, context=ctx) as r:
        return int(r.status)


def metrics_status(node: LocalCluster) -> int:
    return 200 if "brook_node_info" in node.read_metrics(1, timeout_s=ANSWER_S) else 0


def health_status(node: LocalCluster) -> int:
    return node.probe(1, "/livez", timeout_s=ANSWER_S)[0]


# port name: (its per-address share, its connections in all, the partial bytes, a legitimate request)
PORTS: dict[str, tuple[int, int, bytes, Callable[[LocalCluster], int]]] = {
    "health": (health.PER_ADDRESS, health.WORKERS + health.MAX_PENDING, PARTIAL_HTTP, health_status),
    "metrics": (metrics.METRICS_PER_ADDRESS, metrics.METRICS_WORKERS + metrics.METRICS_PENDING, PARTIAL_TLS,
                metrics_status),
    "console": (console.PER_ADDRESS, console.WORKERS + console.MAX_PENDING, PARTIAL_TLS, console_status),
}


def port_of(node: LocalCluster, name: str) -> int:
    spec = node.spec(1)
    return {"health": spec.health_port, "metrics": spec.metrics_port, "console": spec.console_port}[name]


def still_open(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True  # nothing to read and not closed
    except OSError:
        return False


@contextlib.contextmanager
def slow_clients(port: int, sources: list[str], per_source: int, partial: bytes) -> Iterator[list[socket.socket]]:
    """``per_source`` connections from each of ``sources`` that send ``partial`` and then nothing, all
    accepted by the node (its listen queue drained) when this yields."""
    held: list[socket.socket] = []
    try:
        for source in sources:
            for _ in range(per_source):
                s = socket.socket()
                s.bind((source, 0))
                s.settimeout(ANSWER_S)
                s.connect(("127.0.0.1", port))
                s.sendall(partial)
                held.append(s)
        wait_for(lambda: accept_backlog(port) == 0, ANSWER_S, f"port {port} to accept the slow connections")
        yield held
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("name", sorted(PORTS))
def test_one_address_sending_part_of_its_requests_holds_no_worker(node: LocalCluster, name: str) -> None:
    per_address, _, partial, legitimate = PORTS[name]
    with slow_clients(port_of(node, name), ["127.0.0.2"], per_address, partial) as slow:
        assert legitimate(node) == 200
        # Answered while every slow connection is still open: none of them held the worker it needed
        # (before, the answer came only once the slow ones had been cut at their timeout).
        assert all(still_open(s) for s in slow), \
            f"{name}: answered only after {sum(not still_open(s) for s in slow)} slow connection(s) were cut"


@pytest.mark.parametrize("name", sorted(PORTS))
def test_a_port_full_of_slow_connections_from_many_addresses_still_takes_a_probe(node: LocalCluster,
                                                                                 name: str) -> None:
    per_address, capacity, partial, legitimate = PORTS[name]
    sources = [f"127.0.0.{2 + i}" for i in range(-(-capacity // per_address))]
    with slow_clients(port_of(node, name), sources, per_address, partial):
        # Before, a full port closed every new connection unread: the probe got a reset.
        assert legitimate(node) == 200
