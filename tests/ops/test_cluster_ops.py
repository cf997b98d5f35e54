"""Cluster operations an operator runs by hand, on a real split cluster (1 controller, 3 brokers).

Each test moves real data through real processes and checks nothing acknowledged is lost:
leader election on demand (preferred and unclean), DeleteRecords, log-dirs and per-partition
offsets. The controller runs apart from the brokers, so brokers can be killed without
losing the metadata quorum.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from admin_cli.main import main as brook_main
from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster, free_port
from proto import controller_pb2, errors

pytestmark = pytest.mark.slow

OVERRIDES = {
    "replica.lag.time.max.ms": "2000",  # a stopped follower leaves the ISR within a test's patience
    "broker.session.timeout.ms": "3000",  # a killed broker is fenced quickly
    "auto.leader.rebalance.enable": "false",  # only the operator moves leaders here
}


@pytest.fixture(scope="module")
def split_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster-ops"), nodes=3, mode="split", controllers=1,
                           overrides=OVERRIDES)
    try:
        cluster.start()
        cluster.wait_ready(90)
        yield cluster
    finally:
        cluster.teardown()


@pytest.fixture
def admin(split_cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(split_cluster.bootstrap_servers, request_timeout_ms=20000) as a:
        yield a


@pytest.fixture
def brook(capsys: pytest.CaptureFixture[str], split_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BROOK_BOOTSTRAP", split_cluster.bootstrap_servers)
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = brook_main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: str) -> list[tuple[int, bytes]]:
    """acks=all, idempotent; returns (partition, value) of every acknowledged record."""
    sent = []
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=2, request_timeout_ms=5000,
                  delivery_timeout_ms=60000) as producer:
        futures = []
        for p in range(partitions):
            for i in range(per_partition):
                value = f"{tag}-{p}-{i:05d}".encode()
                futures.append((p, value, producer.send(topic, value, partition=p)))
        producer.flush()
        for p, value, f in futures:
            f.get(timeout=30)
            sent.append((p, value))
    return sent


def read_all(bootstrap: str, topic: str, partitions: int, expected: int,
             timeout_s: float = 60.0) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", request_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        total = 0
        while total < expected and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition].extend(r.value for r in records)
                total += len(records)
    return out


def wait_back(admin: Admin, node_id: int) -> None:
    """A restarted broker serves again: it answers, is unfenced, and every partition's ISR is full (the
    next test starts from a whole cluster; "unfenced" alone may still be the killed process's lease)."""
    from proto import broker_pb2

    def answers() -> bool:
        try:
            admin.cluster.broker_stub(node_id).Metadata(broker_pb2.MetadataRequest(), timeout=2)
            return True
        except Exception:
            return False

    def whole() -> bool:
        admin.cluster.request_update()
        described = admin.describe_topics(admin.list_topics())
        return all(p.leader >= 0 and len(p.isr) == len(p.replicas)
                   for t in described.values() for p in t.partitions.values())

    wait_for(answers, 60, f"broker {node_id} answering")
    wait_for(lambda: node_id not in admin.describe_cluster().fenced_brokers, 60, f"broker {node_id} unfenced")
    wait_for(whole, 60, "every partition led with a full ISR")


def partitions_of(admin: Admin, topic: str):
    admin.cluster.request_update()
    parts = admin.describe_topics([topic])[topic].partitions
    return [parts[i] for i in sorted(parts)]


def test_kafka_admin_clients_create_and_delete_topics_on_a_split_cluster(split_cluster) -> None:
    """In the split layout the active controller is a controller-only node, which no Kafka client can reach: the
    Metadata and DescribeCluster answers named it as the controller, so confluent-kafka waited for it until its
    timeout and kafka-python failed with UnknownBrokerIdError (config audit). As KRaft's brokers do, they name a
    live broker, which forwards the request."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    confluent = AdminClient({"bootstrap.servers": split_cluster.kafka_bootstrap_servers})
    md = confluent.list_topics(timeout=10)
    assert md.controller_id in md.brokers, (md.controller_id, sorted(md.brokers))
    confluent.create_topics([NewTopic("split-kafka-admin", 1, 3)], operation_timeout=20)["split-kafka-admin"].result(30)
    confluent.delete_topics(["split-kafka-admin"], operation_timeout=20)["split-kafka-admin"].result(30)
    kp = KafkaAdminClient(bootstrap_servers=split_cluster.kafka_bootstrap_servers, request_timeout_ms=20_000)
    try:
        cluster = kp.describe_cluster()
        assert cluster["controller_id"] in {b.get("node_id", b.get("broker_id")) for b in cluster["brokers"]}, cluster
        kp.create_topics([KpNewTopic("split-kafka-python", 1, 3)])
        kp.delete_topics(["split-kafka-python"])
    finally:
        kp.close()


def test_elect_preferred_leaders_after_a_restart_spreads_them_back(split_cluster, admin, brook) -> None:
    topic = "elect-preferred"
    admin.create_topics([NewTopic(topic, 6, 3)])
    sent = produce(split_cluster.bootstrap_servers, topic, 6, 50, "before")
    preferred = {p.partition: p.replicas[0] for p in partitions_of(admin, topic)}
    assert sorted(preferred.values()) == [1, 1, 2, 2, 3, 3], preferred

    # A controlled restart of broker 1 moves its leaderships away; they stay away on their own.
    split_cluster.restart_node(1)
    wait_for(lambda: all(1 in p.isr for p in partitions_of(admin, topic)), 60, "broker 1 back in every ISR")
    led_by_1 = [p.partition for p in partitions_of(admin, topic) if p.leader == 1]
    assert led_by_1 == [], f"broker 1 leads {led_by_1} right after its restart: the test shows nothing"

    code, out, err = brook("cluster", "elect-leaders", "--all", "-o", "json")
    assert code == 0, (out, err)
    results = {(r["topic"], r["partition"]): r for r in json.loads(out)["results"]}
    moved = {k: r for k, r in results.items() if k[0] == topic}
    assert {k[1] for k in moved} == {p for p, b in preferred.items() if b == 1}, results
    assert all(r["result"] == "elected" and r["leader"] == 1 for r in moved.values()), moved

    wait_for(lambda: all(p.leader == p.replicas[0] for p in partitions_of(admin, topic)), 30,
             "every partition led by its preferred replica")
    sent += produce(split_cluster.bootstrap_servers, topic, 6, 50, "after")
    got = read_all(split_cluster.bootstrap_servers, topic, 6, len(sent))
    for p in range(6):
        assert got[p] == [v for q, v in sent if q == p], f"partition {p}: {len(got[p])} records read"

    # Already preferred: nothing to do, and that is not a failure.
    code, out, err = brook("cluster", "elect-leaders", "--topic", topic, "--partition", "0", "-o", "json")
    assert code == 0, (out, err)
    assert json.loads(out)["results"][0]["result"] == "ELECTION_NOT_NEEDED", out


def test_elect_leaders_refuses_bad_input_and_changes_nothing(split_cluster, admin, brook) -> None:
    code, out, err = brook("cluster", "elect-leaders")
    assert code == 2 and "--all or --topic" in err, (out, err)
    code, out, err = brook("cluster", "elect-leaders", "--all", "--topic", "x")
    assert code == 2, (out, err)
    code, out, err = brook("cluster", "elect-leaders", "--partition", "1")
    assert code == 2, (out, err)
    code, out, err = brook("cluster", "elect-leaders", "--type", "dirty", "--all")
    assert code == 2, (out, err)
    code, out, err = brook("cluster", "elect-leaders", "--topic", "no-such-topic", "-o", "json")
    assert code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in out, (out, err)
    assert "topic 'no-such-topic' does not exist" in out, out  # was "no-such-topic--1 does not exist"
    # The table says which rows failed; stderr has the one error line every failure has (it was empty).
    assert err.startswith("error: 1 of 1 partitions not elected: no-such-topic") and err.count("\n") == 1, err
    admin.create_topics([NewTopic("elect-bad", 1, 3)])
    code, out, err = brook("cluster", "elect-leaders", "--topic", "elect-bad", "--partition", "7")
    assert code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in out and "has no partition 7" in out, (out, err)
    assert "error: 1 of 1 partitions not elected: elect-bad-7 UNKNOWN_TOPIC_OR_PARTITION" in err, err
    # An unclean election of a partition that has a leader is not needed, and moves nothing.
    before = partitions_of(admin, "elect-bad")[0]
    code, out, err = brook("cluster", "elect-leaders", "--type", "unclean", "--topic", "elect-bad", "-o", "json")
    assert code == 0 and "ELECTION_NOT_NEEDED" in out, (out, err)
    after = partitions_of(admin, "elect-bad")[0]
    assert (after.leader, after.leader_epoch) == (before.leader, before.leader_epoch)


def eligible(admin: Admin, node_id: int) -> bool:
    """The controller would let ``node_id`` lead (what elections check), from its own DescribeCluster."""
    desc = admin._call("DescribeCluster", controller_pb2.DescribeClusterRequest())
    b = next((b for b in desc.brokers if b.node_id == node_id), None)
    return b is not None and not b.fenced and not b.in_controlled_shutdown


def test_unclean_election_only_on_request(split_cluster, admin, brook) -> None:
    """ISR [2] after 3 stopped; 2 dies: the partition is offline and stays so (3 is out of sync) until
    the operator asks for an unclean election, which makes 3 the leader; writes work again."""
    topic = "elect-unclean"
    admin.create_topics([NewTopic(topic, replica_assignments=[[2, 3]])])
    produce(split_cluster.bootstrap_servers, topic, 1, 20, "shared")
    split_cluster.stop_node(3)
    try:
        wait_for(lambda: partitions_of(admin, topic)[0].isr == (2,), 30, "ISR shrinks to [2]")
        produce(split_cluster.bootstrap_servers, topic, 1, 20, "only-on-2")
        split_cluster.kill_node(2)
        wait_for(lambda: partitions_of(admin, topic)[0].leader == -1, 30, "the partition goes offline")
        split_cluster.start_node(3)
        # Eligible to lead: registered anew, unfenced and not shutting down. "Not fenced" alone also holds
        # for the old incarnation between its controlled shutdown and its fencing (the test failed so once).
        wait_for(lambda: eligible(admin, 3), 60, "broker 3 back: registered, unfenced, not shutting down")
        assert partitions_of(admin, topic)[0].leader == -1, "an unclean election happened on its own"

        code, out, err = brook("cluster", "elect-leaders", "--topic", topic, "-o", "json")
        assert code == 1 and "PREFERRED_LEADER_NOT_AVAILABLE" in out, (out, err)
        assert partitions_of(admin, topic)[0].leader == -1

        code, out, err = brook("cluster", "elect-leaders", "--type", "unclean", "--topic", topic, "-o", "json")
        assert code == 0, (out, err)
        wait_for(lambda: partitions_of(admin, topic)[0].leader == 3, 30, "broker 3 leads after the unclean election")
        assert partitions_of(admin, topic)[0].isr == (3,)
        after = produce(split_cluster.bootstrap_servers, topic, 1, 10, "after")
        got = read_all(split_cluster.bootstrap_servers, topic, 1, 30)[0]
        # 3 had the shared prefix only: the records only 2 held are gone, exactly as the warning says.
        assert got == [f"shared-0-{i:05d}".encode() for i in range(20)] + [v for _, v in after], got[:5]
    finally:
        for node in (2, 3):
            if not split_cluster.is_running(node):
                split_cluster.start_node(node)
        wait_back(admin, 2)
        wait_back(admin, 3)


def read_from(bootstrap: str, topic: str, partition: int, offset: int | None, expected: int,
              timeout_s: float = 60.0) -> list[tuple[int, bytes]]:
    """(offset, value) read from ``offset`` (None: the reset policy's start), until ``expected`` arrived."""
    tp = TopicPartition(topic, partition)
    got: list[tuple[int, bytes]] = []
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", request_timeout_ms=5000) as consumer:
        consumer.assign([tp])
        if offset is not None:
            consumer.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while len(got) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.offset, r.value) for r in records)
    return got


def test_trim_prefix_deletes_records_on_every_replica_and_survives_failover(split_cluster, admin, brook) -> None:
    topic = "trim"
    admin.create_topics([NewTopic(topic, 2, 3)])
    sent = produce(split_cluster.bootstrap_servers, topic, 2, 100, "v")
    values0 = [v for p, v in sent if p == 0]

    code, out, err = brook("topic", "trim-prefix", topic, "--partition", "0", "--offset", "40", "-o", "json")
    assert code == 0, (out, err)
    assert json.loads(out)["partitions"] == [{"partition": 0, "log_start_offset": 40, "error": None, "detail": ""}]

    code, out, err = brook("topic", "describe", topic, "--offsets", "-o", "json")
    assert code == 0, (out, err)
    offsets = {p["partition"]: (p["log_start_offset"], p["high_watermark"], p["log_end_offset"])
               for p in json.loads(out)["partitions"]}
    assert offsets == {0: (40, 100, 100), 1: (0, 100, 100)}, offsets
    code, out, err = brook("topic", "describe", topic, "--offsets")
    assert code == 0 and "HIGH WATERMARK" in out, (out, err)

    # DeleteRecords answered once every in-sync replica had followed: each broker's log starts at 40.
    code, out, err = brook("cluster", "log-dirs", "--topic", topic, "-o", "json")
    assert code == 0, [(b["broker"], b.get("detail"), [d["error"] for d in b["dirs"]]) for b in json.loads(out)]
    starts = {(b["broker"], p["partition"]): p["log_start_offset"]
              for b in json.loads(out) for d in b["dirs"] for p in d["partitions"]}
    assert starts == {(b, p): 40 if p == 0 else 0 for b in (1, 2, 3) for p in (0, 1)}, starts
    code, out, err = brook("cluster", "log-dirs", "--broker", "2")
    assert code == 0 and "Partition logs" in out and f"{topic}-0" in out, (out, err)

    assert read_from(split_cluster.bootstrap_servers, topic, 0, None, 60) == list(zip(range(40, 100), values0[40:], strict=True))
    # A position before the new start is out of range: the consumer resets to the log start.
    assert read_from(split_cluster.bootstrap_servers, topic, 0, 10, 60)[0] == (40, values0[40])

    # The trimmed prefix stays gone after the leader is SIGKILLed: the new leader starts at 40 too.
    leader = partitions_of(admin, topic)[0].leader
    split_cluster.kill_node(leader)
    try:
        wait_for(lambda: partitions_of(admin, topic)[0].leader not in (-1, leader), 30, "a new leader")
        more = produce(split_cluster.bootstrap_servers, topic, 1, 10, "after")
        got = read_from(split_cluster.bootstrap_servers, topic, 0, None, 70)
        assert got == list(zip(range(40, 110), values0[40:] + [v for _, v in more], strict=True)), got[:3]
    finally:
        split_cluster.start_node(leader)
        wait_back(admin, leader)


def test_trim_prefix_refuses_bad_input_and_changes_nothing(split_cluster, admin, brook) -> None:
    topic = "trim-bad"
    admin.create_topics([NewTopic(topic, 1, 3)])
    produce(split_cluster.bootstrap_servers, topic, 1, 10, "v")
    tp = TopicPartition(topic, 0)

    def start() -> int:
        return admin.list_offsets({tp: "earliest"})[tp][0]

    code, out, err = brook("topic", "trim-prefix", topic, "--offset", "11", "-o", "json")
    assert code == 1 and "OFFSET_OUT_OF_RANGE" in err and "nothing trimmed" in err, (out, err)
    # Past one partition's high watermark: no partition is trimmed (before, the others were).
    admin.create_topics([NewTopic("trim-some", 2, 3)])
    produce(split_cluster.bootstrap_servers, "trim-some", 2, 20, "v")
    produce(split_cluster.bootstrap_servers, "trim-some", 1, 5, "w")  # partition 0 is 5 longer
    counts = {p: admin.list_offsets({TopicPartition("trim-some", p): "latest"})[TopicPartition("trim-some", p)][0]
              for p in (0, 1)}
    past = min(counts.values()) + 1  # within the longer partition, past the shorter one
    code, out, err = brook("topic", "trim-prefix", "trim-some", "--offset", str(past))
    assert code == 1 and "OFFSET_OUT_OF_RANGE" in err, (out, err)
    assert all(admin.list_offsets({TopicPartition("trim-some", p): "earliest"})[TopicPartition("trim-some", p)][0]
               == 0 for p in (0, 1)), "a refused trim moved a log start"
    for args, message in ((["--offset", "abc"], "--offset must be"), (["--offset", "-5"], "--offset must be"),
                          (["--offset", "1", "--partition", "3"], "no partition 3")):
        code, out, err = brook("topic", "trim-prefix", topic, *args)
        assert code != 0 and message in err, (args, out, err)
    code, out, err = brook("topic", "trim-prefix", "no-such-topic", "--offset", "1")
    assert code != 0 and "no-such-topic" in err, (out, err)
    assert start() == 0, "a refused trim moved the log start"
    # Refused by the brokers partition by partition: the table says which, and stderr has the error line.
    admin.create_topics([NewTopic("trim-compacted", 2, 3, configs={"cleanup.policy": "compact"})])
    code, out, err = brook("topic", "trim-prefix", "trim-compacted", "--offset", "0")
    assert code == 1 and "POLICY_VIOLATION" in out, (out, err)
    assert err.startswith("error: 2 of 2 partitions not trimmed: partition 0 POLICY_VIOLATION") \
        and "(and 1 more)" in err, err

    # Internal topics are refused by every broker, whether or not it leads them.
    from proto import broker_pb2
    r = admin.cluster.broker_stub(1).DeleteRecords(broker_pb2.DeleteRecordsRequest(
        partitions=[broker_pb2.DeleteRecordsPartition(topic="__consumer_offsets", partition=0, offset=0)]), timeout=10)
    assert r.partitions[0].error_code == 17, r  # INVALID_TOPIC_EXCEPTION

    code, out, err = brook("topic", "trim-prefix", topic, "--offset", "end", "-o", "json")
    assert code == 0 and json.loads(out)["partitions"][0]["log_start_offset"] == 10, (out, err)
    assert start() == 10
    # Trimming below the current start is a no-op that still answers the start.
    code, out, err = brook("topic", "trim-prefix", topic, "--offset", "3", "-o", "json")
    assert code == 0 and json.loads(out)["partitions"][0]["log_start_offset"] == 10, (out, err)


def log_holders(brook, topic: str) -> dict[int, dict[int, dict]]:
    """{partition: {broker: its log of it}} from `brook cluster log-dirs`."""
    code, out, err = brook("cluster", "log-dirs", "--topic", topic, "-o", "json")
    assert code == 0, (out, err)
    holders: dict[int, dict[int, dict]] = {}
    for b in json.loads(out):
        for d in b["dirs"]:
            for p in d["partitions"]:
                holders.setdefault(p["partition"], {})[b["broker"]] = p
    return holders


class Writer:
    """An acks=all idempotent producer running in a thread while the cluster changes under it."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        import threading

        self.topic, self.partitions = topic, partitions
        self.acked: list[tuple[int, bytes]] = []
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, request_timeout_ms=5000,
                                  delivery_timeout_ms=120000)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            p = i % self.partitions
            value = f"w-{p}-{i:06d}".encode()

            def done(md, err, p=p, value=value) -> None:
                if err is None:
                    self.acked.append((p, value))
                else:
                    self.failures.append(err)
            self._producer.send(self.topic, value, partition=p, on_delivery=done)
            i += 1
            if i % 20 == 0:
                time.sleep(0.02)  # ~1000 records/s: the move competes with real traffic

    def stop(self) -> list[tuple[int, bytes]]:
        self._stop.set()
        self._thread.join(10)
        self._producer.flush()
        self._producer.close()
        assert not self.failures, f"{len(self.failures)} sends failed, first: {self.failures[0]!r}"
        return self.acked


def test_partition_move_under_load_loses_nothing(split_cluster, admin, brook) -> None:
    topic = "move"
    admin.create_topics([NewTopic(topic, replica_assignments=[[1, 2], [2, 1]])])
    sent = produce(split_cluster.bootstrap_servers, topic, 2, 300, "before")
    writer = Writer(split_cluster.bootstrap_servers, topic, 2)
    try:
        wait_for(lambda: len(writer.acked) > 200, 30, "acks from the writer")
        # Partition 0: the leader (1) leaves. Partition 1: a follower is swapped and the order changes.
        code, out, err = brook("partition", "move", topic, "0", "--replicas", "3,2", "--wait")
        assert code == 0, (out, err)
        code, out, err = brook("partition", "move", topic, "1", "--replicas", "3,2", "--wait", "-o", "json")
        assert code == 0 and json.loads(out)["complete"], (out, err)
        before_stop = len(writer.acked)
        wait_for(lambda: len(writer.acked) > before_stop + 200, 30, "acks after the moves")
    finally:
        sent += writer.stop()
    parts = partitions_of(admin, topic)
    assert [(p.replicas, sorted(p.isr)) for p in parts] == [((3, 2), [2, 3]), ((3, 2), [2, 3])], parts
    code, out, err = brook("partition", "reassignments", "-o", "json")
    assert code == 0 and json.loads(out) == [], (out, err)
    # Broker 1 deleted its logs; broker 3 holds complete copies.
    holders = wait_for(lambda: (h := log_holders(brook, topic)) and all(set(h[p]) == {2, 3} for p in (0, 1)) and h,
                       30, "logs only on brokers 2 and 3")
    for p in (0, 1):
        ends = {b: (log["high_watermark"], log["log_end_offset"]) for b, log in holders[p].items()}
        assert ends[3][1] >= ends[2][0], ends
    got = read_all(split_cluster.bootstrap_servers, topic, 2, len(sent))
    for p in (0, 1):
        mine = [v for q, v in sent if q == p]
        assert got[p] == mine, f"partition {p}: {len(got[p])} read, {len(mine)} acknowledged (in order)"


def test_partition_move_refuses_bad_input(split_cluster, admin, brook) -> None:
    topic = "move-bad"
    admin.create_topics([NewTopic(topic, replica_assignments=[[1, 2]])])
    for args, code_expected, message in (
            (["--replicas", "1,1"], 2, "twice"),
            (["--replicas", "1,x"], 2, "--replicas must be"),
            (["--replicas", "1,9"], 1, "unregistered"),
            (["--cancel"], 1, "NO_REASSIGNMENT_IN_PROGRESS"),
            ([], 2, "--replicas"),
    ):
        code, out, err = brook("partition", "move", topic, "0", *args)
        assert code == code_expected and message in err, (args, code, out, err)
    code, out, err = brook("partition", "move", topic, "5", "--replicas", "1,2")
    assert code == 1 and "no partition 5" in err, (out, err)
    assert partitions_of(admin, topic)[0].replicas == (1, 2)
    # A refused move with --throttle leaves the operator's own throttle as it was (before, it deleted it).
    code, out, err = brook("cluster", "config", "set", "follower.replication.throttled.rate=5000")
    assert code == 0, (out, err)
    try:
        code, out, err = brook("partition", "move", topic, "0", "--replicas", "1,9", "--throttle", "100")
        assert code == 1 and "unregistered" in err, (out, err)
        code, out, err = brook("cluster", "config", "get", "follower.replication.throttled.rate", "-o", "json")
        assert code == 0 and json.loads(out)[0]["value"] == "5000", out
    finally:
        brook("cluster", "config", "delete", "follower.replication.throttled.rate")


def _copied_config(cluster: LocalCluster, node_id: int, base: Path) -> Path:
    """Broker ``node_id``'s config with its own ports and log directory: what an operator gets by
    copying a node's config to a second machine and forgetting to change node.id."""
    values = tomllib.loads(cluster.config_path(node_id).read_text())
    values["listeners"] = re.sub(r":\d+(?=,|$)", lambda m: f":{free_port()}", values["listeners"])
    for key in [k for k in values if k.endswith(".listener")]:
        values[key] = f"127.0.0.1:{free_port()}"
    values["log.dirs"] = str(base / "data")
    cfg = base / "node.toml"
    cfg.write_text("".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in values.items()))
    return cfg


def test_a_second_process_with_a_running_brokers_node_id_is_refused(split_cluster, admin, tmp_path) -> None:
    """node.id configured on two processes: while the registered one runs (unfenced, heartbeating) the
    other is refused with DUPLICATE_BROKER_REGISTRATION and keeps trying, so the registration does not
    pass between them (each time taking the broker out of every ISR); acks=all writes go on. A broker
    restarted on its own directories names the incarnation it replaces, recorded there."""
    def registration(node_id: int) -> controller_pb2.BrokerRecord:
        desc = admin._call("DescribeCluster", controller_pb2.DescribeClusterRequest())
        return next(b for b in desc.brokers if b.node_id == node_id)

    topic = "duplicate-id"
    admin.create_topics([NewTopic(topic, 3, 3)])
    wait_back(admin, 2)
    before = registration(2)
    recorded = split_cluster.node_dir(2) / "data" / "broker.incarnation"
    assert recorded.read_text().strip() == before.incarnation_id
    node_log = split_cluster.node_log(2)
    log_size = node_log.stat().st_size
    intruder_log = tmp_path / "intruder.log"
    with intruder_log.open("w") as out:
        intruder = subprocess.Popen([sys.executable, "-m", "broker.node", "--config",
                                     str(_copied_config(split_cluster, 2, tmp_path))], stdout=out, stderr=out)
    try:
        wait_for(lambda: "DUPLICATE_BROKER_REGISTRATION" in intruder_log.read_text() or intruder.poll() is not None,
                 60, lambda: f"the second process refused by the controller; its output:\n"
                             f"{intruder_log.read_text()[-3000:]}")
        assert intruder.poll() is None, intruder_log.read_text()[-3000:]  # still trying, as Kafka's broker does
        assert "is node.id 2 configured on two nodes?" in intruder_log.read_text()
        sent = produce(split_cluster.bootstrap_servers, topic, 3, 20, "during")
        assert len(sent) == 60
        after = registration(2)
        assert (after.incarnation_id, after.broker_epoch, after.fenced) == \
            (before.incarnation_id, before.broker_epoch, False), (before, after)
        assert all(len(p.isr) == 3 for p in partitions_of(admin, topic)), partitions_of(admin, topic)
        with node_log.open() as f:
            f.seek(log_size)
            grown = f.read()
        assert "registering again" not in grown and "registered with epoch" not in grown, grown[-3000:]
    finally:
        intruder.kill()
        intruder.wait(30)

    split_cluster.kill_node(2)
    split_cluster.start_node(2)
    wait_for(lambda: registration(2).incarnation_id != before.incarnation_id, 60, "broker 2 registered again")
    wait_back(admin, 2)
    assert recorded.read_text().strip() == registration(2).incarnation_id
    got = read_all(split_cluster.bootstrap_servers, topic, 3, len(sent))
    for p in range(3):
        assert got[p] == [v for q, v in sent if q == p], f"partition {p}: {got[p][:3]}..."


def test_decommission_unregister_then_rebalance_onto_a_new_broker(split_cluster, admin, brook) -> None:
    """Empty broker 3 while writes go on, stop it, release its id; start it again as a new, empty
    broker and rebalance replicas and leaders onto it."""
    # RF 3 topics of the earlier tests could not leave broker 3 (only 2 brokers would remain).
    leftovers = [t for t in admin.list_topics() if not t.startswith("__")]
    if leftovers:
        admin.delete_topics(leftovers)
    topic = "decom"
    admin.create_topics([NewTopic(topic, 6, 2)])
    sent = produce(split_cluster.bootstrap_servers, topic, 6, 50, "before")
    code, out, err = brook("cluster", "unregister", "3")
    assert code == 1 and "running" in err, (out, err)
    code, out, err = brook("cluster", "decommission", "3", "--dry-run", "-o", "json")
    assert code == 0, (out, err)
    planned = json.loads(out)["moves"]
    assert planned and all(3 in m["from"] and 3 not in m["to"] for m in planned), planned
    assert any(3 in p.replicas for p in partitions_of(admin, topic)), "dry run moved something"

    writer = Writer(split_cluster.bootstrap_servers, topic, 6)
    try:
        code, out, err = brook("cluster", "decommission", "3", "--wait")
        assert code == 0, (out, err)
    finally:
        sent += writer.stop()
    desc = admin._call("DescribeCluster", controller_pb2.DescribeClusterRequest())
    assert not [f"{p.topic}-{p.partition}" for p in desc.partitions if 3 in p.replicas]
    code, out, err = brook("cluster", "unregister", "3")
    assert code == 1 and "running" in err, (out, err)
    split_cluster.stop_node(3)
    wait_for(lambda: 3 in admin.describe_cluster().fenced_brokers, 30, "broker 3 fenced after its stop")
    code, out, err = brook("cluster", "unregister", "3")
    assert code == 0, (out, err)
    assert 3 not in [b.node_id for b in admin.describe_cluster().brokers]

    # The same id comes back as a new broker: it registers again and holds nothing.
    split_cluster.start_node(3)
    wait_back(admin, 3)
    code, out, err = brook("cluster", "rebalance", "--wait", "-o", "json")
    assert code == 0, (out, err)
    assert json.loads(out)["moves"], out
    desc = admin._call("DescribeCluster", controller_pb2.DescribeClusterRequest())
    counts = {b: sum(b in p.replicas for p in desc.partitions) for b in (1, 2, 3)}
    assert max(counts.values()) - min(counts.values()) <= 1, counts
    wait_for(lambda: all(p.leader == p.replicas[0] for p in partitions_of(admin, topic)), 30,
             "preferred leaders elected after the rebalance")
    got = read_all(split_cluster.bootstrap_servers, topic, 6, len(sent))
    for p in range(6):
        mine = [v for q, v in sent if q == p]
        assert got[p] == mine, f"partition {p}: {len(got[p])} read, {len(mine)} acknowledged (in order)"


def test_dynamic_cluster_configs_reach_every_broker_and_the_controller(split_cluster, admin, brook) -> None:
    topic = "dynamic"
    admin.create_topics([NewTopic(topic, 1, 3)])
    try:
        code, out, err = brook("cluster", "config", "set", "log.segment.bytes=20000")
        assert code == 0, (out, err)
        code, out, err = brook("cluster", "config", "get", "log.segment.bytes", "-o", "json")
        assert code == 0 and json.loads(out) == [{"name": "log.segment.bytes", "value": "20000",
                                                  "source": "dynamic"}], out
        # The topic has no segment.bytes of its own: every replica now rolls at 20 kB.
        produce(split_cluster.bootstrap_servers, topic, 1, 1000, "x" * 100)
        holders = log_holders(brook, topic)[0]
        assert set(holders) == {1, 2, 3} and all(log["segments"] >= 3 for log in holders.values()), holders
        # A default above a topic's replication factor is taken, as Kafka takes it (the controller logs it), and
        # the brokers judge the topic by it: acks=1 writes go on, acks=all ones are refused at once.
        admin.create_topics([NewTopic("dynamic-rf1", 1, 1)])
        code, out, err = brook("cluster", "config", "set", "min.insync.replicas=2")
        assert code == 0, (out, err)
        with Producer(bootstrap_servers=split_cluster.bootstrap_servers, acks=1) as producer:
            producer.send("dynamic-rf1", b"one").get(timeout=30)

        def refused_as_not_enough_replicas() -> bool:
            with Producer(bootstrap_servers=split_cluster.bootstrap_servers, acks="all", retries=0,
                          enable_idempotence=False) as producer:
                try:
                    producer.send("dynamic-rf1", b"all").get(timeout=30)
                except errors.NotEnoughReplicasError:
                    return True
            return False  # acknowledged: this broker has not applied the new default yet
        wait_for(refused_as_not_enough_replicas, 30, "acks=all to an RF 1 topic refused under the default of 2")
    finally:
        code, out, err = brook("cluster", "config", "delete", "log.segment.bytes", "min.insync.replicas")
        assert code == 0, (out, err)
    code, out, err = brook("cluster", "config", "get", "-o", "json")
    assert code == 0 and not [e for e in json.loads(out) if e["source"] == "dynamic"], out
    # A key nobody set shows its built-in value (it showed "-"); the throttle is unset by default.
    values = {e["name"]: (e["value"], e["source"]) for e in json.loads(out)}
    assert values["log.retention.ms"] == ("604800000", "default"), values
    assert values["follower.replication.throttled.rate"] == ("", "default"), values
    for args, message in ((["set", "num.io.threads=4"], "cannot be changed at runtime"),
                          (["set", "log.retention.ms=soon"], "log.retention.ms"),
                          (["set", "follower.replication.throttled.rate=0"], "at least 1"),
                          (["delete", "nope"], "cannot be changed at runtime")):
        code, out, err = brook("cluster", "config", *args)
        assert code == 2 and message in err, (args, out, err)


def test_throttled_move_is_held_to_the_rate_and_the_throttle_is_removed(split_cluster, admin, brook) -> None:
    from opskit import sample_values

    topic = "throttled"
    admin.create_topics([NewTopic(topic, replica_assignments=[[1, 2]])])
    produce(split_cluster.bootstrap_servers, topic, 1, 2000, "y" * 200)  # ~0.5 MB to copy
    before = sum(sample_values(split_cluster.read_metrics(3), "brook_replication_throttled_seconds_total"))
    code, out, err = brook("partition", "move", topic, "0", "--replicas", "1,3", "--throttle", "100000", "--wait",
                           "-o", "json")
    assert code == 0 and json.loads(out)["throttle"] == 100000, (out, err)
    page = split_cluster.read_metrics(3)
    held = sum(sample_values(page, "brook_replication_throttled_seconds_total")) - before
    assert held > 0, "broker 3 copied ~0.5 MB at 100 kB/s without ever being held back"
    assert partitions_of(admin, topic)[0].replicas == (1, 3)
    # --wait saw the move done and removed the throttle from the quorum and from every broker.
    code, out, err = brook("cluster", "config", "get", "follower.replication.throttled.rate", "-o", "json")
    assert code == 0 and json.loads(out)[0]["source"] != "dynamic", out
    wait_for(lambda: sample_values(split_cluster.read_metrics(3), "brook_replication_throttle_rate_bytes") == [0.0],
             30, "broker 3 without a throttle")


def test_health_listener_readiness_waits_for_a_catching_up_replica(split_cluster, admin, brook) -> None:
    """/readyz of a broker is 503 while it is out of the ISR of a partition it hosts (here: a move held
    back by a 1 byte/s throttle), 200 once it caught up; /livez stays 200 all along."""
    for node in split_cluster.node_ids:
        assert split_cluster.probe(node, "/livez")[0] == 200
        wait_for(lambda n=node: split_cluster.probe(n)[0] == 200, 30, f"node {node} ready")
    topic = "health"
    admin.create_topics([NewTopic(topic, replica_assignments=[[1, 2]])])
    produce(split_cluster.bootstrap_servers, topic, 1, 500, "z" * 200)
    try:
        code, out, err = brook("partition", "move", topic, "0", "--replicas", "1,3", "--throttle", "1")
        assert code == 0, (out, err)
        status, body = wait_for(lambda: (r := split_cluster.probe(3)) and r[0] == 503 and r, 30,
                                "broker 3 not ready while it copies the partition")
        assert "catching up" in body["reason"], body
        assert split_cluster.probe(3, "/livez")[0] == 200
        assert split_cluster.probe(1)[0] == 200  # the leader is in sync: ready
    finally:
        brook("cluster", "config", "delete", "follower.replication.throttled.rate")
    wait_for(lambda: split_cluster.probe(3)[0] == 200, 60, "broker 3 ready once caught up")
    wait_for(lambda: not admin.list_partition_reassignments(), 60, "the move completed")
    status, body = split_cluster.probe(3, "/nope")
    assert status == 404, body


def _referenced_metrics() -> set[str]:
    import re
    from pathlib import Path

    import yaml

    deploy = Path(__file__).resolve().parents[2] / "deploy"
    exprs = [r["expr"] for g in yaml.safe_load((deploy / "prometheus" / "alerts.yml").read_text())["groups"]
             for r in g["rules"]]
    dashboard = json.loads((deploy / "grafana" / "brook-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return {m for e in exprs for m in re.findall(r"\bbrook_[a-z_]+", e)}


def test_every_metric_the_alerts_and_dashboard_use_is_exported(split_cluster, admin) -> None:
    """A typo in an alert or a panel would never fire or show: each brook_* name they use must be on
    a real node's /metrics page (a consumer group with a commit makes the lag series exist)."""
    from prometheus_client.parser import text_string_to_metric_families

    topic = "metrics-check"
    admin.create_topics([NewTopic(topic, 1, 2)])
    produce(split_cluster.bootstrap_servers, topic, 1, 10, "m")
    with Consumer(bootstrap_servers=split_cluster.bootstrap_servers, group_id="metrics-check-group",
                  auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        consumer.subscribe([topic])
        wait_for(lambda: consumer.poll(timeout_ms=500), 30, "records for the group")
        consumer.commit()
    exported: set[str] = set()

    def missing() -> list[str]:
        for node in split_cluster.node_ids:
            for family in text_string_to_metric_families(split_cluster.read_metrics(node)):
                exported.add(family.name)  # a counter family is named without _total, even with no samples
                exported.update(s.name for s in family.samples)
        return sorted(m for m in _referenced_metrics()
                      if m not in exported and m.removesuffix("_total").removesuffix("_bucket") not in exported)

    wait_for(lambda: not missing(), 30, lambda: f"these names on some node's /metrics: {missing()}")


def test_a_pause_of_every_node_moves_nothing(split_cluster, admin) -> None:
    """Every node at once (a frozen host, a paused VM) stops (SIGSTOP) for twice the brokers' session timeout,
    and three times replica.lag.time.max.ms, then resumes. The silence was the paused processes' own: the only
    controller, which kept its leadership, must fence no broker (a fenced broker loses every leadership: leader
    epochs move and writes stop; before, it fenced them on its first tick), and no leader may count against its
    followers the time it did not run itself (each proposed to shrink every ISR to itself). acks=all writes
    must be taken again within a bound. (A pause of the controller alone: tests/metadata_quorum/
    test_controller_stall.py.)"""
    paused = "every node"
    topic = "pause-every-node"
    admin.create_topics([NewTopic(topic, 3, 3)])
    produce(split_cluster.bootstrap_servers, topic, 3, 5, "before")

    def state() -> tuple[list[int], dict[int, tuple[int, int, int, list[int]]], dict[int, int]]:
        desc = admin._call("DescribeCluster", controller_pb2.DescribeClusterRequest())
        fenced = sorted(b.node_id for b in desc.brokers if b.fenced)
        partitions = {p.partition: (p.leader, p.leader_epoch, p.partition_epoch, sorted(p.isr))
                      for p in desc.partitions if p.topic == topic}
        epochs = {b.node_id: b.broker_epoch for b in desc.brokers}
        return fenced, partitions, epochs

    fenced, partitions, epochs = wait_for(
        lambda: (lambda s: s if not s[0] and all(len(p[3]) == 3 for p in s[1].values()) else None)(state()), 30,
        "no broker fenced and every ISR full before the pause")
    (controller,) = split_cluster.controller_ids
    victims = [controller, *split_cluster.broker_ids]
    session_s = int(OVERRIDES["broker.session.timeout.ms"]) / 1000
    for node in victims:
        split_cluster.pause_node(node)
    try:
        time.sleep(2 * session_s)  # the fault itself: the nodes stay stopped this long
    finally:
        for node in victims:
            split_cluster.resume_node(node)
    # For a whole session after the resume, each broker has had time to be heard and each follower to fetch:
    # nothing may have moved.
    deadline = time.monotonic() + session_s + 1
    while time.monotonic() < deadline:
        try:
            now = state()
        except Exception:  # noqa: BLE001  # the controller's first calls after SIGCONT may time out
            continue
        assert not now[0], f"brokers {now[0]} fenced after a pause of the {paused}"
        assert now[1] == partitions, f"partitions changed after a pause of the {paused}: {partitions} -> {now[1]}"
        assert now[2] == epochs, f"brokers registered again after a pause of the {paused}: {epochs} -> {now[2]}"
        time.sleep(0.2)
    started = time.monotonic()
    produce(split_cluster.bootstrap_servers, topic, 3, 5, "after")  # each send waits at most 30 s
    print(f"\nacks=all writes taken {time.monotonic() - started:.2f}s after the checks")


def test_topic_producers_lists_each_partitions_idempotent_producer(split_cluster, admin, brook) -> None:
    """`brook topic producers` (Kafka's describe-producers): the producer id and epoch that wrote each partition and
    the last sequence it used; a partition never written to lists none; a missing partition is refused by name."""
    topic = "producers"
    admin.create_topics([NewTopic(topic, 3, 3)])
    produce(split_cluster.bootstrap_servers, topic, 2, 25, "v")  # partitions 0 and 1, sequences 0..24
    code, out, err = brook("topic", "producers", topic, "-o", "json")
    assert code == 0, (out, err)
    parts = {p["partition"]: p for p in json.loads(out)["partitions"]}
    assert parts[2]["producers"] == [] and all(p["error"] is None for p in parts.values()), parts
    [s0], [s1] = parts[0]["producers"], parts[1]["producers"]
    assert s0["producer_id"] == s1["producer_id"] >= 0 and s0["producer_epoch"] == s1["producer_epoch"] >= 0
    assert (s0["last_sequence"], s1["last_sequence"]) == (24, 24), parts
    assert s0["last_timestamp"] > time.time() * 1000 - 600_000
    assert (s0["coordinator_epoch"], s0["current_txn_start_offset"]) == (-1, -1), s0  # not transactional
    code, out, err = brook("topic", "producers", topic, "--partition", "1")
    assert code == 0 and str(s1["producer_id"]) in out and "LAST SEQ" in out, (out, err)
    code, out, err = brook("topic", "producers", topic, "--partition", "7")
    assert code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err and "partition 7" in err, (out, err)


def test_set_replication_factor_grows_then_shrinks_a_topic_under_load(split_cluster, admin, brook) -> None:
    """Kafka changes a replication factor by reassignment to longer or shorter replica lists (Redpanda by a
    topic property): `brook topic set-replication-factor` plans those moves. Grown from 1 to 3 under acks=all
    writes, the new replicas hold every acknowledged record (the only original replica is then killed); shrunk
    back, the leader stays and the dropped brokers delete their copies. Below brook.metadata.version 5 it is
    refused and nothing changes; Kafka's allowReplicationFactorChange=false (KIP-860) is honoured."""
    from kafka_raw import kafka_ask

    from metadata_quorum import features

    topic = "rf-change"
    admin.create_topics([NewTopic(topic, replica_assignments=[[1], [2]])])
    sent = produce(split_cluster.bootstrap_servers, topic, 2, 200, "before")
    # A new cluster is at the highest level of its release (initial.metadata.version), as Kafka formats one; level 1
    # refuses (tests/security/test_features_cli.py).
    wait_for(lambda: admin.describe_features().finalized_level == features.SUPPORTED_MAX, 30,
             f"the new cluster at {features.METADATA_VERSION} {features.SUPPORTED_MAX}")

    code, out, err = brook("topic", "set-replication-factor", topic, "3", "--dry-run", "-o", "json")
    assert code == 0, (out, err)
    planned = {m["partition"]: m["to"] for m in json.loads(out)["moves"]}
    assert planned[0][0] == 1 and planned[1][0] == 2 and all(sorted(r) == [1, 2, 3] for r in planned.values()), out
    assert [p.replicas for p in partitions_of(admin, topic)] == [(1,), (2,)]  # a dry run changes nothing
    for args, expected in ((["4"], "only 3 live brokers"), (["0"], "greater than or equal to 1"),
                           (["x"], "Invalid value")):
        code, out, err = brook("topic", "set-replication-factor", topic, *args)
        assert code in (1, 2) and expected in err, (args, code, out, err)
    code, out, err = brook("topic", "set-replication-factor", "no-such-topic", "2")
    assert code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err, (code, out, err)

    writer = Writer(split_cluster.bootstrap_servers, topic, 2)
    try:
        wait_for(lambda: len(writer.acked) > 200, 30, "acks from the writer")
        code, out, err = brook("topic", "set-replication-factor", topic, "3", "--wait")
        assert code == 0 and "to 3 replicas" in out, (out, err)
        grown = partitions_of(admin, topic)
        assert [(len(p.replicas), sorted(p.isr)) for p in grown] == [(3, [1, 2, 3])] * 2, grown
        assert [p.replicas[0] for p in grown] == [1, 2], grown  # the preferred leaders stayed
        acked = len(writer.acked)
        wait_for(lambda: len(writer.acked) > acked + 200, 30, "acks after the growth")
    finally:
        sent += writer.stop()
    # The one replica the partition had is killed: the copies made by the growth serve everything acknowledged.
    split_cluster.kill_node(1)
    try:
        wait_for(lambda: partitions_of(admin, topic)[0].leader in (2, 3), 30, "partition 0 led by a new replica")
        got = read_all(split_cluster.bootstrap_servers, topic, 2, len(sent))
        for p in (0, 1):
            mine = [v for q, v in sent if q == p]
            assert got[p] == mine, f"partition {p}: {len(got[p])} read, {len(mine)} acknowledged (in order)"
    finally:
        split_cluster.start_node(1)
    wait_back(admin, 1)

    # Kafka's way: AlterPartitionReassignments v1. allowReplicationFactorChange=false refuses a shrink, as Kafka's.
    target = [partitions_of(admin, topic)[0].leader, 1 if partitions_of(admin, topic)[0].leader != 1 else 2]

    def reassign(allow: bool) -> tuple[int, str | None]:
        out = kafka_ask(split_cluster, 2, 45, 1, {"timeout_ms": 30_000, "allow_replication_factor_change": allow,
                                                  "topics": [{"name": topic, "partitions": [
                                                      {"partition_index": 0, "replicas": target}]}]})
        assert int(out.error_code) == 0, out
        [t] = out.responses
        [p] = t.partitions
        return int(p.error_code), p.error_message

    assert reassign(False) == (38, "The replication factor is changed from 3 to 2")  # Kafka's words
    assert len(partitions_of(admin, topic)[0].replicas) == 3
    assert reassign(True) == (0, None)
    wait_for(lambda: partitions_of(admin, topic)[0].replicas == tuple(target), 30, "partition 0 shrunk to 2")
    code, out, err = brook("topic", "list", "-o", "json")
    assert code == 0 and [t["replica_counts"] for t in json.loads(out) if t["name"] == topic] == ["2-3"], out

    # Below min.insync.replicas acks=all writes would all fail: refused, nothing moved.
    code, out, err = brook("topic", "alter-config", topic, "--set", "min.insync.replicas=2")
    assert code == 0, (out, err)
    code, out, err = brook("topic", "set-replication-factor", topic, "1")
    assert code == 1 and "min.insync.replicas" in err, (code, out, err)
    code, out, err = brook("topic", "alter-config", topic, "--delete", "min.insync.replicas")
    assert code == 0, (out, err)
    leaders = [p.leader for p in partitions_of(admin, topic)]
    code, out, err = brook("topic", "set-replication-factor", topic, "1", "--wait")
    assert code == 0, (out, err)
    shrunk = partitions_of(admin, topic)
    assert [p.replicas for p in shrunk] == [(leader,) for leader in leaders], (leaders, shrunk)  # leaders kept
    wait_for(lambda: (h := log_holders(brook, topic)) and all(set(h[p]) == {leaders[p]} for p in (0, 1)), 30,
             "the dropped replicas' logs deleted")
    sent += produce(split_cluster.bootstrap_servers, topic, 2, 50, "after")
    got = read_all(split_cluster.bootstrap_servers, topic, 2, len(sent))
    for p in (0, 1):
        assert got[p] == [v for q, v in sent if q == p], f"partition {p}: {len(got[p])} records read"
