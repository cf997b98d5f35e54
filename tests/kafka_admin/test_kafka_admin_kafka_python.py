"""kafka-python's KafkaAdminClient (Kafka's newest message versions) against the KAFKA listener of a real
TLS + authorizer cluster, as User:admin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from waiting import wait_for

pytestmark = pytest.mark.slow

T = 30


def _partitions(admin: Any, name: str) -> int:
    found = [t for t in admin.describe_topics([name]) if t["name"] == name and t["error_code"] == 0]
    return len(found[0]["partitions"]) if found else 0


def _partition0(admin: Any, name: str) -> dict[str, Any]:
    topic = [t for t in admin.describe_topics([name]) if t["name"] == name][0]
    return [p for p in topic["partitions"] if p["partition_index"] == 0][0]


def _wait_known_everywhere(cluster: Any, topics: dict[str, int]) -> None:
    """Until every broker's metadata has ``topics`` with their partition counts: each broker hears of a new topic
    from the controller on its own, and a client sends a request to whichever broker it picks."""
    from kafka_raw import kafka_ask

    asked = {"topics": [{"name": name} for name in sorted(topics)], "response_partition_limit": 2000}
    want = [(name, 0, topics[name]) for name in sorted(topics)]
    seen: dict[int, Any] = {}

    def known() -> bool:
        for node in cluster.broker_ids:
            seen[node] = [(t.name, int(t.error_code), len(t.partitions)) for t in kafka_ask(cluster, node, 75, 0,
                                                                                             asked).topics]
        return all(got == want for got in seen.values())
    wait_for(known, T, lambda: f"{sorted(topics)} on every broker; each broker's answer: {seen}")


def _committed(admin: Any, group: str, offsets: dict[Any, Any]) -> bool:
    """kafka-python's alter_group_offsets of ``offsets`` for ``group``: did every partition take it?"""
    from kafka.errors import CoordinatorNotAvailableError

    try:
        return all(e.__name__ == "NoError" for e in admin.alter_group_offsets(group, offsets).values())
    except CoordinatorNotAvailableError:  # __consumer_offsets being created on a fresh cluster
        return False


def test_topics_configs_and_partitions(kcluster: Any, kp_admin: Any, topic_name: str) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    a = kp_admin
    brokers = sorted(kcluster.broker_ids)
    a.create_topics({topic_name: {"assignments": {0: [brokers[0], brokers[1]], 1: [brokers[1], brokers[2]]},
                                  "configs": {"retention.ms": "7200000"}}}, timeout_ms=T * 1000)
    wait_for(lambda: _partitions(a, topic_name) == 2, T, "the topic")
    defaults = "ka-d-" + topic_name[3:]
    a.create_topics({defaults: {}}, timeout_ms=T * 1000)  # -1/-1: the cluster's num.partitions / replication
    wait_for(lambda: _partitions(a, defaults) >= 1, T, "the topic with default counts")

    described = a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)])
    assert described["topic"][topic_name]["retention.ms"]["value"] == "7200000"  # 'modified' filter: overrides

    a.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name, {"retention.ms": "60000"})])
    described = a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)])
    assert described["topic"][topic_name]["retention.ms"]["value"] == "60000"

    broker = str(brokers[0])
    mine = a.describe_configs([ConfigResource(ConfigResourceType.BROKER, broker)], config_filter="all")
    assert mine["broker"][broker]["node.id"]["value"] == broker
    assert mine["broker"][broker]["num.partitions"]["config_source"] == "DEFAULT_CONFIG"  # no one set it
    # KIP-569: each entry's type, as Kafka declares the key (it was UNKNOWN for every entry).
    assert {k: mine["broker"][broker][k]["config_type"] for k in (
        "auto.create.topics.enable", "num.partitions", "log.retention.ms", "listeners")} == {
        "auto.create.topics.enable": "BOOLEAN", "num.partitions": "INT", "log.retention.ms": "LONG",
        "listeners": "LIST"}
    every = a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)], config_filter="all")
    assert {k: every["topic"][topic_name][k]["config_type"] for k in (
        "cleanup.policy", "compression.type", "max.message.bytes", "retention.ms", "min.cleanable.dirty.ratio",
        "unclean.leader.election.enable")} == {
        "cleanup.policy": "LIST", "compression.type": "STRING", "max.message.bytes": "INT", "retention.ms": "LONG",
        "min.cleanable.dirty.ratio": "DOUBLE", "unclean.leader.election.enable": "BOOLEAN"}
    assert "UNKNOWN" not in {e["config_type"] for e in every["topic"][topic_name].values()}
    for key in ("inter.broker.sasl.password", "scram.bootstrap.users"):  # set on this cluster: never shown
        secret = mine["broker"][broker].get(key)
        assert secret is None or (secret["value"] is None and secret["is_sensitive"]), secret

    a.create_partitions({topic_name: 3}, timeout_ms=T * 1000)
    wait_for(lambda: _partitions(a, topic_name) == 3, T, "3 partitions")

    dirs = a.describe_log_dirs({topic_name: [0]}, brokers=[brokers[0]])
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]])
            for d in dirs[0]["log_dirs"] for t in d["topics"]] == [(topic_name, [0])]

    a.delete_topics([topic_name, defaults], timeout_ms=T * 1000)
    wait_for(lambda: _partitions(a, topic_name) == 0 and _partitions(a, defaults) == 0, T, "the topics gone")


def test_an_assignment_with_a_count_beside_it_is_refused_as_kafka_does(kcluster: Any, kp_admin: Any,
                                                                       topic_name: str) -> None:
    """Kafka's controller takes a manual assignment only with -1/-1 beside it (KIP-464), the replication factor
    checked first: INVALID_REQUEST. Brook created such a topic when the counts agreed with the assignment (Go
    clients audit: Sarama)."""
    b = sorted(kcluster.broker_ids)
    cases = {f"{topic_name}-rf": (-1, 2, "replication factor was not set to -1"),
             f"{topic_name}-np": (1, -1, "numPartitions was not set to -1"),
             f"{topic_name}-both": (1, 2, "replication factor was not set to -1")}
    out = kp_admin.create_topics({name: {"num_partitions": n, "replication_factor": rf, "assignments": {0: b[:2]}}
                                  for name, (n, rf, _) in cases.items()}, timeout_ms=T * 1000, raise_errors=False)
    got = {t["name"]: (t["error_code"], t["error_message"]) for t in out["topics"]}
    for name, (_, _, said) in cases.items():
        assert got[name][0] == 42 and said in (got[name][1] or ""), (name, got[name])  # INVALID_REQUEST
    assert not set(cases) & set(kp_admin.list_topics()), "a refused topic was created"


def test_broker_configs_as_kafka_tools_filter_them(kcluster: Any, kp_admin: Any) -> None:
    """kafka-python's config filters read the sources and read-only flags a broker answers: "dynamic" (what
    alter_configs accepts) is Brook's dynamic cluster configs, "static" what the node's file set, and each
    entry's synonyms list every source with a value, the default last; v3+ carries each key's documentation."""
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.protocol.admin import DescribeConfigsRequest

    from broker.config import KEYS
    from metadata_quorum import cluster_configs

    a = kp_admin
    broker = str(sorted(kcluster.broker_ids)[1])
    mine = [ConfigResource(ConfigResourceType.BROKER, broker)]
    dynamic = a.describe_configs(mine, config_filter="dynamic")["broker"][broker]
    assert set(dynamic) == set(cluster_configs.known_keys())
    static = a.describe_configs(mine, config_filter="static")["broker"][broker]
    assert {"node.id", "listeners", "log.dirs", "replica.lag.time.max.ms", "ssl.client.auth"} <= set(static)
    assert not {"num.partitions", "log.retention.ms", "auto.create.topics.enable"} & set(static)

    every = a.describe_configs(mine, include_synonyms=True, config_filter="all")["broker"][broker]

    def synonyms(key: str) -> list[tuple[str, str | None, str]]:
        return [(s["name"], s["value"], s["source"]) for s in every[key]["synonyms"]]
    assert synonyms("replica.lag.time.max.ms") == [("replica.lag.time.max.ms", "10000", "STATIC_BROKER_CONFIG"),
                                                   ("replica.lag.time.max.ms", "30000", "DEFAULT_CONFIG")]
    assert synonyms("auto.create.topics.enable") == [("auto.create.topics.enable", "true", "DEFAULT_CONFIG")]
    assert (every["log.retention.ms"]["value"], every["log.retention.ms"]["read_only"]) == ("604800000", False)
    # Kafka's defaults are on the hours keys: 168 h, the same time as log.retention.ms's 604800000 (it was None,
    # KafkaJS audit); the minutes key has none, as in Kafka.
    assert every["log.retention.hours"]["value"] == "168" and synonyms("log.retention.hours") == [
        ("log.retention.hours", "168", "DEFAULT_CONFIG")]
    assert every["log.roll.hours"]["value"] == "168" and every["log.roll.jitter.hours"]["value"] == "0"
    assert every["log.retention.minutes"]["value"] is None

    keys = ["num.partitions", "log.retention.ms"]
    request = DescribeConfigsRequest(resources=[(ConfigResourceType.BROKER, broker, keys)], include_synonyms=False,
                                     include_documentation=True, min_version=3)
    response = a._manager.run(a._manager.send, request, int(broker))
    docs = {c.name: c.documentation for r in response.results for c in r.configs}
    assert docs == {k: KEYS[k].doc for k in keys}


def test_reassignment_and_election(kcluster: Any, kp_admin: Any, topic_name: str) -> None:
    from kafka import TopicPartition
    from kafka.protocol.admin import ElectionType

    a = kp_admin
    brokers = sorted(kcluster.broker_ids)
    a.create_topics({topic_name: {"assignments": {0: [brokers[0], brokers[1]]}}}, timeout_ms=T * 1000)
    wait_for(lambda: _partitions(a, topic_name) == 1, T, "the topic")
    wait_for(lambda: _partition0(a, topic_name)["leader_id"] == brokers[0], T, "the first replica to lead")
    tp = TopicPartition(topic_name, 0)
    # This cluster stays at brook.metadata.version 1 (initial.metadata.version): a list of another length, Kafka's
    # way to change the replication factor, needs level 5 and is refused per partition, nothing changed.
    from kafka.errors import InvalidReplicationFactorError

    assert a.alter_partition_reassignments({tp: brokers}, timeout_ms=T * 1000) == {tp: InvalidReplicationFactorError}
    assert _partition0(a, topic_name)["replica_nodes"] == [brokers[0], brokers[1]]
    a.alter_partition_reassignments({tp: [brokers[2], brokers[1]]}, timeout_ms=T * 1000)

    def moved(replicas: list[int]) -> Callable[[], bool]:
        def done() -> bool:
            return not a.list_partition_reassignments([tp]) and _partition0(a, topic_name)["replica_nodes"] == replicas
        return done

    wait_for(moved([brokers[2], brokers[1]]), 60, "the move to finish")
    leader = _partition0(a, topic_name)["leader_id"]
    assert leader in (brokers[2], brokers[1])
    # Put the other replica first: the leader stays, so only an election makes the new first one lead.
    other = brokers[1] if leader == brokers[2] else brokers[2]
    a.alter_partition_reassignments({tp: [other, leader]}, timeout_ms=T * 1000)
    wait_for(moved([other, leader]), 60, "the reorder to finish")
    assert _partition0(a, topic_name)["leader_id"] == leader, "a reorder alone moved the leader"
    # kafka-python reads a list as topic names: the partitions go as {topic: [partition ids]}.
    resp = a.elect_leaders(ElectionType.PREFERRED, {topic_name: [0]}, timeout_ms=T * 1000)
    results = [(r.topic, p.partition_id, p.error_code) for r in resp.replica_election_results
               for p in r.partition_result]
    assert results == [(topic_name, 0, 0)], results
    wait_for(lambda: _partition0(a, topic_name)["leader_id"] == other, T, "the elected preferred replica to lead")
    a.delete_topics([topic_name], timeout_ms=T * 1000)


def test_describe_metadata_quorum(kcluster: Any, kp_admin: Any) -> None:
    """kafka-python's describe_metadata_quorum (DescribeQuorum, what kafka-metadata-quorum shows): the quorum as the
    active controller sees it; other partitions are unknown; DESCRIBE on the cluster is needed."""
    from kafka_raw import kafka_ask

    from client.admin import Admin

    quorum = kp_admin.describe_metadata_quorum()
    [topic] = quorum["topics"]
    [p] = topic["partitions"]
    assert topic["topic_name"] == "__cluster_metadata" and p["error"] is None, quorum
    voters = {v["replica_id"]: v for v in p["current_voters"]}
    assert set(voters) == set(kcluster.controller_ids) and p["leader_id"] in voters and p["observers"] == []
    with Admin(kcluster.bootstrap_servers, controller_endpoints=kcluster.controller_endpoints,
               security=kcluster.security) as brook:
        described = brook.describe_quorum()
    assert p["leader_id"] == described.leader_id and p["leader_epoch"] == described.term
    assert 0 < voters[p["leader_id"]]["log_end_offset"] and 0 < p["high_watermark"] <= described.commit_index
    assert all(v["last_fetch_timestamp"] > 0 for v in voters.values()), voters

    node = kcluster.broker_ids[0]
    other = kafka_ask(kcluster, node, 55, 2, {"topics": [{"topic_name": "__cluster_metadata",
                                                          "partitions": [{"partition_index": 1}]}]})
    assert [int(p.error_code) for t in other.topics for p in t.partitions] == [3]  # UNKNOWN_TOPIC_OR_PARTITION
    # The quorum's partition is answered once; each copy is INVALID_REQUEST without the voters (10,000 copies were
    # each answered in full on the event loop; audit).
    copies = kafka_ask(kcluster, node, 55, 2, {"topics": [{"topic_name": "__cluster_metadata",
                                                           "partitions": [{"partition_index": 0}] * 3}]})
    answered = [(int(p.error_code), len(p.current_voters)) for t in copies.topics for p in t.partitions]
    assert answered[1:] == [(42, 0), (42, 0)] and answered[0][0] != 42, answered
    denied = kafka_ask(kcluster, node, 55, 0, {"topics": [{"topic_name": "__cluster_metadata",
                                                           "partitions": [{"partition_index": 0}]}]}, name="demo")
    assert int(denied.error_code) == 31 and denied.topics == ()  # CLUSTER_AUTHORIZATION_FAILED


def test_describe_producers(kcluster: Any, kp_admin: Any, confluent_admin: Any, topic_name: str) -> None:
    """kafka-python's describe_producers (what kafka-transactions describe-producers sends): librdkafka's idempotent
    producer as the leader and each follower track it; READ on the topic is needed."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka_raw import kafka_ask

    for f in confluent_admin.create_topics([NewTopic(topic_name, 1, 3)], request_timeout=T).values():
        f.result(T)
    producer = Producer({**kcluster.kafka_client_config("admin"), "enable.idempotence": True, "linger.ms": 0})
    for i in range(5):
        producer.produce(topic_name, value=f"v{i}".encode())
        producer.flush(T)  # one batch each: sequences 0..4
    assert len(producer) == 0
    tp = KafkaTopicPartition(topic_name, 0)

    def described(broker_id: int | None = None) -> list[tuple[int, int, int]]:
        got = kp_admin.describe_producers([tp], broker_id=broker_id)[tp].active_producers
        return [(p.producer_id, p.last_sequence, p.coordinator_epoch) for p in got]
    [(pid, last_seq, coordinator_epoch)] = described()
    assert pid >= 0 and last_seq == 4 and coordinator_epoch == -1
    # Each follower answers from its own copy (Kafka's --broker-id), once it has fetched the last batch.
    for broker in kcluster.broker_ids:
        wait_for(lambda b=broker: described(b) == [(pid, 4, -1)], T, f"broker {broker}'s copy of the producer state")
    denied = kafka_ask(kcluster, kcluster.broker_ids[0], 61, 0,
                       {"topics": [{"name": topic_name, "partition_indexes": [0]}]}, name="demo")
    assert [(int(p.error_code), p.active_producers) for t in denied.topics for p in t.partitions] == [(29, ())]
    # Each partition once: a copy is INVALID_REQUEST without the producers (1,000 copies of a partition with 5,000
    # producers took 21 s of the event loop and 3.5 GB; audit).
    copies = kafka_ask(kcluster, kcluster.broker_ids[0], 61, 0,
                       {"topics": [{"name": topic_name, "partition_indexes": [0, 0, 0]}]})
    answered = [(int(p.error_code), len(p.active_producers)) for t in copies.topics for p in t.partitions]
    assert answered == [(0, 1), (42, 0), (42, 0)], answered


def test_offsets_of_several_groups_in_one_request(kcluster: Any, kp_admin: Any, confluent_admin: Any,
                                                  topic_name: str) -> None:
    """OffsetFetch v8 (KIP-709): kafka-python's list_group_offsets of several groups sends them to each coordinator
    in one request (against a broker without v8 it refuses more than one group); a group the caller may not
    DESCRIBE is refused on its own."""
    from confluent_kafka.admin import NewTopic
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka.structs import OffsetAndMetadata
    from kafka_raw import kafka_ask

    for f in confluent_admin.create_topics([NewTopic(topic_name, 2, 1)], request_timeout=T).values():
        f.result(T)
    tp0, tp1 = KafkaTopicPartition(topic_name, 0), KafkaTopicPartition(topic_name, 1)
    groups = {f"{topic_name}-g{i}": {tp0: OffsetAndMetadata(i, f"m{i}", -1), tp1: OffsetAndMetadata(10 + i, "", -1)}
              for i in range(3)}
    for group in groups:
        wait_for(lambda g=group: _committed(kp_admin, g, groups[g]), T, f"{group}'s offsets committed")
    names = sorted(groups)
    got = kp_admin.list_group_offsets({names[0]: None, names[1]: [tp1], names[2]: None})
    assert {g: {tp: (o.offset, o.metadata) for tp, o in offsets.items()} for g, offsets in got.items()} == {
        names[0]: {tp0: (0, "m0"), tp1: (10, "")}, names[1]: {tp1: (11, "")}, names[2]: {tp0: (2, "m2"), tp1: (12, "")}}

    coordinator = kcluster.broker_ids[0]
    raw = kafka_ask(kcluster, coordinator, 9, 8, {"groups": [{"group_id": g, "topics": None} for g in names]},
                    name="demo")  # demo may DESCRIBE only demo-* groups
    assert [(g.group_id, int(g.error_code), g.topics) for g in raw.groups] == [(g, 30, ()) for g in names]
    # Each group is fetched once: a copy of an id named before is INVALID_REQUEST, not another full answer (1,000
    # copies of a large group made a 10 KB request build gigabytes; audit).
    repeated = kafka_ask(kcluster, coordinator, 9, 8, {"groups": [{"group_id": names[0], "topics": None}] * 3})
    codes = [int(g.error_code) for g in repeated.groups]
    assert codes[1:] == [42, 42] and codes[0] != 42 and [g.topics for g in repeated.groups][1:] == [(), ()], codes


def test_transactions_listed_and_described(kcluster: Any, kp_admin: Any, confluent_admin: Any,
                                           topic_name: str) -> None:
    """kafka-python's list_transactions, find_hanging_transactions and describe_transactions (``kafka-transactions
    list / find-hanging / describe``) over a transaction left open by confluent-kafka: listed by its coordinator
    only, with its state; filtered by state (an unknown state echoed back), by producer id and by a transactional id
    pattern (v2, KIP-1152); described with its partitions. Once it is aborted it is listed CompleteAbort."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka_raw import kafka_ask

    for f in confluent_admin.create_topics([NewTopic(topic_name, 2, 1)], request_timeout=T).values():
        f.result(T)
    _wait_known_everywhere(kcluster, {topic_name: 2})
    tid = "lt-" + topic_name
    p = Producer({**kcluster.kafka_client_config("admin"), "transactional.id": tid})
    p.init_transactions(T)
    p.begin_transaction()
    p.produce(topic_name, b"open", partition=1)
    p.flush(T)
    try:
        listed = kp_admin.list_transactions()
        mine = {b: [t for t in ts if t.transactional_id == tid] for b, ts in listed.items()}
        [coordinator] = [b for b, ts in mine.items() if ts]
        [entry] = mine[coordinator]
        assert str(getattr(entry.state, "value", entry.state)) == "Ongoing", entry
        assert [t.transactional_id for t in kp_admin.list_transactions(
            broker_ids=[coordinator], transactional_id_pattern="lt-" + topic_name[:6] + ".*")[coordinator]] == [tid]
        assert kp_admin.list_transactions(broker_ids=[coordinator], transactional_id_pattern="nomatch-.*") == \
            {coordinator: []}
        assert kp_admin.list_transactions(broker_ids=[coordinator], producer_id_filters=[entry.producer_id + 1]) == \
            {coordinator: []}
        out = kafka_ask(kcluster, coordinator, 66, 1, {"state_filters": ["Ongoing", "Bogus"],
                                                       "producer_id_filters": [], "duration_filter": -1})
        assert int(out.error_code) == 0 and out.unknown_state_filters == ("Bogus",), out
        assert tid in [t.transactional_id for t in out.transaction_states], out
        described = kp_admin.describe_transactions([tid])[tid]
        assert {(tp.topic, tp.partition) for tp in described.topic_partitions} == {(topic_name, 1)}, described
        assert described.producer_id == entry.producer_id
        # the partition's leader: the producer, where its open transaction began, and no marker yet
        [state] = kp_admin.describe_producers([KafkaTopicPartition(topic_name, 1)])[
            KafkaTopicPartition(topic_name, 1)].active_producers
        assert (state.producer_id, state.current_transaction_start_offset, state.coordinator_epoch) == \
            (entry.producer_id, 0, -1), state
        unknown = kafka_ask(kcluster, coordinator, 65, 0, {"transactional_ids": ["never-" + topic_name]})
        # an id this broker does not coordinate, or that it never saw: answered (the fuzzer found this answer's
        # start time of -1 made the encoder fail, and the connection close)
        assert int(unknown.transaction_states[0].error_code) in (16, 105), unknown
        bad = kafka_ask(kcluster, coordinator, 66, 2, {"state_filters": [], "producer_id_filters": [],
                                                       "duration_filter": -1, "transactional_id_pattern": "(a"})
        assert int(bad.error_code) == 128, bad  # INVALID_REGULAR_EXPRESSION
    finally:
        p.abort_transaction(T)
    wait_for(lambda: [str(getattr(t.state, "value", t.state)) for t in kp_admin.list_transactions(
        broker_ids=[coordinator])[coordinator] if t.transactional_id == tid] == ["CompleteAbort"], T, "the abort")
    assert tid not in {t.transactional_id for t in kp_admin.find_hanging_transactions()}

    def after_abort() -> tuple[int, bool]:
        [state] = kp_admin.describe_producers([KafkaTopicPartition(topic_name, 1)])[
            KafkaTopicPartition(topic_name, 1)].active_producers
        return state.current_transaction_start_offset, state.coordinator_epoch >= 0
    wait_for(lambda: after_abort() == (-1, True), T, lambda: f"the ABORT marker in the producer state: {after_abort()}")


def test_an_operator_aborts_an_open_transaction_and_read_committed_readers_go_on(
        kcluster: Any, kp_admin: Any, confluent_admin: Any, topic_name: str) -> None:
    """kafka-python's abort_transaction (what ``kafka-transactions abort`` sends: WriteTxnMarkers to the partition's
    leader, which needs CLUSTER_ACTION on the cluster). The remedy for a transaction no coordinator will end: its
    partition's last stable offset, and every read_committed reader, would stay at its first offset. Without
    CLUSTER_ACTION nothing is written; with it the ABORT marker frees the partition, and the transaction's records
    are never read committed, even once its producer commits (the coordinator's marker completes nothing)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka.admin import AbortTransactionSpec
    from kafka_raw import kafka_ask

    for f in confluent_admin.create_topics([NewTopic(topic_name, 1, 3)], request_timeout=T).values():
        f.result(T)
    _wait_known_everywhere(kcluster, {topic_name: 1})
    tp = KafkaTopicPartition(topic_name, 0)
    p = Producer({**kcluster.kafka_client_config("admin"), "transactional.id": "ab-" + topic_name})
    p.init_transactions(T)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic_name, b"in-txn-%d" % i, partition=0)
    p.flush(T)
    plain = Producer({**kcluster.kafka_client_config("admin"), "enable.idempotence": True})
    plain.produce(topic_name, b"after", partition=0)
    assert plain.flush(T) == 0
    def txn_producer() -> Any:  # the transactional producer's state (the other is the idempotent one)
        states = kp_admin.describe_producers([tp])[tp].active_producers
        return next(s for s in states if s.producer_id != plain_pid)
    plain_pid = next(s.producer_id for s in kp_admin.describe_producers([tp])[tp].active_producers
                     if s.current_transaction_start_offset == -1)
    state = txn_producer()
    assert state.current_transaction_start_offset == 0, state
    leader = confluent_admin.list_topics(topic_name, timeout=T).topics[topic_name].partitions[0].leader

    def stable() -> int:
        got = kafka_ask(kcluster, leader, 2, 2, {"replica_id": -1, "isolation_level": 1, "topics": [
            {"name": topic_name, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
        return int(got.topics[0].partitions[0].offset)
    assert stable() == 0  # held at the open transaction
    marker = {"producer_id": state.producer_id, "producer_epoch": state.producer_epoch, "transaction_result": False,
              "coordinator_epoch": state.coordinator_epoch, "topics": [{"name": topic_name, "partition_indexes": [0]}]}
    denied = kafka_ask(kcluster, leader, 27, 1, {"markers": [marker]}, name="demo")
    assert [int(q.error_code) for m in denied.markers for t in m.topics for q in t.partitions] == [31], denied
    too_many = kafka_ask(kcluster, leader, 27, 1, {"markers": [
        {**marker, "topics": [{"name": topic_name, "partition_indexes": list(range(1001))}]}]})
    assert {int(q.error_code) for m in too_many.markers for t in m.topics for q in t.partitions} == {42}
    version2 = kafka_ask(kcluster, leader, 27, 2, {"markers": [{**marker, "transaction_version": 2}]})
    assert [int(q.error_code) for m in version2.markers for t in m.topics for q in t.partitions] == [42], version2
    assert stable() == 0 and txn_producer() == state

    kp_admin.abort_transaction(AbortTransactionSpec(tp, state.producer_id, state.producer_epoch,
                                                    state.coordinator_epoch))
    wait_for(lambda: stable() == 5, T, lambda: f"the last stable offset past the abort: {stable()}")  # 3, marker, 1
    after = txn_producer()
    assert after.current_transaction_start_offset == -1, after
    p.commit_transaction(T)  # its coordinator's COMMIT marker completes nothing on this partition
    end = wait_for(lambda: stable() == 6 and 6, T, lambda: f"the coordinator's marker: {stable()}")
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as RdTopicPartition

    c = Consumer({**kcluster.kafka_client_config("admin"), "group.id": "ab-" + topic_name,
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        c.assign([RdTopicPartition(topic_name, 0, 0)])
        values: list[bytes] = []

        def read_to_end() -> bool:
            values.extend(m.value() for m in c.consume(10, 0.2) if not m.error())
            return c.position([RdTopicPartition(topic_name, 0)])[0].offset >= end
        wait_for(read_to_end, T, lambda: f"read_committed to offset {end}: {values}")
        assert values == [b"after"], values
    finally:
        c.close()


def test_config_resources_listed_as_kafka_4_1_lists_them(kcluster: Any, kp_admin: Any, confluent_admin: Any,
                                                         topic_name: str) -> None:
    """ListConfigResources v1 (KIP-1142), which kafka-python's list_config_resources and Kafka 4.1's ``kafka-configs
    --describe`` without an entity name send: every topic, and each broker as a broker and as a broker logger, after
    DESCRIBE_CONFIGS on the cluster. Brook has no group configs or client-metrics subscriptions, so those list none; a
    type Kafka does not list fails the whole request UNSUPPORTED_VERSION; v0 (KIP-714's ListClientMetricsResources)
    lists client metrics only. Against a broker without the API, kafka-python raised IncompatibleBrokerVersion."""
    from confluent_kafka.admin import NewTopic
    from kafka.admin import ConfigResourceType
    from kafka_raw import kafka_ask

    for f in confluent_admin.create_topics([NewTopic(topic_name, 1, 1)], request_timeout=T).values():
        f.result(T)
    _wait_known_everywhere(kcluster, {topic_name: 1})
    nodes = [str(b) for b in sorted(kcluster.broker_ids)]

    listed = kp_admin.list_config_resources()
    assert sorted(listed) == ["broker", "broker_logger", "topic"], listed
    assert listed["broker"] == nodes and listed["broker_logger"] == nodes, listed
    assert topic_name in listed["topic"] and listed["topic"] == sorted(listed["topic"]), listed["topic"]
    assert kp_admin.list_config_resources([ConfigResourceType.BROKER]) == {"broker": nodes}
    assert kp_admin.list_config_resources(["GROUP", "CLIENT_METRICS"]) == {}

    node = kcluster.broker_ids[0]

    def raw(version: int, types: list[int], name: str = "admin") -> tuple[int, list[tuple[int, str]]]:
        out = kafka_ask(kcluster, node, 74, version, {"resource_types": types}, name=name)
        return int(out.error_code), [(int(r.resource_type), r.resource_name) for r in out.config_resources]
    def check(code: int, rows: list[tuple[int, str]], types: list[int]) -> None:
        """Kafka's order of types (groups, client metrics, broker loggers, brokers, topics), whatever the filter's
        order; each broker once a type, and the topics by name (a topic another test deleted may still be going)."""
        assert code == 0 and [t for t, _ in rows] == [t for t in types for _ in range(sum(k == t for k, _ in rows))]
        for kind in set(types) & {4, 8}:
            assert [n for k, n in rows if k == kind] == nodes, rows
        topics = [n for k, n in rows if k == 2]
        assert (2 not in types and not topics) or (topic_name in topics and topics == sorted(topics)), rows
    check(*raw(1, []), [8, 4, 2])
    check(*raw(1, [2, 4, 2]), [4, 2])  # a repeated type is listed once
    assert raw(1, [2, 64]) == (35, [])  # UNSUPPORTED_VERSION: a type Kafka does not list, beside one it does
    assert raw(1, [3]) == (35, [])  # GROUP is 32 here, as in Kafka's ConfigResource.Type, not the ACL code 3
    assert raw(0, []) == (0, [])
    assert raw(1, [], name="demo") == (31, [])  # CLUSTER_AUTHORIZATION_FAILED: no DESCRIBE_CONFIGS on the cluster


def test_describe_topic_partitions_pages(kcluster: Any, kp_admin: Any, confluent_admin: Any, topic_name: str) -> None:
    """kafka-python's describe_topic_partitions (KIP-966; kafka-topics --describe from Kafka 3.8): topics in name
    order, at most response_partition_limit partitions a page, the cursor where the next page starts."""
    from confluent_kafka.admin import NewTopic
    from kafka_raw import kafka_ask

    a, b = f"{topic_name}-a", f"{topic_name}-b"
    for f in confluent_admin.create_topics([NewTopic(a, 3, 1), NewTopic(b, 2, 1)], request_timeout=T).values():
        f.result(T)
    # Every broker must know both: kafka-python sends each page to whichever broker it picks, and a broker that had
    # not yet heard of b from the controller answered it UNKNOWN_TOPIC_OR_PARTITION, without partitions (seen in CI).
    _wait_known_everywhere(kcluster, {a: 3, b: 2})

    def page(cursor: dict[str, Any] | None) -> tuple[list[tuple[str, list[int]]], dict[str, Any] | None]:
        got = kp_admin.describe_topic_partitions([b, a], response_partition_limit=2, cursor=cursor)
        return [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in got["topics"]], got["next_cursor"]
    assert page(None) == ([(a, [0, 1])], {"topic_name": a, "partition_index": 2})
    assert page({"topic_name": a, "partition_index": 2}) == ([(a, [2]), (b, [0])], {"topic_name": b, "partition_index": 1})
    assert page({"topic_name": b, "partition_index": 1}) == ([(b, [1])], None)

    node = kcluster.broker_ids[0]
    unknown = kafka_ask(kcluster, node, 75, 0, {"topics": [{"name": f"{topic_name}-none"}], "response_partition_limit": 10})
    assert [(t.name, int(t.error_code)) for t in unknown.topics] == [(f"{topic_name}-none", 3)]
    stray = kafka_ask(kcluster, node, 75, 0, {"topics": [{"name": a}], "response_partition_limit": 10,
                                              "cursor": {"topic_name": b, "partition_index": 0}})
    assert [(t.name, int(t.error_code)) for t in stray.topics] == [(a, 42)]  # the cursor's topic is not asked for
    # User:demo may DESCRIBE only demo-* topics: named, the others are refused; unnamed, they are left out.
    denied = kafka_ask(kcluster, node, 75, 0, {"topics": [{"name": a}], "response_partition_limit": 10}, name="demo")
    assert [(t.name, int(t.error_code), t.partitions) for t in denied.topics] == [(a, 29, ())]
    everything = kafka_ask(kcluster, node, 75, 0, {"topics": [], "response_partition_limit": 2000}, name="demo")
    assert all(t.name.startswith("demo-") for t in everything.topics), [t.name for t in everything.topics]


def test_groups_listed_by_type_and_state_and_a_missing_group_not_found(kcluster: Any, kp_admin: Any,
                                                                       confluent_admin: Any, topic_name: str) -> None:
    """ListGroups v5 (KIP-848) and DescribeGroups v6 (KIP-1043), as Kafka 4 answers them: every group here is a
    classic group, so a types filter naming ``classic`` (any case) lists it, with that type, and one naming only
    other types lists none; a states filter is compared without case; a group that does not exist is
    GROUP_ID_NOT_FOUND from v6 on, a Dead group without an error before. kafka-python refuses a types filter
    against a broker without v5, and librdkafka shows such a broker's groups as of an unknown type."""
    from confluent_kafka import ConsumerGroupState, ConsumerGroupType
    from confluent_kafka.admin import NewTopic
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka.structs import OffsetAndMetadata
    from kafka_raw import kafka_ask

    for f in confluent_admin.create_topics([NewTopic(topic_name, 1, 1)], request_timeout=T).values():
        f.result(T)
    group = f"{topic_name}-g"

    wait_for(lambda: _committed(kp_admin, group, {KafkaTopicPartition(topic_name, 0): OffsetAndMetadata(1, "", -1)}),
             T, f"{group}'s offset committed")  # an Empty group with an offset

    listed = {g["group_id"]: g for g in kp_admin.list_groups(types_filter=["classic"])}
    assert listed[group]["group_type"] == "classic" and listed[group]["group_state"] == "Empty", listed.get(group)
    assert group not in {g["group_id"] for g in kp_admin.list_groups(types_filter=["consumer"])}
    classic = confluent_admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}, request_timeout=T).result(T)
    assert [(g.type, g.state) for g in classic.valid if g.group_id == group] == [
        (ConsumerGroupType.CLASSIC, ConsumerGroupState.EMPTY)], (classic.valid, classic.errors)

    def raw_listing(version: int, values: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for node in kcluster.broker_ids:  # each coordinator lists its own groups
            answer = kafka_ask(kcluster, node, 16, version, values)
            assert int(answer.error_code) == 0, answer
            out.update({g.group_id: g for g in answer.groups})
        return out
    assert group in raw_listing(4, {"states_filter": ["eMPTY"]})
    assert group not in raw_listing(4, {"states_filter": ["stable"]})
    assert raw_listing(5, {"types_filter": ["Classic"]})[group].group_type == "classic"
    assert group not in raw_listing(5, {"types_filter": ["share", "consumer"]})

    missing = f"{topic_name}-nosuch"
    described = kp_admin.describe_groups([missing, group])
    assert "GroupIdNotFound" in (described[missing]["error"] or ""), described[missing]
    assert described[group]["error"] is None and described[group]["group_state"] == "Empty", described[group]
    coordinator = kafka_ask(kcluster, kcluster.broker_ids[0], 10, 4, {"key_type": 0, "coordinator_keys": [missing]})
    node = coordinator.coordinators[0].node_id
    v6 = kafka_ask(kcluster, node, 15, 6, {"groups": [missing]}).groups[0]
    assert (int(v6.error_code), v6.error_message, v6.group_state) == (69, f"Group {missing} not found.", "Dead"), v6
    v5 = kafka_ask(kcluster, node, 15, 5, {"groups": [missing]}).groups[0]
    assert (int(v5.error_code), v5.group_state) == (0, "Dead"), v5


def test_earliest_local_and_latest_tiered_offsets(kcluster: Any, kp_admin: Any, confluent_admin: Any,
                                                  topic_name: str) -> None:
    """ListOffsets v8 (KIP-405's earliest local offset, -4) and v9 (KIP-1005's latest tiered offset, -5), which
    kafka-python's OffsetSpec and Kafka 4's ``kafka-get-offsets.sh --time earliest-local|latest-tiered`` send.
    Brook has no tiered storage, so as Kafka without it: the earliest local offset is the log start, with its
    leader epoch, and the latest tiered one is -1. Against a broker without v8, kafka-python refused both."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    from kafka import OffsetSpec
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka_raw import kafka_ask

    for f in confluent_admin.create_topics([NewTopic(topic_name, 1, 3)], request_timeout=T).values():
        f.result(T)
    _wait_known_everywhere(kcluster, {topic_name: 1})
    producer = Producer(kcluster.kafka_client_config("admin"))
    for i in range(10):
        producer.produce(topic_name, b"r%d" % i)
    assert producer.flush(T) == 0
    del producer  # its threads would go on dialling the cluster once it stops
    tp = KafkaTopicPartition(topic_name, 0)
    wait_for(lambda: kp_admin.list_partition_offsets({tp: OffsetSpec.LATEST})[tp].offset == 10, T, "10 records")
    kp_admin.delete_records({tp: 4})  # the log start moves to 4

    def offsets(spec: Any) -> tuple[int, int, int | None]:
        found = kp_admin.list_partition_offsets({tp: spec})[tp]
        return found.offset, found.timestamp, found.leader_epoch
    earliest = offsets(OffsetSpec.EARLIEST)
    assert earliest[0] == 4 and offsets(OffsetSpec.EARLIEST_LOCAL) == earliest, earliest
    assert offsets(OffsetSpec.LATEST_TIERED)[:2] == (-1, -1)
    leader = kp_admin.describe_topics([topic_name])[0]["partitions"][0]["leader_id"]
    for version, ts, want in ((8, -4, 4), (9, -5, -1), (10, -4, 4)):
        values = {"replica_id": -1, "isolation_level": 0, "timeout": 1000,
                  "topics": [{"name": topic_name, "partitions": [{"partition_index": 0, "timestamp": ts}]}]}
        answer = kafka_ask(kcluster, leader, 2, version, values).topics[0].partitions[0]
        assert (int(answer.error_code), answer.offset) == (0, want), (version, answer)
