"""Unmodified Kafka clients against the KAFKA listener of a real 3-node Brook cluster.

kcat (Debian's package), confluent-kafka (librdkafka), kafka-python and aiokafka talk
Kafka's wire protocol to every broker's KAFKA listener; Brook's own client reads and
writes the same topics over gRPC, so records cross between the two. One plaintext
cluster is shared by the whole module; the failover test (last) kills and restarts a
partition leader and leaves the cluster whole again.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafkakit import (
    brook_batch_headers,
    brook_read_all,
    in_sync,
    kcat,
    kcat_binary,
    partition_leader,
    rdkafka_config,
    rdkafka_read_all,
    unique,
)
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.producer import Producer as BrookProducer
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-compat"), nodes=3) as c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(cluster.bootstrap_servers, request_timeout_ms=20_000) as a:
        yield a


@pytest.fixture(scope="module")
def kconf(cluster: LocalCluster) -> dict[str, str]:
    """What a Kafka client needs: the KAFKA listeners (librdkafka-style keys)."""
    conf = cluster.kafka_client_config()
    assert conf["bootstrap.servers"] == cluster.kafka_bootstrap_servers
    return conf


@pytest.fixture(scope="module")
def make_topic(admin: Admin) -> Callable[..., str]:
    """A fresh topic made through Brook's admin client (gRPC); waits until every partition has a leader."""
    def make(partitions: int = 3, replication_factor: int = 3, configs: dict[str, str] | None = None) -> str:
        name = unique("kc")
        admin.create_topics([NewTopic(name, partitions, replication_factor, configs or {})])
        return name
    return make


@pytest.fixture(scope="module")
def kcat_bin() -> str:
    found, why = kcat_binary()
    if found is None:
        pytest.skip(why)
    return found


def _delivery_log() -> tuple[list[tuple[Any, ...]], Callable[[Any, Any], None]]:
    """(reports, on_delivery): each report is (error or None, partition, offset, key, value, headers)."""
    reports: list[tuple[Any, ...]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        reports.append((err, msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers()))
    return reports, on_delivery


# ---------------------------------------------------------------------------- kcat


def test_kcat_lists_brokers_and_topic_metadata(cluster: LocalCluster, kconf, make_topic, kcat_bin) -> None:
    topic = make_topic(partitions=3)
    proc = kcat(kcat_bin, kconf, ["-L", "-J", "-t", topic])
    assert proc.returncode == 0, f"kcat -L failed: {proc.stderr[-2000:]}"
    md = json.loads(proc.stdout)
    brokers = {b["id"]: b["name"] for b in md["brokers"]}
    assert brokers == {n: cluster.kafka_address(n) for n in cluster.broker_ids}, md["brokers"]
    [t] = md["topics"]
    assert t["topic"] == topic and not t.get("error"), t
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2]
    for p in t["partitions"]:
        replicas = {r["id"] for r in p["replicas"]}
        assert replicas == set(cluster.broker_ids), p
        assert p["leader"] in replicas and {r["id"] for r in p["isrs"]} <= replicas, p


def test_kcat_produces_keys_and_headers_and_consumes_them_back(kconf, make_topic, kcat_bin) -> None:
    topic = make_topic(partitions=3)
    sent = {f"key-{i}": f"value {i}" for i in range(30)}
    stdin = "".join(f"{k}:{v}\n" for k, v in sent.items())
    proc = kcat(kcat_bin, kconf, ["-P", "-t", topic, "-K:", "-H", "source=kcat", "-H", "trace=t-1"], stdin=stdin)
    assert proc.returncode == 0 and "ERROR" not in proc.stderr, f"kcat -P failed: {proc.stderr[-2000:]}"

    proc = kcat(kcat_bin, kconf, ["-C", "-t", topic, "-o", "beginning", "-e", "-q",
                                  "-f", "%k\t%h\t%s\t%p\t%o\n"])
    assert proc.returncode == 0, f"kcat -C failed: {proc.stderr[-2000:]}"
    rows = [line.split("\t") for line in proc.stdout.splitlines() if line]
    assert {k: v for k, _h, v, _p, _o in rows} == sent and len(rows) == len(sent), proc.stdout[-2000:]
    assert {h for _k, h, _v, _p, _o in rows} == {"source=kcat,trace=t-1"}
    by_partition: dict[str, list[int]] = {}
    for _k, _h, _v, p, o in rows:
        by_partition.setdefault(p, []).append(int(o))
    for p, offsets in by_partition.items():
        assert offsets == list(range(len(offsets))), f"partition {p} offsets {offsets}"


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_kcat_compresses_what_it_is_asked_to(cluster: LocalCluster, kconf, make_topic, kcat_bin, codec) -> None:
    """librdkafka before 2.8 (Debian 12's kcat, rsyslog's omkafka) turns gzip, snappy and lz4 on only when the
    broker advertises Produce v0-v2, and otherwise writes those batches uncompressed without a word. Brook
    advertised Produce from v3 (what it serves): every batch of `kcat -z gzip` was stored uncompressed (kcat
    -d msg: "Broker does not support compression type gzip: not compressing batch"). Kafka 4 advertises Produce
    from v0 for this (KAFKA-18659), and so does Brook now."""
    topic = make_topic(partitions=1)
    sent = [f"{codec} record {i} " + "payload " * 10 for i in range(200)]
    proc = kcat(kcat_bin, kconf, ["-P", "-t", topic, "-p", "0", "-z", codec], stdin="".join(f"{v}\n" for v in sent))
    assert proc.returncode == 0 and "ERROR" not in proc.stderr, f"kcat -P failed: {proc.stderr[-2000:]}"
    batches = brook_batch_headers(cluster, topic, 1, len(sent))[0]
    assert {h.compression for h in batches} == {CODEC_IDS[codec]}, batches[:3]
    proc = kcat(kcat_bin, kconf, ["-C", "-t", topic, "-o", "beginning", "-e", "-q"])
    assert proc.returncode == 0 and proc.stdout.splitlines() == sent, proc.stderr[-2000:]


# ---------------------------------------------------------------------------- confluent-kafka


def _kafka_string(buf: bytes, pos: int) -> tuple[str | None, int]:
    (n,) = struct.unpack_from(">h", buf, pos)
    return (None, pos + 2) if n < 0 else (buf[pos + 2:pos + 2 + n].decode(), pos + 2 + n)


def test_consumer_offsets_records_are_read_by_kafkas_schemas(kconf, make_topic) -> None:
    """Tools read a group's commits and members from __consumer_offsets by Kafka's published schemas (Burrow,
    kminion, the console consumer's formatter). Brook's keys were Kafka's but its values a version 0 and
    protobuf, which such a tool read as Kafka's v0: a commit of 42 came out as offset 588301393022943231 (Go
    clients audit). Read here with librdkafka and decoded by the schemas, field by field."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as RdTopicPartition

    topic, group = make_topic(partitions=1), unique("schemas")
    member = Consumer(rdkafka_config(kconf, **{"group.id": group, "client.id": "schema-reader",
                                               "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
    reader = Consumer(rdkafka_config(kconf, **{"group.id": unique("reader"), "enable.auto.commit": False}))
    try:
        member.subscribe([topic])
        wait_for(lambda: member.poll(0.2) is None and bool(member.assignment()), 30, "the member's assignment")
        member.commit(offsets=[RdTopicPartition(topic, 0, 42, metadata="hello")], asynchronous=False)
        internal = reader.list_topics("__consumer_offsets", timeout=10).topics["__consumer_offsets"]
        reader.assign([RdTopicPartition("__consumer_offsets", p, 0) for p in internal.partitions])
        found: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while len(found) < 2 and time.monotonic() < deadline:
            for msg in reader.consume(100, 0.5):
                if msg.error() or msg.value() is None:
                    continue
                key, value = msg.key(), msg.value()
                (key_version,) = struct.unpack_from(">h", key)
                name, pos = _kafka_string(key, 2)
                if name != group:
                    continue
                (value_version,) = struct.unpack_from(">h", value)
                if key_version == 1:  # OffsetCommitKey v1 -> OffsetCommitValue v3
                    key_topic, pos = _kafka_string(key, pos)
                    partition = struct.unpack_from(">i", key, pos)[0]
                    offset, epoch = struct.unpack_from(">qi", value, 2)
                    metadata, vpos = _kafka_string(value, 14)
                    (committed_ms,) = struct.unpack_from(">q", value, vpos)
                    assert vpos + 8 == len(value), "bytes left after the v3 fields"
                    # librdkafka sends the metadata with its C string's NUL (as it does to Kafka)
                    found["offset"] = (value_version, key_topic, partition, offset, (metadata or "").rstrip("\0"),
                                       committed_ms > 0)
                elif key_version == 2 and value_version == 3:  # GroupMetadataKey v2 -> GroupMetadataValue v3
                    protocol_type, vpos = _kafka_string(value, 2)
                    generation = struct.unpack_from(">i", value, vpos)[0]
                    protocol, vpos = _kafka_string(value, vpos + 4)
                    leader, vpos = _kafka_string(value, vpos)
                    count = struct.unpack_from(">i", value, vpos + 8)[0]
                    member_id, vpos = _kafka_string(value, vpos + 12)
                    instance_id, vpos = _kafka_string(value, vpos)
                    client_id, vpos = _kafka_string(value, vpos)
                    host, vpos = _kafka_string(value, vpos)
                    if count == 1:
                        found["group"] = (protocol_type, generation >= 1, protocol is not None, leader == member_id,
                                          instance_id, client_id, host)
        assert found.get("offset") == (3, topic, 0, 42, "hello", True), found
        assert found.get("group") == ("consumer", True, True, True, None, "schema-reader", "127.0.0.1"), found
    finally:
        member.close()
        reader.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_confluent_idempotent_producer_with_compression(cluster: LocalCluster, kconf, make_topic, codec) -> None:
    from confluent_kafka import Producer

    topic = make_topic(partitions=3)
    reports, on_delivery = _delivery_log()
    producer = Producer(rdkafka_config(kconf, **{"enable.idempotence": True, "acks": "all",
                                                  "compression.type": codec, "linger.ms": 20}))
    n = 600
    for i in range(n):
        producer.produce(topic, value=(b"payload-%d " % i) * 8, key=b"k%d" % (i % 12),
                         headers=[("i", str(i).encode())], on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0, "records still queued after 30 s"
    failed = [r for r in reports if r[0] is not None]
    assert len(reports) == n and not failed, f"{len(failed)} failed deliveries, first {failed[:1]}"

    got = rdkafka_read_all(kconf, topic, 3, n)
    for p in range(3):
        acked = sorted((off, key, value) for err, part, off, key, value, _h in reports if part == p)
        read = [(m.offset(), m.key(), m.value()) for m in got[p]]
        assert read == acked, f"partition {p}: what was read is not what was acknowledged"
    # What librdkafka really wrote: compressed, idempotent (a producer id, sequences from 0, no gaps).
    by_partition = brook_batch_headers(cluster, topic, 3, n)
    batches = [h for hs in by_partition.values() for h in hs]
    assert {h.compression for h in batches} == {CODEC_IDS[codec]}
    assert len({(h.producer_id, h.producer_epoch) for h in batches}) == 1 and batches[0].producer_id >= 0
    for p, hs in by_partition.items():
        expected_seq = 0
        for h in hs:
            assert h.base_sequence == expected_seq and h.base_offset == expected_seq, f"partition {p}: {h}"
            expected_seq += h.record_count


def test_a_record_stamped_far_ahead_is_refused_invalid_timestamp(kconf, make_topic) -> None:
    """KIP-937 with Kafka 4's default (message.timestamp.after.max.ms one hour): librdkafka gets
    INVALID_TIMESTAMP for a record stamped ten years ahead, as from Kafka, and the partition keeps
    only the records within the bound."""
    from confluent_kafka import KafkaError, Producer

    topic = make_topic(partitions=1)
    reports, on_delivery = _delivery_log()
    producer = Producer(rdkafka_config(kconf, **{"acks": "all", "linger.ms": 0, "enable.idempotence": False}))
    now_ms = int(time.time() * 1000)
    producer.produce(topic, value=b"now", timestamp=now_ms, on_delivery=on_delivery)
    producer.flush(30)
    producer.produce(topic, value=b"decade-ahead", timestamp=now_ms + 10 * 365 * 24 * 3600 * 1000,
                     on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert [r[0] is None for r in reports] == [True, False], reports
    assert reports[1][0].code() == KafkaError.INVALID_TIMESTAMP, reports[1][0]
    got = rdkafka_read_all(kconf, topic, 1, 1)
    assert [m.value() for m in got[0]] == [b"now"]


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_offsets_for_times_answers_the_first_record_inside_a_batch(cluster: LocalCluster, kconf, make_topic,
                                                                   codec: str) -> None:
    """ListOffsets by timestamp, as Kafka (FileRecords.searchForTimestamp): ten records of one batch stamped
    base+0 s .. base+9 s, asked base+3.5 s, answer offset 4 stamped base+4 s, not the batch's base offset 0 and
    largest timestamp base+9 s (compat audit, finding 3)."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka import TopicPartition as TP
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    topic = make_topic(partitions=1)
    base = int(time.time() * 1000) - 60_000
    producer = Producer(rdkafka_config(kconf, **{"acks": "all", "linger.ms": 500, "compression.type": codec}))
    for i in range(10):
        producer.produce(topic, value=b"v%d" % i, key=b"k%d" % i, partition=0, timestamp=base + i * 1000)
    assert producer.flush(30) == 0
    batches = brook_batch_headers(cluster, topic, 1, 10)[0]
    assert [(h.base_offset, h.record_count) for h in batches] == [(0, 10)], batches  # one batch of ten

    consumer = Consumer(rdkafka_config(kconf, **{"group.id": unique("g"), "enable.auto.commit": False}))
    try:
        for ts, expected in ((base + 3500, 4), (base, 0), (base + 9000, 9), (base + 9001, -1)):
            res = consumer.offsets_for_times([TP(topic, 0, ts)], timeout=20)
            assert res[0].error is None and res[0].offset == expected, (ts, res)
    finally:
        consumer.close()

    kp = KafkaConsumer(bootstrap_servers=kconf["bootstrap.servers"].split(","), request_timeout_ms=30_000)
    try:
        found = kp.offsets_for_times({KTP(topic, 0): base + 3500})[KTP(topic, 0)]
        assert (found.offset, found.timestamp) == (4, base + 4000), found
        found = kp.offsets_for_times({KTP(topic, 0): base + 8001})[KTP(topic, 0)]
        assert (found.offset, found.timestamp) == (9, base + 9000), found
    finally:
        kp.close()


def test_confluent_consumer_group_commits_offsets(kconf, admin: Admin, make_topic) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka import TopicPartition as RdTopicPartition

    topic = make_topic(partitions=3)
    producer = Producer(rdkafka_config(kconf))
    for i in range(30):
        producer.produce(topic, value=b"v%d" % i, key=b"k%d" % i)
    assert producer.flush(30) == 0
    group = unique("rdk-group")
    consumer = Consumer(rdkafka_config(kconf, **{"group.id": group, "auto.offset.reset": "earliest",
                                                 "enable.auto.commit": False}))
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < 30 and time.monotonic() < deadline:
            for m in consumer.consume(100, 0.5):
                assert not m.error(), m.error()
                values.append(m.value())
        assert sorted(values) == sorted(b"v%d" % i for i in range(30))
        consumer.commit(asynchronous=False)
        committed = consumer.committed([RdTopicPartition(topic, p) for p in range(3)], timeout=10)
        ends = {p: consumer.get_watermark_offsets(RdTopicPartition(topic, p), timeout=10)[1] for p in range(3)}
        assert {tp.partition: tp.offset for tp in committed} == ends
        # Kafka refuses to delete the offsets of a topic a live member subscribes to, read from the
        # member's subscription metadata (Kafka's ConsumerProtocolSubscription, not Brook's format);
        # the deletion comes from another client library, kafka-python's admin.
        assert _delete_offsets(kconf, group, topic) == "GroupSubscribedToTopicError"
        # Brook's admin (what `brook group describe` shows) reads the member's Kafka-format subscription
        # and assignment: the topic, its three partitions, and each partition's owner.
        (member,) = admin.describe_groups([group])[group].members
        assert member.subscribed_topics == [topic]
        assert sorted(tp.partition for tp in member.assignment if tp.topic == topic) == [0, 1, 2]
        owners = {tp.partition: o.member_id for tp, o in admin.describe_groups([group])[group].offsets.items()
                  if tp.topic == topic}
        assert owners == {p: member.member_id for p in range(3)}
    finally:
        consumer.close()
    # The same commits, seen by Brook's admin client through the group coordinator.
    offsets = admin.list_group_offsets(group)
    assert {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == topic} == ends
    wait_for(lambda: _delete_offsets(kconf, group, topic) == "NoError", 30,
             "the offsets deleted once the group has no member")
    assert all(tp.topic != topic or tp.partition != 0 for tp in admin.list_group_offsets(group))


def _delete_offsets(kconf, group: str, topic: str) -> str:
    """kafka-python's KafkaAdminClient.delete_group_offsets (OffsetDelete) of ``topic``'s partition 0:
    the partition's error name (NoError on success)."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTopicPartition

    admin = KafkaAdminClient(bootstrap_servers=kconf["bootstrap.servers"].split(","), request_timeout_ms=20_000)
    try:
        result = admin.delete_group_offsets(group, [KpTopicPartition(topic, 0)])
    finally:
        admin.close()
    return result[KpTopicPartition(topic, 0)].__name__


def test_confluent_rebalance_across_two_consumers(kconf, make_topic) -> None:
    from confluent_kafka import Consumer

    topic = make_topic(partitions=4)
    group = unique("rdk-rebalance")
    conf = rdkafka_config(kconf, **{"group.id": group, "auto.offset.reset": "earliest",
                                    "session.timeout.ms": 10_000, "heartbeat.interval.ms": 500})
    a, b = Consumer(conf), Consumer(conf)
    b_open = True
    try:
        a.subscribe([topic])

        def owned(*consumers: Any) -> list[set[int]]:
            for c in consumers:
                c.poll(0.2)
            return [{tp.partition for tp in c.assignment()} for c in consumers]

        wait_for(lambda: owned(a)[0] == {0, 1, 2, 3}, 30, "the first consumer to own all 4 partitions")
        b.subscribe([topic])

        def split() -> list[set[int]] | None:
            sa, sb = owned(a, b)
            return [sa, sb] if sa and sb and not sa & sb and sa | sb == {0, 1, 2, 3} else None
        wait_for(split, 45, lambda: f"both consumers to share the partitions; own {owned(a, b)}")
        b.close()
        b_open = False
        wait_for(lambda: owned(a)[0] == {0, 1, 2, 3}, 45, "the remaining consumer to own all 4 partitions again")
    finally:
        a.close()
        if b_open:
            b.close()


def test_confluent_static_member_restarts_without_a_rebalance_and_a_twin_is_fenced(kconf, admin: Admin,
                                                                                       make_topic) -> None:
    """KIP-345 with librdkafka's group.instance.id: a static member that closes (no LeaveGroup) and comes
    back within its session gets its partitions again in the same generation, the other member untouched;
    a second process started with the same instance id takes the place, and the one it replaced is fenced
    (FENCED_INSTANCE_ID, fatal for librdkafka). Brook's and Kafka's admin both show the instance ids."""
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka.admin import AdminClient

    topic = make_topic(partitions=4)
    group = unique("rdk-static")
    events: dict[str, list[Any]] = {}
    errors_seen: dict[str, list[Any]] = {}

    def member(instance: str, name: str) -> Any:
        events[name], errors_seen[name] = [], []
        c = Consumer(rdkafka_config(kconf, **{
            "group.id": group, "group.instance.id": instance, "auto.offset.reset": "earliest",
            "session.timeout.ms": 30_000, "heartbeat.interval.ms": 300,
            "error_cb": lambda err: errors_seen[name].append(err)}))
        consumers[c] = name
        c.subscribe([topic], on_assign=lambda _c, ps: events[name].append(("assign", {p.partition for p in ps})),
                    on_revoke=lambda _c, ps: events[name].append(("revoke", {p.partition for p in ps})))
        return c

    consumers: dict[Any, str] = {}

    def owned(c: Any) -> set[int]:
        msg = c.poll(0.2)
        if msg is not None and msg.error() is not None:  # librdkafka hands a consumer's errors to poll()
            errors_seen[consumers[c]].append(msg.error())
        return {tp.partition for tp in c.assignment()}

    def generation() -> int:
        return admin.describe_groups([group])[group].generation_id

    a, b = member("a", "a"), member("b", "b")
    open_consumers = [a, b]
    try:
        def split() -> tuple[set[int], set[int]] | None:
            sa, sb = owned(a), owned(b)
            return (sa, sb) if sa and sb and not sa & sb and sa | sb == {0, 1, 2, 3} else None
        _, b_owned = wait_for(split, 45, lambda: f"a and b to share the partitions; events {events}")
        gen = generation()
        described = admin.describe_groups([group])[group]
        assert sorted(m.group_instance_id for m in described.members) == ["a", "b"], described
        a_events = list(events["a"])

        b.close()  # a static member does not leave on close: its place waits for it for its session
        open_consumers.remove(b)
        b2 = member("b", "b2")
        open_consumers.append(b2)
        wait_for(lambda: owned(b2) == b_owned and owned(a), 30,
                 lambda: f"the restarted b to get its partitions {b_owned} back; events {events}")
        assert generation() == gen, "the restart of a static member rebalanced the group"
        assert events["a"] == a_events, f"a was disturbed: {events['a']}"

        rd_admin = AdminClient(rdkafka_config(kconf))
        rd_group = rd_admin.describe_consumer_groups([group])[group].result(timeout=30)
        assert sorted(m.group_instance_id for m in rd_group.members) == ["a", "b"], rd_group.members
        # Kafka's coordinator shows a member's address as Java prints it, what kafka-consumer-groups.sh shows.
        assert {m.host for m in rd_group.members} == {"/127.0.0.1"}, rd_group.members

        b3 = member("b", "b3")  # the same instance id, while b2 runs
        open_consumers.append(b3)

        def b2_fenced() -> bool:
            owned(b3)
            owned(b2)
            return any(e.code() == KafkaError.FENCED_INSTANCE_ID
                       or (e.code() == KafkaError._FATAL and "fenced" in e.str()) for e in errors_seen["b2"])
        wait_for(b2_fenced, 30, lambda: f"b2 fenced by b3; b2 saw {errors_seen['b2']}, events {events}")
        wait_for(lambda: owned(b3) == b_owned, 30, lambda: f"b3 to hold {b_owned}; events {events}")
        assert generation() == gen
    finally:
        for c in open_consumers:
            try:
                c.close()
            except Exception:  # a fenced consumer's close reports the fatal error again
                pass


def test_confluent_admin_client_topics_and_configs(kconf) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

    client = AdminClient(kconf)
    name = unique("rdk-admin")
    futures = client.create_topics([NewTopic(name, num_partitions=3, replication_factor=3,
                                             config={"retention.ms": "3600000"})], operation_timeout=30)
    futures[name].result(timeout=60)

    def listed() -> Any:
        t = client.list_topics(timeout=10).topics.get(name)
        return t if t is not None and t.error is None and len(t.partitions) == 3 else None
    topic = wait_for(listed, 30, f"{name} with 3 partitions in list_topics")
    assert all(len(p.replicas) == 3 and p.leader in p.replicas for p in topic.partitions.values())

    [fut] = client.describe_configs([ConfigResource(ResourceType.TOPIC, name)]).values()
    configs = fut.result(timeout=30)
    assert configs["retention.ms"].value == "3600000"
    assert "cleanup.policy" in configs

    client.delete_topics([name], operation_timeout=30)[name].result(timeout=60)
    wait_for(lambda: name not in client.list_topics(timeout=10).topics, 30, f"{name} to disappear")


# ---------------------------------------------------------------------------- kafka-python


def test_kafka_python_producer_consumer_and_admin(cluster: LocalCluster, kconf, make_topic) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    topic = make_topic(partitions=2)
    boot = kconf["bootstrap.servers"].split(",")
    producer = KafkaProducer(bootstrap_servers=boot, acks="all", compression_type="gzip", linger_ms=5)
    try:
        futures = [producer.send(topic, value=b"kp-%d" % i, key=b"k%d" % (i % 4), headers=[("n", b"%d" % i)])
                   for i in range(40)]
        metas = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(timeout=10)
    assert {m.partition for m in metas} <= {0, 1}

    consumer = KafkaConsumer(topic, bootstrap_servers=boot, group_id=unique("kp-group"),
                             auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=1000)
    got: list[Any] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < 40 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(records)
        consumer.commit()
    finally:
        consumer.close()
    assert sorted(r.value for r in got) == sorted(b"kp-%d" % i for i in range(40))
    for r in got:
        i = int(r.value.split(b"-")[1])
        assert r.key == b"k%d" % (i % 4) and list(r.headers) == [("n", b"%d" % i)]
    stored = {(m.partition, m.offset) for m in metas}
    assert {(r.partition, r.offset) for r in got} == stored

    admin = KafkaAdminClient(bootstrap_servers=boot, request_timeout_ms=20_000)
    try:
        assert topic in admin.list_topics()
        described = admin.describe_cluster()
        assert {b["broker_id"] for b in described["brokers"]} == set(cluster.broker_ids)
    finally:
        admin.close()


# ---------------------------------------------------------------------------- aiokafka


async def test_aiokafka_producer_and_group_consumer(kconf, make_topic) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = make_topic(partitions=2)
    producer = AIOKafkaProducer(bootstrap_servers=kconf["bootstrap.servers"], acks="all",
                                enable_idempotence=True, compression_type="zstd")
    await producer.start()
    try:
        metas = [await producer.send_and_wait(topic, b"aio-%d" % i, key=b"k%d" % i, headers=[("h", b"x")])
                 for i in range(20)]
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kconf["bootstrap.servers"], group_id=unique("aio"),
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    got: list[Any] = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(records)
        await consumer.commit()
    finally:
        await consumer.stop()
    assert sorted(r.value for r in got) == sorted(b"aio-%d" % i for i in range(20))
    assert all(r.key == b"k" + r.value[4:] and list(r.headers) == [("h", b"x")] for r in got)
    assert {(r.partition, r.offset) for r in got} == {(m.partition, m.offset) for m in metas}


async def test_aiokafka_static_member_restarts_without_a_rebalance(kconf, admin: Admin, make_topic) -> None:
    """aiokafka's group_instance_id: a stopped static member's place waits; started again it gets the same
    partitions in the same generation."""
    from aiokafka import AIOKafkaConsumer

    topic, group = make_topic(partitions=4), unique("aio-static")

    async def member(instance: str) -> Any:
        c = AIOKafkaConsumer(topic, bootstrap_servers=kconf["bootstrap.servers"], group_id=group,
                             group_instance_id=instance, session_timeout_ms=30_000, heartbeat_interval_ms=300,
                             auto_offset_reset="earliest")
        await c.start()
        return c

    async def owned(c: Any) -> set[int]:
        await c.getmany(timeout_ms=100)
        return {tp.partition for tp in c.assignment()}

    async def until(cond: Callable[[], Any], what: str) -> Any:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            if found := await cond():
                return found
        raise AssertionError(f"timed out waiting for {what}")

    a, b = await member("a"), await member("b")
    running = [a, b]
    try:
        async def split() -> tuple[set[int], set[int]] | None:
            sa, sb = await owned(a), await owned(b)
            return (sa, sb) if sa and sb and not sa & sb and sa | sb == {0, 1, 2, 3} else None
        _, b_owned = await until(split, "a and b to share the partitions")
        before = admin.describe_groups([group])[group]
        await b.stop()
        running.remove(b)
        b2 = await member("b")
        running.append(b2)

        async def b_back() -> bool:
            await owned(a)
            return await owned(b2) == b_owned
        await until(b_back, f"the restarted b to get {b_owned} back")
        after = admin.describe_groups([group])[group]
        assert after.generation_id == before.generation_id, (before, after)
        assert sorted(m.group_instance_id for m in after.members) == ["a", "b"]
    finally:
        for c in running:
            await c.stop()


# ---------------------------------------------------------------------------- committed offsets and ACLs


def test_a_negative_committed_offset_is_stored_and_read_back_as_none(kconf, make_topic) -> None:
    """Kafka stores an OffsetCommit's offset as given: KafkaJS commits -1 and -2 to reset a group (after
    OFFSET_OUT_OF_RANGE, and in admin.resetOffsets). Brook refused them with INVALID_COMMIT_OFFSET_SIZE, which
    is not retriable: KafkaJS consumers died and resetOffsets never returned (KafkaJS audit). Every client
    reads a negative committed offset as none, and the group then starts by auto.offset.reset."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=kconf["bootstrap.servers"].split(","), group_id=unique("kp-neg"),
                             enable_auto_commit=False)
    try:
        consumer.commit({tp: OffsetAndMetadata(-2, "", -1)})  # raised InvalidCommitOffsetSizeError
        assert consumer.committed(tp) is None
        consumer.commit({tp: OffsetAndMetadata(5, "", -1)})
        assert consumer.committed(tp) == 5
    finally:
        consumer.close()


def test_acl_apis_on_a_broker_without_an_authorizer_answer_security_disabled(kconf) -> None:
    """As Kafka answers them: a DENY created there would enforce nothing, and looked like protection (KafkaJS
    audit: createAcls succeeded, describeAcls listed it)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient(kconf)
    binding = AclBinding(ResourceType.TOPIC, "payroll", ResourcePatternType.LITERAL, "User:mallory", "*",
                         AclOperation.READ, AclPermissionType.DENY)
    with pytest.raises(KafkaException) as created:
        admin.create_acls([binding])[binding].result(30)
    assert created.value.args[0].name() == "SECURITY_DISABLED", created.value
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    with pytest.raises(KafkaException) as deleted:
        admin.delete_acls([everything])[everything].result(30)
    assert deleted.value.args[0].name() == "SECURITY_DISABLED", deleted.value
    # confluent-kafka 2.16 answers a DescribeAcls error with an empty list; kafka-python raises it.
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KpResourceType
    from kafka.errors import SecurityDisabledError

    kp = KafkaAdminClient(bootstrap_servers=kconf["bootstrap.servers"].split(","))
    try:
        with pytest.raises(SecurityDisabledError):
            kp.describe_acls(ACLFilter(principal=None, host="*", operation=ACLOperation.ANY,
                                       permission_type=ACLPermissionType.ANY,
                                       resource_pattern=ResourcePatternFilter(KpResourceType.ANY, None,
                                                                              ACLResourcePatternType.ANY)))
    finally:
        kp.close()


# ---------------------------------------------------------------------------- transactions
# Each client's own transactional API, as an application uses it: init, a transaction committed over both
# partitions, one flushed then aborted, a third committed. A read_committed consumer of the same client reads
# exactly the committed records, at the offsets the producer was given; a read_uncommitted one the aborted too.
TXN_PARTITIONS = 2
TXN_RECORDS = 6  # per transaction; record i goes to partition i % TXN_PARTITIONS
TXN_PLAN = (("first", "commit"), ("second", "abort"), ("third", "commit"))
TXN_WITHIN_S = 30.0  # each init, commit, abort, flush and read

Row = tuple[int, int, bytes]  # (partition, offset, value)


def _txn_records(name: str) -> list[tuple[int, bytes]]:
    """(partition, value) of each record of transaction ``name``, in send order."""
    return [(i % TXN_PARTITIONS, f"{name}-{i}".encode()) for i in range(TXN_RECORDS)]


def _per_partition(rows: list[Row]) -> dict[int, list[tuple[int, bytes]]]:
    """{partition: [(offset, value), ...]} in the order of ``rows``."""
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(TXN_PARTITIONS)}
    for partition, offset, value in rows:
        out[partition].append((offset, value))
    return out


def _expected_reads(produced: dict[str, list[Row]]) -> dict[str, list[Row]]:
    """What each isolation level must read, from what the producer was told of each transaction."""
    assert [name for name, _ in TXN_PLAN] == list(produced), produced
    return {"read_committed": [r for name, outcome in TXN_PLAN if outcome == "commit" for r in produced[name]],
            "read_uncommitted": [r for name, _ in TXN_PLAN for r in produced[name]]}


def _assert_read(isolation: str, got: list[Row], expected: list[Row]) -> None:
    assert _per_partition(got) == _per_partition(expected), (
        f"a {isolation} consumer read {_per_partition(got)}; the producer was given {_per_partition(expected)}")


def _within(call: Callable[[], Any], what: str, timeout_s: float = TXN_WITHIN_S) -> None:
    """``call()`` with a deadline, for a client call that waits without one (kafka-python's commit_transaction
    and abort_transaction): fails saying what did not return, or raises what the call raised."""
    done, raised = threading.Event(), []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            raised.append(e)
        finally:
            done.set()
    threading.Thread(target=run, daemon=True, name=what).start()
    assert done.wait(timeout_s), f"{what} did not return within {timeout_s} s"
    if raised:
        raise raised[0]


def _confluent_read(kconf, topic: str, isolation: str, expected: int) -> list[Row]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as RdTopicPartition

    consumer = Consumer(rdkafka_config(kconf, **{"group.id": unique("txn-reader"), "enable.auto.commit": False,
                                                 "isolation.level": isolation}))
    rows: list[Row] = []
    errors: list[str] = []

    def read_more() -> bool:
        for m in consumer.consume(100, 0.2):
            if m.error():
                errors.append(str(m.error()))
            else:
                rows.append((m.partition(), m.offset(), m.value()))
        return len(rows) >= expected
    try:
        consumer.assign([RdTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(TXN_PARTITIONS)])
        wait_for(read_more, TXN_WITHIN_S,
                 lambda: f"{expected} records of {topic} read {isolation}: read {rows}, errors {errors[-3:]}")
    finally:
        consumer.close()
    return rows


def test_confluent_transactions_commit_and_abort(kconf, make_topic) -> None:
    """librdkafka's init_transactions, begin_transaction, commit_transaction, abort_transaction (after flush):
    read_committed consumers read the committed records only, read_uncommitted ones all."""
    from confluent_kafka import Producer

    topic = make_topic(partitions=TXN_PARTITIONS)
    reports, on_delivery = _delivery_log()
    producer = Producer(rdkafka_config(kconf, **{"transactional.id": unique("rd-txn")}))
    producer.init_transactions(TXN_WITHIN_S)
    produced: dict[str, list[Row]] = {}
    for name, outcome in TXN_PLAN:
        producer.begin_transaction()
        for partition, value in _txn_records(name):
            producer.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
        if outcome == "commit":
            producer.commit_transaction(TXN_WITHIN_S)
        else:
            assert producer.flush(TXN_WITHIN_S) == 0, f"transaction {name}: records left unsent"
            producer.abort_transaction(TXN_WITHIN_S)
        assert producer.flush(TXN_WITHIN_S) == 0  # serves the delivery reports left
        delivered = {r[4]: r for r in reports if r[4].startswith(f"{name}-".encode())}
        ok = [(None, p) for p, v in _txn_records(name)]
        assert [delivered[v][:2] if v in delivered else None for _p, v in _txn_records(name)] == ok, (
            f"transaction {name}: delivery reports {delivered}")
        produced[name] = [(p, delivered[v][2], v) for p, v in _txn_records(name)]

    for isolation, expected in _expected_reads(produced).items():
        _assert_read(isolation, _confluent_read(kconf, topic, isolation, len(expected)), expected)


def _kafka_python_read(boot: list[str], topic: str, isolation: str, expected: int) -> list[Row]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=boot, isolation_level=isolation, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    rows: list[Row] = []

    def read_more() -> bool:
        for records in consumer.poll(timeout_ms=200).values():
            rows.extend((r.partition, r.offset, r.value) for r in records)
        return len(rows) >= expected
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(TXN_PARTITIONS)])
        consumer.seek_to_beginning()
        wait_for(read_more, TXN_WITHIN_S, lambda: f"{expected} records of {topic} read {isolation}: read {rows}")
    finally:
        consumer.close()
    return rows


def test_kafka_python_transactions_commit_and_abort(kconf, make_topic) -> None:
    """kafka-python's KafkaProducer(transactional_id=...): init_transactions, begin_transaction,
    commit_transaction, abort_transaction (after flush); KafkaConsumer(isolation_level=...) reads them back."""
    from kafka import KafkaProducer

    topic = make_topic(partitions=TXN_PARTITIONS)
    boot = kconf["bootstrap.servers"].split(",")
    producer = KafkaProducer(bootstrap_servers=boot, transactional_id=unique("kp-txn"),
                             max_block_ms=int(TXN_WITHIN_S * 1000))
    produced: dict[str, list[Row]] = {}
    try:
        producer.init_transactions()
        for name, outcome in TXN_PLAN:
            producer.begin_transaction()
            sent = [(p, v, producer.send(topic, value=v, partition=p)) for p, v in _txn_records(name)]
            if outcome == "commit":
                _within(producer.commit_transaction, f"kafka-python's commit_transaction of {name}")
            else:
                producer.flush(timeout=TXN_WITHIN_S)
                _within(producer.abort_transaction, f"kafka-python's abort_transaction of {name}")
            metas = [(p, v, f.get(timeout=TXN_WITHIN_S)) for p, v, f in sent]
            assert [m.partition for _p, _v, m in metas] == [p for p, _v, _m in metas], metas
            produced[name] = [(p, m.offset, v) for p, v, m in metas]
    finally:
        producer.close(timeout=10)

    for isolation, expected in _expected_reads(produced).items():
        _assert_read(isolation, _kafka_python_read(boot, topic, isolation, len(expected)), expected)


async def test_aiokafka_transactions_commit_and_abort(kconf, make_topic) -> None:
    """aiokafka's AIOKafkaProducer(transactional_id=...): ``async with producer.transaction()`` commits,
    begin_transaction/flush/abort_transaction aborts; AIOKafkaConsumer(isolation_level=...) reads them back."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    topic = make_topic(partitions=TXN_PARTITIONS)
    boot = kconf["bootstrap.servers"]
    producer = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=unique("aio-txn"))
    produced: dict[str, list[Row]] = {}

    async def transaction(name: str, outcome: str) -> list[Row]:
        if outcome == "commit":
            async with producer.transaction():
                sent = [(p, v, await producer.send(topic, v, partition=p)) for p, v in _txn_records(name)]
        else:
            await producer.begin_transaction()
            sent = [(p, v, await producer.send(topic, v, partition=p)) for p, v in _txn_records(name)]
            await producer.flush()
            await producer.abort_transaction()
        metas = [(p, v, await f) for p, v, f in sent]
        assert [m.partition for _p, _v, m in metas] == [p for p, _v, _m in metas], metas
        return [(p, m.offset, v) for p, v, m in metas]
    try:
        await asyncio.wait_for(producer.start(), TXN_WITHIN_S)  # InitProducerId for the transactional id
        for name, outcome in TXN_PLAN:
            try:
                produced[name] = await asyncio.wait_for(transaction(name, outcome), TXN_WITHIN_S)
            except TimeoutError:
                raise AssertionError(f"aiokafka's transaction {name} ({outcome}) took over {TXN_WITHIN_S} s") from None
    finally:
        await producer.stop()

    for isolation, expected in _expected_reads(produced).items():
        consumer = AIOKafkaConsumer(bootstrap_servers=boot, isolation_level=isolation, enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        rows: list[Row] = []
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, p) for p in range(TXN_PARTITIONS)])
            await consumer.seek_to_beginning()
            deadline = time.monotonic() + TXN_WITHIN_S
            while len(rows) < len(expected):
                assert time.monotonic() < deadline, (
                    f"timed out after {TXN_WITHIN_S} s waiting for {len(expected)} records of {topic} read "
                    f"{isolation}; read {rows}")
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    rows.extend((r.partition, r.offset, r.value) for r in records)
        finally:
            await consumer.stop()
        _assert_read(isolation, rows, expected)


# ---------------------------------------------------------------------------- cross-reads


def test_kafka_client_records_read_by_brook_client(cluster: LocalCluster, kconf, make_topic) -> None:
    from confluent_kafka import Producer

    topic = make_topic(partitions=2)
    reports, on_delivery = _delivery_log()
    producer = Producer(rdkafka_config(kconf, **{"enable.idempotence": True}))
    sent = []
    base_ms = int(time.time() * 1000) - 60_000  # recent: records past retention.ms go, the active segment's too
    for i in range(20):
        key = None if i % 5 == 0 else b"key-%d" % i
        headers = [("n", b"%d" % i), ("empty", None), ("dup", b"a"), ("dup", b"b")]
        producer.produce(topic, value=b"from-kafka-%d" % i, key=key, headers=headers, partition=i % 2,
                         timestamp=base_ms + i, on_delivery=on_delivery)
        sent.append((i % 2, key, b"from-kafka-%d" % i, headers, base_ms + i))
    assert producer.flush(30) == 0 and all(r[0] is None for r in reports), reports[:1]

    got = brook_read_all(cluster, topic, 2, len(sent))
    for p in range(2):
        expected = [(k, v, tuple(h), ts) for part, k, v, h, ts in sent if part == p]
        assert [(r.key, r.value, r.headers, r.timestamp) for r in got[p]] == expected, f"partition {p}"


def test_brook_client_records_read_by_kafka_clients(cluster: LocalCluster, kconf, make_topic, kcat_bin) -> None:
    topic = make_topic(partitions=1)
    sent = []
    with BrookProducer(bootstrap_servers=cluster.bootstrap_servers, acks="all", compression_type="snappy") as p:
        for i in range(10):
            key = None if i == 0 else b"bk-%d" % i
            headers = [("origin", b"brook"), ("i", b"%d" % i), ("null", None)]
            p.send(topic, b"from-brook-%d" % i, key=key, headers=headers, partition=0)
            sent.append((key, b"from-brook-%d" % i, headers))
        p.flush()

    [msgs] = rdkafka_read_all(kconf, topic, 1, len(sent)).values()
    assert [(m.key(), m.value(), m.headers()) for m in msgs] == sent

    proc = kcat(kcat_bin, kconf, ["-C", "-t", topic, "-o", "beginning", "-e", "-q", "-J"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [(r["key"], r["payload"]) for r in rows] == [
        (None if k is None else k.decode(), v.decode()) for k, v, _h in sent]
    assert rows[1]["headers"] == ["origin", "brook", "i", "1", "null", None]


# ---------------------------------------------------------------------------- failover (last: kills a node)


def _kafka_python_sequence(bootstrap: str, topic: str, n: int, acked: dict[int, int], failed: list[Any]) -> None:
    """kafka-python, enable_idempotence + acks=all: values b"kp%06d"; acked {i: offset}."""
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all", enable_idempotence=True, linger_ms=5,
                      delivery_timeout_ms=90_000, request_timeout_ms=15_000, retry_backoff_ms=100)
    try:
        futures = []
        for i in range(n):
            futures.append((i, p.send(topic, value=b"kp%06d" % i)))
            time.sleep(0.005)
        acked[-1] = int(time.monotonic() * 1000)  # when the last record was sent (removed before the checks)
        p.flush(120)
        for i, f in futures:
            try:
                acked[i] = f.get(timeout=1).offset
            except Exception as exc:  # a failed delivery is allowed; a lost acknowledged one is not
                failed.append(exc)
    finally:
        p.close(timeout=5)


def _aiokafka_sequence(bootstrap: str, topic: str, n: int, acked: dict[int, int], failed: list[Any]) -> None:
    """aiokafka, enable_idempotence (acks=all): values b"ak%06d"; acked {i: offset}."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5,
                             request_timeout_ms=90_000, retry_backoff_ms=100)
        await p.start()
        try:
            futures = []
            for i in range(n):
                futures.append((i, await p.send(topic, value=b"ak%06d" % i)))
                await asyncio.sleep(0.005)
            acked[-1] = int(time.monotonic() * 1000)  # when the last record was sent (removed before the checks)
            for i, f in futures:
                try:
                    acked[i] = (await f).offset
                except Exception as exc:
                    failed.append(exc)
        finally:
            await p.stop()
    asyncio.run(run())


def test_the_peer_bench_fixed_rate_run_times_each_record_once(cluster: LocalCluster, kconf, make_topic,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``make bench-peer``'s latency run for librdkafka (``kafka_perf.produce_at_rate``): every record,
    warm-up included, is written once, each measured record has one latency (librdkafka's own), and
    the line it prints is the one the bench's table is read from."""
    from deploy.local import kafka_perf
    from deploy.local.peer_bench import latency_figures

    topic = make_topic(1)
    result = kafka_perf.produce_at_rate(kconf, topic, 400, rate=4000, warmup_records=100)
    out = capsys.readouterr().out
    assert result is not None, out
    assert len(result.latencies_ms) == 400 and min(result.latencies_ms) > 0, out
    figures = latency_figures(out)
    assert figures is not None, out
    assert figures["50th"] == pytest.approx(result.percentile(0.5), abs=0.01)
    assert figures["99th"] == pytest.approx(result.percentile(0.99), abs=0.01)
    # 400 records at 4,000/s take at least 0.1 s, whatever the machine
    assert result.elapsed_s >= 0.09 and figures["rate"] <= 4400, out
    read = brook_read_all(cluster, topic, 1, 500)
    assert len(read[0]) == 500 and [r.offset for r in read[0]] == list(range(500))


def test_idempotent_acks_all_survives_leader_sigkill(cluster: LocalCluster, admin: Admin, kconf, make_topic) -> None:
    """confluent-kafka, kafka-python and aiokafka, each an idempotent acks=all producer of a numbered
    sequence, write to one RF-3 partition while its leader is SIGKILLed and later restarted: for each
    client, every acknowledged record is in the log exactly once, in order, at the offset it was
    acknowledged with."""
    import threading

    from confluent_kafka import Producer

    topic = make_topic(partitions=1, configs={"min.insync.replicas": "2"})
    reports, on_delivery = _delivery_log()
    producer = Producer(rdkafka_config(kconf, **{"enable.idempotence": True, "acks": "all", "linger.ms": 5,
                                                  "message.timeout.ms": 90_000}))
    n, kill_at, restart_at = 600, 200, 400
    others: dict[bytes, tuple[dict[int, int], list[Any]]] = {b"kp": ({}, []), b"ak": ({}, [])}
    threads = [threading.Thread(target=fn, args=(kconf["bootstrap.servers"], topic, n, *others[prefix]),
                                name=f"failover-{prefix.decode()}", daemon=True)
               for prefix, fn in ((b"kp", _kafka_python_sequence), (b"ak", _aiokafka_sequence))]
    for t in threads:
        t.start()
    victim = None
    for i in range(n):
        producer.produce(topic, value=b"%06d" % i, on_delivery=on_delivery)
        producer.poll(0.005)  # paced: batches are in flight when the leader dies
        if i == kill_at:
            victim = partition_leader(admin, topic)
            cluster.kill_node(victim)
            killed_ms = int(time.monotonic() * 1000)
        if i == restart_at:
            assert victim is not None
            wait_for(lambda v=victim: partition_leader(admin, topic) not in (-1, v), 30, "a new leader")
            cluster.start_node(victim)
    assert producer.flush(120) == 0, "records still queued 120 s after the last send"
    for t in threads:
        t.join(180)
        assert not t.is_alive(), f"{t.name} did not finish within 180 s"
    for prefix, (client_acked, _) in others.items():  # each client was still sending when the leader died
        assert client_acked.pop(-1, 0) > killed_ms, f"{prefix!r} finished sending before the SIGKILL"
    failed = [r for r in reports if r[0] is not None]
    acked = {int(v): off for err, _p, off, _k, v, _h in reports if err is None}
    assert len(reports) == n
    # librdkafka's idempotent producer retries through a leader change without giving up.
    assert not failed, f"{len(failed)} deliveries failed, first: {failed[0][0]}"

    end = max([*acked.values(), *(off for a, _ in others.values() for off in a.values())]) + 1
    [msgs] = rdkafka_read_all(kconf, topic, 1, end, timeout_s=60).values()
    by_client: dict[bytes, list[tuple[int, int]]] = {b"": [], b"kp": [], b"ak": []}
    for m in msgs:
        v = m.value()
        by_client[v[:2] if v[:2] in (b"kp", b"ak") else b""].append((int(v.lstrip(b"kpa")), m.offset()))
    for prefix, client_acked in ((b"", acked), (b"kp", others[b"kp"][0]), (b"ak", others[b"ak"][0])):
        name = {b"": "confluent-kafka", b"kp": "kafka-python", b"ak": "aiokafka"}[prefix]
        numbers = [i for i, _ in by_client[prefix]]
        at = dict(by_client[prefix])
        assert client_acked, f"{name}: nothing was acknowledged (failures: {others.get(prefix, ({}, []))[1][:1]})"
        assert len(numbers) == len(set(numbers)), f"{name}: a record was written twice"
        assert numbers == sorted(numbers), f"{name}: records are out of order"
        lost = sorted(set(client_acked) - set(numbers))
        assert not lost, f"{name}: acknowledged but lost: {lost[:10]}"
        assert all(at[i] == off for i, off in client_acked.items()), \
            f"{name}: a record is not at the offset its acknowledgement gave"

    # Leave the cluster whole for whatever runs next.
    cluster.wait_ready(timeout_s=120)
    wait_for(lambda: in_sync(admin, topic, 3), 60, f"node {victim} back in the ISR of {topic}")


def test_acks_all_writes_resume_within_a_bound_when_the_leader_freezes(cluster: LocalCluster, admin: Admin, kconf,
                                                                      make_topic) -> None:
    """Liveness with a client nobody here wrote: an idempotent librdkafka producer at acks=all writes to one RF-3
    partition, and its leader is SIGSTOPped (alive, silent: a hung host, a long pause). The controller fences
    it, another replica leads, and librdkafka, whose requests to the frozen leader time out
    (``socket.timeout.ms`` 10 s here), finds the new leader: records sent after the freeze are acknowledged
    within a bound. When the frozen node wakes it holds a stale epoch and takes no write. Every acknowledged
    record is in the log once, in order, at its offset."""
    from confluent_kafka import Producer

    topic = make_topic(partitions=1, configs={"min.insync.replicas": "2"})
    reports, on_delivery = _delivery_log()
    producer = Producer(rdkafka_config(kconf, **{"enable.idempotence": True, "acks": "all", "linger.ms": 5,
                                                  "message.timeout.ms": 120_000}))
    victim = partition_leader(admin, topic)
    sent_at: dict[int, float] = {}
    frozen_at = resumed = None
    i = seen = acks = 0
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and resumed is None:
            sent_at[i] = time.monotonic()
            producer.produce(topic, value=b"%06d" % i, on_delivery=on_delivery)
            producer.poll(0.01)
            i += 1
            for err, _p, _o, _k, v, _h in reports[seen:]:
                acks += err is None
                if err is None and frozen_at is not None and sent_at[int(v)] > frozen_at:
                    resumed = time.monotonic() - frozen_at
            seen = len(reports)
            if frozen_at is None and acks >= 100:
                cluster.pause_node(victim)
                frozen_at = time.monotonic()
        assert resumed is not None, f"no record sent after the freeze of node {victim} was acknowledged in 180 s"
        print(f"leader node {victim} frozen: writes acknowledged again after {resumed:.1f} s")
        assert resumed < 90, f"writes resumed only {resumed:.1f} s after the leader froze"
        for _ in range(100):  # more after it, then wake the frozen node: it must not take them
            producer.produce(topic, value=b"%06d" % i, on_delivery=on_delivery)
            producer.poll(0.005)
            i += 1
        cluster.resume_node(victim)
        assert producer.flush(120) == 0, "records still queued 120 s after the last send"
    finally:
        cluster.resume_node(victim)
    failed = [r for r in reports if r[0] is not None]
    assert not failed, f"{len(failed)} deliveries failed, first: {failed[0][0]}"
    acked = {int(v): off for err, _p, off, _k, v, _h in reports if err is None}
    assert len(acked) == i
    [msgs] = rdkafka_read_all(kconf, topic, 1, i, timeout_s=60).values()
    numbers = [int(m.value()) for m in msgs]
    assert numbers == list(range(i)), "a record was lost, written twice or reordered"
    assert all(acked[int(m.value())] == m.offset() for m in msgs), "a record is not at its acknowledged offset"
    cluster.wait_ready(timeout_s=120)
    wait_for(lambda: in_sync(admin, topic, 3), 60, f"node {victim} back in the ISR of {topic}")


@pytest.mark.parametrize("first", ["brook", "librdkafka"])
def test_a_group_mixes_brook_and_librdkafka_consumers(cluster: LocalCluster, kconf, make_topic, first: str) -> None:
    """One group, a Brook consumer (gRPC) and a librdkafka one (Kafka listener), either of them the leader
    that assigns (the first to join): both speak Kafka's consumer protocol, so each gets two of the four
    partitions and together they read every record once. Kafka's admin (kafka-python) then describes the
    group, assignments decoded. Brook's client used to write protobuf: with it leading, every rebalance
    failed in librdkafka's decode; with librdkafka leading, the Brook member got no partition."""
    from confluent_kafka import Consumer as RdConsumer
    from confluent_kafka import Producer
    from kafka import KafkaAdminClient

    from client.consumer import Consumer as BrookConsumer

    topic = make_topic(partitions=4)
    group = unique("mixed")
    kw = {k.replace(".", "_"): v for k, v in cluster.client_config.items()}
    brook = BrookConsumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                          partition_assignment_strategy="range", enable_auto_commit=False, **kw)
    rdk = RdConsumer(rdkafka_config(kconf, **{"group.id": group, "auto.offset.reset": "earliest",
                                               "enable.auto.commit": False, "partition.assignment.strategy": "range"}))
    seen: dict[str, list[bytes]] = {"brook": [], "librdkafka": []}

    def poll_both() -> None:
        for records in brook.poll(timeout_ms=200).values():
            seen["brook"].extend(r.value for r in records)
        for m in rdk.consume(100, 0.2):
            assert not m.error(), m.error()
            seen["librdkafka"].append(m.value())

    try:
        if first == "brook":
            brook.subscribe([topic])
            wait_for(lambda: (poll_both(), len(brook.assignment()) == 4)[1], 30, "the Brook consumer alone")
            rdk.subscribe([topic])
        else:
            rdk.subscribe([topic])
            wait_for(lambda: (poll_both(), len(rdk.assignment()) == 4)[1], 30, "the librdkafka consumer alone")
            brook.subscribe([topic])
        wait_for(lambda: (poll_both(), len(brook.assignment()) == 2 and len(rdk.assignment()) == 2)[1], 60,
                 lambda: f"two partitions each: brook {sorted(brook.assignment())}, "
                         f"librdkafka {[(p.topic, p.partition) for p in rdk.assignment()]}")
        # Written once the partitions are shared out: each record is then read by its partition's owner only.
        producer = Producer(rdkafka_config(kconf))
        for i in range(40):
            producer.produce(topic, value=b"m%d" % i, partition=i % 4)
        assert producer.flush(30) == 0
        wait_for(lambda: (poll_both(), len(seen["brook"]) + len(seen["librdkafka"]) >= 40)[1], 30,
                 lambda: f"every record: {len(seen['brook'])} + {len(seen['librdkafka'])} of 40")
        assert sorted(seen["brook"] + seen["librdkafka"]) == sorted(b"m%d" % i for i in range(40))
        assert len(seen["brook"]) == len(seen["librdkafka"]) == 20, {k: len(v) for k, v in seen.items()}
        admin = KafkaAdminClient(bootstrap_servers=kconf["bootstrap.servers"].split(","), request_timeout_ms=20_000)
        try:
            described = admin.describe_groups([group])[group]
        finally:
            admin.close()
        text = repr(described)
        assert described["group_state"] == "Stable" and len(described["members"]) == 2, text[:800]
        assert text.count(topic) >= 4, f"both members' subscriptions and assignments decoded: {text[:800]}"
    finally:
        brook.close()
        rdk.close()
