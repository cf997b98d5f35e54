"""Producer retries under real faults: lost responses (idempotent dedupe), a SIGKILLed leader, a leader's failed disk."""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from clientkit import consume_all
from waiting import wait_for

from client import errors
from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.streams import refused_unread
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster
from proto.errors import STREAM_REFUSED_METADATA_KEY

pytestmark = pytest.mark.slow


class _LostResponse(grpc.RpcError):
    """What the producer sees when a connection dies after the broker answered."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "response dropped by the test"

    def result(self, timeout: float | None = None) -> None:
        raise self

    def exception(self, timeout: float | None = None) -> BaseException:
        return self

    def done(self) -> bool:
        return True

    def add_done_callback(self, fn) -> None:
        fn(self)

    def cancel(self) -> bool:
        return False


class DropProduceResponses(grpc.UnaryUnaryClientInterceptor):
    """Lets chosen Produce requests reach the broker and be written, then throws the answer away."""

    def __init__(self, drop_requests: set[int]) -> None:
        self.drop_requests = drop_requests
        self.seen = 0
        self.dropped = 0
        self.lock = threading.Lock()

    def intercept_unary_unary(self, continuation, client_call_details, request):
        call = continuation(client_call_details, request)
        if not client_call_details.method.endswith("/Produce"):
            return call
        with self.lock:
            index = self.seen
            self.seen += 1
        if index not in self.drop_requests:
            return call
        call.result()  # the broker has appended (and answered): only the answer is lost
        with self.lock:
            self.dropped += 1
        return _LostResponse()


class _AnswersUntilLost:
    """A ProduceStream call that breaks, as a dying connection does, right after a chosen answer arrives."""

    def __init__(self, call, dropper: DropProduceStreamAnswers) -> None:
        self._call = call
        self._dropper = dropper

    def __iter__(self):
        return self

    def __next__(self):
        response = next(self._call)
        if self._dropper.drop_next():
            self._call.cancel()
            raise _LostResponse()
        return response

    def cancel(self) -> bool:
        return self._call.cancel()

    def __getattr__(self, name: str):
        return getattr(self._call, name)


class DropProduceStreamAnswers(grpc.StreamStreamClientInterceptor):
    """Lets chosen answers of the producer's ProduceStreams arrive (the broker appended and answered),
    then breaks the stream: that answer and every later one still unanswered on the stream are lost."""

    def __init__(self, drop_answers: set[int]) -> None:
        self.drop_answers = drop_answers
        self.seen = 0
        self.dropped = 0
        self.lock = threading.Lock()

    def drop_next(self) -> bool:
        with self.lock:
            index = self.seen
            self.seen += 1
            if index in self.drop_answers:
                self.dropped += 1
                return True
        return False

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        call = continuation(client_call_details, request_iterator)
        if not client_call_details.method.endswith("/ProduceStream"):
            return call
        return _AnswersUntilLost(call, self)


class _Unimplemented(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNIMPLEMENTED

    def details(self) -> str:
        return "Method not found!"

    def __iter__(self):
        return self

    def __next__(self):
        raise self

    def cancel(self) -> bool:
        return False


class _Refused(_Unimplemented):
    def __init__(self, code: grpc.StatusCode, trailing: tuple[tuple[str, str], ...]) -> None:
        self._code, self._trailing = code, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


@pytest.mark.parametrize(("code", "trailing", "unread"), [
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ((STREAM_REFUSED_METADATA_KEY, "1"),), True),
    # Refused after requests were read (the broker's byte budget): they may have been appended, so
    # they are retried as errors, not resent as if never sent.
    (grpc.StatusCode.RESOURCE_EXHAUSTED, (), False),
    (grpc.StatusCode.UNAVAILABLE, ((STREAM_REFUSED_METADATA_KEY, "1"),), False),
])
def test_a_stream_refused_before_any_request_was_read_is_told_apart(code: grpc.StatusCode, trailing: tuple,
                                                                     unread: bool) -> None:
    assert refused_unread(_Refused(code, trailing)) is unread


class RefuseProduceStream(grpc.StreamStreamClientInterceptor):
    """Answers ProduceStream as a broker of an older version does (UNIMPLEMENTED, nothing handled), so
    the producer sends unary Produce calls, the path where a broker may handle requests out of order."""

    def __init__(self) -> None:
        self.refused = 0

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        if not client_call_details.method.endswith("/ProduceStream"):
            return continuation(client_call_details, request_iterator)
        self.refused += 1
        return _Unimplemented()


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_idempotent_retry_after_lost_responses_writes_each_record_once_in_order(cluster, new_topic,
                                                                                 transport: str) -> None:
    topic = new_topic(partitions=1)
    if transport == "stream":
        dropper: DropProduceResponses | DropProduceStreamAnswers = DropProduceStreamAnswers({0, 2, 5})
        interceptors: list = [dropper]
    else:
        refuser = RefuseProduceStream()
        dropper = DropProduceResponses({0, 2, 5})
        interceptors = [refuser, dropper]
    n = 400
    with Producer(bootstrap_servers=cluster.bootstrap_servers, interceptors=interceptors, linger_ms=2,
                  batch_size=2000, retry_backoff_ms=20) as producer:
        assert producer.idempotent
        futures = [producer.send(topic, b"%06d" % i) for i in range(n)]
        producer.flush()
        metas = [f.get(timeout=20) for f in futures]
    assert dropper.dropped == 3, f"fault not injected: {dropper.dropped} responses dropped of {dropper.seen}"
    if transport == "unary":
        assert refuser.refused == 1, f"ProduceStream asked for {refuser.refused} times after UNIMPLEMENTED"
    got = consume_all(cluster.bootstrap_servers, topic, 1, n)[0]
    values = [r.value for r in got]
    assert values == [b"%06d" % i for i in range(n)], (
        f"{len(values)} records stored for {n} sent; duplicates: {len(values) - len(set(values))}")
    reported = [m.offset for m in metas if m.offset >= 0]
    assert reported == sorted(reported) and len(set(reported)) == len(reported)
    by_offset = {r.offset: r.value for r in got}
    assert all(by_offset[m.offset] == b"%06d" % i for i, m in enumerate(metas) if m.offset >= 0)


@pytest.fixture(scope="module")
def fault_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("client-faults"), nodes=3) as c:
        yield c


def test_delivery_timeout_fails_records_while_the_leader_is_frozen(fault_cluster: LocalCluster) -> None:
    topic = "frozen-leader"
    with Admin(fault_cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
    with Producer(bootstrap_servers=fault_cluster.bootstrap_servers, linger_ms=0, request_timeout_ms=1000,
                  delivery_timeout_ms=1500, retry_backoff_ms=50) as producer:
        assert producer.send(topic, b"warm-up").get(timeout=10).offset == 0
        fault_cluster.pause_node(leader)  # SIGSTOP: connections stay open, nothing answers
        try:
            start = time.monotonic()
            futures = [producer.send(topic, b"%d" % i) for i in range(10)]
            errors_seen = [f.exception(timeout=10) for f in futures]
            elapsed = time.monotonic() - start
        finally:
            fault_cluster.resume_node(leader)
    assert all(isinstance(e, errors.RequestTimedOutError) for e in errors_seen), errors_seen
    # delivery.timeout.ms bounds it (plus one in-flight request timeout), well before the 6 s fencing.
    assert elapsed < 6, f"records failed only after {elapsed:.1f} s"



# A leader frozen with its connections open: the controller fences its broker after
# broker.session.timeout.ms (6 s on the launcher) and elects another; the producer's calls to the
# frozen process end when its HTTP/2 pings go unanswered for 5 s, and its reconnects when no
# SETTINGS frame comes within 5 s, instead of after request.timeout.ms (30 s). Measured 10 s here.
FROZEN_LEADER_WRITE_BOUND_S = 20


def test_writes_and_reads_go_on_within_a_bound_while_the_leader_is_frozen(fault_cluster: LocalCluster) -> None:
    """Liveness, with the clients' defaults (request.timeout.ms 30 s, delivery.timeout.ms 120 s): every
    record sent after the leader is SIGSTOPped is written by its successor well before one request
    timeout, once, in order after the records acknowledged before; a consumer that was reading from
    the frozen leader reads them from its successor within the same bound."""
    topic = "frozen-leader-liveness"
    tp = TopicPartition(topic, 0)
    with Admin(fault_cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
    before = [b"before-%d" % i for i in range(5)]
    during = [b"during-%d" % i for i in range(20)]
    with (Producer(bootstrap_servers=fault_cluster.bootstrap_servers, acks="all") as producer,
          Consumer(bootstrap_servers=fault_cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer):
        for v in before:
            producer.send(topic, v).get(timeout=30)
        consumer.assign([tp])
        read: list[bytes] = []

        def read_up_to(n: int) -> bool:
            for records in consumer.poll(timeout_ms=200).values():
                read.extend(r.value for r in records)
            return len(read) >= n

        wait_for(lambda: read_up_to(len(before)), 30, lambda: f"the records before the freeze read (read {read})")
        fault_cluster.pause_node(leader)
        try:
            start = time.monotonic()
            futures = [producer.send(topic, v) for v in during]
            offsets = [f.get(timeout=FROZEN_LEADER_WRITE_BOUND_S + 15).offset for f in futures]
            written_s = time.monotonic() - start
            wait_for(lambda: read_up_to(len(before) + len(during)), FROZEN_LEADER_WRITE_BOUND_S + 15,
                     lambda: f"the records written after the freeze read (read {len(read)})", poll_s=0)
            read_s = time.monotonic() - start
        finally:
            fault_cluster.resume_node(leader)
    print(f"records sent to a frozen leader written by its successor after {written_s:.1f} s, read after {read_s:.1f} s")
    assert written_s < FROZEN_LEADER_WRITE_BOUND_S, (
        f"writes resumed only after {written_s:.1f} s (request.timeout.ms is 30 s: the frozen leader was not noticed)")
    assert read_s < FROZEN_LEADER_WRITE_BOUND_S, f"the consumer read the new leader's records only after {read_s:.1f} s"
    assert offsets == list(range(5, 25)), offsets
    assert read == before + during, read
    fault_cluster.wait_ready(90)
    with Admin(fault_cluster.bootstrap_servers) as admin:
        # The resumed broker answers from its metadata as it was when it froze until its watch catches
        # up (as a Kafka broker does); the new leader epoch shows on every broker soon after.
        seen: list[object] = []

        def failed_over() -> bool:
            seen.append(admin.describe_topics([topic])[topic].partitions[0])
            return seen[-1].leader_epoch >= 1  # type: ignore[attr-defined]
        wait_for(failed_over, 30, lambda: f"the partition's new leader epoch in the metadata (last seen {seen[-1:]})")
    values = [r.value for r in consume_all(fault_cluster.bootstrap_servers, topic, 1, 25)[0]]
    assert values == before + during, values


def test_writes_go_on_when_the_leaders_disk_fails(fault_cluster: LocalCluster) -> None:
    """A real disk fault under a partition leader: its process's file size limit (RLIMIT_FSIZE) set
    just above every file it has, so the append that grows the partition's segment past it fails
    with EFBIG, as writes fail on a full disk. The broker halts (exit code 4; it used to answer
    KAFKA_STORAGE_ERROR to every write of that partition for as long as it ran), the controller
    elects an in-sync replica, and every record the producer sends is written there within a bound,
    in order, after the ones acknowledged before; started again, the broker catches up."""
    topic = "disk-fault"
    with Admin(fault_cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 3, {"min.insync.replicas": "2"})])
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
    pid = fault_cluster.pid(leader)
    assert pid is not None
    values = [b"before-%03d" % i for i in range(20)] + [b"after-%03d-" % i + b"x" * 10_000 for i in range(60)]
    with Producer(bootstrap_servers=fault_cluster.bootstrap_servers, linger_ms=0, request_timeout_ms=3000,
                  delivery_timeout_ms=120_000, retry_backoff_ms=100) as producer:
        for v in values[:20]:
            producer.send(topic, v).get(timeout=30)
        # Every file it writes may grow by 256 KiB (its own log too); the 600 KB of records below may not.
        # Index files are left out: sized in advance and written through an mmap, the limit is not theirs.
        largest = max(f.stat().st_size for f in fault_cluster.node_dir(leader).rglob("*")
                      if f.is_file() and not f.name.endswith("index"))
        _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (largest + 256 * 1024, hard))
        started = time.monotonic()
        futures = [producer.send(topic, v) for v in values[20:]]
        for f in futures:
            f.get(timeout=150)
        took = time.monotonic() - started
    wait_for(lambda: fault_cluster.returncode(leader) is not None, 30, "the leader's process to exit")
    assert fault_cluster.returncode(leader) == 4, fault_cluster.log_tail(leader, 40)
    assert "halting the broker" in fault_cluster.log_tail(leader, 200), fault_cluster.log_tail(leader, 40)
    with Admin(fault_cluster.bootstrap_servers) as admin:
        new_leader = admin.describe_topics([topic])[topic].partitions[0].leader
    assert new_leader not in (leader, -1)
    # A bound on the outage (the broker session timeout, then an election), far above its length and
    # below the producer's delivery timeout: the writes came back by themselves.
    assert took < 90, f"the 60 records took {took:.0f} s to be written after the leader's disk failed"
    got = [r.value for r in consume_all(fault_cluster.bootstrap_servers, topic, 1, len(values), timeout_s=30)[0]]
    assert got == values, f"{len(got)} records read back for {len(values)} acknowledged"
    fault_cluster.start_node(leader)  # the disk is "fixed": a new process has no such limit
    fault_cluster.wait_ready(90)

    def back_in_sync() -> bool:
        with Admin(fault_cluster.bootstrap_servers) as admin:
            return leader in admin.describe_topics([topic])[topic].partitions[0].isr
    wait_for(back_in_sync, 60, "the restarted broker back in the ISR")


def test_producer_and_consumer_ride_out_leader_sigkill(fault_cluster: LocalCluster) -> None:
    topic = "leader-kill"
    tp = TopicPartition(topic, 0)
    with Admin(fault_cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
    n = 3000
    acked = [0]
    consumed: list[bytes] = []
    consumer = Consumer(bootstrap_servers=fault_cluster.bootstrap_servers, auto_offset_reset="earliest",
                        request_timeout_ms=5000, fetch_max_wait_ms=100)
    consumer.assign([tp])

    def consume(timeout_ms: int) -> None:
        for records in consumer.poll(timeout_ms=timeout_ms).values():
            consumed.extend(r.value for r in records)

    with Producer(bootstrap_servers=fault_cluster.bootstrap_servers, linger_ms=5, request_timeout_ms=3000,
                  delivery_timeout_ms=60000, retry_backoff_ms=50) as producer:
        def on_ack(md, err):
            if err is None:
                acked[0] += 1

        futures = []
        start = time.monotonic()
        for i in range(n):
            futures.append(producer.send(topic, b"%06d" % i, on_delivery=on_ack))
            if i == n // 3:
                deadline = time.monotonic() + 20
                while acked[0] < n // 4:
                    assert time.monotonic() < deadline, "no acks before the kill"
                    time.sleep(0.01)
                consume(1000)
                assert consumed, "the consumer read nothing from the first leader"
                fault_cluster.kill_node(leader)
            if i % 50 == 0:
                consume(0)
                time.sleep(max(0.0, start + i / 2000 - time.monotonic()))  # ~2000 records/s
        producer.flush()
        failures = [f.exception(timeout=0) for f in futures if f.exception(timeout=0) is not None]
    assert not failures, f"{len(failures)} sends failed, first: {failures[0]!r}"
    with Admin(fault_cluster.bootstrap_servers) as admin:
        new_leader = admin.describe_topics([topic])[topic].partitions[0].leader
    assert new_leader not in (leader, -1), f"leadership did not move off the killed broker {leader}"
    deadline = time.monotonic() + 30
    while len(consumed) < n and time.monotonic() < deadline:
        consume(500)
    consumer.close()
    expected = [b"%06d" % i for i in range(n)]
    assert consumed == expected, (
        f"the consumer saw {len(consumed)} records across the failover, {len(consumed) - len(set(consumed))} dup")
    got = consume_all(fault_cluster.bootstrap_servers, topic, 1, n, timeout_s=30)[0]
    values = [r.value for r in got]
    assert values == expected, (
        f"{len(values)} records stored for {n} sent, {len(values) - len(set(values))} duplicates")
