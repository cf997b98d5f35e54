"""``request.cpu.max.percent.per.ip`` on a real broker (one node, real processes and sockets).

One address pipelining requests as fast as the broker answers them took its interpreter: another address's
requests waited behind that work (broker/cpu_shares.py). Here an address over its share, while another
address has requests too, is made to wait and still gets every answer; a lone client, however busy, is
never held. What is checked is who waits (the broker's counters), never how fast anything went.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from sockets import ATTACKER, connect_from
from waiting import wait_for

from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

SHARE_PERCENT = 5  # of one core: a pipelining flood of ApiVersions passes it many times over
PIPELINE = 5  # requests each connection keeps outstanding (the listener's PIPELINE_DEPTH)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cpu-share"), nodes=1,
                     overrides={"request.cpu.max.percent.per.ip": str(SHARE_PERCENT)})
    with c:
        c.wait_ready(60)
        yield c


def api_versions(correlation_id: int) -> bytes:
    """ApiVersions v0: request header v1 (api key 18, version 0, correlation id, client id), no body."""
    body = struct.pack(">hhih", 18, 0, correlation_id, 4) + b"test"
    return struct.pack(">i", len(body)) + body


def read_answer(s: socket.socket) -> int:
    """The correlation id of the next answer on ``s``."""
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return buf
    (size,) = struct.unpack(">i", exactly(4))
    (correlation_id,) = struct.unpack(">i", exactly(size)[:4])
    return correlation_id


class Flood:
    """``connections`` connections from ``source``, each pipelining ApiVersions, every answer checked."""

    def __init__(self, port: int, source: str, connections: int = 3) -> None:
        self.port, self.source = port, source
        self.answered = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(connections)]

    def __enter__(self) -> Flood:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        assert not any(t.is_alive() for t in self._threads), "a flood connection never finished"

    def _run(self) -> None:
        try:
            with connect_from(self.source, self.port, timeout_s=60) as s:
                sent = 0
                for _ in range(PIPELINE):
                    s.sendall(api_versions(sent))
                    sent += 1
                got = 0
                while got < sent:
                    cid = read_answer(s)
                    if cid != got:
                        self.failures.append(f"answer {cid} where {got} was due")
                        return
                    got += 1
                    self.answered += 1
                    if not self._stop.is_set():
                        s.sendall(api_versions(sent))
                        sent += 1
        except OSError as exc:
            self.failures.append(repr(exc))


def metric(cluster: LocalCluster, name: str) -> float:
    for line in cluster.read_metrics(1).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} in the broker's metrics")


def port(cluster: LocalCluster) -> int:
    return int(cluster.spec(1).kafka_port or 0)


def test_a_lone_client_is_never_held_however_busy(cluster: LocalCluster) -> None:
    before = metric(cluster, "brook_requests_throttled_total")
    with Flood(port(cluster), "127.0.0.1") as flood:
        wait_for(lambda: flood.answered >= 3000 or flood.failures, 120, "3,000 answers to the lone client")
    assert not flood.failures, flood.failures
    assert metric(cluster, "brook_requests_throttled_total") == before, "a client alone on the broker was held"


def test_an_address_over_its_share_waits_while_another_is_served_and_both_get_every_answer(
        cluster: LocalCluster) -> None:
    time.sleep(1.5)  # nothing of the last test's client left in the broker's one-second window
    before = metric(cluster, "brook_requests_throttled_total")
    victim_answers = 0
    with Flood(port(cluster), ATTACKER) as flood:
        wait_for(lambda: flood.answered >= 200 or flood.failures, 60, "the flood under way")
        # Another address with requests of its own: from now on the flood is over its share with company.
        with connect_from("127.0.0.1", port(cluster), timeout_s=60) as victim:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                victim.sendall(api_versions(victim_answers))
                assert read_answer(victim) == victim_answers
                victim_answers += 1
                if victim_answers >= 20 and metric(cluster, "brook_requests_throttled_total") > before:
                    break
                time.sleep(0.05)
            throttled = metric(cluster, "brook_requests_throttled_total") - before
            assert throttled > 0, f"the flood was never held ({flood.answered} answers, {victim_answers} to the other)"
            assert metric(cluster, "brook_request_throttle_seconds_total") > 0
        held_answers = flood.answered
        wait_for(lambda: flood.answered > held_answers + 10 or flood.failures, 60,
                 "the held address still answered")
    assert not flood.failures, f"the held address lost answers or its connection: {flood.failures}"
    # Everyone gone: no address is left held, and a client alone again goes at once.
    wait_for(lambda: metric(cluster, "brook_request_throttled_addresses") == 0, 30, "no address held")
