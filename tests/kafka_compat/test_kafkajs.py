"""KafkaJS 2.2.4 (Node.js; a Kafka client nobody at Brook wrote, with request versions of its own: Produce
v7, Fetch v11, JoinGroup v5, Metadata v6, OffsetCommit v5) against the KAFKA listeners of a 3-node Brook
cluster as ``make demo`` runs one: mTLS, and the authorizer on. Each test drives ``kafkajs/driver.js``
in a Node.js process and checks what KafkaJS saw against what Brook's own client reads over gRPC.

Node.js and npm come from the machine (or Debian's packages when root, as kcat does); the module is
skipped, saying why, on a machine that has neither and cannot install them."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafkakit import (
    KafkaJSProcess,
    brook_read_all,
    in_sync,
    kafkajs_admin,
    kafkajs_connection,
    kafkajs_node,
    kafkajs_run,
    partition_leader,
    unique,
)
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.producer import Producer as BrookProducer
from deploy.local.cluster import DEMO_PREFIX, DEMO_USER, LocalCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node() -> str:
    found, why = kafkajs_node()
    if found is None:
        pytest.skip(why)
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, node: str) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafkajs"), nodes=3, tls=True, authorizer=True) as c:
        c.grant_demo_acls()
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(cluster.bootstrap_servers, request_timeout_ms=20_000, security=cluster.security) as a:
        yield a


@pytest.fixture(scope="module")
def conn(cluster: LocalCluster) -> dict[str, Any]:
    return kafkajs_connection(cluster)


def _topic(admin: Admin, partitions: int = 3, configs: dict[str, str] | None = None, prefix: str = "kjs") -> str:
    name = unique(prefix)
    admin.create_topics([NewTopic(name, partitions, 3, configs or {})])
    return name


def _acked(lines: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """{record number: (partition, offset)} from a produce run's lines."""
    return {i: (p, o) for line in lines for i, p, o in line.get("acked", [])}


def _ok(answers: list[dict[str, Any]], call: str) -> Any:
    [answer] = [a for a in answers if a["call"] == call]
    assert "ok" in answer, f"KafkaJS admin.{call} failed: {answer}"
    return answer["ok"]


def test_records_cross_between_kafkajs_and_brook(node: str, cluster: LocalCluster, admin: Admin, conn) -> None:
    """KafkaJS writes keyed records with headers and timestamps, uncompressed and gzip, at acks=-1: Brook's
    client reads each at the offset KafkaJS was given, bytes and headers intact. Records Brook's client
    writes are read by a KafkaJS group consumer, which commits them: Brook's admin sees the commits."""
    topic = _topic(admin)
    ts = int(time.time() * 1000) - 60_000  # recent: retention must not take the records
    plain = kafkajs_run(node, {**conn, "op": "produce", "topic": topic, "count": 300, "batch": 50, "key": "k",
                               "partitions": 3, "headers": True, "timestamp": ts, "prefix": "plain-"})
    gzip = kafkajs_run(node, {**conn, "op": "produce", "topic": topic, "count": 100, "batch": 25, "key": "g",
                              "partitions": 3, "compression": "gzip", "prefix": "gzip-"})
    assert not [x for x in plain + gzip if "acked" not in x and "done" not in x], plain + gzip
    acked = _acked(plain)
    assert len(acked) == 300 and len(_acked(gzip)) == 100

    read = brook_read_all(cluster, topic, 3, 400)
    by_value = {r.value.decode(): (p, r) for p, records in read.items() for r in records}
    assert len(by_value) == 400
    for i in range(300):
        p, r = by_value[f"plain-{i:06d}"]
        assert (p, r.offset) == acked[i], f"record {i}: acknowledged at {acked[i]}, stored at {(p, r.offset)}"
        assert r.key == f"k{i}".encode() and r.timestamp == ts + i, r
        assert dict(r.headers) == {"n": str(i).encode(), "origin": b"kafkajs"}, r.headers
    assert all(by_value[f"gzip-{i:06d}"][1].key == f"g{i}".encode() for i in range(100))

    # ... and the other way round: Brook writes, a KafkaJS group reads and commits.
    back = _topic(admin, partitions=2)
    kw = {k.replace(".", "_"): v for k, v in cluster.client_config.items()}
    with BrookProducer(bootstrap_servers=cluster.bootstrap_servers, acks="all", **kw) as p:
        for i in range(200):
            p.send(back, value=b"brook-%04d" % i, key=b"b%d" % (i % 7), headers=[("from", b"brook")])
        p.flush()
    group = unique("kjs-reader")
    [answer] = kafkajs_run(node, {**conn, "op": "consume", "topic": back, "group": group, "expected": 200})
    records = answer["records"]
    assert sorted(v for _p, _o, _k, v, _h, _ts in records) == [f"brook-{i:04d}" for i in range(200)]
    assert all(h == {"from": "brook"} for *_x, h, _ts in records)
    ends = {p: max(o for q, o, *_ in records if q == p) + 1 for p in (0, 1)}
    committed = admin.list_group_offsets(group)
    assert {tp.partition: om.offset for tp, om in committed.items() if tp.topic == back} == ends, committed


class Member(KafkaJSProcess):
    """A KafkaJS group member in its own Node.js process: what it was assigned at each join, what it read."""

    def __init__(self, node: str, conn: dict[str, Any], topic: str, group: str) -> None:
        super().__init__(node, {**conn, "op": "member", "topic": topic, "group": group, "heartbeatMs": 300,
                                "sessionMs": 10_000})

    @property
    def assignment(self) -> set[int]:
        """The partitions of its latest join (empty before the first)."""
        joins = [x["assigned"] for x in self.lines if "assigned" in x]
        return {p for parts in joins[-1].values() for p in parts} if joins else set()

    @property
    def values(self) -> list[str]:
        return [x["record"][2] for x in self.lines if "record" in x]

    def leave(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.wait(30)
        assert {"left": True} in self.lines, f"the member did not leave the group cleanly: {self.lines[-3:]}"


def test_a_kafkajs_group_splits_hands_over_and_resumes_from_its_commits(node: str, cluster: LocalCluster,
                                                                       admin: Admin, conn) -> None:
    """Two KafkaJS members (JoinGroup v5, SyncGroup v3, Heartbeat v3) split a 4-partition topic, no partition
    in both assignments; when one leaves, the other gets all four and the group reads every record. A third
    member of the group, started after both left, reads only what came after the commits."""
    topic = _topic(admin, partitions=4)
    group = unique("kjs-group")
    kafkajs_run(node, {**conn, "op": "produce", "topic": topic, "count": 400, "batch": 100, "partitions": 4,
                       "prefix": "a-"})
    a = Member(node, conn, topic, group)
    b = Member(node, conn, topic, group)
    try:
        wait_for(lambda: len(a.assignment) == 2 and len(b.assignment) == 2, 60,
                 lambda: f"the two members to split 4 partitions: a {a.lines[-3:]} b {b.lines[-3:]}")
        assert not a.assignment & b.assignment, (a.assignment, b.assignment)
        wait_for(lambda: len(a.values) + len(b.values) >= 400, 60,
                 lambda: f"the group to read 400 records; a {len(a.values)}, b {len(b.values)}")
        b.leave()
        wait_for(lambda: a.assignment == {0, 1, 2, 3}, 60, lambda: f"a to get every partition: {a.lines[-3:]}")
        kafkajs_run(node, {**conn, "op": "produce", "topic": topic, "count": 100, "batch": 100, "partitions": 4,
                           "prefix": "b-"})
        wait_for(lambda: sum(v.startswith("b-") for v in a.values) == 100, 60,
                 lambda: f"a to read the 100 later records; it read {len(a.values)}")
        a.leave()
    finally:
        a.kill()
        b.kill()
    read = sorted(a.values + b.values)
    # Each record once: the leave commits before the next member's join takes the partition over.
    assert read == sorted([f"a-{i:06d}" for i in range(400)] + [f"b-{i:06d}" for i in range(100)]), \
        f"{len(read)} read, {len(set(read))} distinct"

    kafkajs_run(node, {**conn, "op": "produce", "topic": topic, "count": 40, "batch": 40, "partitions": 4,
                       "prefix": "c-"})
    [answer] = kafkajs_run(node, {**conn, "op": "consume", "topic": topic, "group": group, "expected": 40,
                                  "timeoutMs": 60_000})
    assert sorted(v for *_x, v, _h, _ts in answer["records"]) == [f"c-{i:06d}" for i in range(40)]
    [described] = admin.describe_groups([group]).values()
    assert described.state == "Empty", described


def test_kafkajs_admin_over_brook(node: str, cluster: LocalCluster, admin: Admin, conn) -> None:
    """KafkaJS's admin client, call by call: topics, partitions, configs (a bad one refused and nothing
    changed), offsets by time, group offsets reset and set, records deleted, groups, ACLs, the cluster."""
    topic = unique("kjs-admin")
    group = unique("kjs-admin-group")
    ts = int(time.time() * 1000) - 60_000  # recent: retention must not take the records
    created = kafkajs_admin(node, conn,
                            ["createTopics", {"topics": [{"topic": topic, "numPartitions": 2, "replicationFactor": 3,
                                                         "configEntries": [{"name": "retention.ms",
                                                                            "value": "86400000"}]}],
                                              "waitForLeaders": True}],
                            ["fetchTopicMetadata", {"topics": [topic]}],
                            ["describeCluster"])
    assert _ok(created, "createTopics") is True
    [meta] = _ok(created, "fetchTopicMetadata")["topics"]
    assert sorted(p["partitionId"] for p in meta["partitions"]) == [0, 1]
    assert all(len(p["replicas"]) == 3 and sorted(p["isr"]) == sorted(p["replicas"]) for p in meta["partitions"])
    assert sorted(b["nodeId"] for b in _ok(created, "describeCluster")["brokers"]) == cluster.node_ids

    kafkajs_run(node, {**conn, "op": "produce", "topic": topic, "count": 20, "batch": 20, "partitions": 2,
                       "timestamp": ts})
    kafkajs_run(node, {**conn, "op": "consume", "topic": topic, "group": group, "expected": 20})
    answers = kafkajs_admin(
        node, conn,
        ["createPartitions", {"topicPartitions": [{"topic": topic, "count": 3}]}],
        ["alterConfigs", {"validateOnly": False, "resources": [{"type": 2, "name": topic, "configEntries": [
            {"name": "retention.ms", "value": "3600000"}]}]}],
        ["alterConfigs", {"validateOnly": False, "resources": [{"type": 2, "name": topic, "configEntries": [
            {"name": "retention.ms", "value": "-7"}]}]}],
        ["describeConfigs", {"resources": [{"type": 2, "name": topic, "configNames": ["retention.ms"]}]}],
        ["fetchTopicOffsets", topic],
        ["fetchTopicOffsetsByTimestamp", topic, ts + 10],
        ["fetchOffsets", {"groupId": group, "topics": [topic]}],
        ["resetOffsets", {"groupId": group, "topic": topic, "earliest": True}],
        ["setOffsets", {"groupId": group, "topic": topic, "partitions": [{"partition": 1, "offset": "4"}]}],
        ["fetchOffsets", {"groupId": group, "topics": [topic]}],
        ["deleteTopicRecords", {"topic": topic, "partitions": [{"partition": 0, "offset": "3"}]}],
        ["fetchTopicOffsets", topic],
        ["listGroups"],
        ["describeGroups", [group]],
        ["deleteGroups", [group]],
        ["listGroups"],
        ["createAcls", {"acl": [{"resourceType": 2, "resourceName": topic, "resourcePatternType": 3,
                                 "principal": "User:kjs", "host": "*", "operation": 3, "permissionType": 3}]}],
        ["describeAcls", {"resourceType": 2, "resourceName": topic, "resourcePatternType": 3,
                          "operation": 1, "permissionType": 1}],
        ["deleteAcls", {"filters": [{"resourceType": 2, "resourceName": topic, "resourcePatternType": 3,
                                     "operation": 1, "permissionType": 1}]}],
        ["deleteTopics", {"topics": [topic]}],
    )
    calls = [a["call"] for a in answers]
    by_call: dict[str, list[dict[str, Any]]] = {}
    for a in answers:
        by_call.setdefault(a["call"], []).append(a)
    assert "ok" in by_call["createPartitions"][0], answers
    good, bad = by_call["alterConfigs"]
    assert "ok" in good and bad["error"]["type"] == "INVALID_CONFIG", (good, bad)
    [resource] = _ok(answers, "describeConfigs")["resources"]
    assert [(e["configName"], e["configValue"]) for e in resource["configEntries"]] == [("retention.ms", "3600000")]
    before, after = (sorted((x["partition"], x["low"], x["high"]) for x in a["ok"]) for a in by_call["fetchTopicOffsets"])
    assert before == [(0, "0", "10"), (1, "0", "10"), (2, "0", "0")], before
    assert after == [(0, "3", "10"), (1, "0", "10"), (2, "0", "0")], after
    # timestamps ts+i went to partition i % 2: the first at or after ts+10 is record 10 (p0, offset 5), 11 (p1, 5)
    by_ts = sorted((x["partition"], x["offset"]) for x in _ok(answers, "fetchTopicOffsetsByTimestamp"))
    assert by_ts == [(0, "5"), (1, "5"), (2, "0")], by_ts
    committed, moved = ({(p["partition"], p["offset"]) for p in a["ok"][0]["partitions"]} for a in by_call["fetchOffsets"])
    assert committed >= {(0, "10"), (1, "10")}, committed
    assert moved >= {(0, "-2"), (1, "4")}, moved  # -2: KafkaJS's "earliest", as Kafka stores it
    listed_before, listed_after = ({g["groupId"] for g in a["ok"]["groups"]} for a in by_call["listGroups"])
    assert group in listed_before and group not in listed_after
    [described] = _ok(answers, "describeGroups")["groups"]
    assert described["errorCode"] == 0 and described["state"] == "Empty", described
    assert _ok(answers, "deleteGroups") == [{"groupId": group, "errorCode": 0}]
    [acl] = _ok(answers, "describeAcls")["resources"]
    assert acl["resourceName"] == topic and acl["acls"][0]["principal"] == "User:kjs", acl
    assert "ok" in by_call["deleteAcls"][0] and "ok" in by_call["deleteTopics"][0], answers
    assert calls[-1] == "deleteTopics"
    wait_for(lambda: topic not in admin.list_topics(), 30, f"{topic} to be gone")


def test_kafkajs_as_a_least_privileged_user(node: str, cluster: LocalCluster, admin: Admin) -> None:
    """User:demo (ACLs on demo-* only) through KafkaJS: writes to its own topic; a write to another topic and
    a topic creation are refused with Kafka's authorization errors, and nothing is written or created."""
    conn = kafkajs_connection(cluster, DEMO_USER)
    own = _topic(admin, partitions=1, prefix=f"{DEMO_PREFIX}kjs")
    other = _topic(admin, partitions=1)
    [*_acks, done] = kafkajs_run(node, {**conn, "op": "produce", "topic": own, "count": 5, "batch": 5,
                                        "partitions": 1})
    assert done == {"done": True} and len(_acked(_acks)) == 5, _acks
    refused = kafkajs_run(node, {**conn, "op": "produce", "topic": other, "count": 1, "partitions": 1,
                                 "retries": 0})
    assert "Topic authorization failed" in refused[0].get("error", {}).get("message", ""), refused
    [create] = kafkajs_admin(node, conn, ["createTopics", {"topics": [{"topic": unique("not-demo")}]}])
    assert [e.get("type") for e in create.get("error", {}).get("errors", [])] == ["TOPIC_AUTHORIZATION_FAILED"], create
    assert admin.list_offsets({_tp(other): "latest"})[_tp(other)][0] == 0
    assert not [t for t in admin.list_topics() if t.startswith("not-demo")]


def _tp(topic: str) -> Any:
    from client.types import TopicPartition

    return TopicPartition(topic, 0)


def test_kafkajs_transactions_commit_and_abort(node: str, admin: Admin, conn) -> None:
    """One KafkaJS transactional producer (idempotent, one request in flight) commits a transaction over both
    partitions, aborts a second after its records are written, commits a third. A KafkaJS group consumer reads
    back: read_committed (KafkaJS's default) exactly the committed records, each at the offset KafkaJS was given
    in its partition's order; read_uncommitted the aborted ones too."""
    topic, partitions, count = _topic(admin, partitions=2), 2, 6
    plan = [["first", "commit"], ["second", "abort"], ["third", "commit"]]
    lines = kafkajs_run(node, {**conn, "op": "transaction", "transactionalId": unique("kjs-tx"), "topic": topic,
                               "partitions": partitions, "count": count, "transactions": plan})
    assert lines[-1:] == [{"done": True}] and [[x.get("transaction"), x.get("outcome")] for x in lines[:-1]] == plan, (
        f"KafkaJS's transactions: {lines}")
    acked = {x["transaction"]: [(p, o, v) for _i, p, o, v in x["acked"]] for x in lines[:-1]}
    assert all(o is not None for rows in acked.values() for _p, o, _v in rows), f"an offset KafkaJS was not given: {acked}"

    def per_partition(rows: list[Any]) -> dict[int, list[tuple[int, str]]]:
        return {p: [(o, v) for q, o, v in rows if q == p] for p in range(partitions)}
    for read_uncommitted, names in ((False, ["first", "third"]), (True, ["first", "second", "third"])):
        expected = [r for name in names for r in acked[name]]
        [answer] = kafkajs_run(node, {**conn, "op": "consume", "topic": topic, "group": unique("kjs-tx-reader"),
                                      "expected": len(expected), "timeoutMs": 30_000,
                                      "readUncommitted": read_uncommitted})
        got = [(p, o, v) for p, o, _k, v, _h, _ts in answer["records"]]
        isolation = "read_uncommitted" if read_uncommitted else "read_committed"
        assert per_partition(got) == per_partition(expected), (
            f"a {isolation} KafkaJS consumer read {per_partition(got)}; KafkaJS's producer was given "
            f"{per_partition(expected)}")


def test_kafkajs_idempotent_acks_all_survives_leader_sigkill(node: str, cluster: LocalCluster, admin: Admin,
                                                            conn) -> None:
    """An idempotent KafkaJS producer at acks=-1 writes a numbered sequence to one RF-3 partition while its
    leader is SIGKILLed and restarted: writes resume on the new leader, and every acknowledged record is in
    the log once, in order, at the offset KafkaJS was given. Last: it kills a node."""
    topic = _topic(admin, partitions=1, configs={"min.insync.replicas": "2"})
    n = 600
    producer = KafkaJSProcess(node, {**conn, "op": "produce", "topic": topic, "count": n, "partitions": 1,
                                     "idempotent": True, "paceMs": 5, "retries": 20})
    lines = producer.lines
    victim = partition_leader(admin, topic)
    try:
        wait_for(lambda: len(_acked(lines)) >= 150, 60, lambda: f"150 acknowledgements: {lines[-3:]}")
        cluster.kill_node(victim)
        acked_at_kill = len(_acked(lines))
        wait_for(lambda: partition_leader(admin, topic) not in (-1, victim), 30, "a new leader")
        wait_for(lambda: len(_acked(lines)) > acked_at_kill + 50, 60,
                 lambda: f"writes to resume after the kill: {lines[-3:]}")
        cluster.start_node(victim)
        producer.wait(180)
    finally:
        producer.kill()
    assert lines and lines[-1] == {"done": True}, f"the producer did not finish: {lines[-3:]}"
    acked = _acked(lines)
    failed = [x for x in lines if "failed" in x]
    assert not failed, f"KafkaJS gave up on {len(failed)} sends, first {failed[0]}"
    assert len(acked) == n

    [records] = brook_read_all(cluster, topic, 1, n, timeout_s=60).values()
    numbers = [int(r.value) for r in records]
    assert len(numbers) == len(set(numbers)), "a record was written twice"
    assert numbers == sorted(numbers), "records are out of order"
    assert all(acked[int(r.value)] == (0, r.offset) for r in records), "a record is not where it was acknowledged"
    cluster.wait_ready(timeout_s=120)
    wait_for(lambda: in_sync(admin, topic, 3), 60, f"node {victim} back in the ISR of {topic}")
