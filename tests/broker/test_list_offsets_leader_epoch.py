"""ListOffsets answers the leader epoch of the offset it answers (Kafka's Partition.fetchOffsetForTimestamp,
UnifiedLog.fetchOffsetByTimestamp), on both listeners.

- a timestamp: the partition leader epoch of the batch holding the record found;
- MAX_TIMESTAMP (-3): the epoch of the batch with the largest timestamp;
- EARLIEST (-2): the epoch of the log start (the leader epoch cache's first entry);
- LATEST (-1): the partition's current leader epoch;
- nothing found: -1.

Brook answered the partition's current epoch for every target. A KIP-320 client (librdkafka, the Java
consumer) keeps that epoch with the position it seeks to and validates it with OffsetsForLeaderEpoch: with a
later epoch than the record's, a position on a diverged tail is not detected as truncated.

In process (broker 1's real ReplicaManager, its leader epoch bumped by a metadata update between writes),
then on a real 3-broker cluster whose partition leader moves to another broker between writes: ListOffsets
over gRPC (Brook's listener) and over the Kafka listener (confluent-kafka's offsets_for_times and
AdminClient.list_offsets, which expose the epoch).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from brokerkit import Kit, running_kit, wait_until
from inprocess import InProcessBroker
from waiting import wait_for

from broker.replica_manager import MAX_TIMESTAMP
from proto import broker_pb2, controller_pb2
from proto.errors import ErrorCode
from storage.record_batch import RecordBatchBuilder

EARLIEST, LATEST = -2, -1


def batch(*timestamps: int) -> bytes:
    b = RecordBatchBuilder()
    for ts in timestamps:
        b.append(ts, None, f"at-{ts}".encode())
    return b.build()


# ------------------------------------------------------------------------------------------- in process
def bump_leader_epoch(broker: InProcessBroker, epoch: int, version: int) -> None:
    """Broker 1 stays the leader at a new epoch, as the controller's update of a reassignment or of an
    election of the same replica makes it."""
    update = controller_pb2.MetadataUpdate(version=version, cluster_id="c", active_controller_id=-1)
    update.partitions.add(topic="t", topic_id="t" * 32, partition=0, replicas=[1], isr=[1], leader=1,
                          leader_epoch=epoch, partition_epoch=epoch)
    broker.rm.apply_metadata_delta(broker.rm.metadata_cache.apply(update))
    assert broker.rm.leader_partition("t", 0).leader_epoch == epoch


def produce(broker: InProcessBroker, *timestamps: int) -> int:
    result = broker.rm.append_records("t", 0, batch(*timestamps), acks=1, timeout_ms=5000).result(timeout=10)
    return result.base_offset


def answers(broker: InProcessBroker, *timestamps: int) -> list[tuple[int, int, int, int]]:
    """(error, offset, timestamp, leader epoch) for each timestamp: one request each (a partition may be
    named once in a request)."""
    out = []
    for ts in timestamps:
        p = broker.rm.list_offsets(broker_pb2.ListOffsetsRequest(replica_id=-1, partitions=[
            broker_pb2.ListOffsetsPartition(topic="t", partition=0, timestamp=ts, current_leader_epoch=-1)
        ])).partitions[0]
        out.append((p.error_code, p.offset, p.timestamp, p.leader_epoch))
    return out


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {"t": {}}) as b:
        yield b


def test_every_target_answers_the_epoch_of_its_offset(broker: InProcessBroker) -> None:
    lg = broker.rm.leader_partition("t", 0).log

    def committed() -> int:
        wait_until(lambda: lg.high_watermark == lg.log_end_offset, 10, "the high watermark to reach the log end")
        return lg.high_watermark

    ok = ErrorCode.NONE
    produce(broker, 1000, 1001)          # offsets 0-1, epoch 0
    produce(broker, 9000)                # offset 2, epoch 0: the largest timestamp
    bump_leader_epoch(broker, 4, version=2)
    produce(broker, 2000, 2001)          # offsets 3-4, epoch 4
    hw = committed()
    assert answers(broker, 1001, 1500, 9001, EARLIEST, LATEST, MAX_TIMESTAMP) == [
        (ok, 1, 1001, 0),         # in the first leader's batch: its epoch, not the current 4
        (ok, 2, 9000, 0),         # the first record in log order reaching 1500
        (ok, -1, -1, -1),         # no record that late
        (ok, 0, -1, 0),           # the log start's epoch
        (ok, hw, -1, 4),          # the current epoch
        (ok, 2, 9000, 0),         # the batch with the largest timestamp was written at epoch 0
    ]
    at_4 = produce(broker, 9100)         # offset 5, epoch 4
    bump_leader_epoch(broker, 6, version=3)
    at_6 = produce(broker, 9500)         # offset 6, epoch 6
    hw = committed()
    assert answers(broker, 9001, 9200, MAX_TIMESTAMP, 1001, LATEST) == [
        (ok, at_4, 9100, 4),      # epoch 4's batch, while the current epoch is 6
        (ok, at_6, 9500, 6),
        (ok, at_6, 9500, 6),
        (ok, 1, 1001, 0),
        (ok, hw, -1, 6),
    ]
    broker.rm.delete_records("t", 0, 3)  # the log start moves into epoch 4's batches
    assert answers(broker, EARLIEST, 0) == [(ok, 3, -1, 4), (ok, 3, 2000, 4)]


# ------------------------------------------------------------------------------------- real cluster
@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    with running_kit(tmp_path_factory.mktemp("list-offsets-epoch"), nodes=3,
                     overrides={"auto.leader.rebalance.enable": "false"}) as k:
        yield k


def grpc_list_offsets(kit: Kit, topic: str, timestamp: int) -> tuple[int, int, int]:
    """(offset, timestamp, leader epoch) from the leader, over Brook's gRPC listener; retried while the
    leader is new (OFFSET_NOT_AVAILABLE until its high watermark reaches its epoch start, KIP-207)."""
    last: list[str] = []

    def answered() -> tuple[int, int, int] | None:
        try:
            p = kit.stub(kit.leader(topic)).ListOffsets(broker_pb2.ListOffsetsRequest(replica_id=-1, partitions=[
                broker_pb2.ListOffsetsPartition(topic=topic, partition=0, timestamp=timestamp,
                                                current_leader_epoch=-1)]), timeout=5).partitions[0]
        except grpc.RpcError as exc:
            last.append(str(exc.code()))
            return None
        if p.error_code == ErrorCode.NONE:
            return p.offset, p.timestamp, p.leader_epoch
        last.append(f"{ErrorCode.Name(p.error_code)} {p.error_message}")
        return None

    return wait_for(answered, 30, lambda: f"ListOffsets({timestamp}) of {topic}: {last[-1:]}", poll_s=0.1)


def move_leader(kit: Kit, topic: str, to: int) -> int:
    """Make broker ``to`` the leader (a reordered replica list, then a preferred election); the new epoch."""
    from client.admin import Admin
    from client.types import TopicPartition

    before = kit.state(topic)
    replicas = [to, *[r for r in before.replicas if r != to]]
    with Admin(bootstrap_servers=kit.cluster.bootstrap_servers) as admin:
        assert admin.alter_partition_reassignments({TopicPartition(topic, 0): replicas}) == \
            {TopicPartition(topic, 0): None}
        wait_until(lambda: list(kit.state(topic).replicas) == replicas, 30, "the replica order to change")
        admin.elect_leaders("preferred", [(topic, 0)])
    wait_until(lambda: kit.state(topic).leader == to and kit.broker_knows_leader(topic), 30,
               f"broker {to} to lead {topic}")
    after = kit.state(topic)
    assert after.leader_epoch > before.leader_epoch
    return after.leader_epoch


def produce_acked(kit: Kit, topic: str, *timestamps: int) -> int:
    last: list[str] = []

    def acked() -> tuple[int] | None:
        try:
            r = kit.produce(topic, 0, batch(*timestamps), acks=-1, timeout_ms=10_000)
        except grpc.RpcError as exc:
            last.append(str(exc.code()))
            return None
        if r.error_code == ErrorCode.NONE:
            return (r.base_offset,)  # a tuple: truthy for offset 0 too
        last.append(ErrorCode.Name(r.error_code))
        return None

    return wait_for(acked, 30, lambda: f"produce to {topic}: {last[-1:]}", poll_s=0.1)[0]


def kafka_answers(kit: Kit, topic: str, timestamps: list[int], specs: dict[str, object]
                  ) -> tuple[dict[int, tuple[int, int]], dict[str, tuple[int, int]]]:
    """Over the Kafka listener, through librdkafka: {timestamp: (offset, leader epoch)} from a consumer's
    offsets_for_times, and {name: (offset, leader epoch)} from the admin client's ListOffsets (v7, which
    carries MAX_TIMESTAMP)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as RdTopicPartition
    from confluent_kafka.admin import AdminClient

    config = {"bootstrap.servers": kit.cluster.kafka_bootstrap_servers}
    consumer = Consumer({**config, "group.id": "epochs-reader", "enable.auto.commit": False})
    try:
        found = {}
        for ts in timestamps:
            [tp] = consumer.offsets_for_times([RdTopicPartition(topic, 0, ts)], timeout=30)
            assert tp.error is None, tp
            found[ts] = (tp.offset, tp.leader_epoch)
    finally:
        consumer.close()
    admin = AdminClient(config)
    listed = {}
    for name, spec in specs.items():
        futures = admin.list_offsets({RdTopicPartition(topic, 0): spec}, request_timeout=30)
        info = next(iter(futures.values())).result(timeout=30)
        listed[name] = (info.offset, info.leader_epoch)
    return found, listed


def test_after_a_leader_change_each_listener_answers_the_epoch_of_the_batch(kit: Kit) -> None:
    from confluent_kafka.admin import OffsetSpec

    topic = "epochs"
    kit.create_topic(topic, assignments=[[1, 2, 3]])
    e0 = kit.state(topic).leader_epoch
    base = int(time.time() * 1000) - 600_000  # CreateTime ten minutes ago: within the broker's bounds
    produce_acked(kit, topic, base + 1000, base + 1001)   # offsets 0-1, led by broker 1
    produce_acked(kit, topic, base + 50_000)              # offset 2: the largest timestamp
    e1 = move_leader(kit, topic, 2)
    assert produce_acked(kit, topic, base + 2000, base + 2001) == 3  # offsets 3-4, led by broker 2

    # Brook's gRPC listener, and the Kafka listener (librdkafka): compared at once, so a failure shows both.
    found, listed = kafka_answers(kit, topic, [base + 1001, base + 1500], {
        "earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(), "max": OffsetSpec.max_timestamp()})
    got = {"grpc": {ts: grpc_list_offsets(kit, topic, ts) for ts in (base + 1001, base + 1500, EARLIEST, LATEST,
                                                                    MAX_TIMESTAMP)},
           "offsets_for_times": found, "admin list_offsets": listed}
    assert got == {
        "grpc": {
            base + 1001: (1, base + 1001, e0),   # a timestamp in the first leader's batch: its epoch
            base + 1500: (2, base + 50_000, e0),
            EARLIEST: (0, -1, e0),
            LATEST: (5, -1, e1),
            MAX_TIMESTAMP: (2, base + 50_000, e0),
        },
        "offsets_for_times": {base + 1001: (1, e0), base + 1500: (2, e0)},
        "admin list_offsets": {"earliest": (0, e0), "latest": (5, e1), "max": (2, e0)},
    }, (e0, e1)

    assert produce_acked(kit, topic, base + 60_000) == 5  # the later leader's batch now holds the largest
    found, listed = kafka_answers(kit, topic, [base + 1001, base + 50_001], {
        "max": OffsetSpec.max_timestamp(), "ts": OffsetSpec.for_timestamp(base + 1001)})
    got = {"grpc": {ts: grpc_list_offsets(kit, topic, ts) for ts in (base + 50_001, MAX_TIMESTAMP, base + 1001)},
           "offsets_for_times": found, "admin list_offsets": listed}
    assert got == {
        "grpc": {
            base + 50_001: (5, base + 60_000, e1),
            MAX_TIMESTAMP: (5, base + 60_000, e1),
            base + 1001: (1, base + 1001, e0),
        },
        "offsets_for_times": {base + 1001: (1, e0), base + 50_001: (5, e1)},
        "admin list_offsets": {"max": (5, e1), "ts": (1, e0)},
    }, (e0, e1)
