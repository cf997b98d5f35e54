"""Incremental fetch sessions (KIP-227) on the KAFKA listener of a real TLS + authorizer cluster: raw Fetch v12
frames for the protocol's rules, and kafka-python's consumer, which opens a session with every broker it reads."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from waiting import wait_for

pytestmark = pytest.mark.slow

T = 30


def _fetch(cluster: Any, node: int, session_id: int, epoch: int, parts: list[tuple[str, int, int]],
           forgotten: list[tuple[str, int]] = (), name: str = "admin") -> Any:
    from kafka_raw import kafka_ask

    topics: dict[str, list[dict[str, Any]]] = {}
    for topic, partition, offset in parts:
        topics.setdefault(topic, []).append({"partition": partition, "fetch_offset": offset,
                                             "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
                                             "last_fetched_epoch": -1, "log_start_offset": -1})
    gone: dict[str, list[int]] = {}
    for topic, partition in forgotten:
        gone.setdefault(topic, []).append(partition)
    return kafka_ask(cluster, node, 1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": session_id, "session_epoch": epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in gone.items()], "rack_id": ""},
        name=name)


def _cached(cluster: Any, node: int) -> tuple[float, float]:
    """(sessions, their partitions) the node's KAFKA listener holds, from its metrics."""
    found = {}
    for line in cluster.read_metrics(node).splitlines():
        name, _, value = line.partition(" ")
        if name in ('brook_kafka_fetch_sessions{listener="KAFKA"}',
                    'brook_kafka_fetch_session_partitions{listener="KAFKA"}'):
            found[name.split("{")[0]] = float(value)
    return found["brook_kafka_fetch_sessions"], found["brook_kafka_fetch_session_partitions"]


def _carried(answer: Any) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(topic, partition) -> (error code, high watermark, bytes of records) of each partition an answer carries."""
    return {(t.topic, p.partition_index): (int(p.error_code), int(p.high_watermark), len(p.records or b""))
            for t in answer.responses for p in t.partitions}


def test_a_session_answers_only_what_changed_and_refuses_stale_epochs_and_strangers(
        kcluster: Any, kp_admin: Any, topic_name: str) -> None:
    from confluent_kafka import Producer

    node = sorted(kcluster.broker_ids)[0]
    kp_admin.create_topics({topic_name: {"assignments": {0: [node], 1: [node]}}}, timeout_ms=T * 1000)
    producers = [Producer(kcluster.kafka_client_config("admin"))]

    def produce(partition: int, count: int) -> None:
        for i in range(count):
            producers[0].produce(topic_name, b"r%d" % i, partition=partition)
        assert producers[0].flush(T) == 0
    wait_for(lambda: _carried(_fetch(kcluster, node, 0, -1, [(topic_name, 0, 0)])).get((topic_name, 0), (-1,))[0] == 0,
             T, f"{topic_name} led by broker {node}")
    produce(0, 3)
    p0, p1 = (topic_name, 0), (topic_name, 1)

    # INITIAL (epoch 0): a full answer, and a new session.
    cached_before = _cached(kcluster, node)
    first = _fetch(kcluster, node, 0, 0, [(topic_name, 0, 0), (topic_name, 1, 0)])
    sid = int(first.session_id)
    assert int(first.error_code) == 0 and sid > 0, first
    opened = _cached(kcluster, node)
    assert (opened[0] - cached_before[0], opened[1] - cached_before[1]) == (1, 2), (cached_before, opened)
    carried = _carried(first)
    assert set(carried) == {p0, p1} and carried[p0][:2] == (0, 3) and carried[p0][2] > 0, carried

    # Epoch 1 names p0's new position only: nothing changed, so nothing is carried.
    quiet = _fetch(kcluster, node, sid, 1, [(topic_name, 0, 3)])
    assert (int(quiet.error_code), int(quiet.session_id), _carried(quiet)) == (0, sid, {}), quiet

    # Records on p1, which this fetch does not name: the session fetches it from where it was, and carries it alone.
    produce(1, 2)
    news = _fetch(kcluster, node, sid, 2, [])
    carried = _carried(news)
    assert int(news.error_code) == 0 and set(carried) == {p1} and carried[p1][:2] == (0, 2) and carried[p1][2] > 0

    # The same epoch again (a duplicate, or an answer the client lost): INVALID_FETCH_SESSION_EPOCH.
    assert (int(_fetch(kcluster, node, sid, 2, []).error_code)) == 71
    # An id this broker never gave, or another principal naming this one: FETCH_SESSION_ID_NOT_FOUND.
    assert int(_fetch(kcluster, node, sid ^ 0x5A5A5, 3, []).error_code) == 70
    assert int(_fetch(kcluster, node, sid, 3, [], name="demo").error_code) == 70
    # The stranger's refusal did not touch the session: its next epoch is served.
    assert (int(_fetch(kcluster, node, sid, 3, [(topic_name, 1, 2)]).error_code)) == 0

    # Forgetting every partition closes the session (answered without one); the id is then unknown.
    closed = _fetch(kcluster, node, sid, 4, [], forgotten=[p0, p1])
    assert (int(closed.error_code), int(closed.session_id)) == (0, 0), closed
    assert int(_fetch(kcluster, node, sid, 5, []).error_code) == 70
    assert _cached(kcluster, node) == cached_before
    # A fetch without a session (FINAL epoch, as librdkafka sends) answers every partition, as before.
    plain = _fetch(kcluster, node, 0, -1, [(topic_name, 0, 3), (topic_name, 1, 2)])
    assert (int(plain.session_id), set(_carried(plain))) == (0, {p0, p1}), plain
    producers.clear()  # its threads would go on dialling the cluster once it stops


def test_kafka_python_reads_through_incremental_sessions(kcluster: Any, confluent_admin: Any, topic_name: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    from kafka import KafkaConsumer
    from kafka_admin_kit import kafka_python_ssl

    for f in confluent_admin.create_topics([NewTopic(topic_name, 6, 1)], request_timeout=T).values():
        f.result(T)
    producer = Producer(kcluster.kafka_client_config("admin"))
    sent = {(p, b"%d-%d" % (p, i)) for p in range(6) for i in range(20)}
    for p, value in sent:
        producer.produce(topic_name, value, partition=p)
    assert producer.flush(T) == 0
    caplog.set_level(logging.DEBUG, logger="kafka.consumer.fetcher")
    consumer = KafkaConsumer(topic_name, auto_offset_reset="earliest", enable_auto_commit=False,
                             fetch_max_wait_ms=100, **kafka_python_ssl(kcluster))
    try:
        seen: set[tuple[int, bytes]] = set()
        late = False
        deadline = time.monotonic() + T
        while (len(seen) < len(sent) or not late) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                seen.update((tp.partition, r.value) for r in records)
            if len(seen) == len(sent) and not late:
                late = True  # records after the first reads: only the sessions' incremental fetches carry them
                for more in range(3):
                    producer.produce(topic_name, b"late-%d" % more, partition=more)
                    sent.add((more, b"late-%d" % more))
                assert producer.flush(T) == 0
    finally:
        consumer.close()
    del producer
    assert seen == sent, (len(seen), len(sent), sorted(sent - seen)[:5])
    assert "incremental fetch response for session" in caplog.text, caplog.text[-2000:]
    assert "invalid" not in caplog.text.lower(), [line for line in caplog.text.splitlines() if "nvalid" in line]
