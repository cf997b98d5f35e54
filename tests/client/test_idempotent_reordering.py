"""Idempotent producers with pipelined lz4 batches, lost responses and gRPC reordering: exactly once, in order.

Several producers (acks=all, linger.ms=10, lz4, max.in.flight=5) write to six partitions
(RF 3) of a real cluster while some Produce responses are thrown away after the broker
wrote the batch, and some requests (each producer's first among them) are held back on
the client side so that later requests overtake them, as a slow link does. Brokers
handle one connection's unary requests concurrently anyway, so a batch may reach a partition
before an earlier one of the same producer: the broker refuses it (a new producer must
start at sequence 0, a known one must not skip) and the producer retries it after the
earlier batch. Everything is then read back.

The producers send unary Produce calls here, as to a broker without ProduceStream (whose
requests are appended in the order sent, so nothing can overtake on it): the brokers answer
ProduceStream UNIMPLEMENTED (RefuseProduceStream).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import grpc
import pytest
from clientkit import consume_all
from test_producer_faults import DropProduceResponses, RefuseProduceStream

from client.admin import Admin, NewTopic
from client.cluster import ClusterClient
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow

PRODUCERS = 3
RECORDS_EACH = 20_000
PARTITIONS = 6


class _CountRefusals(logging.Handler):
    """Counts the sender's retries after a sequence refusal (a figure for the failure message)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.refusals = 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "OUT_OF_ORDER_SEQUENCE_NUMBER" in msg or "UNKNOWN_PRODUCER_ID" in msg:
            self.refusals += 1


class DelayProduceRequests(grpc.UnaryUnaryClientInterceptor):
    """Holds chosen Produce requests back before they leave, so later ones overtake them."""

    def __init__(self, delay_requests: set[int], delay_s: float) -> None:
        self.delay_requests = delay_requests
        self.delay_s = delay_s
        self.seen = 0
        self.lock = threading.Lock()

    def intercept_unary_unary(self, continuation, client_call_details, request):
        if client_call_details.method.endswith("/Produce"):
            with self.lock:
                index = self.seen
                self.seen += 1
            if index in self.delay_requests:
                time.sleep(self.delay_s)  # this request's pool thread only; the others go on
        return continuation(client_call_details, request)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _produce(bootstrap: str, topic: str, producer_no: int, interceptors: list[grpc.UnaryUnaryClientInterceptor |
                                                                        grpc.StreamStreamClientInterceptor],
             sent: dict[int, list[tuple[int, int, int]]]) -> None:
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=10, compression_type="lz4",
                  max_in_flight_requests_per_connection=5, batch_size=4096, retry_backoff_ms=20,
                  enable_idempotence=True, interceptors=interceptors) as producer:
        futures = [producer.send(topic, b"p%d-%07d" % (producer_no, i), key=b"key-%d" % (i % 24))
                   for i in range(RECORDS_EACH)]
        producer.flush(120)
        # (index, partition, offset): offset -1 when the answer was a duplicate's
        sent[producer_no] = [(i, m.partition, m.offset) for i, m in
                             enumerate(f.get(timeout=0) for f in futures)]


def test_pipelined_lz4_producers_with_lost_responses_write_each_record_once_in_send_order(
        cluster, new_topic) -> None:
    topic = new_topic(partitions=PARTITIONS, replication_factor=3)
    droppers = [DropProduceResponses(set(range(5 + p, 200, 9))) for p in range(PRODUCERS)]
    delayers = [DelayProduceRequests({0, 1, *range(12 + p, 200, 11)}, 0.1) for p in range(PRODUCERS)]
    sent: dict[int, list[tuple[int, int, int]]] = {}
    errors_seen: list[BaseException] = []
    counter = _CountRefusals()
    sender_log = logging.getLogger("client.sender")
    old_level = sender_log.level
    sender_log.setLevel(logging.DEBUG)
    sender_log.addHandler(counter)

    def run(p: int) -> None:
        try:
            _produce(cluster.bootstrap_servers, topic, p, [RefuseProduceStream(), delayers[p], droppers[p]], sent)
        except BaseException as exc:  # reported by the main thread
            errors_seen.append(exc)

    try:
        threads = [threading.Thread(target=run, args=(p,)) for p in range(PRODUCERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        sender_log.removeHandler(counter)
        sender_log.setLevel(old_level)
    assert not errors_seen, f"a producer failed: {errors_seen[0]!r}"
    assert sorted(sent) == list(range(PRODUCERS)), f"producers still running or lost: {sorted(sent)}"
    dropped = [d.dropped for d in droppers]
    assert all(dropped), f"fault not injected: responses dropped per producer {dropped}"

    total = PRODUCERS * RECORDS_EACH
    got = consume_all(cluster.bootstrap_servers, topic, PARTITIONS, total, timeout_s=90)
    stored = [r.value for records in got.values() for r in records]
    counts: dict[bytes, int] = defaultdict(int)
    for v in stored:
        counts[v] += 1
    dups = [v for v, c in counts.items() if c > 1]
    expected = {b"p%d-%07d" % (p, i) for p in range(PRODUCERS) for i in range(RECORDS_EACH)}
    missing = expected - counts.keys()
    assert not dups and not missing and len(stored) == total, (
        f"{len(stored)} records stored for {total} sent: {len(missing)} missing (e.g. {sorted(missing)[:3]}), "
        f"{len(dups)} duplicated (e.g. {dups[:3]}); {counter.refusals} sequence refusals retried, "
        f"responses dropped {dropped}")

    for partition, records in got.items():
        by_producer: dict[int, list[int]] = defaultdict(list)
        for r in records:
            p, i = r.value[1:].split(b"-")
            by_producer[int(p)].append(int(i))
        for p, indexes in by_producer.items():
            expected_order = [i for i, part, _off in sent[p] if part == partition]
            assert indexes == expected_order, (
                f"partition {partition}, producer {p}: stored order differs from send order at "
                f"{_first_difference(indexes, expected_order)} "
                f"({len(indexes)} stored, {len(expected_order)} sent there)")
        offsets = {r.offset: r.value for r in records}
        for p in range(PRODUCERS):
            wrong = [(i, off) for i, part, off in sent[p]
                     if part == partition and off >= 0 and offsets.get(off) != b"p%d-%07d" % (p, i)]
            assert not wrong, f"partition {partition}: reported offsets hold other records, e.g. {wrong[:3]}"


def test_broker_answers_an_overtaking_first_batch_with_out_of_order_sequence_and_writes_nothing(
        cluster, new_topic, admin) -> None:
    from proto import broker_pb2
    from storage.record_batch import RecordBatchBuilder

    topic = new_topic(partitions=1, replication_factor=3)
    leader = admin.describe_topics([topic])[topic].partitions[0].leader
    with ClusterClient(cluster.bootstrap_servers) as cc:
        producer_id, epoch = cc.init_producer_id()

        def produce(seq: int, count: int) -> broker_pb2.ProducePartitionResponse:
            b = RecordBatchBuilder(producer_id=producer_id, producer_epoch=epoch, base_sequence=seq)
            for i in range(count):
                b.append(int(time.time() * 1000), None, b"seq-%d" % (seq + i))
            req = broker_pb2.ProduceRequest(acks=-1, timeout_ms=10000, partitions=[
                broker_pb2.ProducePartitionData(topic=topic, partition=0, records=b.build())])
            # The controller names the leader before that broker has applied the change; until
            # then it answers NOT_LEADER_OR_FOLLOWER / LEADER_NOT_AVAILABLE and appends nothing,
            # so asking again is safe.
            deadline = time.monotonic() + 15
            while True:
                answer = cc.broker_stub(leader).Produce(req, timeout=15).partitions[0]
                settling = answer.error_code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE)
                if not settling or time.monotonic() > deadline:
                    return answer
                time.sleep(0.05)

        refused = produce(3, 2)
        assert refused.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, refused
        assert "expected sequence 0" in refused.error_message, refused.error_message
        first, second = produce(0, 3), produce(3, 2)
        assert (first.error_code, first.base_offset, second.error_code, second.base_offset) == (0, 0, 0, 3), (
            first, second)
    got = consume_all(cluster.bootstrap_servers, topic, 1, 5)[0]
    assert [r.value for r in got] == [b"seq-%d" % i for i in range(5)], "the refused batch left records behind"


@pytest.fixture(scope="module")
def retention_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("lost-producer-state"), nodes=3,
                      overrides={"log.retention.check.interval.ms": "200"}) as c:
        yield c


def test_producer_resets_its_sequence_when_the_broker_lost_its_state(retention_cluster: LocalCluster) -> None:
    """KIP-360: retention removed every batch of the producer, then a crash dropped the state in
    memory. Its next batch is refused with UNKNOWN_PRODUCER_ID; it bumps its epoch and starts
    the partition again at sequence 0, without losing or repeating a record."""
    topic, tp = "lost-state", TopicPartition("lost-state", 0)
    bootstrap = retention_cluster.bootstrap_servers
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, {"segment.bytes": "2048", "retention.bytes": "4096"})])
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
    with Producer(bootstrap_servers=bootstrap, linger_ms=0, retry_backoff_ms=20, request_timeout_ms=5000) as mine:
        assert mine.idempotent
        first = [mine.send(topic, b"mine-%02d" % i).get(timeout=20) for i in range(10)]
        with Producer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=900) as other:
            # pushes this producer's batches out through retention
            pushed = [other.send(topic, b"other-%04d" % i + b"." * 60) for i in range(400)]
            other.flush(30)
            assert all(f.exception(timeout=0) is None for f in pushed), [f.exception(timeout=0) for f in pushed][:1]
        with ClusterClient(bootstrap) as cc:
            deadline = time.monotonic() + 20
            while (start := cc.list_offsets({tp: -2})[tp][0]) <= first[-1].offset:
                assert time.monotonic() < deadline, f"retention did not pass offset {first[-1].offset}: start {start}"
                time.sleep(0.1)
        retention_cluster.kill_node(leader)  # no clean close: the state is rebuilt from what is left
        retention_cluster.start_node(leader)
        retention_cluster.wait_ready(60)
        with caplog_sender() as seen:
            later = [mine.send(topic, b"mine-%02d" % i) for i in range(10, 20)]
            mine.flush(60)
            metas = [f.get(timeout=0) for f in later]
    assert any("UNKNOWN_PRODUCER_ID" in m for m in seen), f"the broker did not lose the state? sender said {seen}"
    got = consume_all(bootstrap, topic, 1, 10_000, timeout_s=5)[0]
    mine_stored = [r.value for r in got if r.value.startswith(b"mine-")]
    assert mine_stored == [b"mine-%02d" % i for i in range(10, 20)], mine_stored
    by_offset = {r.offset: r.value for r in got}
    assert [by_offset.get(m.offset) for m in metas] == mine_stored


class caplog_sender:  # noqa: N801 - used as a context manager like a function
    """Collects client.sender's messages (INFO and up) while active."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._handler = logging.Handler(logging.DEBUG)
        self._handler.emit = lambda record: self.messages.append(record.getMessage())  # type: ignore[method-assign]
        self._log = logging.getLogger("client.sender")

    def __enter__(self) -> list[str]:
        self._old_level = self._log.level
        self._log.setLevel(logging.DEBUG)
        self._log.addHandler(self._handler)
        return self.messages

    def __exit__(self, *exc: object) -> None:
        self._log.removeHandler(self._handler)
        self._log.setLevel(self._old_level)
