"""librdkafka's AdminClient (confluent-kafka) against the KAFKA listener of a real TLS + authorizer cluster,
as User:admin (a super user): topics, configs, partitions, records, cluster, elections, ACLs."""

from __future__ import annotations

from typing import Any

import pytest
from waiting import wait_for

pytestmark = pytest.mark.slow

T = 30  # seconds for one admin call


def _source(entry: Any) -> int:
    return getattr(entry.source, "value", entry.source)


def _topics(admin: Any) -> dict[str, Any]:
    return admin.list_topics(timeout=T).topics


def test_topic_lifecycle(confluent_admin: Any, topic_name: str) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
        NewTopic,
        ResourceType,
    )

    a = confluent_admin
    new = NewTopic(topic_name, num_partitions=2, replication_factor=2, config={"retention.ms": "3600000"})
    a.create_topics([new], validate_only=True, operation_timeout=T)[topic_name].result(T)
    assert topic_name not in _topics(a), "validate_only created the topic"

    a.create_topics([new], operation_timeout=T)[topic_name].result(T)
    wait_for(lambda: topic_name in _topics(a) and len(_topics(a)[topic_name].partitions) == 2, T, "the topic")
    with pytest.raises(KafkaException) as exists:
        a.create_topics([new], operation_timeout=T)[topic_name].result(T)
    assert exists.value.args[0].name() == "TOPIC_ALREADY_EXISTS"

    resource = ConfigResource(ResourceType.TOPIC, topic_name)
    configs = a.describe_configs([resource])[resource].result(T)
    assert configs["retention.ms"].value == "3600000" and _source(configs["retention.ms"]) == 1  # DYNAMIC_TOPIC
    assert _source(configs["segment.bytes"]) == 5  # DEFAULT_CONFIG

    change = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([change])[change].result(T)
    configs = a.describe_configs([resource])[resource].result(T)
    assert configs["cleanup.policy"].value == "compact" and _source(configs["retention.ms"]) == 5

    append = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND)])
    a.incremental_alter_configs([append])[append].result(T)
    assert a.describe_configs([resource])[resource].result(T)["cleanup.policy"].value == "compact,delete"
    not_a_list = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND)])
    with pytest.raises(KafkaException) as refused:
        a.incremental_alter_configs([not_a_list])[not_a_list].result(T)
    assert refused.value.args[0].name() == "INVALID_CONFIG"

    legacy = ConfigResource(ResourceType.TOPIC, topic_name, set_config={"retention.bytes": "1048576"})
    a.alter_configs([legacy])[legacy].result(T)  # replaces the whole set: cleanup.policy goes back to default
    configs = a.describe_configs([resource])[resource].result(T)
    assert configs["retention.bytes"].value == "1048576" and _source(configs["cleanup.policy"]) == 5

    a.create_partitions([NewPartitions(topic_name, 4)], operation_timeout=T)[topic_name].result(T)
    wait_for(lambda: len(_topics(a)[topic_name].partitions) == 4, T, "4 partitions")
    with pytest.raises(KafkaException) as fewer:
        a.create_partitions([NewPartitions(topic_name, 3)], operation_timeout=T)[topic_name].result(T)
    assert fewer.value.args[0].name() == "INVALID_PARTITIONS"

    a.delete_topics([topic_name], operation_timeout=T)[topic_name].result(T)
    wait_for(lambda: topic_name not in _topics(a), T, "the topic to be gone")
    with pytest.raises(KafkaException) as gone:
        a.delete_topics([topic_name], operation_timeout=T)[topic_name].result(T)
    assert gone.value.args[0].name() == "UNKNOWN_TOPIC_OR_PART"


def test_records_cluster_and_elections(kcluster: Any, confluent_admin: Any, topic_name: str) -> None:
    from confluent_kafka import ElectionType, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic

    a = confluent_admin
    a.create_topics([NewTopic(topic_name, 1, 3)], operation_timeout=T)[topic_name].result(T)
    producer = Producer({**kcluster.kafka_client_config("admin"), "acks": "all"})
    for i in range(10):
        producer.produce(topic_name, value=b"v%d" % i, partition=0)
    assert producer.flush(T) == 0

    tp = TopicPartition(topic_name, 0, 4)
    deleted = a.delete_records([tp], operation_timeout=T)[tp].result(T)
    assert deleted.low_watermark == 4

    cluster = a.describe_cluster(request_timeout=T).result(T)
    assert {n.id for n in cluster.nodes} == set(kcluster.broker_ids)
    assert cluster.cluster_id and cluster.controller is not None

    # (confluent-kafka 2.16's elect_leaders fails on its own keyword arguments: called without any)
    elected = a.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic_name, 0)]).result(T)
    err = elected[TopicPartition(topic_name, 0)]
    assert err is not None and err.name() == "ELECTION_NOT_NEEDED"  # the preferred replica leads already
    a.delete_topics([topic_name], operation_timeout=T)[topic_name].result(T)


def test_acls(confluent_admin: Any, topic_name: str) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    a = confluent_admin
    principal = f"User:{topic_name}"
    read = AclBinding(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL, principal, "*",
                      AclOperation.READ, AclPermissionType.ALLOW)
    group = AclBinding(ResourceType.GROUP, "g-", ResourcePatternType.PREFIXED, principal, "*",
                       AclOperation.READ, AclPermissionType.ALLOW)
    for f in a.create_acls([read, group], request_timeout=T).values():
        f.result(T)
    on_host = AclBinding(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL, principal, "10.0.0.1",
                         AclOperation.READ, AclPermissionType.ALLOW)
    a.create_acls([on_host], request_timeout=T)[on_host].result(T)
    by_name = AclBinding(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL, principal, "db.example",
                         AclOperation.READ, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as named:  # ACLs match the client's IP address, never a host name
        a.create_acls([by_name], request_timeout=T)[by_name].result(T)
    assert named.value.args[0].name() == "INVALID_REQUEST"

    of_principal = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None,
                                    AclOperation.ANY, AclPermissionType.ANY)
    found = wait_for(lambda: a.describe_acls(of_principal, request_timeout=T).result(T), T, "the ACLs")
    assert sorted(found, key=str) == sorted([read, group, on_host], key=str)
    on_that_host = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, "10.0.0.1",
                                    AclOperation.ANY, AclPermissionType.ANY)
    assert a.describe_acls(on_that_host, request_timeout=T).result(T) == [on_host]
    # A filter naming a host deletes the bindings on that host only, not their twins on "*".
    assert a.delete_acls([on_that_host], request_timeout=T)[on_that_host].result(T) == [on_host]
    # An empty host matches no client in Kafka: it was stored as "*" (every client), and an empty host in a filter
    # was read as "any", so a DeleteAcls with it deleted the bindings of every host (audit).
    empty_host = AclBinding(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL, principal, "",
                            AclOperation.WRITE, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as empty:
        a.create_acls([empty_host], request_timeout=T)[empty_host].result(T)
    assert empty.value.args[0].name() == "INVALID_REQUEST"
    no_host = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, "",
                               AclOperation.ANY, AclPermissionType.ANY)
    assert a.describe_acls(no_host, request_timeout=T).result(T) == []
    assert a.delete_acls([no_host], request_timeout=T)[no_host].result(T) == []
    assert sorted(a.describe_acls(of_principal, request_timeout=T).result(T), key=str) == sorted([read, group], key=str)

    topic_only = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, principal, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    assert a.delete_acls([topic_only], request_timeout=T)[topic_only].result(T) == [read]
    assert a.delete_acls([of_principal], request_timeout=T)[of_principal].result(T) == [group]
    assert a.describe_acls(of_principal, request_timeout=T).result(T) == []


def _cluster_default(kp_admin: Any, key: str, value: str | None) -> None:
    """SET (or DELETE: ``value`` None) ``key`` in the cluster-wide defaults, the BROKER resource '', with an
    IncrementalAlterConfigs as kafka-configs.sh --alter --entity-type brokers --entity-default sends it.
    librdkafka refuses a resource without a name, and kafka-python's alter_configs sends a BROKER resource to
    the broker its name numbers: the request is kafka-python's own, sent as it builds it."""
    from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType

    op = AlterConfigOp.SET if value is not None else AlterConfigOp.DELETE
    request = kp_admin._alter_configs_request(
        [ConfigResource(ConfigResourceType.BROKER, "", {key: (op, value)})], incremental=True)
    response = kp_admin._manager.run(kp_admin._manager.send, request)
    assert [(r.error_code, r.resource_name) for r in response.responses] == [(0, "")], response


def test_broker_configs_sources_read_only_and_synonyms(kcluster: Any, confluent_admin: Any, kp_admin: Any) -> None:
    """A broker's own configs as Kafka's tools expect them (kafka-configs.sh --describe --all, UIs): each key's
    value in effect and its real source, read-only only when Brook cannot change it at runtime, and Kafka's
    topic-default keys with the value the logs use."""
    from confluent_kafka.admin import ConfigResource, ResourceType
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType

    from metadata_quorum import cluster_configs

    a = confluent_admin
    broker = str(sorted(kcluster.broker_ids)[0])
    mine = ConfigResource(ResourceType.BROKER, broker)

    def describe() -> dict[str, Any]:
        return a.describe_configs([mine], request_timeout=T)[mine].result(T)  # type: ignore[no-any-return]

    configs = describe()
    # Set by no one: the built-in default (DEFAULT_CONFIG), read-only only if Brook cannot alter it cluster-wide.
    retention = configs["log.retention.ms"]
    assert (retention.value, _source(retention), retention.is_default, retention.is_read_only) == \
        ("604800000", 5, True, False)
    partitions = configs["num.partitions"]
    assert (partitions.value, _source(partitions), partitions.is_read_only) == ("1", 5, True)
    # Written in the node's config file by LocalCluster: STATIC_BROKER_CONFIG, read-only (a restart changes it),
    # even when the value written is the default one (ssl.client.auth=required).
    lag = configs["replica.lag.time.max.ms"]
    assert (lag.value, _source(lag), lag.is_default, lag.is_read_only) == ("10000", 4, False, True)
    assert (configs["ssl.client.auth"].value, _source(configs["ssl.client.auth"])) == ("required", 4)
    assert (configs["node.id"].value, _source(configs["node.id"])) == (broker, 4)
    # Kafka's broker keys for the topic defaults, with the values the logs apply; never the topic names.
    assert configs["log.segment.bytes"].value == str(1024 ** 3)
    assert configs["message.max.bytes"].value == str(1024 * 1024 + 12)
    assert configs["log.cleanup.policy"].value == "delete" and configs["min.insync.replicas"].value == "1"
    assert "segment.bytes" not in configs and "retention.ms" not in configs
    # Exactly Brook's dynamic cluster configs are writable.
    assert {name for name, e in configs.items() if not e.is_read_only} == set(cluster_configs.known_keys())
    secret = configs["controller.quorum.password"]  # set in the node file: a secret, never shown
    assert secret.is_sensitive and secret.value is None and _source(secret) == 4

    key = "log.cleaner.delete.retention.ms"  # what compaction does with tombstones: harmless to the other tests
    assert _source(configs[key]) == 5
    _cluster_default(kp_admin, key, "3600000")
    try:
        entry = wait_for(lambda: (lambda e: e if _source(e) == 3 else None)(describe()[key]), T,
                         f"{key} to be a dynamic default on broker {broker}", poll_s=0.2)
        assert (entry.value, entry.is_read_only, entry.is_default) == ("3600000", False, False)
        # Every source with a value, the one in effect first: the dynamic default, then the default (librdkafka
        # keys synonyms by name and keeps the last: kafka-python shows the list).
        assert [(n, s.value, _source(s)) for n, s in entry.synonyms.items()] == [(key, "86400000", 5)]
        listed = kp_admin.describe_configs([KpResource(ConfigResourceType.BROKER, broker, {key: None})],
                                           include_synonyms=True, config_filter="all")["broker"][broker][key]
        assert [(s["name"], s["value"], s["source"]) for s in listed["synonyms"]] == \
            [(key, "3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG"), (key, "86400000", "DEFAULT_CONFIG")]
        # The cluster-wide defaults themselves (resource ''): the dynamic ones only, writable.
        request = kp_admin._describe_configs_request([KpResource(ConfigResourceType.BROKER, "")], True)
        response = kp_admin._manager.run(kp_admin._manager.send, request, int(broker))
        defaults = {c.name: c for r in response.results for c in r.configs}
        assert (defaults[key].value, defaults[key].config_source, defaults[key].read_only) == ("3600000", 3, False)
        assert [(y.name, y.value, y.source) for y in defaults[key].synonyms] == [(key, "3600000", 3)]
    finally:
        _cluster_default(kp_admin, key, None)
    back = wait_for(lambda: (lambda e: e if _source(e) == 5 else None)(describe()[key]), T,
                    f"{key} back to its default", poll_s=0.2)
    assert back.value == "86400000"


def test_topic_configs_show_the_brokers_default_and_every_synonym(kcluster: Any, confluent_admin: Any,
                                                                   kp_admin: Any, topic_name: str) -> None:
    """A topic config as Kafka's broker describes it (kafka-configs.sh --describe --all, UIs): a key the topic
    does not set has the value and source of the broker key that stands for it (a dynamic cluster default:
    DYNAMIC_DEFAULT_BROKER_CONFIG; the node's file: STATIC_BROKER_CONFIG; else DEFAULT_CONFIG), and with
    include_synonyms every level is listed, the topic's own first. Brook showed DEFAULT_CONFIG and no synonym
    for every key the topic did not set."""
    from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType

    a = confluent_admin
    a.create_topics([NewTopic(topic_name, 1, 1, config={"retention.ms": "3600000"})], operation_timeout=T)[
        topic_name].result(T)
    resource = ConfigResource(ResourceType.TOPIC, topic_name)

    def synonyms(key: str) -> list[tuple[str, str | None, str]]:
        described = kp_admin.describe_configs([KpResource(ConfigResourceType.TOPIC, topic_name, {key: None})],
                                              include_synonyms=True, config_filter="all")
        entry = described["topic"][topic_name][key]
        return [(s["name"], s["value"], s["source"]) for s in entry["synonyms"]]

    wait_for(lambda: topic_name in a.list_topics(timeout=T).topics, T, f"{topic_name} to exist")
    assert synonyms("retention.ms") == [("retention.ms", "3600000", "DYNAMIC_TOPIC_CONFIG"),
                                        ("log.retention.ms", "604800000", "DEFAULT_CONFIG")]
    assert synonyms("segment.bytes") == [("log.segment.bytes", str(1024 ** 3), "DEFAULT_CONFIG")]
    key, broker_key = "delete.retention.ms", "log.cleaner.delete.retention.ms"
    _cluster_default(kp_admin, broker_key, "3600000")
    try:
        entry = wait_for(lambda: (lambda e: e if _source(e) == 3 else None)(
            a.describe_configs([resource], request_timeout=T)[resource].result(T)[key]), T,
            f"{key} of {topic_name} to come from the dynamic cluster default", poll_s=0.2)
        assert (entry.value, entry.is_default) == ("3600000", False)
        # kafka-python asks a broker of its choosing, which may not have applied the change yet (each broker
        # follows the cluster configs in its own metadata, as Kafka's brokers do)
        expected = [(broker_key, "3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG"), (broker_key, "86400000", "DEFAULT_CONFIG")]
        seen: list[Any] = []
        wait_for(lambda: seen.append(synonyms(key)) or seen[-1] == expected, T,
                 lambda: f"the synonyms of {key} to be {expected}, last seen {seen[-1:]}", poll_s=0.2)
    finally:
        _cluster_default(kp_admin, broker_key, None)


def test_the_controller_clients_are_told_of_is_a_live_broker_at_random(confluent_admin: Any, kp_admin: Any) -> None:
    """As KRaft's brokers answer Metadata and DescribeCluster: a random live broker (any forwards admin requests to
    the active controller). The active controller was named, so with combined nodes every Kafka client's admin
    requests went to that one node and waited out their timeout (20-80 s) while it restarted (upgrade audit)."""
    named = set()
    for _ in range(30):
        md = confluent_admin.list_topics(timeout=T)
        assert md.controller_id in md.brokers, (md.controller_id, sorted(md.brokers))
        named.add(md.controller_id)
    assert len(named) > 1, f"every answer named broker {named}: clients are pinned to one node"
    cluster = kp_admin.describe_cluster()
    assert cluster["controller_id"] in {b.get("node_id", b.get("broker_id")) for b in cluster["brokers"]}, cluster


def test_a_min_insync_above_the_replication_factor_takes_acks_1_and_refuses_acks_all(
        kcluster: Any, confluent_admin: Any, topic_name: str) -> None:
    """As on Kafka: the create succeeds (Brook refused it), acks=1 writes are taken, and an acks=all write is
    refused with NOT_ENOUGH_REPLICAS, not left to time out."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    a = confluent_admin
    a.create_topics([NewTopic(topic_name, 1, 1, config={"min.insync.replicas": "2"})],
                    operation_timeout=T)[topic_name].result(T)
    outcomes: list[Any] = []

    def produce(acks: str) -> Any:
        producer = Producer({**kcluster.kafka_client_config("admin"), "acks": acks, "retries": 0,
                             "enable.idempotence": False, "message.timeout.ms": T * 1000})
        producer.produce(topic_name, value=b"v", partition=0, on_delivery=lambda err, msg: outcomes.append(err))
        assert producer.flush(T) == 0
        return outcomes.pop()

    assert produce("1") is None
    refused = produce("all")
    assert refused is not None and refused.name() == "NOT_ENOUGH_REPLICAS", refused
    a.delete_topics([topic_name], operation_timeout=T)[topic_name].result(T)
