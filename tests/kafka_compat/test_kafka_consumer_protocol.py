"""librdkafka's consumers of Kafka's consumer group protocol (KIP-848, ``group.protocol=consumer``) against a
3-node mTLS cluster: the broker assigns, partitions move between members only once given up, commits are
taken at the member epoch, and a coordinator killed with kill -9 costs a rejoin, not the group.

Before Brook served ConsumerGroupHeartbeat, such a consumer found the coordinator, logged (at debug level only)
"ConsumerGroupHeartbeatRequest not supported by broker" and never consumed, raising nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafkakit import rdkafka_config, unique

from client.admin import Admin
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

PARTITIONS = 6
HEARTBEAT_MS = 500  # group.consumer.heartbeat.interval.ms: a reassignment reaches a member at its next heartbeat


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("consumer-protocol"), nodes=3, tls=True,
                      overrides={"group.consumer.heartbeat.interval.ms": str(HEARTBEAT_MS)}) as c:
        c.wait_ready(90)
        yield c


def _topic(cluster: LocalCluster, records: int) -> str:
    from confluent_kafka import Producer

    topic = unique("kip848")
    with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints,
               **{k.replace(".", "_"): v for k, v in cluster.client_config.items()}) as admin:
        admin.create_topic(topic, PARTITIONS, 3)
        admin.wait_for_topics([topic])
    _produce(cluster, topic, 0, records, Producer)
    return topic


def _produce(cluster: LocalCluster, topic: str, start: int, count: int, producer_cls: Any = None) -> None:
    if producer_cls is None:
        from confluent_kafka import Producer as producer_cls
    producer = producer_cls(rdkafka_config(cluster.kafka_client_config(), acks="all"))
    for i in range(start, start + count):
        producer.produce(topic, value=b"v%d" % i, key=b"k%d" % i)
    assert producer.flush(90) == 0, "records left undelivered"  # a frozen leader: librdkafka times out first


def _consumer(cluster: LocalCluster, group: str, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    # librdkafka's own metadata refresh (5 minutes), as everywhere in this suite: such a consumer looks up the
    # topic ids of its assignment with Metadata v12 by id, which Brook once answered with no topic, so it
    # waited for its next refresh (a 1 s refresh in the suite hid it).
    return Consumer(rdkafka_config(cluster.kafka_client_config(), **{
        "group.id": group, "group.protocol": "consumer", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, **extra}))


def _poll_until(consumers: list[Any], seen: dict[tuple[int, int], bytes], done: Callable[[], bool],
                timeout_s: float, what: str) -> None:
    """Poll every consumer in turn, recording each record by (partition, offset), until ``done()``."""
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            for m in c.consume(100, 0.1):
                if m.error():
                    errors.append(str(m.error()))
                    continue
                seen[(m.partition(), m.offset())] = m.value()
        if done():
            return
    assignments = [sorted(tp.partition for tp in c.assignment()) for c in consumers]
    pytest.fail(f"{what}: not within {timeout_s} s; read {len(seen)} records, assignments {assignments}, "
                f"errors {errors[-5:]}")


def _partitions(consumer: Any) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def test_members_share_the_partitions_and_resume_from_their_commits(cluster: LocalCluster) -> None:
    from confluent_kafka.admin import AdminClient

    topic, group = _topic(cluster, 600), unique("kip848-group")
    a, b = _consumer(cluster, group), _consumer(cluster, group)
    seen: dict[tuple[int, int], bytes] = {}
    try:
        a.subscribe([topic])
        _poll_until([a], seen, lambda: len(_partitions(a)) == PARTITIONS, 30, "the first member assigned all")
        b.subscribe([topic])
        # The broker moves half of the partitions to b, and no partition is ever assigned to both.
        overlaps: list[set[int]] = []

        def split() -> bool:
            mine, theirs = _partitions(a), _partitions(b)
            if mine & theirs:
                overlaps.append(mine & theirs)
            return len(mine) == len(theirs) == PARTITIONS // 2 and mine | theirs == set(range(PARTITIONS))
        _poll_until([a, b], seen, split, 60, "the two members split the partitions")
        _poll_until([a, b], seen, lambda: len(seen) >= 600, 60, "the two members read every record")
        assert not overlaps, f"partitions assigned to both members at once: {overlaps}"
        assert sorted(int(v[1:]) for v in seen.values()) == list(range(600))
        for c in (a, b):
            c.commit(asynchronous=False)

        kafka_admin = AdminClient(cluster.kafka_client_config())  # held: the result needs its handle
        listed = kafka_admin.list_consumer_groups(request_timeout=15).result()
        ours = [g for g in listed.valid if g.group_id == group]
        assert ours and ours[0].type.name == "CONSUMER", \
            f"listed: {[(g.group_id, g.type) for g in listed.valid]}, errors {listed.errors}"

        described = kafka_admin.describe_consumer_groups([group], request_timeout=15)[group].result()
        assert described.type.name == "CONSUMER" and described.state.name == "STABLE", described
        members = {m.member_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
                   for m in described.members}
        assert len(members) == 2 and sorted(p for ps in members.values() for p in ps) == list(range(PARTITIONS)), \
            f"described members: {members}"

        # Brook's own admin client (gRPC; what `brook group describe` shows) sees the same group.
        with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints,
                   **{k.replace(".", "_"): v for k, v in cluster.client_config.items()}) as admin:
            mine = admin.describe_groups([group])[group]
            listing = {g.group_id: g for g in admin.list_groups()}
        assert (mine.group_type, mine.state, mine.protocol_name, len(mine.members)) == (
            "consumer", "Stable", "uniform", 2), mine
        assert sorted(tp.partition for m in mine.members for tp in m.assignment) == list(range(PARTITIONS)), mine
        assert all(m.subscribed_topics == [topic] for m in mine.members), mine
        assert listing[group].group_type == "consumer" and listing[group].state == "Stable", listing.get(group)

        members = sum(float(line.split()[1]) for n in cluster.broker_ids
                      for line in cluster.read_metrics(n).splitlines()
                      if line.startswith("brook_consumer_protocol_members "))
        assert members == 2, f"the coordinators' metrics count {members} consumer-protocol members"

        # A member that leaves gives its partitions to the one that stays.
        a.close()
        a = None
        _poll_until([b], seen, lambda: len(_partitions(b)) == PARTITIONS, 60, "the member left got every partition")
        _produce(cluster, topic, 600, 60)
        _poll_until([b], seen, lambda: len(seen) >= 660, 60, "the remaining member read the new records")
        b.commit(asynchronous=False)
        b.close()
        b = None

        # A new member of the group starts where the group's commits left off.
        c = _consumer(cluster, group)
        try:
            c.subscribe([topic])
            fresh: dict[tuple[int, int], bytes] = {}
            _poll_until([c], fresh, lambda: len(_partitions(c)) == PARTITIONS, 30, "the new member assigned all")
            _produce(cluster, topic, 660, 12)
            _poll_until([c], fresh, lambda: len(fresh) >= 12, 30, "the new member read the newest records")
            assert sorted(int(v[1:]) for v in fresh.values()) == list(range(660, 672)), \
                "the new member read records the group had committed past"
        finally:
            c.close()
    finally:
        for c in (a, b):
            if c is not None:
                c.close()


def test_a_static_member_gets_its_partitions_back_after_a_restart(cluster: LocalCluster) -> None:
    """group.instance.id: a static member that closes (librdkafka leaves with epoch -2) keeps its partitions,
    unassigned, until its session ends; its next process takes them over without moving the others'."""
    topic, group = _topic(cluster, 0), unique("kip848-static")
    first, other = (_consumer(cluster, group, **{"group.instance.id": i}) for i in ("one", "two"))
    seen: dict[tuple[int, int], bytes] = {}
    again = None
    try:
        first.subscribe([topic])
        other.subscribe([topic])
        _poll_until([first, other], seen, lambda: len(_partitions(first)) == len(_partitions(other)) == 3, 60,
                    "the two static members split the partitions")
        theirs, kept = _partitions(first), _partitions(other)
        first.close()
        first = None
        # While the member is away, its partitions stay its own: the other member, heartbeating, is not given them.
        ends = time.monotonic() + 5 * HEARTBEAT_MS / 1000
        while time.monotonic() < ends:
            other.consume(100, 0.1)
            assert _partitions(other) == kept, f"the other member took {_partitions(other) - kept}"
        again = _consumer(cluster, group, **{"group.instance.id": "one"})
        again.subscribe([topic])
        _poll_until([again, other], seen, lambda: _partitions(again) == theirs, 30,
                    "the restarted static member got its partitions back")
        assert _partitions(other) == kept
    finally:
        for c in (first, other, again):
            if c is not None:
                c.close()


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_a_coordinator_killed_or_frozen_costs_its_members_nothing(cluster: LocalCluster, fault: str) -> None:
    """The group's state is written to __consumer_offsets as it changes (README, Consumer groups): when its
    coordinator is killed with kill -9, or frozen with SIGSTOP (its broker fenced, its connections silent),
    the replica that takes the partition over loads the group as it was.
    The member goes on at its epoch with its partitions: nothing is revoked or lost, the group epoch does not
    move, and it reads what is written after the kill. Before, the new coordinator answered UNKNOWN_MEMBER_ID:
    the member gave everything up and rejoined (a rebalance of the whole group)."""
    from broker.group_records import OFFSETS_TOPIC, partition_for_group

    topic, group = _topic(cluster, 60), unique("kip848-failover")
    security = {k.replace(".", "_"): v for k, v in cluster.client_config.items()}
    consumer = _consumer(cluster, group)
    given_up: list[tuple[str, list[int]]] = []
    seen: dict[tuple[int, int], bytes] = {}
    coordinator = 0
    try:
        consumer.subscribe([topic], on_revoke=lambda _c, ps: given_up.append(("revoked", [p.partition for p in ps])),
                           on_lost=lambda _c, ps: given_up.append(("lost", [p.partition for p in ps])))
        _poll_until([consumer], seen, lambda: len(seen) >= 60 and len(_partitions(consumer)) == PARTITIONS, 60,
                    "the member read the first records")
        with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints, **security) as admin:
            epoch = admin.describe_groups([group])[group].generation_id
            offsets = admin.describe_topics([OFFSETS_TOPIC])[OFFSETS_TOPIC].partitions
            wanted = partition_for_group(group, len(offsets))
            coordinator = offsets[wanted].leader
        assert coordinator > 0, f"{OFFSETS_TOPIC}-{wanted} has no leader"
        given_up.clear()
        if fault == "kill":
            cluster.kill_node(coordinator)
        else:
            cluster.pause_node(coordinator)
        _produce(cluster, topic, 60, 60)
        _poll_until([consumer], seen, lambda: len({v for v in seen.values()}) >= 120, 90,
                    f"the member read on after its coordinator (node {coordinator}) was hit ({fault})")
        assert len(_partitions(consumer)) == PARTITIONS
        survivors = [n for n in cluster.broker_ids if n != coordinator]
        with Admin(",".join(cluster.broker_address(n) for n in survivors), **security) as admin:
            described = admin.describe_groups([group])[group]
        assert (described.generation_id, described.state, len(described.members)) == (epoch, "Stable", 1), described
        assert not given_up, f"the member gave partitions up when its coordinator moved: {given_up}"
    finally:
        consumer.close()
        if coordinator > 0:
            if fault == "kill":
                cluster.start_node(coordinator)
            else:
                cluster.resume_node(coordinator)
            cluster.wait_ready(90)


def test_a_regex_subscription_reads_the_matching_topics_and_one_made_later(cluster: LocalCluster) -> None:
    """librdkafka's regex subscription (``^``-prefixed) under this protocol: the coordinator matches it in RE2
    against the cluster's topics. Two matching topics are read and a non-matching one is not; a matching topic
    made while the member consumes joins its assignment at Kafka's pace (the metadata moved, 10 s since the
    group's last match), and its records are read. Before, the heartbeat was refused INVALID_REQUEST: a fatal
    error for the consumer, which read nothing."""
    from confluent_kafka import KafkaError

    prefix = unique("rx")
    with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints,
               **{k.replace(".", "_"): v for k, v in cluster.client_config.items()}) as admin:
        for name in (f"{prefix}-a", f"{prefix}-b", f"x{prefix}-c"):
            admin.create_topic(name, 2, 3)
        admin.wait_for_topics([f"{prefix}-a", f"{prefix}-b", f"x{prefix}-c"])
        for name in (f"{prefix}-a", f"{prefix}-b", f"x{prefix}-c"):
            _produce(cluster, name, 0, 10)
        errors: list[Any] = []
        group = unique("rx-group")
        consumer = _consumer(cluster, group, error_cb=errors.append)
        seen: dict[tuple[str, int, int], bytes] = {}

        def poll_until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and not done():
                for m in consumer.consume(100, 0.2):
                    if m.error():
                        errors.append(m.error())
                    else:
                        seen[(m.topic(), m.partition(), m.offset())] = m.value()
            if not done():
                pytest.fail(f"{what}: not within {timeout_s} s; read {len(seen)} records of "
                            f"{sorted({t for t, _, _ in seen})}, assignment {consumer.assignment()}, errors {errors[-5:]}")
        try:
            consumer.subscribe([f"^{prefix}-.*"])
            poll_until(lambda: len(seen) >= 20, 60, "the two matching topics read")
            assert {t for t, _, _ in seen} == {f"{prefix}-a", f"{prefix}-b"}, "a topic the pattern does not match"
            # As `brook group describe -o json` shows it (librdkafka sends its patterns joined, each in parentheses).
            [member] = admin.describe_groups([group])[group].members
            assert (member.subscribed_topic_regex, sorted(member.subscribed_topics)) == (
                f"(^{prefix}-.*)", [f"{prefix}-a", f"{prefix}-b"]), member
            admin.create_topic(f"{prefix}-later", 2, 3)
            admin.wait_for_topics([f"{prefix}-later"])
            _produce(cluster, f"{prefix}-later", 0, 10)
            poll_until(lambda: len(seen) >= 30, 90, "the topic made later read")
        finally:
            consumer.close()
    assert {t for t, _, _ in seen} == {f"{prefix}-a", f"{prefix}-b", f"{prefix}-later"}
    assert not [e for e in errors if e.fatal() or e.code() == KafkaError.INVALID_ARG], errors
