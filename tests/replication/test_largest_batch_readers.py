"""The largest batch a leader accepts reaches every reader; anything larger is refused before it is stored.

"A leader stores only what every reader can decode; no request may make a partition unreadable." A topic's
max.message.bytes bounds the batch a leader stores (after it recompresses one for compression.type), and
that can be far more than a request carries: a zstd batch of a few KB sent to a compression.type=none topic
with max.message.bytes=64 MiB was stored as a 60 MiB batch. Every follower's replica fetch then failed
(gRPC RESOURCE_EXHAUSTED: a follower took answers of replica.fetch.response.max.bytes + 4 MiB, 14 MiB by
default) at every retry, the followers left the ISR for good and acks=all went on with the leader alone. With
socket.request.max.bytes raised, a 140 MiB batch was stored that no reader could take: the broker's gRPC
refused to send it (128 MiB at most) to followers and Brook consumers, librdkafka refused it (100 MB).

Now the controller refuses max.message.bytes above MAX_MESSAGE_BYTES_LIMIT (64 MiB), and every reader takes a
batch of that size whole (a follower's receive bound is derived from it). Real brokers (3, real processes):
the largest batch a topic accepts is replicated to every replica and read by Brook's consumer (gRPC) and by
confluent-kafka (the Kafka listener); one byte more is refused with MESSAGE_TOO_LARGE.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.cluster import ClusterClient
from client.consumer import Consumer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster
from metadata_quorum.cluster_configs import MAX_MESSAGE_BYTES_LIMIT
from proto import broker_pb2, errors
from proto.errors import ErrorCode
from storage.record_batch import BATCH_HEADER_SIZE, CODEC_ZSTD, RecordBatchBuilder, read_header

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
RECORD_BYTES = MiB
# Now, not a fixed day: the topic keeps 7 days (retention.ms), and the local cluster checks retention every 5 s.
# With a fixed 2023 timestamp the full segment holding the batch was deleted by the first check after it rolled,
# and a reader that came later found the log starting after it (confluent-kafka: "0 of 64", CI).
TIMESTAMP_MS = int(time.time() * 1000)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("largest-batch"), nodes=3) as c:
        c.wait_ready(90)
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as a:
        yield a


def records_for(stored_bytes: int) -> list[bytes]:
    """Values whose uncompressed batch is exactly ``stored_bytes`` long: 1 MiB records of a repeated text
    (zstd makes a few KB of them), the last one sized to fit."""
    phrase = b"brook stores only what every reader can take. "
    text = (phrase * (RECORD_BYTES // len(phrase) + 1))[:RECORD_BYTES]
    values = [text] * (stored_bytes // RECORD_BYTES - 1)
    last = RECORD_BYTES
    for _ in range(10):  # the record's length fields are varints: a few rounds settle it
        size = uncompressed_size([*values, text[:last]])
        if size == stored_bytes:
            return [*values, text[:last]]
        last += stored_bytes - size
    raise AssertionError(f"no record fits {stored_bytes} bytes exactly (last try {size})")


def uncompressed_size(values: list[bytes]) -> int:
    b = RecordBatchBuilder()
    for v in values:
        b.append(TIMESTAMP_MS, None, v)
    return b.size_estimate


def build(values: list[bytes], codec: int) -> bytes:
    b = RecordBatchBuilder(codec)
    for v in values:
        b.append(TIMESTAMP_MS, None, v)
    return b.build()


def produce(cluster: LocalCluster, topic: str, records: bytes) -> broker_pb2.ProducePartitionResponse:
    with ClusterClient(cluster.bootstrap_servers) as client:
        tp = TopicPartition(topic, 0)
        leader = client.leader_for(tp)
        resp = client.broker_stub(leader).Produce(broker_pb2.ProduceRequest(acks=-1, timeout_ms=30_000, partitions=[
            broker_pb2.ProducePartitionData(topic=topic, partition=0, records=records)]), timeout=60)
        return resp.partitions[0]


def stored_batches(cluster: LocalCluster, node_id: int, topic: str) -> list[tuple[int, int]]:
    """(base offset, size) of every batch in ``node_id``'s segment files of ``topic``-0 (headers only)."""
    found = list(Path(cluster.node_dir(node_id)).glob(f"**/{topic}-0"))
    if not found:
        return []
    out = []
    for seg in sorted(found[0].glob("*.log")):
        with seg.open("rb") as f:
            end = f.seek(0, 2)
            pos = 0
            while pos + BATCH_HEADER_SIZE <= end:
                f.seek(pos)
                h = read_header(f.read(BATCH_HEADER_SIZE))
                if pos + h.size > end:
                    break  # being written
                out.append((h.base_offset, h.size))
                pos += h.size
    return out


def brook_read(cluster: LocalCluster, topic: str, expected: int, timeout_s: float = 60) -> list[int]:
    sizes: list[int] = []
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + timeout_s
        while len(sizes) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                sizes.extend(len(r.value or b"") for r in records)
    return sizes


def rdkafka_read(cluster: LocalCluster, topic: str, expected: int, timeout_s: float = 60) -> tuple[list[int], list[str]]:
    from confluent_kafka import OFFSET_BEGINNING
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import TopicPartition as RdTopicPartition

    consumer = RdConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers, "group.id": f"read-{topic}",
                           "enable.auto.commit": False})
    sizes: list[int] = []
    problems: list[str] = []
    try:
        consumer.assign([RdTopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while len(sizes) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                if msg.error():
                    problems.append(str(msg.error()))
                else:
                    sizes.append(len(msg.value() or b""))
    finally:
        consumer.close()
    return sizes, problems


def test_max_message_bytes_above_what_every_reader_takes_is_refused(admin: Admin, cluster: LocalCluster) -> None:
    over = str(MAX_MESSAGE_BYTES_LIMIT + 1)
    with pytest.raises(errors.InvalidConfigError, match="must be at most"):
        admin.create_topics([NewTopic("too-large", 1, 3, {"max.message.bytes": over})])
    admin.create_topics([NewTopic("at-bound", 1, 3, {"max.message.bytes": str(MAX_MESSAGE_BYTES_LIMIT)})])
    with pytest.raises(errors.InvalidConfigError, match="must be at most"):
        admin.alter_configs("at-bound", set={"max.message.bytes": over})
    with pytest.raises(errors.InvalidConfigError, match="must be at most"):
        admin.alter_cluster_configs(set={"message.max.bytes": over})
    assert "too-large" not in admin.list_topics()

    # The Kafka listener's admin requests go to the same controller checks.
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
    from confluent_kafka.admin import NewTopic as RdNewTopic

    kafka_admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap_servers})
    [created] = kafka_admin.create_topics(
        [RdNewTopic("too-large-kafka", 1, 3, config={"max.message.bytes": over})], request_timeout=30).values()
    with pytest.raises(Exception, match="(?i)at most|INVALID_CONFIG|InvalidConfig"):
        created.result(timeout=30)
    [altered] = kafka_admin.incremental_alter_configs([ConfigResource("topic", "at-bound", incremental_configs=[
        ConfigEntry("max.message.bytes", over, incremental_operation=AlterConfigOpType.SET)])],
        request_timeout=30).values()
    with pytest.raises(Exception, match="(?i)at most|INVALID_CONFIG|InvalidConfig"):
        altered.result(timeout=30)


def test_the_largest_batch_accepted_is_replicated_and_read_by_every_reader(
        admin: Admin, cluster: LocalCluster) -> None:
    """compression.type=none: the leader stores the zstd batch it is sent uncompressed, at the bound."""
    topic = "largest"
    admin.create_topics([NewTopic(topic, 1, 3, {"max.message.bytes": str(MAX_MESSAGE_BYTES_LIMIT),
                                                "compression.type": "none"})])
    values = records_for(MAX_MESSAGE_BYTES_LIMIT)
    sent = build(values, CODEC_ZSTD)
    assert len(sent) < MiB  # a request far below socket.request.max.bytes

    # One byte more than the bound is refused before anything is stored.
    over = build([*values[:-1], values[-1] + b"x"], CODEC_ZSTD)
    refused = produce(cluster, topic, over)
    assert refused.error_code == ErrorCode.MESSAGE_TOO_LARGE, refused

    done = produce(cluster, topic, sent)
    assert done.error_code == ErrorCode.NONE, done
    assert done.base_offset == 0

    # Every replica stores it, and stays in the ISR (a follower that cannot take it leaves for good).
    def replicated() -> bool:
        return all(stored_batches(cluster, n, topic) == [(0, MAX_MESSAGE_BYTES_LIMIT)] for n in (1, 2, 3))

    wait_for(replicated, 90, lambda: "every replica to store the largest batch: "
             f"{ {n: stored_batches(cluster, n, topic) for n in (1, 2, 3)} }", poll_s=0.5)
    wait_for(lambda: len(admin.describe_topics([topic])[topic].partitions[0].isr) == 3, 60,
             "the ISR to hold all three replicas")

    expected = [len(v) for v in values]
    assert brook_read(cluster, topic, len(values)) == expected, "Brook's consumer (gRPC)"
    sizes, problems = rdkafka_read(cluster, topic, len(values))
    assert sizes == expected, f"confluent-kafka (Kafka listener): {len(sizes)} of {len(values)}; {problems[:3]}"
