"""Producer, Consumer and Admin against a real 3-node cluster (RF=3)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from clientkit import KAFKA_MURMUR2, consume_all
from waiting import wait_for

from client import errors
from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.types import OffsetAndMetadata, TopicPartition
from storage.record_batch import decode_records

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_every_codec(cluster, new_topic, codec: str) -> None:
    topic = new_topic(partitions=2)
    sent = []
    base_ms = int(time.time() * 1000) - 60_000  # recent: records past retention.ms go, the active segment's too
    with Producer(bootstrap_servers=cluster.bootstrap_servers, compression_type=codec, linger_ms=20) as producer:
        futures = []
        for i in range(300):
            key = b"key-%d" % (i % 7)
            value = (b"value-%d-" % i) * (1 + i % 5)
            headers = [("i", str(i).encode()), ("none", None)]
            futures.append(producer.send(topic, value, key=key, headers=headers, timestamp=base_ms + i))
            sent.append((key, value))
        producer.flush()
        metas = [f.get(timeout=10) for f in futures]
    by_partition: dict[int, list[tuple[int, bytes, bytes]]] = {0: [], 1: []}
    for (key, value), md in zip(sent, metas, strict=True):
        by_partition[md.partition].append((md.offset, key, value))
    got = consume_all(cluster.bootstrap_servers, topic, 2, len(sent))
    for p, expected in by_partition.items():
        records = got[p]
        assert [(r.offset, r.key, r.value) for r in records] == expected, f"partition {p} with {codec}"
    first = got[0][0] if got[0] else got[1][0]
    i = int(dict(first.headers)["i"])
    assert first.headers == (("i", str(i).encode()), ("none", None))
    assert first.timestamp == base_ms + i and first.timestamp_type == 0


@pytest.mark.parametrize("idempotent", [False, True])
def test_each_answer_frees_the_next_held_batch_at_once(cluster, new_topic, idempotent: bool) -> None:
    """One partition, batches of one record and as few requests in flight as allowed: every batch but
    the first waits for an answer, so the sender must be woken by each answer (a missed wake-up would
    leave it asleep for its 1 s idle wait: 400 batches would take minutes, not the deadline below)."""
    topic = new_topic(partitions=1)
    with Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0, batch_size=120,
                  enable_idempotence=idempotent, max_in_flight_requests_per_connection=1, acks="all") as producer:
        futures = [producer.send(topic, b"%04d" % i + b"x" * 60) for i in range(400)]
        wait_for(lambda: all(f.done() for f in futures), 30, lambda: f"{sum(f.done() for f in futures)} of 400 "
                 "records answered: the sender was not woken when a held batch's turn came")
        offsets = [f.get(timeout=1).offset for f in futures]
    assert offsets == sorted(offsets) and len(set(offsets)) == 400


def test_keys_land_on_kafka_murmur2_partitions(cluster, new_topic) -> None:
    partitions = 6
    topic = new_topic(partitions=partitions)
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as producer:
        futures = {key: producer.send(topic, b"v", key=key) for key in KAFKA_MURMUR2}
        placed = {key: f.get(timeout=10).partition for key, f in futures.items()}
    expected = {key: (h & 0x7FFFFFFF) % partitions for key, h in KAFKA_MURMUR2.items()}
    assert placed == expected
    got = consume_all(cluster.bootstrap_servers, topic, partitions, len(KAFKA_MURMUR2))
    stored = {r.key: p for p, records in got.items() for r in records}
    assert stored == expected, "records are not stored in the partitions the producer reported"


def test_serializers_run_once_a_record_and_their_bytes_land_where_kafka_puts_them(cluster, new_topic) -> None:
    """A producer with serializers takes the compiled send() past them: each serializer runs once a
    record, also for the records the compiled path hands back to the Python one (headers, an explicit
    partition, the first record before any batch is open), and the bytes they returned land on
    murmur2's partitions."""
    partitions = 6
    topic = new_topic(partitions=partitions)
    calls = {"key": 0, "value": 0}

    def key_serializer(key: str | None) -> bytes | None:
        calls["key"] += 1
        return None if key is None else key.encode()

    def value_serializer(value: dict) -> bytes:
        calls["value"] += 1
        return json.dumps(value, sort_keys=True).encode()

    sends = [(key.decode(), {"i": i}) for i, key in enumerate(KAFKA_MURMUR2)] * 3
    with Producer(bootstrap_servers=cluster.bootstrap_servers, key_serializer=key_serializer,
                  value_serializer=value_serializer) as producer:
        futures = [producer.send(topic, value, key=key) for key, value in sends]
        futures.append(producer.send(topic, {"i": -1}, key="foobar", headers={"h": b"1"}))
        futures.append(producer.send(topic, {"i": -2}, partition=5))
        placed = [f.get(timeout=10) for f in futures]
    assert calls == {"key": len(sends) + 2, "value": len(sends) + 2}
    expected = [(KAFKA_MURMUR2[key.encode()] & 0x7FFFFFFF) % partitions for key, _ in sends]
    assert [md.partition for md in placed] == [*expected, expected[1], 5]  # sends[1] is "foobar"
    got = consume_all(cluster.bootstrap_servers, topic, partitions, len(futures))
    stored = sorted(((p, r.key, r.value) for p, records in got.items() for r in records), key=repr)
    assert stored == sorted(
        [(p, key.encode(), json.dumps(value, sort_keys=True).encode()) for p, (key, value) in zip(expected, sends, strict=True)]
        + [(expected[1], b"foobar", b'{"i": -1}'), (5, None, b'{"i": -2}')], key=repr)


def test_keyless_records_are_sticky_per_batch(cluster, new_topic) -> None:
    topic = new_topic(partitions=4)
    with Producer(bootstrap_servers=cluster.bootstrap_servers, batch_size=2000, linger_ms=1000) as producer:
        futures = [producer.send(topic, b"x" * 100) for _ in range(60)]
        producer.flush()
        parts = [f.get(timeout=10).partition for f in futures]
    runs = sum(1 for a, b in zip(parts, parts[1:], strict=False) if a != b) + 1
    # ~16 records of 121 estimated bytes fill a 2000-byte batch: a run per batch, not per record.
    assert runs <= 6, f"partition changed {runs - 1} times: {parts}"
    assert len(set(parts)) > 1, "sticky partitioning should move on when a batch fills"


def test_explicit_partition_and_custom_partitioner(cluster, new_topic) -> None:
    topic = new_topic(partitions=3)
    with Producer(bootstrap_servers=cluster.bootstrap_servers,
                  partitioner=lambda key, all_parts, available: all_parts[-1]) as producer:
        assert producer.send(topic, b"a", partition=1).get(timeout=10).partition == 1
        assert producer.send(topic, b"b", key=b"k").get(timeout=10).partition == 2
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            producer.send(topic, b"c", partition=7)


def test_too_large_records_fail_at_once_with_typed_errors(cluster, new_topic) -> None:
    topic = new_topic(partitions=1, configs={"max.message.bytes": "2000"})
    with Producer(bootstrap_servers=cluster.bootstrap_servers, max_request_size=100_000, linger_ms=0) as producer:
        with pytest.raises(errors.MessageTooLargeError, match="max.request.size"):
            producer.send(topic, b"x" * 200_000).get(timeout=10)
        start = time.monotonic()
        with pytest.raises((errors.MessageTooLargeError, errors.RecordListTooLargeError)) as info:
            producer.send(topic, b"y" * 5000).get(timeout=20)
        assert time.monotonic() - start < 10, "a non-retriable error must not be retried until the timeout"
        assert info.value.message, "the server's message should be carried"
        assert producer.send(topic, b"small").get(timeout=10).offset == 0


def test_unknown_topic_without_auto_create_fails_after_max_block(cluster) -> None:
    with Producer(bootstrap_servers=cluster.bootstrap_servers, allow_auto_create_topics=False,
                  max_block_ms=500) as producer:
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="max.block.ms"):
            producer.send("no-such-topic-xyz", b"v")


def test_seek_position_and_committed_semantics(cluster, new_topic) -> None:
    topic = new_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as producer:
        for i in range(20):
            producer.send(topic, b"%d" % i)
    group = f"g-{topic}"
    bs = cluster.bootstrap_servers
    with Consumer(bootstrap_servers=bs, group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:
        consumer.assign([tp])
        assert consumer.committed(tp) is None
        assert consumer.position(tp) == 0
        records = consumer.poll(timeout_ms=5000, max_records=5)[tp]
        assert [r.offset for r in records] == [0, 1, 2, 3, 4]
        assert consumer.position(tp) == 5
        consumer.commit()
        assert consumer.committed(tp) == OffsetAndMetadata(5, "")
        consumer.seek(tp, 15)
        assert [r.offset for r in consumer.poll(timeout_ms=5000)[tp]] == list(range(15, 20))
        consumer.seek_to_beginning(tp)
        assert consumer.position(tp) == 0
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == 20
        assert consumer.poll(timeout_ms=200) == {}
        consumer.commit({tp: OffsetAndMetadata(12, "checkpoint")})
        assert consumer.committed([tp]) == {tp: OffsetAndMetadata(12, "checkpoint")}
        assert consumer.end_offsets([tp]) == {tp: 20} and consumer.beginning_offsets([tp]) == {tp: 0}
    with Consumer(bootstrap_servers=bs, group_id=group, auto_offset_reset="none") as again:
        again.assign([tp])
        assert again.position(tp) == 12, "a new consumer of the group resumes at the committed offset"
    with Consumer(bootstrap_servers=bs, group_id=f"{group}-other", auto_offset_reset="none") as fresh:
        fresh.assign([tp])
        with pytest.raises(errors.NoOffsetForPartitionError):
            fresh.poll(timeout_ms=100)
    with Consumer(bootstrap_servers=bs, auto_offset_reset="latest") as latest:
        latest.assign([tp])
        assert latest.position(tp) == 20


def test_pause_resume_and_out_of_range_reset(cluster, new_topic) -> None:
    topic = new_topic(partitions=2)
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as producer:
        for p in (0, 1):
            for i in range(5):
                producer.send(topic, b"%d" % i, partition=p)
    t0, t1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([t0, t1])
        consumer.pause(t1)
        seen: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + 5
        while seen.get(t0, 0) < 5 and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=300).items():
                seen[tp] = seen.get(tp, 0) + len(records)
        assert seen == {t0: 5}, f"paused partition delivered records: {seen}"
        consumer.resume(t1)
        consumer.seek(t0, 1000)  # beyond the log end: OFFSET_OUT_OF_RANGE -> reset to earliest
        deadline = time.monotonic() + 5
        while len(seen) < 2 or seen[t0] < 10:
            assert time.monotonic() < deadline, f"did not reset and resume: {seen}"
            for tp, records in consumer.poll(timeout_ms=300).items():
                seen[tp] = seen.get(tp, 0) + len(records)
        assert seen == {t0: 10, t1: 5}


def test_subscribe_reads_and_commits_through_the_group(cluster, new_topic) -> None:
    topic = new_topic(partitions=3)
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as producer:
        for i in range(30):
            producer.send(topic, b"%d" % i, key=b"%d" % i)
    group = f"sub-{topic}"
    with Consumer(topic, bootstrap_servers=cluster.bootstrap_servers, group_id=group,
                  auto_offset_reset="earliest", session_timeout_ms=10000, heartbeat_interval_ms=500) as consumer:
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 30 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(records)
        assert sorted(int(r.value) for r in got) == list(range(30))
        assert consumer.assignment() == {TopicPartition(topic, p) for p in range(3)}
        consumer.commit()
        committed = consumer.committed([TopicPartition(topic, p) for p in range(3)])
    assert sum(om.offset for om in committed.values()) == 30


def _read(consumer: Consumer, count: int, timeout_s: float = 30) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            got.extend(records)
    return got


def _woken_after(consumer: Consumer, delay_s: float, poll_ms: int) -> float:
    """poll(``poll_ms``) with ``wakeup()`` called from another thread ``delay_s`` in: raises WakeupError;
    how long that poll took."""
    waker = threading.Timer(delay_s, consumer.wakeup)
    started = time.monotonic()
    waker.start()
    try:
        with pytest.raises(errors.WakeupError):
            consumer.poll(timeout_ms=poll_ms)
    finally:
        waker.cancel()
    return time.monotonic() - started


def test_wakeup_ends_a_blocked_poll_and_the_consumer_goes_on(cluster, new_topic) -> None:
    """Kafka's KafkaConsumer.wakeup(): from another thread it makes the blocked poll raise (here a
    poll of 60 s with nothing to read, assigned and subscribed); called while no poll runs, the next
    call that would block raises, once; the consumer then reads on from where it was, and close() is
    not affected by a wakeup nobody consumed."""
    topic = new_topic(partitions=2)
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as producer:
        for i in range(10):
            producer.send(topic, b"%d" % i, partition=i % 2)
    tps = [TopicPartition(topic, p) for p in range(2)]
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        assert sorted(int(r.value) for r in _read(consumer, 10)) == list(range(10))
        took = _woken_after(consumer, 1.0, 60_000)
        assert took < 30, f"an assigned consumer's poll(60 s) ended {took:.1f} s after it started"
        consumer.wakeup()
        with pytest.raises(errors.WakeupError):
            consumer.poll(timeout_ms=0)
        assert consumer.poll(timeout_ms=200) == {}  # raised once: the next poll is a poll
        consumer.wakeup()
        assert consumer.position(tps[0]) == 5  # known: position() does not block, so it does not raise
        consumer.seek_to_beginning(tps[0])
        with pytest.raises(errors.WakeupError):
            consumer.position(tps[0])  # a lookup to make: the wakeup ends it
        assert consumer.position(tps[0]) == 0
        consumer.seek(tps[0], 5)
    group = f"wakeup-{topic}"
    with Consumer(topic, bootstrap_servers=cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                  session_timeout_ms=10000, heartbeat_interval_ms=500) as consumer:
        assert sorted(int(r.value) for r in _read(consumer, 10)) == list(range(10))
        took = _woken_after(consumer, 1.0, 60_000)
        assert took < 30, f"a group member's poll(60 s) ended {took:.1f} s after it started"
        with Producer(bootstrap_servers=cluster.bootstrap_servers) as producer:
            producer.send(topic, b"10", partition=0)
        assert [int(r.value) for r in _read(consumer, 1)] == [10]
        consumer.wakeup()  # not consumed by any poll: close() still commits and leaves
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group) as check:
        committed = check.committed(tps)
    assert {tp: om.offset for tp, om in committed.items()} == {tps[0]: 6, tps[1]: 5}


def test_admin_topics_configs_and_errors(cluster, admin: Admin) -> None:
    name = "admin-topic-1"
    admin.create_topics([NewTopic(name, 2, 3, {"retention.ms": "3600000"})])
    assert name in admin.list_topics()
    with pytest.raises(errors.TopicAlreadyExistsError) as info:
        admin.create_topics([NewTopic(name, 2, 3)])
    assert name in info.value.message
    with pytest.raises(errors.InvalidReplicationFactorError):
        admin.create_topics([NewTopic("admin-topic-rf", 1, 5)])
    desc = admin.describe_topics([name])[name]
    assert sorted(desc.partitions) == [0, 1] and all(len(p.isr) == 3 for p in desc.partitions.values())
    assert admin.describe_configs([name])[name]["retention.ms"].value == "3600000"
    admin.alter_configs(name, set={"retention.ms": "7200000"})
    assert admin.describe_configs([name])[name]["retention.ms"].value == "7200000"
    with pytest.raises(errors.InvalidConfigError):
        admin.alter_configs(name, set={"no.such.config": "1"})
    admin.create_partitions({name: 4})
    assert sorted(admin.describe_topics([name])[name].partitions) == [0, 1, 2, 3]
    offsets = admin.list_offsets({TopicPartition(name, 0): "earliest", TopicPartition(name, 1): "latest"})
    assert offsets[TopicPartition(name, 0)][0] == 0 and offsets[TopicPartition(name, 1)][0] == 0
    described = admin.describe_cluster()
    assert sorted(b.node_id for b in described.brokers) == [1, 2, 3]
    quorum = admin.describe_quorum()
    assert quorum.leader_id in (1, 2, 3) and len(quorum.voters) == 3
    admin.delete_topics([name])
    wait_for(lambda: name not in admin.list_topics(), 10, "the deleted topic to leave the list", poll_s=0.1)
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        admin.describe_topics([name])


def test_admin_group_operations(cluster, admin: Admin, new_topic) -> None:
    topic = new_topic(partitions=2)
    group = f"admin-g-{topic}"
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as producer:
        for i in range(10):
            producer.send(topic, b"%d" % i, partition=i % 2)
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group) as consumer:
        consumer.assign([tp0, tp1])
        consumer.commit({tp0: 3, tp1: 4})
    assert group in {g.group_id for g in admin.list_groups()}
    described = admin.describe_groups([group])[group]
    assert described.offsets[tp0].committed_offset == 3 and described.offsets[tp1].lag == 1
    assert admin.list_group_offsets(group) == {tp0: OffsetAndMetadata(3, ""), tp1: OffsetAndMetadata(4, "")}
    admin.reset_group_offsets(group, [(topic, -1, "earliest", 0)])
    assert {tp: om.offset for tp, om in admin.list_group_offsets(group).items()} == {tp0: 0, tp1: 0}
    admin.alter_group_offsets(group, {tp0: 2})
    assert admin.list_group_offsets(group)[tp0].offset == 2
    admin.delete_groups([group])
    assert group not in {g.group_id for g in admin.list_groups()}


@pytest.mark.parametrize("acks", ["0", "1"])
def test_weaker_acks_still_deliver(cluster, new_topic, acks: str) -> None:
    topic = new_topic(partitions=1)
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks=acks) as producer:
        assert not producer.idempotent, "idempotence needs acks=all"
        futures = [producer.send(topic, b"%d" % i) for i in range(50)]
        producer.flush()
        assert all(f.exception(timeout=5) is None for f in futures)
    got = consume_all(cluster.bootstrap_servers, topic, 1, 50)[0]
    assert [r.value for r in got] == [b"%d" % i for i in range(50)]


def test_poll_batches_iteration_commit_async_and_auto_commit(cluster, new_topic) -> None:
    topic = new_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    with Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=50) as producer:
        for i in range(100):
            producer.send(topic, b"%d" % i)
    bs = cluster.bootstrap_servers
    with Consumer(bootstrap_servers=bs, auto_offset_reset="earliest") as raw:
        raw.assign([tp])
        raw.seek(tp, 10)
        total = 0
        first_offsets = []
        deadline = time.monotonic() + 10
        while raw.position(tp) < 100:
            assert time.monotonic() < deadline, f"poll_batches stalled at {raw.position(tp)}"
            for data in raw.poll_batches(timeout_ms=500).values():
                records = list(decode_records(data))
                first_offsets.append(records[0].offset)
                total += sum(1 for r in records if r.offset >= 10)
        assert total == 90 and first_offsets[0] <= 10
    group = f"it-{topic}"
    done = []
    with Consumer(bootstrap_servers=bs, group_id=group, auto_offset_reset="earliest", consumer_timeout_ms=1500,
                  enable_auto_commit=True, auto_commit_interval_ms=100) as consumer:
        consumer.assign([tp])
        values = [r.value for r in consumer]  # iteration ends after consumer_timeout_ms without records
        assert values == [b"%d" % i for i in range(100)]
        consumer.commit_async({tp: 42}, callback=lambda offsets, err: done.append(err)).result(timeout=10)
        assert done == [None] and consumer.committed(tp).offset == 42
    with Consumer(bootstrap_servers=bs, group_id=group) as again:
        # close() of the first consumer committed its position (auto commit on close).
        assert again.committed(tp).offset == 100
