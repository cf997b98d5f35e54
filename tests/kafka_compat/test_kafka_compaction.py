"""A compacted topic after Brook's cleaner has been at it, as unmodified Kafka clients read it.

Idempotent producers (librdkafka) overwrite and delete keys; transactions commit and abort on the same keys; then
the cleaner runs on every replica (a 200 ms cleaner backoff, ``delete.retention.ms`` 0). What is left has gaps
between batches, a batch of no records (an idempotent producer's last batch, all of it replaced: Kafka's empty
batch, which keeps the producer's sequence), an aborted transaction's empty batch with its ABORT marker, and
fewer markers. confluent-kafka (read_committed and read_uncommitted), kafka-python, aiokafka and Brook's client
must each read every key's latest committed value at its original offset and reach the end of the partition:
nothing aborted, nothing replaced, no deleted key back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafkakit import brook_read_all, rdkafka_config, unique
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.consumer import Consumer as BrookConsumer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster
from storage.record_batch import ATTR_CONTROL, ATTR_TRANSACTIONAL, iter_batches

pytestmark = pytest.mark.slow

CLEANED_WITHIN_S = 60.0
READ_WITHIN_S = 30.0
TOPIC_CONFIGS = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0",
                 "segment.bytes": "2048"}
FILLERS = 40  # records after the ones under test: every one of those ends up in a closed, cleanable segment

Row = tuple[int, bytes, bytes | None]  # offset, key, value


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-compaction"), nodes=3,
                      overrides={"log.cleaner.backoff.ms": "200"}) as c:
        yield c


@pytest.fixture(scope="module")
def kconf(cluster: LocalCluster) -> dict[str, str]:
    return cluster.kafka_client_config()


class Written:
    """What was produced, with the offsets the producers were told; ``latest`` is each key's last committed
    value (None: deleted)."""

    def __init__(self) -> None:
        self.latest: dict[bytes, tuple[int, bytes | None]] = {}
        self.aborted: list[Row] = []
        self.replaced: list[Row] = []

    def committed(self, rows: list[Row]) -> None:
        for offset, key, value in rows:
            if key in self.latest:
                self.replaced.append((self.latest[key][0], key, self.latest[key][1]))
            self.latest[key] = (offset, value)

    def expected(self) -> list[Row]:
        return sorted((o, k, v) for k, (o, v) in self.latest.items() if v is not None)


def _produce(producer: Any, topic: str, records: list[tuple[bytes, bytes | None]]) -> list[Row]:
    got: list[Any] = []
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0,
                         on_delivery=lambda err, msg: got.append((err, msg)))
    assert producer.flush(30) == 0, "librdkafka did not deliver within 30 s"
    assert all(err is None for err, _m in got), got
    return sorted((m.offset(), m.key(), m.value()) for _e, m in got)


def _transaction(producer: Any, topic: str, records: list[tuple[bytes, bytes | None]], commit: bool) -> list[Row]:
    producer.begin_transaction()
    rows = _produce(producer, topic, records)
    (producer.commit_transaction if commit else producer.abort_transaction)(30)
    return rows


def _write(kconf: dict[str, str], topic: str) -> Written:
    from confluent_kafka import Producer

    w = Written()
    idem = [Producer(rdkafka_config(kconf, **{"enable.idempotence": True, "linger.ms": 50})) for _ in range(2)]
    txn = []
    for _ in range(2):
        p = Producer(rdkafka_config(kconf, **{"transactional.id": unique("compaction-txn"), "linger.ms": 50}))
        p.init_transactions(30)
        txn.append(p)
    w.committed(_produce(idem[0], topic, [(b"k%d" % i, b"v1-%d" % i) for i in range(10)]))
    # the second producer's only batch: both records replaced below, so the cleaner leaves an empty batch
    w.committed(_produce(idem[1], topic, [(b"k1", b"p2-1"), (b"k2", b"p2-2")]))
    w.committed(_produce(idem[0], topic, [(b"k%d" % i, b"v2-%d" % i) for i in range(5)]))
    w.committed(_produce(idem[0], topic, [(b"k5", None), (b"k6", None)]))  # deletes
    w.committed(_transaction(txn[0], topic, [(b"k7", b"t1")], commit=True))
    w.aborted += _transaction(txn[0], topic, [(b"k8", b"x"), (b"k0", b"x")], commit=False)
    w.committed(_transaction(txn[0], topic, [(b"k9", b"t2")], commit=True))
    # the other transactional producer's last batch is aborted: left empty, with its ABORT marker
    w.aborted += _transaction(txn[1], topic, [(b"k6", b"y")], commit=False)
    for start in range(0, FILLERS, 10):  # batches of about 1.2 KiB: several segments roll
        w.committed(_produce(idem[0], topic, [(b"filler-%02d" % i, b"f" * 100) for i in range(start, start + 10)]))
    for p in idem + txn:
        p.flush(10)
    return w


def _confluent_rows(kconf: dict[str, str], topic: str, isolation: str, end: int) -> tuple[list[Row], int]:
    """Every record of partition 0 from the beginning, until the consumer's position reaches ``end``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as RdTopicPartition

    c = Consumer(rdkafka_config(kconf, **{"group.id": unique("compaction-read"), "enable.auto.commit": False,
                                          "isolation.level": isolation}))
    rows: list[Row] = []
    tp = RdTopicPartition(topic, 0, OFFSET_BEGINNING)
    try:
        c.assign([tp])
        deadline = time.monotonic() + READ_WITHIN_S
        position = -1
        while position < end:
            assert time.monotonic() < deadline, f"confluent-kafka ({isolation}) at {position} of {end}: {rows}"
            for msg in c.consume(500, 0.2):
                assert not msg.error(), msg.error()
                rows.append((msg.offset(), msg.key(), msg.value()))
            position = c.position([RdTopicPartition(topic, 0)])[0].offset
        return rows, position
    finally:
        c.close()


def _end_offset(cluster: LocalCluster, topic: str) -> int:
    kw = {k.replace(".", "_"): v for k, v in cluster.client_config.items()}
    with BrookConsumer(bootstrap_servers=cluster.bootstrap_servers, **kw) as c:
        tp = TopicPartition(topic, 0)
        return c.end_offsets([tp])[tp]


def _batches(cluster: LocalCluster, topic: str, end: int) -> list[Any]:
    """The stored batch headers of partition 0 (undecoded, through Brook's client), up to ``end``."""
    kw = {k.replace(".", "_"): v for k, v in cluster.client_config.items()}
    headers: list[Any] = []
    with BrookConsumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest", **kw) as c:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + READ_WITHIN_S
        while not headers or headers[-1].next_offset < end:
            assert time.monotonic() < deadline, f"batches read to {headers[-1].next_offset if headers else 0} of {end}"
            for raw in c.poll_batches(timeout_ms=200).values():
                headers.extend(h for _pos, h in iter_batches(raw))
    return headers


def test_kafka_clients_read_a_compacted_topic_with_transactions_as_kafka_leaves_it(cluster: LocalCluster,
                                                                                     kconf) -> None:
    topic = unique("compacted")
    with Admin(cluster.bootstrap_servers, request_timeout_ms=20_000) as admin:
        admin.create_topics([NewTopic(topic, 1, 3, TOPIC_CONFIGS)])
    w = _write(kconf, topic)
    expected = w.expected()
    end = _end_offset(cluster, topic)
    assert w.aborted and w.replaced

    def cleaned() -> bool:  # the leader's copy: nothing aborted, replaced or deleted is read any more
        return sorted(_confluent_rows(kconf, topic, "read_uncommitted", end)[0]) == expected
    wait_for(cleaned, CLEANED_WITHIN_S, lambda: f"the cleaner to leave only {expected[:12]}... of {topic}")

    headers = _batches(cluster, topic, end)
    data = [h for h in headers if not h.attributes & ATTR_CONTROL]
    markers = [h for h in headers if h.attributes & ATTR_CONTROL]
    empty = [h for h in data if h.record_count == 0]
    # the second idempotent producer's replaced batch and the second transactional producer's aborted one
    assert len(empty) == 2 and sum(1 for h in empty if h.attributes & ATTR_TRANSACTIONAL) == 1, empty
    # kept: the markers of k7's and k9's commits (their records stay) and of the empty aborted batch
    assert len(markers) == 3, markers

    for isolation in ("read_committed", "read_uncommitted"):
        rows, position = _confluent_rows(kconf, topic, isolation, end)
        assert sorted(rows) == expected and position == end, (isolation, rows, position)
    assert sorted(_kafka_python_rows(kconf, topic, len(expected))) == expected
    assert sorted(asyncio.run(_aiokafka_rows(kconf, topic, len(expected)))) == expected
    brook = brook_read_all(cluster, topic, 1, len(expected))[0]
    assert sorted((r.offset, r.key, r.value) for r in brook) == expected


def _kafka_python_rows(kconf: dict[str, str], topic: str, count: int) -> list[Row]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    c = KafkaConsumer(bootstrap_servers=kconf["bootstrap.servers"].split(","), isolation_level="read_committed",
                      enable_auto_commit=False, auto_offset_reset="earliest")
    rows: list[Row] = []
    try:
        c.assign([KpTopicPartition(topic, 0)])
        c.seek_to_beginning()

        def more() -> bool:
            for records in c.poll(timeout_ms=200).values():
                rows.extend((r.offset, r.key, r.value) for r in records)
            return len(rows) >= count
        wait_for(more, READ_WITHIN_S, lambda: f"kafka-python read {rows} of {count}")
    finally:
        c.close()
    return rows


async def _aiokafka_rows(kconf: dict[str, str], topic: str, count: int) -> list[Row]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioTopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=kconf["bootstrap.servers"], isolation_level="read_committed",
                         enable_auto_commit=False, auto_offset_reset="earliest")
    rows: list[Row] = []
    await c.start()
    try:
        c.assign([AioTopicPartition(topic, 0)])
        await c.seek_to_beginning()
        deadline = time.monotonic() + READ_WITHIN_S
        while len(rows) < count:
            assert time.monotonic() < deadline, f"aiokafka read {rows} of {count}"
            for records in (await c.getmany(timeout_ms=200)).values():
                rows.extend((r.offset, r.key, r.value) for r in records)
    finally:
        await c.stop()
    return rows
