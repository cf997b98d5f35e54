"""BrokerService over real processes: every bad input gets its error code and appends nothing;
long polling, byte limits, ListOffsets, Metadata auto-creation, InitProducerId."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerkit import FAST_FAILURE_DETECTION, Kit, make_batch, running_kit
from waiting import wait_for

from proto import broker_pb2
from proto.errors import ErrorCode
from storage.record_batch import decode_records, iter_batches

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    base: Path = tmp_path_factory.mktemp("api-cluster")
    overrides = {**FAST_FAILURE_DETECTION, "auto.create.topics.enable": "true", "num.partitions": "2",
                 "default.replication.factor": "2"}
    with running_kit(base, nodes=3, overrides=overrides) as k:
        k.create_topic("api", partitions=2, rf=3, configs={"max.message.bytes": "2000"})
        yield k


def produce_req(topic: str, partition: int, records: bytes, acks: int = 1) -> broker_pb2.ProduceRequest:
    return broker_pb2.ProduceRequest(acks=acks, timeout_ms=3000, partitions=[
        broker_pb2.ProducePartitionData(topic=topic, partition=partition, records=records)])


def leo(kit: Kit, partition: int) -> int:
    return kit.fetch(kit.leader("api", partition), "api", partition, 0, max_bytes=1).log_end_offset


def test_produce_errors_append_nothing(kit: Kit) -> None:
    leader = kit.leader("api", 0)
    follower = next(r for r in kit.state("api", 0).replicas if r != leader)
    before = leo(kit, 0)
    good = make_batch(b"ok")
    stub = kit.stub(leader)

    r = stub.Produce(produce_req("api", 0, good, acks=2)).partitions[0]
    assert r.error_code == ErrorCode.INVALID_REQUIRED_ACKS, r
    r = stub.Produce(produce_req("__consumer_offsets", 0, good)).partitions[0]
    assert r.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION, r  # only the broker writes internal topics
    r = stub.Produce(produce_req("api", 7, good)).partitions[0]
    assert r.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, r
    r = stub.Produce(produce_req("api", -1, good)).partitions[0]
    assert r.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, r
    r = kit.stub(follower).Produce(produce_req("api", 0, good)).partitions[0]
    assert r.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, r
    assert r.current_leader.leader_id == leader, r
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # payload byte: CRC mismatch
    r = stub.Produce(produce_req("api", 0, bytes(corrupt))).partitions[0]
    assert r.error_code == ErrorCode.CORRUPT_MESSAGE, r
    r = stub.Produce(produce_req("api", 0, good[:30])).partitions[0]
    assert r.error_code == ErrorCode.CORRUPT_MESSAGE, r
    r = stub.Produce(produce_req("api", 0, b"")).partitions[0]
    assert r.error_code == ErrorCode.INVALID_RECORD, r  # no batch at all: Kafka's code, not retried by clients
    r = stub.Produce(produce_req("api", 0, make_batch(b"x" * 5000))).partitions[0]
    assert r.error_code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE), r
    # a good batch followed by a corrupt one: all or nothing
    r = stub.Produce(produce_req("api", 0, good + bytes(corrupt))).partitions[0]
    assert r.error_code == ErrorCode.CORRUPT_MESSAGE, r
    assert leo(kit, 0) == before, "a refused produce appended something"
    r = stub.Produce(produce_req("api", 0, good)).partitions[0]
    assert r.error_code == ErrorCode.NONE and r.base_offset == before, r


def test_many_partitions_in_one_produce_and_fetch(kit: Kit) -> None:
    kit.create_topic("multi", partitions=3, rf=3, assignments=[[2, 1, 3], [2, 3, 1], [2, 1, 3]])
    stub = kit.stub(2)
    req = broker_pb2.ProduceRequest(acks=-1, timeout_ms=5000, partitions=[
        broker_pb2.ProducePartitionData(topic="multi", partition=p, records=make_batch(f"multi-{p}".encode()))
        for p in (0, 1, 2)])
    resp = stub.Produce(req)
    assert [(r.error_code, r.base_offset) for r in resp.partitions] == [(ErrorCode.NONE, 0)] * 3, resp
    fetch = stub.Fetch(broker_pb2.FetchRequest(replica_id=-1, max_bytes=1 << 20, partitions=[
        broker_pb2.FetchPartition(topic="multi", partition=p, fetch_offset=0, partition_max_bytes=1 << 20,
                                  current_leader_epoch=-1) for p in (0, 1, 2)]))
    got = {r.partition: [rec.value for rec in decode_records(r.records)] for r in fetch.partitions}
    assert got == {p: [f"multi-{p}".encode()] for p in (0, 1, 2)}, fetch
    # a total max_bytes smaller than the data: the first partition still gets a batch, later ones none
    small = stub.Fetch(broker_pb2.FetchRequest(replica_id=-1, max_bytes=10, partitions=[
        broker_pb2.FetchPartition(topic="multi", partition=p, fetch_offset=0, partition_max_bytes=1 << 20,
                                  current_leader_epoch=-1) for p in (0, 1, 2)]))
    assert [bool(r.records) for r in small.partitions] == [True, False, False], small


def test_fetch_errors(kit: Kit) -> None:
    leader = kit.leader("api", 0)
    follower = next(r for r in kit.state("api", 0).replicas if r != leader)
    end = leo(kit, 0)
    r = kit.fetch(leader, "api", 0, end + 1000)
    assert r.error_code == ErrorCode.OFFSET_OUT_OF_RANGE, r
    assert r.log_end_offset == end
    r = kit.fetch(follower, "api", 0, 0)
    assert r.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and r.current_leader.leader_id == leader, r
    r = kit.fetch(leader, "nope", 0, 0)
    assert r.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, r
    epoch = kit.state("api", 0).leader_epoch
    resp = kit.stub(leader).Fetch(broker_pb2.FetchRequest(replica_id=-1, max_bytes=1 << 20, partitions=[
        broker_pb2.FetchPartition(topic="api", partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                  current_leader_epoch=epoch - 1 if epoch > 0 else -5)]))
    if epoch > 0:
        assert resp.partitions[0].error_code == ErrorCode.FENCED_LEADER_EPOCH, resp
    resp = kit.stub(leader).Fetch(broker_pb2.FetchRequest(replica_id=-1, max_bytes=1 << 20, partitions=[
        broker_pb2.FetchPartition(topic="api", partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                  current_leader_epoch=epoch + 1)]))
    assert resp.partitions[0].error_code == ErrorCode.UNKNOWN_LEADER_EPOCH, resp


def parked_consumer_fetches(kit: Kit, node_id: int) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    page = kit.cluster.read_metrics(node_id)
    return sum(s.value for f in text_string_to_metric_families(page) for s in f.samples
               if s.name == "brook_purgatory_delayed_operations" and s.labels.get("operation") == "consumer_fetch")


def test_long_poll_wakes_on_append_and_times_out_when_idle(kit: Kit) -> None:
    kit.create_topic("poll", rf=3)
    leader = kit.leader("poll")
    t0 = time.monotonic()
    r = kit.fetch(leader, "poll", 0, 0, max_wait_ms=700, min_bytes=1)
    idle_s = time.monotonic() - t0
    assert r.error_code == ErrorCode.NONE and r.records == b""
    assert idle_s >= 0.6, f"an idle long poll returned after {idle_s:.2f}s, before max_wait_ms"
    got: dict[str, object] = {}

    def poll() -> None:
        t = time.monotonic()
        got["resp"] = kit.fetch(leader, "poll", 0, 0, max_wait_ms=20_000, min_bytes=1)
        got["waited_s"] = time.monotonic() - t

    th = threading.Thread(target=poll)
    th.start()
    # The poll is parked before the append (what this test is about): the leader says so.
    wait_for(lambda: parked_consumer_fetches(kit, leader) >= 1, 10, "the consumer's poll parked on the leader")
    assert kit.produce("poll", 0, make_batch(b"wake"), acks=-1).error_code == ErrorCode.NONE
    th.join(30)
    resp = got["resp"]
    assert [rec.value for rec in decode_records(resp.records)] == [b"wake"], resp  # type: ignore[union-attr]
    assert got["waited_s"] < 15, f"woke after {got['waited_s']}s: not woken by the append"  # type: ignore[operator]


def test_fetch_byte_limits_return_whole_batches(kit: Kit) -> None:
    kit.create_topic("limits", rf=3)
    for i in range(20):
        assert kit.produce("limits", 0, make_batch(f"value-{i:04d}".encode() * 10), acks=-1).error_code == 0
    leader = kit.leader("limits")
    one = kit.fetch(leader, "limits", 0, 0, max_bytes=10)
    batches = list(iter_batches(one.records))
    assert len(batches) == 1, "a too-small limit still returns one whole batch"
    some = kit.fetch(leader, "limits", 0, 0, max_bytes=len(one.records) * 3 + 5)
    assert len(list(iter_batches(some.records))) == 3
    assert sum(h.size for _, h in iter_batches(some.records)) == len(some.records)


def test_list_offsets(kit: Kit) -> None:
    kit.create_topic("times", rf=3)
    for i, ts in enumerate((1000, 2000, 5000, 3000)):
        r = kit.produce("times", 0, make_batch(f"t{i}".encode(), timestamp_ms=ts), acks=-1)
        assert r.error_code == ErrorCode.NONE, r
    leader = kit.leader("times")

    def lo(ts: int) -> broker_pb2.ListOffsetsPartitionResponse:
        return kit.stub(leader).ListOffsets(broker_pb2.ListOffsetsRequest(replica_id=-1, partitions=[
            broker_pb2.ListOffsetsPartition(topic="times", partition=0, timestamp=ts, current_leader_epoch=-1)
        ])).partitions[0]

    assert lo(-2).offset == 0
    assert lo(-1).offset == 4
    assert (lo(-3).offset, lo(-3).timestamp) == (2, 5000)
    assert (lo(1500).offset, lo(1500).timestamp) == (1, 2000)
    assert lo(4000).offset == 2
    assert lo(9999).offset == -1
    assert lo(-7).error_code == ErrorCode.INVALID_REQUEST


def test_metadata_and_auto_creation(kit: Kit) -> None:
    stub = kit.stub(kit.cluster.broker_ids[0])
    md = stub.Metadata(broker_pb2.MetadataRequest(topics=["auto-made"], allow_auto_topic_creation=False))
    assert md.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    md = stub.Metadata(broker_pb2.MetadataRequest(topics=["auto-made"], allow_auto_topic_creation=True))
    t = md.topics[0]
    assert t.error_code == ErrorCode.NONE, md
    assert len(t.partitions) == 2 and all(len(p.replicas) == 2 and p.leader >= 0 for p in t.partitions), t
    assert {b.node_id for b in md.brokers} == set(kit.cluster.broker_ids)
    assert len(md.controllers) == 3 and md.cluster_id
    md = stub.Metadata(broker_pb2.MetadataRequest(all_topics=True))
    assert {"api", "auto-made"} <= {t.name for t in md.topics}
    md = stub.Metadata(broker_pb2.MetadataRequest(topics=["bad/name"], allow_auto_topic_creation=True))
    assert md.topics[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION


def test_produce_to_unknown_topic_auto_creates_it(kit: Kit) -> None:
    r = kit.stub(1).Produce(produce_req("auto-by-produce", 0, make_batch(b"first"))).partitions[0]
    # created with num.partitions / default.replication.factor; appended if broker 1 leads it
    assert r.error_code in (ErrorCode.NONE, ErrorCode.NOT_LEADER_OR_FOLLOWER), r
    st = kit.state("auto-by-produce", 0)
    assert len(st.replicas) == 2
    assert kit.state("auto-by-produce", 1).partition == 1


def test_init_producer_id_unique_across_brokers(kit: Kit) -> None:
    ids = set()
    for b in kit.cluster.broker_ids:
        for _ in range(3):
            r = kit.stub(b).InitProducerId(broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1))
            assert r.error_code == ErrorCode.NONE and r.producer_epoch == 0, r
            ids.add(r.producer_id)
    assert len(ids) == 3 * len(kit.cluster.broker_ids)
    # Someone else's producer id is never bumped (that would fence its owner): a fresh id instead.
    r = kit.stub(kit.cluster.broker_ids[0]).InitProducerId(
        broker_pb2.InitProducerIdRequest(producer_id=min(ids), producer_epoch=4))
    assert r.error_code == ErrorCode.NONE and r.producer_id not in ids and r.producer_epoch == 0, r


def test_idempotent_retry_is_not_appended_twice(kit: Kit) -> None:
    from storage.record_batch import RecordBatchBuilder
    kit.create_topic("idem", rf=3)
    pid = kit.stub(1).InitProducerId(broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1))
    b = RecordBatchBuilder(producer_id=pid.producer_id, producer_epoch=0, base_sequence=0)
    b.append(int(time.time() * 1000), None, b"once")
    batch = b.build()
    first = kit.produce("idem", 0, batch, acks=-1)
    again = kit.produce("idem", 0, batch, acks=-1)
    assert first.error_code == again.error_code == ErrorCode.NONE
    assert again.base_offset == first.base_offset
    values, _raw, _hw = kit.consume_all("idem")
    assert list(values.values()) == [b"once"]


def test_deleted_then_recreated_topic_starts_empty(kit: Kit) -> None:
    from brokerkit import wait_until

    from proto import controller_pb2
    kit.create_topic("reborn", rf=3)
    for i in range(3):
        assert kit.produce("reborn", 0, make_batch(f"old-{i}".encode()), acks=-1).error_code == ErrorCode.NONE
    kit.cc.call("DeleteTopics", controller_pb2.DeleteTopicsRequest(names=["reborn"]))
    wait_until(lambda: not any((kit.cluster.node_dir(n) / "data" / "reborn-0").exists()
                               for n in kit.cluster.broker_ids), 20, "partition dirs removed on every broker")
    kit.create_topic("reborn", rf=3)
    r = kit.produce("reborn", 0, make_batch(b"new"), acks=-1)
    assert (r.error_code, r.base_offset) == (ErrorCode.NONE, 0), r
    values, _raw, _hw = kit.consume_all("reborn")
    assert values == {0: b"new"}


def test_offsets_for_leader_epoch(kit: Kit) -> None:
    kit.create_topic("epochs", rf=3)
    for i in range(4):
        assert kit.produce("epochs", 0, make_batch(f"e{i}".encode()), acks=-1).error_code == ErrorCode.NONE
    st = kit.state("epochs")
    follower = next(r for r in st.replicas if r != st.leader)

    def ask(node: int, epoch: int, current: int = -1) -> broker_pb2.OffsetForLeaderPartitionResult:
        return kit.stub(node).OffsetsForLeaderEpoch(broker_pb2.OffsetsForLeaderEpochRequest(
            replica_id=follower, partitions=[broker_pb2.OffsetForLeaderPartition(
                topic="epochs", partition=0, current_leader_epoch=current, leader_epoch=epoch)])).partitions[0]

    r = ask(st.leader, st.leader_epoch, st.leader_epoch)
    assert (r.error_code, r.leader_epoch, r.end_offset) == (ErrorCode.NONE, st.leader_epoch, 4), r
    assert ask(st.leader, st.leader_epoch + 5).end_offset == -1  # an epoch the leader never had
    assert ask(follower, st.leader_epoch).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert ask(st.leader, 0, st.leader_epoch + 1).error_code == ErrorCode.UNKNOWN_LEADER_EPOCH


def test_abandoned_long_polls_do_not_exhaust_the_broker(kit: Kit) -> None:
    import grpc
    kit.create_topic("abandon", rf=3)
    leader = kit.leader("abandon")
    stub = kit.stub(leader)
    req = broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=2**31 - 1, min_bytes=1 << 30, max_bytes=1 << 20,
                                  partitions=[broker_pb2.FetchPartition(topic="abandon", partition=0, fetch_offset=0,
                                                                        partition_max_bytes=1 << 20,
                                                                        current_leader_epoch=-1)])
    calls = [stub.Fetch.future(req, timeout=0.3) for _ in range(200)]  # more than the worker pool
    for c in calls:
        with pytest.raises(grpc.RpcError):
            c.result()
    # the broker frees the abandoned polls and keeps serving
    def produced() -> bool:
        try:
            r = kit.produce("abandon", 0, make_batch(b"still-alive"), acks=-1, timeout_ms=2000, node_id=leader)
        except grpc.RpcError:
            return False
        return r.error_code == ErrorCode.NONE
    wait_for(produced, 20, "the broker to answer a produce after the abandoned long polls", poll_s=0.2)
