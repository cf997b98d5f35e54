"""``request.cpu.max.percent.per.ip`` on a real broker (one node, real processes and sockets).

One address pipelining requests as fast as the broker answers them took its interpreter: another address's
requests waited behind that work (broker/cpu_shares.py). Here an address over its share, while another
address has requests too, is made to wait and still gets every answer; a lone client, however busy, is
never held. The floods are Kafka-protocol requests and gRPC request streams (ProduceStream, FetchStream:
a stream's requests once never waited). What is checked is who waits (the broker's counters), never how
fast anything went.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from brokerkit import make_batch
from sockets import ATTACKER, connect_from, relayed_from
from waiting import wait_for

from client.admin import Admin
from deploy.local.cluster import LocalCluster
from proto import broker_pb2, broker_pb2_grpc
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow

SHARE_PERCENT = 5  # of one core: a pipelining flood of ApiVersions passes it many times over
PIPELINE = 5  # requests each connection keeps outstanding (the listener's PIPELINE_DEPTH)
TOPIC = "flood"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cpu-share"), nodes=1,
                     overrides={"request.cpu.max.percent.per.ip": str(SHARE_PERCENT)})
    with c:
        c.wait_ready(60)
        with Admin(c.bootstrap_servers, controller_endpoints=c.controller_endpoints) as admin:
            admin.create_topic(TOPIC, 1, 1)
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
    """``threads`` threads flooding the broker from ``source`` (``_run``), counting the answers and what went
    wrong; stopped on exit."""

    def __init__(self, port: int, source: str, threads: int = 3) -> None:
        self.port, self.source = port, source
        self.answered = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Flood:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        assert not any(t.is_alive() for t in self._threads), f"{type(self).__name__} never finished"

    def _run(self) -> None:
        raise NotImplementedError


class KafkaFlood(Flood):
    """A connection a thread from ``source``, each pipelining ApiVersions, every answer checked."""

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
    with KafkaFlood(port(cluster), "127.0.0.1") as flood:
        wait_for(lambda: flood.answered >= 3000 or flood.failures, 120, "3,000 answers to the lone client")
    assert not flood.failures, flood.failures
    assert metric(cluster, "brook_requests_throttled_total") == before, "a client alone on the broker was held"


def test_an_address_over_its_share_waits_while_another_is_served_and_both_get_every_answer(
        cluster: LocalCluster) -> None:
    time.sleep(1.5)  # nothing of the last test's client left in the broker's one-second window
    before = metric(cluster, "brook_requests_throttled_total")
    with KafkaFlood(port(cluster), ATTACKER) as flood, connect_from("127.0.0.1", port(cluster), timeout_s=60) as victim:
        asked = 0

        def ask() -> None:
            nonlocal asked
            victim.sendall(api_versions(asked))
            assert read_answer(victim) == asked
            asked += 1
        held_while_another_is_served(cluster, flood, ask, before)
    assert not flood.failures, f"the held address lost answers or its connection: {flood.failures}"
    # Everyone gone: no address is left held, and a client alone again goes at once.
    wait_for(lambda: metric(cluster, "brook_request_throttled_addresses") == 0, 30, "no address held")


def held_while_another_is_served(cluster: LocalCluster, flood: Flood, ask: Callable[[], None], before: float) -> None:
    """With ``flood`` under way, another address (127.0.0.1) asks (``ask``, checked) every 50 ms until the
    flood is held; the held flood must still be answered."""
    wait_for(lambda: flood.answered >= 200 or flood.failures, 60, "the flood under way")
    # Another address with requests of its own: from now on the flood is over its share with company.
    asked, deadline = 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        ask()
        asked += 1
        if asked >= 20 and metric(cluster, "brook_requests_throttled_total") > before:
            break
        time.sleep(0.05)
    throttled = metric(cluster, "brook_requests_throttled_total") - before
    assert throttled > 0, f"the flood was never held ({flood.answered} answers, {asked} to the other address)"
    assert metric(cluster, "brook_request_throttle_seconds_total") > 0
    held_answers = flood.answered
    wait_for(lambda: flood.answered > held_answers + 10 or flood.failures, 60, "the held address still answered")


class StreamFlood(Flood):
    """A gRPC request stream (``method`` of BrokerService) from ``source``, through a relay: PIPELINE
    requests unanswered at a time, each answer checked (``problem`` says what is wrong with one, or None)."""

    def __init__(self, port: int, method: str, request: Any, problem: Callable[[Any], str | None],
                 source: str = ATTACKER) -> None:
        super().__init__(port, source, 1)
        self.method, self.request, self.problem = method, request, problem

    def _run(self) -> None:
        room = threading.Semaphore(PIPELINE)

        def requests() -> Iterator[Any]:
            while not self._stop.is_set():
                if room.acquire(timeout=0.1):
                    yield self.request
        try:
            with relayed_from(self.source, self.port) as local, grpc.insecure_channel(f"127.0.0.1:{local}") as ch:
                for answer in getattr(broker_pb2_grpc.BrokerServiceStub(ch), self.method)(requests(), timeout=300):
                    if (problem := self.problem(answer)) is not None:
                        self.failures.append(problem)
                        return
                    self.answered += 1
                    room.release()
        except grpc.RpcError as exc:
            self.failures.append(f"{exc.code()}: {exc.details()}")


def partition_errors(answer: Any) -> str | None:
    bad = [(p.error_code, p.error_message) for p in answer.partitions if p.error_code != ErrorCode.NONE]
    return f"partition errors {bad}" if bad or not answer.partitions else None


@pytest.mark.parametrize("method", ["ProduceStream", "FetchStream"])
def test_a_request_stream_over_its_share_waits_while_another_address_is_served(
        cluster: LocalCluster, method: str) -> None:
    time.sleep(1.5)  # nothing of the last test's clients left in the broker's one-second window
    with grpc.insecure_channel(cluster.broker_address(1)) as ch:
        victim = broker_pb2_grpc.BrokerServiceStub(ch)
        records = make_batch(*[b"x" * 100] * 10)
        produce = broker_pb2.ProduceRequest(acks=1, timeout_ms=30_000, partitions=[
            broker_pb2.ProducePartitionData(topic=TOPIC, partition=0, records=records)])
        assert partition_errors(victim.Produce(produce, timeout=30)) is None  # something to fetch
        if method == "ProduceStream":
            request: Any = produce
        else:
            request = broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, partitions=[
                broker_pb2.FetchPartition(topic=TOPIC, partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                          current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])
        before = metric(cluster, "brook_requests_throttled_total")
        with StreamFlood(int(cluster.spec(1).broker_port or 0), method, request, partition_errors) as flood:
            def ask() -> None:
                answer = victim.Metadata(broker_pb2.MetadataRequest(topics=[TOPIC]), timeout=30)
                assert [t.name for t in answer.topics] == [TOPIC], answer
            held_while_another_is_served(cluster, flood, ask, before)
    assert not flood.failures, f"the held stream lost answers or ended: {flood.failures}"
    wait_for(lambda: metric(cluster, "brook_request_throttled_addresses") == 0, 30, "no address held")
