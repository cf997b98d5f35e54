"""More unmodified Kafka clients against the KAFKA listener of a real 3-node Brook cluster: what the
compatibility audit of group offsets, incremental rebalancing and cross-client codecs found.

- A deleted topic's committed offsets go with it, as Kafka's coordinator removes them
  (GroupCoordinator.onPartitionsDeleted): Brook kept them, so OffsetFetch still listed them and a group
  resumed a topic created again under the same name at the old topic's positions, skipping its first records.
- OffsetDelete of a partition that does not exist is refused UNKNOWN_TOPIC_OR_PARTITION, as Kafka's
  KafkaApis.handleDeleteGroupOffsetsRequest answers; Brook answered NONE.
- librdkafka's cooperative-sticky assignor moves only the partitions that change owner (KIP-429), and
  records each client compresses (gzip, snappy, lz4, zstd), with null keys, null and empty values and
  headers, read the same by every other client.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafkakit import kcat, kcat_binary, rdkafka_config, unique
from waiting import wait_for

from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-compat-more"), nodes=3) as c:
        yield c


@pytest.fixture(scope="module")
def kconf(cluster: LocalCluster) -> dict[str, str]:
    return cluster.kafka_client_config()


@pytest.fixture(scope="module")
def rd_admin(kconf: dict[str, str]) -> Any:
    from confluent_kafka.admin import AdminClient
    # An AdminClient is a librdkafka producer handle, and a producer's allow.auto.create.topics is true by
    # default: the Metadata requests it makes for the topics it looked up by name (_create_topic) may create
    # them. After a topic was deleted, its next scan of those topics created it again with
    # auto.create.topics.enable (the default, as Kafka's): 4 of 4 times in a probe, 0 of 4 with this off; the
    # deletion test then waited in vain for the topic to be gone.
    return AdminClient(rdkafka_config(kconf, **{"allow.auto.create.topics": False}))


def _create_topic(rd_admin: Any, name: str, partitions: int, *, again: bool = False) -> None:
    """confluent-kafka's CreateTopics, then until every partition has a leader in its metadata. ``again``: the
    name of a topic just deleted, which may exist again already: with auto.create.topics.enable (the default,
    as Kafka's) a Metadata request naming it with allow_auto_topic_creation creates it, as the module's
    AdminClient's did before it was told not to (rd_admin). Either way the topic is a new, empty one."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    try:
        rd_admin.create_topics([NewTopic(name, partitions, 3)], operation_timeout=30)[name].result(timeout=60)
    except KafkaException as exc:
        if not (again and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise

    def ready() -> bool:
        t = rd_admin.list_topics(name, timeout=10).topics.get(name)
        return (t is not None and t.error is None and len(t.partitions) == partitions
                and all(p.leader >= 0 for p in t.partitions.values()))
    wait_for(ready, 30, f"{name} with {partitions} partitions and their leaders")


@pytest.fixture(scope="module")
def make_topic(rd_admin: Any) -> Callable[[int], str]:
    def make(partitions: int = 1) -> str:
        name = unique("kcm")
        _create_topic(rd_admin, name, partitions)
        return name
    return make


def _produce(kconf: dict[str, str], topic: str, values: list[bytes], partition: int = 0) -> None:
    from confluent_kafka import Producer

    p = Producer(rdkafka_config(kconf, **{"acks": "all"}))
    for v in values:
        p.produce(topic, v, partition=partition)
    assert p.flush(30) == 0


def _group_offsets(rd_admin: Any, group: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    res = rd_admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=30)
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions}


# ---------------------------------------------------------------------------- group offsets and topic deletion


def test_a_deleted_topics_offsets_go_and_a_recreated_topic_starts_from_the_reset_policy(
        kconf, rd_admin, make_topic) -> None:
    """The group commits offset 7 of 10 on a topic and 1 on another; the first topic is deleted (confluent's
    AdminClient): its offsets leave the group (OffsetFetch, as Kafka), the other topic's stay. Created again
    under the same name with 10 new records, the group's consumer starts where auto.offset.reset=earliest
    says, offset 0, and reads all 10: Brook kept the old offset 7 and the consumer skipped 7 records."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as RdTopicPartition

    topic, other = make_topic(1), make_topic(1)
    _produce(kconf, topic, [b"old-%d" % i for i in range(10)])
    _produce(kconf, other, [b"x"])
    group = unique("deleted-topic")
    committer = Consumer(rdkafka_config(kconf, **{"group.id": group, "enable.auto.commit": False}))
    try:
        committer.commit(offsets=[RdTopicPartition(topic, 0, 7), RdTopicPartition(other, 0, 1)], asynchronous=False)
    finally:
        committer.close()
    assert _group_offsets(rd_admin, group) == {(topic, 0): 7, (other, 0): 1}

    rd_admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)
    wait_for(lambda: topic not in rd_admin.list_topics(timeout=10).topics, 30, f"{topic} to be deleted")
    wait_for(lambda: _group_offsets(rd_admin, group) == {(other, 0): 1}, 30,
             lambda: f"the deleted topic's offsets to leave the group; it lists {_group_offsets(rd_admin, group)}")

    _create_topic(rd_admin, topic, 1, again=True)
    _produce(kconf, topic, [b"new-%d" % i for i in range(10)])
    consumer = Consumer(rdkafka_config(kconf, **{"group.id": group, "auto.offset.reset": "earliest",
                                                 "enable.auto.commit": False}))
    read: list[tuple[int, bytes]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(read) < 10 and time.monotonic() < deadline:
            for m in consumer.consume(100, 0.5):
                assert m.error() is None, m.error()
                read.append((m.offset(), m.value()))
    finally:
        consumer.close()
    assert read == [(i, b"new-%d" % i) for i in range(10)], read


def test_offset_delete_refuses_partitions_that_do_not_exist(kconf, rd_admin, make_topic) -> None:
    """kafka-python's delete_group_offsets (OffsetDelete) on an empty group: the committed partition is
    deleted (NONE), a partition past the topic's count and a topic that does not exist are refused
    UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers, and nothing else of the group changes."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as RdTopicPartition
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTopicPartition

    topic = make_topic(2)
    group = unique("offset-delete")
    committer = Consumer(rdkafka_config(kconf, **{"group.id": group, "enable.auto.commit": False}))
    try:
        committer.commit(offsets=[RdTopicPartition(topic, 0, 3), RdTopicPartition(topic, 1, 4)], asynchronous=False)
    finally:
        committer.close()
    missing_topic = unique("no-such-topic")
    asked = [KpTopicPartition(topic, 0), KpTopicPartition(topic, 5), KpTopicPartition(missing_topic, 0)]
    admin = KafkaAdminClient(bootstrap_servers=kconf["bootstrap.servers"].split(","), request_timeout_ms=20_000)
    try:
        result = admin.delete_group_offsets(group, asked)
    finally:
        admin.close()
    assert {tp: err.__name__ for tp, err in result.items()} == {
        asked[0]: "NoError", asked[1]: "UnknownTopicOrPartitionError", asked[2]: "UnknownTopicOrPartitionError"}
    assert _group_offsets(rd_admin, group) == {(topic, 1): 4}
    assert missing_topic not in rd_admin.list_topics(timeout=10).topics  # OffsetDelete made no topic


# ---------------------------------------------------------------------------- incremental rebalancing


def test_cooperative_sticky_moves_only_the_partitions_that_change_owner(kconf, make_topic) -> None:
    """librdkafka's cooperative-sticky (KIP-429) with three consumers joining one by one, then one leaving:
    every partition is owned exactly once at each step, a consumer already in the group is never asked to
    give up a partition it keeps (no revocation of everything, as the eager protocol does), and the leaver's
    partitions alone move."""
    from confluent_kafka import Consumer

    topic = make_topic(6)
    group = unique("coop")
    events: dict[str, list[tuple[str, set[int]]]] = {}

    def member(name: str) -> Any:
        events[name] = []
        c = Consumer(rdkafka_config(kconf, **{
            "group.id": group, "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": 10_000, "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"}))
        c.subscribe([topic], on_assign=lambda _c, ps: events[name].append(("assign", {p.partition for p in ps})),
                    on_revoke=lambda _c, ps: events[name].append(("revoke", {p.partition for p in ps})),
                    on_lost=lambda _c, ps: events[name].append(("lost", {p.partition for p in ps})))
        return c

    def owned(consumers: dict[str, Any]) -> dict[str, set[int]]:
        for c in consumers.values():
            msg = c.poll(0.1)
            assert msg is None or msg.error() is None or msg.error().code() < 0, msg.error()
        return {n: {tp.partition for tp in c.assignment()} for n, c in consumers.items()}

    def balanced(consumers: dict[str, Any]) -> dict[str, set[int]] | None:
        o = owned(consumers)
        sizes = sorted(len(s) for s in o.values())
        covered = set().union(*o.values())
        return o if covered == set(range(6)) and sum(sizes) == 6 and sizes[-1] - sizes[0] <= 1 else None

    running: dict[str, Any] = {}
    try:
        running["a"] = member("a")
        wait_for(lambda: balanced(running), 45, lambda: f"a to own every partition; events {events}")
        previous = owned(running)
        for name in ("b", "c"):
            for e in events.values():
                e.clear()  # what this step does
            running[name] = member(name)
            now = wait_for(lambda: balanced(running), 45,
                           lambda: f"the partitions spread over {sorted(running)}; events {events}")
            for n, kept in previous.items():
                revoked = set().union(set(), *(ps for kind, ps in events[n] if kind == "revoke"))
                assert revoked <= kept - now[n], f"{n} gave up partitions it keeps: {events[n]}"
                assert not any(kind == "lost" for kind, _ in events[n]), events[n]
            previous = now
        leaving = previous["b"]
        for e in events.values():
            e.clear()
        running.pop("b").close()
        now = wait_for(lambda: balanced(running), 45, lambda: f"a and c to take b's partitions; events {events}")
        for n in ("a", "c"):
            assert previous[n] <= now[n], f"{n} lost partitions when b left: {previous[n]} -> {now[n]}"
            assert not any(kind in ("revoke", "lost") for kind, _ in events[n]), events[n]
        assert now["a"] | now["c"] == previous["a"] | previous["c"] | leaving
    finally:
        for c in running.values():
            c.close()


# ---------------------------------------------------------------------------- codecs across clients

RECORDS = 40


def _records() -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    """Null keys, null and empty values (kafka-python needs a key or a value), headers with empty values."""
    out: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
    for i in range(RECORDS):
        key = None if i % 5 == 0 else b"k%d" % i
        value = None if (i % 7 == 3 and key is not None) else b"" if i % 7 == 4 else (b"value-%d " % i) * (i % 4 + 1)
        headers = [] if i % 3 == 0 else [(f"h{i}", b"x"), ("empty", b"")]
        out.append((key, value, headers))
    return out


def _produce_with(client: str, bootstrap: str, kconf: dict[str, str], topic: str, codec: str) -> None:
    recs = _records()
    if client == "confluent":
        from confluent_kafka import Producer

        p = Producer(rdkafka_config(kconf, **{"compression.type": codec, "linger.ms": 50}))
        for k, v, h in recs:
            p.produce(topic, v, k, partition=0, headers=h)
        assert p.flush(30) == 0
    elif client == "kafka-python":
        from kafka import KafkaProducer

        kp = KafkaProducer(bootstrap_servers=bootstrap.split(","), compression_type=codec, linger_ms=50)
        try:
            for f in [kp.send(topic, value=v, key=k, partition=0, headers=h) for k, v, h in recs]:
                f.get(timeout=30)
        finally:
            kp.close(timeout=10)
    else:
        from aiokafka import AIOKafkaProducer

        async def run() -> None:
            ap = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=50)
            await ap.start()
            try:
                futures = [await ap.send(topic, value=v, key=k, partition=0, headers=h) for k, v, h in recs]
                for f in futures:
                    await f
            finally:
                await ap.stop()
        asyncio.run(run())


def _read_with(client: str, bootstrap: str, kconf: dict[str, str], topic: str, kcat_bin: str | None) -> list[Any]:
    """[(key, value, [(header, value)])] of partition 0 from the beginning."""
    out: list[Any] = []
    deadline = time.monotonic() + 30
    if client == "confluent":
        from confluent_kafka import OFFSET_BEGINNING, Consumer
        from confluent_kafka import TopicPartition as RdTopicPartition

        c = Consumer(rdkafka_config(kconf, **{"group.id": unique("r"), "enable.auto.commit": False}))
        try:
            c.assign([RdTopicPartition(topic, 0, OFFSET_BEGINNING)])
            while len(out) < RECORDS and time.monotonic() < deadline:
                for m in c.consume(100, 0.5):
                    assert m.error() is None, m.error()
                    out.append((m.key(), m.value(), list(m.headers() or [])))
        finally:
            c.close()
    elif client == "kafka-python":
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KpTopicPartition

        kc = KafkaConsumer(bootstrap_servers=bootstrap.split(","), auto_offset_reset="earliest")
        try:
            kc.assign([KpTopicPartition(topic, 0)])
            while len(out) < RECORDS and time.monotonic() < deadline:
                for rs in kc.poll(timeout_ms=500).values():
                    out.extend((r.key, r.value, list(r.headers)) for r in rs)
        finally:
            kc.close()
    elif client == "aiokafka":
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition as AioTopicPartition

        async def run() -> None:
            ac = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
            await ac.start()
            try:
                ac.assign([AioTopicPartition(topic, 0)])
                while len(out) < RECORDS and time.monotonic() < deadline:
                    for rs in (await ac.getmany(timeout_ms=500)).values():
                        out.extend((r.key, r.value, list(r.headers)) for r in rs)
            finally:
                await ac.stop()
        asyncio.run(run())
    else:
        assert kcat_bin is not None
        proc = kcat(kcat_bin, kconf, ["-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q", "-J"])
        assert proc.returncode == 0, proc.stderr[-2000:]
        for line in proc.stdout.splitlines():
            if line.strip():
                row = json.loads(line)
                h = row.get("headers") or []
                out.append((None if row["key"] is None else row["key"].encode(),
                            None if row["payload"] is None else row["payload"].encode(),
                            [(h[i], h[i + 1].encode()) for i in range(0, len(h), 2)]))
    return out


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_each_clients_compressed_records_read_the_same_by_every_client(kconf, make_topic, codec: str) -> None:
    kcat_bin, _why = kcat_binary()
    bootstrap = kconf["bootstrap.servers"]
    expected = [(k, v, list(h)) for k, v, h in _records()]
    readers = ["confluent", "kafka-python", "aiokafka"] + (["kcat"] if kcat_bin else [])
    for producer in ("confluent", "kafka-python", "aiokafka"):
        topic = make_topic(1)
        _produce_with(producer, bootstrap, kconf, topic, codec)
        for reader in readers:
            got = _read_with(reader, bootstrap, kconf, topic, kcat_bin)
            assert got == expected, f"{codec} from {producer}, read by {reader}: {got[:3]} ... ({len(got)} records)"


def test_a_refused_produce_names_its_records_in_record_errors(cluster: LocalCluster, rd_admin: Any,
                                                              make_topic: Callable[[int], str]) -> None:
    """KIP-467: a Produce v8+ answer lists the records that made a batch refused, by their index, as Kafka's
    LogValidator does (Java's producer fails those records with their own message). A raw request: librdkafka
    shows only the partition's error."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    from kafka_raw import kafka_ask

    from storage.record_batch import RecordBatchBuilder

    topic = make_topic(1)
    compact = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    rd_admin.incremental_alter_configs([compact])[compact].result(30)
    leader = rd_admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    now = int(time.time() * 1000)

    def produce(records: list[tuple[int, bytes | None]]) -> Any:
        b = RecordBatchBuilder()
        for ts, key in records:
            b.append(ts, key, b"v")
        r = kafka_ask(cluster, leader, 0, 9, {"transactional_id": None, "acks": -1, "timeout": 30_000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": b.build()}]}]})
        return r.responses[0].partition_responses[0]

    def wait_compacted() -> bool:
        return rd_admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])[
            ConfigResource(ResourceType.TOPIC, topic)].result(30)["cleanup.policy"].value == "compact"
    wait_for(wait_compacted, 30, "cleanup.policy=compact")
    keyless = wait_for(lambda: (p := produce([(now, b"a"), (now, None), (now, b"c"), (now, None)])).error_code == 87
                       and p, 30, "the leader to refuse keyless records on the compacted topic (INVALID_RECORD)")
    # Every keyless record, as Kafka lists them, not only the first.
    assert [(e.batch_index, "has no key" in e.batch_index_error_message) for e in keyless.record_errors] == [
        (1, True), (3, True)]
    ahead = produce([(now, b"a"), (now + 3 * 3600_000, b"b"), (now, b"c"), (now + 5 * 3600_000, b"d")])
    assert int(ahead.error_code) == 32, ahead  # INVALID_TIMESTAMP: an hour ahead at most, Kafka 4's default
    assert [e.batch_index for e in ahead.record_errors] == [1, 3]
    # Both kinds in one batch: Kafka checks the key first, and answers INVALID_TIMESTAMP if any timestamp is bad.
    mixed = produce([(now, b"a"), (now, None), (now + 3 * 3600_000, b"c"), (now + 3 * 3600_000, None)])
    assert int(mixed.error_code) == 32, mixed
    assert [(e.batch_index, "has no key" in e.batch_index_error_message) for e in mixed.record_errors] == [
        (1, True), (2, False), (3, True)]
    assert int(produce([(now, b"a")]).error_code) == 0
