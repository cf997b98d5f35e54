"""Idempotent producers with pipelined lz4 batches, lost responses and gRPC reordering: exactly once, in order.

Several producers (acks=all, linger.ms=10, lz4, max.in.flight=5) write to six partitions
(RF 3) of a real cluster while some Produce responses are thrown away after the broker
wrote the batch, and some requests (each producer's first among them) are held back on
the client side so that later requests overtake them, as a slow link does. Brokers
handle one connection's requests concurrently anyway, so a batch may reach a partition
before an earlier one of the same producer: the broker refuses it (a new producer must
start at sequence 0, a known one must not skip) and the producer retries it after the
earlier batch. Everything is then read back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

import grpc
import pytest
from clientkit import consume_all
from test_producer_faults import DropProduceResponses

from client.producer import Producer
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


def _produce(bootstrap: str, topic: str, producer_no: int, interceptors: list[grpc.UnaryUnaryClientInterceptor],
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
            _produce(cluster.bootstrap_servers, topic, p, [delayers[p], droppers[p]], sent)
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
    from client.cluster import ClusterClient
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
            return cc.broker_stub(leader).Produce(req, timeout=15).partitions[0]

        refused = produce(3, 2)
        assert refused.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, refused
        assert "expected sequence 0" in refused.error_message, refused.error_message
        first, second = produce(0, 3), produce(3, 2)
        assert (first.error_code, first.base_offset, second.error_code, second.base_offset) == (0, 0, 0, 3), (
            first, second)
    got = consume_all(cluster.bootstrap_servers, topic, 1, 5)[0]
    assert [r.value for r in got] == [b"seq-%d" % i for i in range(5)], "the refused batch left records behind"
