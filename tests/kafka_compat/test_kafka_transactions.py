"""Kafka transactions through librdkafka (confluent-kafka) on a 3-node cluster: what a transactional
application relies on, and what no client may do to a partition.

- a second producer of the same transactional id fences the first, whose open transaction is aborted;
- a transaction left open past its timeout is aborted by the coordinator, and read_committed consumers go on;
- a transactional batch for a partition never added to the transaction is refused (KIP-890's verification):
  without it, a client could leave a transaction no coordinator knows open for good, and every read_committed
  consumer of the partition would stop there;
- kill -9 of the transaction coordinator in the middle of a transaction: the producer commits through the next
  one within a bound, and every committed record is read once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from kafka_raw import kafka_ask
from kafkakit import partition_leader, unique
from waiting import wait_for

from broker import txn_records
from client.admin import Admin, NewTopic
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

TXN_PARTITIONS = 4  # the local cluster's transaction.state.log.num.partitions
ABORT_CHECK_MS = 500
COMMIT_AFTER_KILL_WITHIN_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": str(ABORT_CHECK_MS)}
    with LocalCluster(tmp_path_factory.mktemp("kafka-txn"), nodes=3, overrides=overrides) as c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(cluster.bootstrap_servers, request_timeout_ms=20_000) as a:
        yield a


@pytest.fixture(scope="module")
def kconf(cluster: LocalCluster) -> dict[str, str]:
    return cluster.kafka_client_config()


@pytest.fixture(scope="module")
def make_topic(admin: Admin) -> Callable[..., str]:
    def make(partitions: int = 2) -> str:
        name = unique("tx")
        admin.create_topics([NewTopic(name, partitions, 3, {})])
        return name
    return make


def producer(kconf: dict[str, str], txn_id: str, **extra: str) -> object:
    from confluent_kafka import Producer

    p = Producer({**kconf, "transactional.id": txn_id, **extra})
    p.init_transactions(30)
    return p


def read(kconf: dict[str, str], topic: str, partitions: int, isolation: str, until: Callable[[list[str]], bool],
         timeout_s: float = 30.0) -> list[str]:
    """Values read from the beginning of every partition until ``until(values)``; fails at the deadline."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**kconf, "group.id": unique("g"), "isolation.level": isolation, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[str] = []
    try:
        deadline = time.monotonic() + timeout_s
        while not until(values):
            assert time.monotonic() < deadline, f"{isolation} read only {sorted(values)} in {timeout_s}s"
            m = c.poll(0.2)
            if m is not None and not m.error():
                values.append(m.value().decode())
        return values
    finally:
        c.close()


def test_a_second_producer_fences_the_first_and_aborts_its_transaction(kconf, make_topic) -> None:
    from confluent_kafka import KafkaException

    topic, txn_id = make_topic(), unique("app")
    old = producer(kconf, txn_id)
    old.begin_transaction()
    for i in range(6):
        old.produce(topic, value=f"zombie-{i}".encode(), partition=i % 2)
    old.flush(30)
    new = producer(kconf, txn_id)  # aborts the open transaction (the producer retries CONCURRENT_TRANSACTIONS)
    new.begin_transaction()
    for i in range(4):
        new.produce(topic, value=f"live-{i}".encode(), partition=i % 2)
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as fenced:
        old.commit_transaction(10)
    assert fenced.value.args[0].fatal(), fenced.value.args[0]
    committed = read(kconf, topic, 2, "read_committed", lambda v: len(v) >= 4)
    assert sorted(committed) == [f"live-{i}" for i in range(4)]
    everything = read(kconf, topic, 2, "read_uncommitted", lambda v: len(v) >= 10)
    assert sorted(everything) == sorted([f"live-{i}" for i in range(4)] + [f"zombie-{i}" for i in range(6)])


def test_a_transaction_left_open_is_aborted_after_its_timeout(kconf, make_topic) -> None:
    topic = make_topic()
    stuck = producer(kconf, unique("stuck"), **{"transaction.timeout.ms": "2000"})
    stuck.begin_transaction()
    for i in range(4):
        stuck.produce(topic, value=f"never-{i}".encode(), partition=i % 2)
    stuck.flush(30)
    started = time.monotonic()
    other = producer(kconf, unique("other"))
    other.begin_transaction()
    for i in range(4):
        other.produce(topic, value=f"after-{i}".encode(), partition=i % 2)
    other.commit_transaction(30)
    # Behind the stuck transaction, read_committed consumers see nothing until the coordinator aborts it.
    got = read(kconf, topic, 2, "read_committed", lambda v: len(v) >= 4, timeout_s=30)
    took = time.monotonic() - started
    assert sorted(got) == [f"after-{i}" for i in range(4)], got
    assert took >= 1.0, f"the records behind the open transaction were readable after {took:.1f}s"


def test_a_transactional_batch_for_a_partition_not_in_the_transaction_is_refused(cluster: LocalCluster, admin: Admin,
                                                                                 make_topic) -> None:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    topic, txn_id = make_topic(partitions=1), unique("rogue")
    leader = partition_leader(admin, topic, 0)

    def init() -> object:
        a = kafka_ask(cluster, leader, 10, 4, {"key_type": 1, "coordinator_keys": [txn_id]})
        [found] = a.coordinators
        return found if found.error_code == 0 else None
    coordinator = wait_for(init, timeout_s=30, what="a transaction coordinator")
    got = kafka_ask(cluster, coordinator.node_id, 22, 4, {"transactional_id": txn_id, "transaction_timeout": 60_000,
                                                          "producer_id": -1, "producer_epoch": -1})
    assert got.error_code == 0, got
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=got.producer_id,
                                  producer_epoch=got.producer_epoch, base_sequence=0, batch_size=1 << 20)
    b.append(0, timestamp=int(time.time() * 1000), key=None, value=b"unverified", headers=[])
    answer = kafka_ask(cluster, leader, 0, 9, {"transactional_id": txn_id, "acks": -1, "timeout": 10_000,
                                               "topic_data": [{"name": topic, "partition_data": [
                                                   {"index": 0, "records": bytes(b.build())}]}]})
    [part] = answer.responses[0].partition_responses
    assert part.error_code == 48, part  # INVALID_TXN_STATE: the partition was never added to the transaction
    offsets = kafka_ask(cluster, leader, 2, 7, {"replica_id": -1, "isolation_level": 1, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
    assert offsets.topics[0].partitions[0].offset == 0, offsets  # nothing appended: the LSO and the log end at 0


def test_the_coordinator_killed_mid_transaction_costs_a_bounded_wait(cluster: LocalCluster, admin: Admin, kconf,
                                                                     make_topic) -> None:
    topic, txn_id = make_topic(), unique("survivor")
    p = producer(kconf, txn_id, **{"transaction.timeout.ms": "60000"})
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=f"first-{i}".encode(), partition=i % 2)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=f"second-{i}".encode(), partition=i % 2)
    p.flush(30)
    victim = partition_leader(admin, txn_records.TRANSACTION_STATE_TOPIC,
                              txn_records.partition_for(txn_id, TXN_PARTITIONS))
    cluster.kill_node(victim)
    killed = time.monotonic()
    try:
        p.commit_transaction(int(COMMIT_AFTER_KILL_WITHIN_S))
        took = time.monotonic() - killed
        assert took < COMMIT_AFTER_KILL_WITHIN_S, f"the commit took {took:.1f}s after the coordinator was killed"
        values = read(kconf, topic, 2, "read_committed", lambda v: len(v) >= 20, timeout_s=60)
        assert sorted(values) == sorted([f"first-{i}" for i in range(10)] + [f"second-{i}" for i in range(10)])
        assert len(values) == len(set(values)), f"a committed record was read twice: {sorted(values)}"
    finally:
        cluster.start_node(victim)
        wait_for(lambda: len(admin.describe_topics([topic])[topic].partitions[0].isr) == 3, timeout_s=60,
                 what="the restarted node back in the ISR")


def test_consumed_offsets_commit_with_the_transaction_and_survive_a_group_coordinator_kill(
        cluster: LocalCluster, admin: Admin, kconf, make_topic) -> None:
    """Consume-transform-produce (``send_offsets_to_transaction``): the consumed offsets become the group's only
    when the transaction commits, never when it aborts; and a transaction whose offsets were written when the
    group's coordinator was killed (kill -9) commits them through the next coordinator, which loads them."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
    from confluent_kafka import TopicPartition as Tp

    source, sink, group = make_topic(partitions=1), make_topic(partitions=1), unique("eos")
    feeder = Producer(kconf)
    for i in range(30):
        feeder.produce(source, value=f"in-{i}".encode())
    feeder.flush(30)
    consumer = Consumer({**kconf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    consumer.assign([Tp(source, 0, 0)])
    p = producer(kconf, unique("eos-app"))

    def committed() -> int:
        return consumer.committed([Tp(source, 0)], 10)[0].offset

    def committed_now() -> int | None:
        """``committed()``, or None while the group's coordinator moves: librdkafka's committed() hands back a
        retriable error of that moment (NOT_COORDINATOR from a broker the metadata names before its group
        coordinator took the partition over) rather than retrying it."""
        try:
            return committed()
        except KafkaException as exc:
            if exc.args[0].code() not in (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                                          KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TIMED_OUT,
                                          KafkaError._TRANSPORT):
                raise
            return None

    def step(count: int, commit: bool, before_end: Callable[[], None] = lambda: None) -> None:
        taken: list[object] = []
        deadline = time.monotonic() + 30
        while len(taken) < count:
            assert time.monotonic() < deadline, f"read {len(taken)} of {count} source records"
            m = consumer.poll(0.2)
            if m is not None and not m.error():
                taken.append(m)
        p.begin_transaction()
        for m in taken:
            p.produce(sink, value=m.value() + b"-out")
        p.send_offsets_to_transaction(consumer.position([Tp(source, 0)]), consumer.consumer_group_metadata(), 30)
        p.flush(30)
        before_end()
        if commit:
            p.commit_transaction(60)
        else:
            p.abort_transaction(30)
            consumer.seek(Tp(source, 0, committed()))  # the application rewinds to what was committed

    try:
        step(10, commit=True)
        # EndTxn is answered once PrepareCommit is written; the offsets become the group's when the COMMIT marker
        # lands on __consumer_offsets, a moment later (as in Kafka): CI's loaded machine read before it once.
        wait_for(lambda: committed() == 10, timeout_s=30, what="the offsets of the committed transaction")
        def unstable() -> None:  # while the offsets wait for their transaction's end
            node = partition_leader(admin, "__consumer_offsets", _offsets_partition(group))
            for require_stable, code in ((True, 88), (False, 0)):  # UNSTABLE_OFFSET_COMMIT: the client retries
                a = kafka_ask(cluster, node, 9, 7, {"group_id": group, "require_stable": require_stable,
                                                    "topics": [{"name": source, "partition_indexes": [0]}]})
                got = a.topics[0].partitions[0]
                assert (got.error_code, got.committed_offset if code == 0 else -1) == (code, 10 if code == 0 else -1), a
        step(10, commit=False, before_end=unstable)
        assert committed() == 10, "an aborted transaction's offsets were committed"
        victim = partition_leader(admin, "__consumer_offsets", _offsets_partition(group))
        step(10, commit=True, before_end=lambda: cluster.kill_node(victim))
        try:
            wait_for(lambda: committed_now() == 20, timeout_s=60,
                     what="the offsets committed through the next coordinator")
            out = read(kconf, sink, 1, "read_committed", lambda v: len(v) >= 20)
            assert out == [f"in-{i}-out" for i in range(20)], out
        finally:
            cluster.start_node(victim)
            wait_for(lambda: len(admin.describe_topics([source])[source].partitions[0].isr) == 3, timeout_s=60,
                     what="the restarted node back in the ISR")
    finally:
        consumer.close()


def _offsets_partition(group: str) -> int:
    from broker.group_records import partition_for_group

    return partition_for_group(group, 4)  # the local cluster's offsets.topic.num.partitions
