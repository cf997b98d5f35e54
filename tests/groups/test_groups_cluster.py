"""Consumer groups on a real 3-node cluster (brook-server processes, real sockets, SIGKILL).

One cluster for the module (startup is the expensive part); each test uses its own
topic and group. Consumers that must die by SIGKILL run as their own processes
(tests/groups/group_worker.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import wall_clock
from waiting import wait_for

from client.admin import Admin
from client.cluster import ClusterClient
from client.consumer import Consumer
from client.coordinator import GroupCoordinatorClient
from client.errors import WakeupError
from client.producer import Producer
from client.types import TopicPartition as TP
from deploy.local.cluster import LocalCluster
from metadata_quorum.client import ControllerClient
from proto import controller_pb2, errors, group_pb2, group_pb2_grpc

pytestmark = pytest.mark.slow

SESSION_MS = 3000
# Kafka's unit is minutes; 1 is the smallest. Every test finishes with its offsets well
# inside a minute, and the expiry test (last) waits out the rest from module start.
RETENTION_MINUTES = 1
EXPIRING_GROUP = "g-expiring"
HELD_MAX = 4 << 20  # group.coordinator.metadata.max.bytes of this module's cluster
WORKER = Path(__file__).with_name("group_worker.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = tmp_path_factory.mktemp("groups-cluster")
    # Each node's wall clock can be stepped (tests/wall_clock.py): a file of its own in the cluster's folder.
    c = LocalCluster(base, nodes=3, launch_prefixes={n: wall_clock.launch_prefix(base / f"clock-{n}") for n in (1, 2, 3)},
                     overrides={"group.min.session.timeout.ms": "1000", "offsets.topic.num.partitions": "4",
                                "offsets.retention.minutes": str(RETENTION_MINUTES),
                                "offsets.retention.check.interval.ms": "1000",
                                "group.coordinator.metadata.max.bytes": str(HELD_MAX)})
    c.start()
    try:
        c.wait_ready(90)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[ClusterClient]:
    cl = ClusterClient(cluster.bootstrap_servers, request_timeout_ms=30_000)
    yield cl
    cl.close()


@pytest.fixture(scope="module", autouse=True)
def expiring_commit(cluster: LocalCluster, client: ClusterClient) -> float:
    """Commit offsets outside group management at module start; the last test sees them expire."""
    create_topic(cluster, "expiring", 1)  # offsets are taken only for partitions that exist
    GroupCoordinatorClient(client, EXPIRING_GROUP).commit({TP("expiring", 0): 3})
    return time.monotonic()


def create_topic(cluster: LocalCluster, name: str, partitions: int) -> None:
    with ControllerClient(cluster.controller_endpoints) as cc:
        resp = cc.call("CreateTopics", controller_pb2.CreateTopicsRequest(topics=[
            controller_pb2.CreatableTopic(name=name, num_partitions=partitions, replication_factor=3)]))
    assert resp.results[0].error_code == 0, resp


def produce(cluster: LocalCluster, topic: str, values: list[str], partitions: int) -> None:
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all") as p:
        futures = [p.send(topic, v.encode(), partition=i % partitions) for i, v in enumerate(values)]
        p.flush(30)
    for f in futures:
        f.result(timeout=30)


class Worker:
    def __init__(self, cluster: LocalCluster, out: Path, name: str, group: str, topic: str,
                 assignor: str = "range") -> None:
        self.out, self.name = out, name
        self.log = (out / f"{name}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--bootstrap", cluster.bootstrap_servers, "--group", group,
             "--topic", topic, "--out", str(out), "--name", name, "--session-ms", str(SESSION_MS),
             "--assignor", assignor],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=str(REPO),
            env={**os.environ, "PYTHONPATH": str(REPO)})

    def assignment(self) -> set[tuple[str, int]] | None:
        path = self.out / f"{self.name}.status.json"
        if not path.exists():
            return None
        return {tuple(x) for x in json.loads(path.read_text())["assignment"]}

    def processed(self) -> list[str]:
        path = self.out / f"{self.name}.processed"
        return path.read_text().split("\n")[:-1] if path.exists() else []

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()

    def log_tail(self) -> str:
        return (self.out / f"{self.name}.log").read_text()[-3000:]


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop(signal.SIGKILL)


def values_of(lines: list[str]) -> list[str]:
    return [line.split(" ", 2)[2] for line in lines]


def consumed(workers: list[Worker]) -> set[str]:
    """The values every worker has processed so far."""
    return set(values_of(sum((w.processed() for w in workers), [])))


def two_members_consuming(cluster: LocalCluster, client: ClusterClient, tmp_path: Path, workers: list[Worker],
                          topic: str, group: str, prefix: str) -> tuple[GroupCoordinatorClient, list[str]]:
    """A 4-partition topic holding 200 records (``prefix``0..199), two member processes of ``group``
    with two partitions each that have consumed them all; returns a client of the group's coordinator
    and the records' values."""
    create_topic(cluster, topic, 4)
    first = [f"{prefix}{i}" for i in range(200)]
    produce(cluster, topic, first, 4)
    workers += [Worker(cluster, tmp_path, f"{prefix}-member{i}", group, topic) for i in range(2)]
    wait_for(lambda: all(len(w.assignment() or ()) == 2 for w in workers), 60, "two members, two partitions each")
    wait_for(lambda: set(first) <= consumed(workers), 30, "first batch")
    coord = GroupCoordinatorClient(client, group)
    coord.find_coordinator(10)
    return coord, first


def wait_all_committed(coord: GroupCoordinatorClient, topic: str, total: int, how: str) -> None:
    """Until the group's committed offsets on the topic's 4 partitions add up to ``total``: members
    commit after processing (asynchronously), so this waits for the last commit, not the first."""
    tps = [TP(topic, p) for p in range(4)]
    last: list[dict | None] = [None]

    def all_committed() -> bool:
        last[0] = _committed_or_none(coord, tps)
        return last[0] is not None and sum(om.offset for om in last[0].values()) == total

    wait_for(all_committed, 30, lambda: f"every consumed record committed {how} (last committed: {last[0]})")


def test_three_members_split_six_partitions_and_sigkilled_members_partitions_move(
        cluster: LocalCluster, tmp_path: Path, workers: list[Worker]) -> None:
    topic, group = "six", "g-six"
    create_topic(cluster, topic, 6)
    first = [f"a{i}" for i in range(300)]
    produce(cluster, topic, first, 6)
    workers += [Worker(cluster, tmp_path, f"w{i}", group, topic) for i in range(3)]

    def balanced() -> list[set] | None:
        a = [w.assignment() for w in workers]
        if any(x is None or len(x) != 2 for x in a):
            return None
        return a if set().union(*a) == {(topic, p) for p in range(6)} else None

    try:
        wait_for(balanced, 60, "three members with two partitions each")
    except AssertionError:
        raise AssertionError("\n".join(w.log_tail() for w in workers)) from None
    wait_for(lambda: set(first) <= set(values_of(sum((w.processed() for w in workers), []))), 30,
             "all first-batch records consumed")

    victim, survivors = workers[2], workers[:2]
    killed_at = time.monotonic()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)

    def moved() -> bool:
        a = [w.assignment() or set() for w in survivors]
        return set().union(*a) == {(topic, p) for p in range(6)} and all(len(x) == 3 for x in a)

    wait_for(moved, SESSION_MS / 1000 + 20, "the killed member's partitions to move to the survivors")
    moved_after_s = time.monotonic() - killed_at
    print(f"partitions of the SIGKILLed member moved after {moved_after_s:.2f}s (session timeout {SESSION_MS} ms)")
    second = [f"b{i}" for i in range(300)]
    produce(cluster, topic, second, 6)
    wait_for(lambda: set(second) <= set(values_of(sum((w.processed() for w in survivors), []))), 30,
             "records produced after the kill consumed by the survivors")
    everything = values_of(sum((w.processed() for w in workers), []))
    assert set(first + second) <= set(everything), "records lost"


PER_PHASE = 60  # records the producer writes in each phase of a rebalance test


def wait_for_records(produced: list[str], n: int, phase: str) -> None:
    """Until the producer thread has written ``n`` more records than now."""
    target = len(produced) + n
    wait_for(lambda: len(produced) >= target, 60,
             lambda: f"{n} records written {phase} (the producer is at {len(produced)}, wanted {target})")


def test_commit_before_revoke_gives_exactly_once_across_clean_rebalances(
        cluster: LocalCluster, tmp_path: Path, workers: list[Worker]) -> None:
    topic, group = "clean", "g-clean"
    create_topic(cluster, topic, 4)
    produced: list[str] = []
    stop = threading.Event()

    def keep_producing() -> None:
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=5) as p:
            i = 0
            while not stop.is_set() and i < 100_000:
                v = f"r{i}"
                p.send(topic, v.encode(), partition=i % 4).result(timeout=30)
                produced.append(v)
                i += 1
                time.sleep(0.005)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    try:
        a = Worker(cluster, tmp_path, "a", group, topic)
        workers.append(a)
        wait_for(lambda: a.assignment() and len(a.assignment()) == 4, 60, "a owns all four partitions")
        b = Worker(cluster, tmp_path, "b", group, topic)
        workers.append(b)
        wait_for(lambda: (b.assignment() or set()) and len(b.assignment() or ()) == 2
                 and len(a.assignment() or ()) == 2, 60, "a and b share the partitions")
        # Both consume under the new assignment while the producer writes (records, not seconds:
        # a loaded machine writes fewer a second, and the test is about records across rebalances).
        wait_for_records(produced, PER_PHASE, "while a and b share the partitions")
        a.stop(signal.SIGTERM)  # clean: commit-before-revoke, then LeaveGroup
        assert a.proc.returncode == 0, a.log_tail()
        wait_for(lambda: len(b.assignment() or ()) == 4, 30, "b takes over a's partitions")
        wait_for_records(produced, PER_PHASE, "after b took over a's partitions")
    finally:
        stop.set()
        producer.join(60)
    expected = list(produced)
    wait_for(lambda: set(expected) <= set(values_of(a.processed() + b.processed())), 30,
             "every produced record consumed")
    counts = Counter(values_of(a.processed() + b.processed()))
    dups = {v: n for v, n in counts.items() if n > 1}
    assert not dups, f"{len(dups)} records processed twice across clean rebalances, e.g. {list(dups)[:5]}"
    assert len(expected) > 100, f"producer only wrote {len(expected)} records"



class AutoCommitMember:
    """A consumer with enable.auto.commit=true polling in its own thread. It "processes"
    every record poll() returned before the next poll() and never commits by itself: the
    periodic auto commit is set far beyond the test, so only the consumer's own
    commit-before-revoke and commit-on-close can keep the next owner from re-reading."""

    def __init__(self, cluster: LocalCluster, group: str, topic: str, name: str, assignor: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.processed: list[str] = []
        self.owned: set[TP] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group, client_id=name,
                                 auto_offset_reset="earliest", enable_auto_commit=True,
                                 auto_commit_interval_ms=3_600_000, session_timeout_ms=SESSION_MS,
                                 heartbeat_interval_ms=500, max_poll_interval_ms=20_000, max_poll_records=50,
                                 partition_assignment_strategy=assignor)
        self.consumer.subscribe([topic])
        self.thread = threading.Thread(target=self._run, daemon=True, name=name)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                batch = self.consumer.poll(100)
                with self.lock:
                    self.processed += [r.value.decode() for recs in batch.values() for r in recs]
                    self.owned = set(self.consumer.assignment())
        except BaseException as exc:  # surfaced by the test
            self.error = exc
        finally:
            self.consumer.close()  # clean: commit (auto commit is on), then LeaveGroup

    def assignment(self) -> set[TP]:
        assert self.error is None, f"{self.name} failed: {self.error!r}"
        with self.lock:
            return set(self.owned)

    def values(self) -> list[str]:
        with self.lock:
            return list(self.processed)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), f"{self.name} did not close"
        assert self.error is None, f"{self.name} failed: {self.error!r}"


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_auto_commit_commits_before_revocation_so_a_clean_rebalance_delivers_each_record_once(
        cluster: LocalCluster, assignor: str) -> None:
    topic, group = f"autocommit-{assignor}", f"g-autocommit-{assignor}"
    create_topic(cluster, topic, 4)
    produced: list[str] = []
    stop = threading.Event()

    def keep_producing() -> None:
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=5) as p:
            i = 0
            while not stop.is_set() and i < 20_000:
                v = f"r{i}"
                p.send(topic, v.encode(), partition=i % 4).result(timeout=30)
                produced.append(v)
                i += 1
                time.sleep(0.005)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    members: list[AutoCommitMember] = []
    try:
        a = AutoCommitMember(cluster, group, topic, "a", assignor)
        members.append(a)
        wait_for(lambda: len(a.assignment()) == 4 and len(a.values()) > 50, 60, "a owns all four and consumes")
        b = AutoCommitMember(cluster, group, topic, "b", assignor)  # joins: a's partitions move
        members.append(b)
        wait_for(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, 60, "a and b share the partitions")
        seen_b = len(b.values())
        wait_for(lambda: len(b.values()) > seen_b + 20, 30, "b consuming what it took over")
        b.close()  # leaves cleanly: its partitions go back to a
        wait_for(lambda: len(a.assignment()) == 4, 30, "a takes b's partitions back")
        seen_a = len(a.values())
        wait_for(lambda: len(a.values()) > seen_a + 20, 30, "a consuming after the second rebalance")
        wait_for(lambda: len(produced) > 100, 60, lambda: f"over 100 records written (at {len(produced)})")
        stop.set()
        producer.join(60)
        expected = list(produced)
        wait_for(lambda: set(expected) <= set(a.values() + b.values()), 30, "every produced record consumed")
        a.close()
    finally:
        stop.set()
        producer.join(60)
        for m in members:
            m.stop.set()
            m.thread.join(60)
    delivered = sum((m.values() for m in members), [])
    dups = {v: n for v, n in Counter(delivered).items() if n > 1}
    assert not dups, (f"{len(dups)} of {len(expected)} records delivered twice across clean rebalances with "
                      f"enable.auto.commit, e.g. {sorted(dups)[:5]}")
    assert set(expected) <= set(delivered), "records lost"
    assert len(expected) > 100, f"producer only wrote {len(expected)} records"

def group_stub(cluster: LocalCluster, node_id: int, client: ClusterClient) -> group_pb2_grpc.GroupCoordinatorServiceStub:
    return group_pb2_grpc.GroupCoordinatorServiceStub(client.channel_for_address(cluster.broker_address(node_id)))


def test_list_describe_reset_and_delete_groups(cluster: LocalCluster, client: ClusterClient) -> None:
    topic, group = "admin", "g-admin"
    create_topic(cluster, topic, 2)
    produce(cluster, topic, [f"v{i}" for i in range(40)], 2)
    coord = GroupCoordinatorClient(client, group)
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                        enable_auto_commit=False, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
    try:
        consumer.subscribe([topic])
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 40 and time.monotonic() < deadline:
            seen += sum(len(r) for r in consumer.poll(200).values())
        assert seen == 40
        consumer.commit({TP(topic, 0): 5, TP(topic, 1): 20})
        desc = coord.call("DescribeGroups", group_pb2.DescribeGroupsRequest(group_ids=[group], include_offsets=True),
                          check=False).groups[0]
        assert desc.state == "Stable" and desc.protocol_type == "consumer" and len(desc.members) == 1, desc
        member = desc.members[0]
        assert list(member.subscribed_topics) == [topic]
        # The host is the connection's address (as Kafka shows it), not a string the client sends.
        assert member.client_host == "127.0.0.1", member.client_host
        assert {(p.topic, p.partition) for p in member.assigned_partitions} == {(topic, 0), (topic, 1)}
        lag = {(o.topic, o.partition): (o.committed_offset, o.log_end_offset, o.lag) for o in desc.offsets}
        assert lag == {(topic, 0): (5, 20, 15), (topic, 1): (20, 20, 0)}, lag
        # Active group: no reset, no delete.
        resp = coord.call("AlterGroupOffsets", group_pb2.AlterGroupOffsetsRequest(group_id=group, specs=[
            group_pb2.OffsetResetSpec(topic=topic, partition=-1, kind=group_pb2.RESET_EARLIEST)]), check=False)
        assert resp.error_code == errors.ErrorCode.NON_EMPTY_GROUP, resp
        resp = coord.call("DeleteGroups", group_pb2.DeleteGroupsRequest(group_ids=[group]), check=False)
        assert resp.results[0].error_code == errors.ErrorCode.NON_EMPTY_GROUP, resp
    finally:
        consumer.close()
    wait_for(lambda: coord.call("DescribeGroups", group_pb2.DescribeGroupsRequest(group_ids=[group]),
                                check=False).groups[0].state == "Empty", 15, "group empty after close")
    listed = {}
    for node in cluster.broker_ids:  # each broker lists the groups it coordinates
        for g in group_stub(cluster, node, client).ListGroups(group_pb2.ListGroupsRequest(), timeout=10).groups:
            listed[g.group_id] = g
    assert listed[group].state == "Empty" and listed[group].coordinator_id == coord.node_id

    def reset(kind: int, value: int = 0, partition: int = -1, dry_run: bool = False) -> dict:
        r = coord.call("AlterGroupOffsets", group_pb2.AlterGroupOffsetsRequest(group_id=group, dry_run=dry_run,
                       specs=[group_pb2.OffsetResetSpec(topic=topic, partition=partition, kind=kind, value=value)]))
        assert all(p.error_code == 0 for p in r.partitions), r
        return {p.partition: p.offset for p in r.partitions}

    assert reset(group_pb2.RESET_EARLIEST, dry_run=True) == {0: 0, 1: 0}
    assert coord.committed([TP(topic, 0)])[TP(topic, 0)].offset == 5, "dry run must not write"
    assert reset(group_pb2.RESET_EARLIEST) == {0: 0, 1: 0}
    assert reset(group_pb2.RESET_LATEST) == {0: 20, 1: 20}
    assert reset(group_pb2.RESET_EXPLICIT, 7, partition=1) == {1: 7}
    assert reset(group_pb2.RESET_SHIFT_BY, -3, partition=1) == {1: 4}
    assert reset(group_pb2.RESET_EXPLICIT, 999, partition=0) == {0: 20}  # clamped to the log end
    assert reset(group_pb2.RESET_TIMESTAMP, 0) == {0: 0, 1: 0}  # everything is after epoch 0
    assert reset(group_pb2.RESET_TIMESTAMP, int(time.time() * 1000) + 3_600_000) == {0: 20, 1: 20}
    committed = coord.committed([TP(topic, 0), TP(topic, 1)])
    assert {tp.partition: om.offset for tp, om in committed.items()} == {0: 20, 1: 20}
    resp = coord.call("DeleteGroups", group_pb2.DeleteGroupsRequest(group_ids=[group]), check=False)
    assert resp.results[0].error_code == 0, resp
    assert coord.committed([TP(topic, 0)])[TP(topic, 0)] is None
    desc = coord.call("DescribeGroups", group_pb2.DescribeGroupsRequest(group_ids=[group]), check=False).groups[0]
    assert desc.state == "Dead"
    resp = coord.call("DeleteGroups", group_pb2.DeleteGroupsRequest(group_ids=[group]), check=False)
    assert resp.results[0].error_code == errors.ErrorCode.GROUP_ID_NOT_FOUND


def test_protocol_errors_over_the_wire(cluster: LocalCluster, client: ClusterClient) -> None:
    group = "g-wire"
    coord = GroupCoordinatorClient(client, group)
    coord.find_coordinator(10)
    here = group_stub(cluster, coord.node_id, client)
    other = next(n for n in cluster.broker_ids if n != coord.node_id)
    elsewhere = group_stub(cluster, other, client)
    sub = group_pb2.ConsumerSubscription(topics=["t"]).SerializeToString()

    def join(stub: Any, member_id: str = "", session_ms: int = SESSION_MS) -> Any:
        return stub.JoinGroup(group_pb2.JoinGroupRequest(
            group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=5000, member_id=member_id,
            protocol_type="consumer", protocols=[group_pb2.GroupProtocol(name="range", metadata=sub)]), timeout=20)

    assert join(elsewhere).error_code == errors.ErrorCode.NOT_COORDINATOR
    assert join(here, session_ms=10).error_code == errors.ErrorCode.INVALID_SESSION_TIMEOUT
    assert join(here, member_id="forged").error_code == errors.ErrorCode.UNKNOWN_MEMBER_ID
    first = join(here)
    assert first.error_code == errors.ErrorCode.MEMBER_ID_REQUIRED and first.member_id
    joined = join(here, member_id=first.member_id)
    assert joined.error_code == 0 and joined.leader == first.member_id and joined.generation_id >= 1
    assert [m.member_id for m in joined.members] == [first.member_id]
    assignment = group_pb2.ConsumerAssignment(partitions=[group_pb2.TopicPartitionRef(topic="t", partition=0)])
    synced = here.SyncGroup(group_pb2.SyncGroupRequest(
        group_id=group, generation_id=joined.generation_id, member_id=first.member_id, protocol_type="consumer",
        protocol_name="range", assignments=[group_pb2.SyncGroupAssignment(
            member_id=first.member_id, assignment=assignment.SerializeToString())]), timeout=20)
    assert synced.error_code == 0 and synced.assignment == assignment.SerializeToString()

    def beat(generation: int, member_id: str) -> int:
        return here.Heartbeat(group_pb2.HeartbeatRequest(group_id=group, generation_id=generation,
                                                         member_id=member_id), timeout=10).error_code

    assert beat(joined.generation_id, first.member_id) == 0
    assert beat(joined.generation_id - 1, first.member_id) == errors.ErrorCode.ILLEGAL_GENERATION
    assert beat(joined.generation_id, "ghost") == errors.ErrorCode.UNKNOWN_MEMBER_ID
    stale = here.OffsetCommit(group_pb2.OffsetCommitRequest(
        group_id=group, generation_id=joined.generation_id + 7, member_id=first.member_id,
        partitions=[group_pb2.OffsetCommitPartition(topic="t", partition=0, offset=1)]), timeout=10)
    assert stale.error_code == errors.ErrorCode.ILLEGAL_GENERATION
    left = here.LeaveGroup(group_pb2.LeaveGroupRequest(group_id=group, member_ids=[first.member_id]), timeout=10)
    assert [m.error_code for m in left.members] == [0]
    # Gone from the group: its next heartbeat is refused and the group is empty. Empty and without
    # offsets (the only commit was refused), it is also removed (Dead) at the next retention check,
    # as Kafka's group cleanup does: this cluster checks every second, so either state may be seen.
    assert beat(joined.generation_id, first.member_id) == errors.ErrorCode.UNKNOWN_MEMBER_ID
    desc = here.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=[group]), timeout=10).groups[0]
    assert desc.state in ("Empty", "Dead") and not desc.members, desc

def test_committed_offsets_survive_sigkill_of_the_coordinator(cluster: LocalCluster, client: ClusterClient) -> None:
    topic, group = "durable", "g-durable"
    create_topic(cluster, topic, 3)
    coord = GroupCoordinatorClient(client, group)
    offsets = {TP(topic, p): 100 + p for p in range(3)}
    for i in range(5):  # several commits: the last one per partition must win after failover
        coord.commit({tp: off + i for tp, off in offsets.items()})
    want = {tp: off + 4 for tp, off in offsets.items()}
    coord.find_coordinator(10)
    victim = coord.node_id
    assert victim in cluster.broker_ids
    cluster.kill_node(victim, signal.SIGKILL)
    try:
        coord.forget()
        got = wait_for(lambda: _committed_or_none(coord, list(want)), 60, "committed offsets from a new coordinator")
        assert {tp: om.offset for tp, om in got.items()} == want
        assert coord.node_id != victim, f"coordinator still reported as the killed broker {victim}"
    finally:
        cluster.start_node(victim)
        cluster.wait_ready(90)



def test_admin_group_calls_find_the_coordinator_again_after_it_moves(cluster: LocalCluster) -> None:
    topic, group = "admin-moves", "g-admin-moves"
    create_topic(cluster, topic, 2)
    want = {TP(topic, 0): 11, TP(topic, 1): 22}
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000) as admin:
        coord = admin._group(group)
        coord.commit(want)
        victim = coord.node_id
        assert victim in cluster.broker_ids

        def offsets_of(desc: Any) -> dict[TP, int]:
            return {tp: o.committed_offset for tp, o in desc.offsets.items()}

        # A stale coordinator (as the cache holds after a move): the live broker it names
        # answers NOT_COORDINATOR for the group, and the admin has to find the real one.
        other = next(n for n in cluster.broker_ids if n != victim)
        with coord._lock:
            coord._address, coord.node_id = cluster.broker_address(other), other
        desc = admin.describe_groups([group])[group]
        assert desc.coordinator_id == victim and offsets_of(desc) == want, desc

        # The coordinator's broker dies: describe at once; it succeeds once the offsets
        # partition has a new leader that loaded the group (NOT_COORDINATOR,
        # COORDINATOR_LOAD_IN_PROGRESS and dead-broker errors on the way are retried).
        cluster.kill_node(victim, signal.SIGKILL)
        try:
            desc = admin.describe_groups([group])[group]
            assert desc.coordinator_id != victim, f"answered by the killed broker {victim}: {desc}"
            assert desc.state == "Empty" and offsets_of(desc) == want, desc
            # Stale again (the surviving broker that is not the new coordinator), now for
            # delete_groups, which goes through the same per-group retry.
            stale = next(n for n in cluster.broker_ids if n not in (victim, desc.coordinator_id))
            with coord._lock:
                coord._address, coord.node_id = cluster.broker_address(stale), stale
            assert admin.delete_groups([group]) == {group: None}
            assert admin.describe_groups([group])[group].state == "Dead"
        finally:
            cluster.start_node(victim)
            cluster.wait_ready(90)

def _committed_or_none(coord: GroupCoordinatorClient, tps: list[TP]) -> dict | None:
    try:
        got = coord.committed(tps, timeout_ms=5000)
    except errors.BrookError:
        return None
    return got if all(v is not None for v in got.values()) else None


class ThreadedMember:
    """An in-process consumer polling in its own thread (a blocked join must not stall the others)."""

    def __init__(self, cluster: LocalCluster, group: str, topic: str, name: str, *, instance_id: str | None = None,
                 session_ms: int = SESSION_MS) -> None:
        self.name = name
        self.revoked: list[set[TP]] = []
        self.lock = threading.Lock()
        self.owned: set[TP] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        member = self

        class Listener:
            def on_partitions_revoked(self, revoked: set[TP]) -> None:
                with member.lock:
                    member.revoked.append(set(revoked))

            def on_partitions_assigned(self, assigned: set[TP]) -> None:
                pass

            def on_partitions_lost(self, lost: set[TP]) -> None:
                pass

        self.consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group, client_id=name,
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 session_timeout_ms=session_ms, heartbeat_interval_ms=500,
                                 max_poll_interval_ms=20_000, partition_assignment_strategy="cooperative-sticky",
                                 group_instance_id=instance_id)
        self.consumer.subscribe([topic], listener=Listener())
        self.thread = threading.Thread(target=self._run, daemon=True, name=name)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.consumer.poll(100)
                with self.lock:
                    self.owned = set(self.consumer.assignment())
        except BaseException as exc:  # surfaced by the test
            self.error = exc
        finally:
            self.consumer.close()

    def assignment(self) -> set[TP]:
        assert self.error is None, f"{self.name} failed: {self.error!r}"
        with self.lock:
            return set(self.owned)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


def test_cooperative_sticky_rebalances_on_new_partitions_and_moves_only_what_it_must(
        cluster: LocalCluster) -> None:
    topic, group = "grow", "g-grow"
    create_topic(cluster, topic, 2)
    members: list[ThreadedMember] = []
    try:
        members += [ThreadedMember(cluster, group, topic, f"c{i}") for i in (1, 2)]

        def shares(sizes: list[int], total: int) -> bool:
            a = [m.assignment() for m in members]
            union = set().union(*a)
            return sorted(len(x) for x in a) == sizes and len(union) == total == sum(len(x) for x in a)

        wait_for(lambda: shares([1, 1], 2), 60, "two members with one partition each")
        before = {m.name: m.assignment() for m in members}
        for m in members:
            with m.lock:
                m.revoked.clear()  # forget the start-up hand-over (c1 alone first, then c2)
        with ControllerClient(cluster.controller_endpoints) as cc:
            resp = cc.call("CreatePartitions", controller_pb2.CreatePartitionsRequest(
                topics=[controller_pb2.CreatePartitionsTopic(name=topic, count=4)]))
        assert all(r.error_code == 0 for r in getattr(resp, "results", [])), resp
        wait_for(lambda: shares([2, 2], 4), 60, "the new partitions assigned after the topic grew")
        for m in members:
            assert before[m.name] <= m.assignment(), f"{m.name} lost a partition it owned: sticky violated"
            assert not m.revoked, f"{m.name} revoked {m.revoked} although nothing had to move"
        members.append(ThreadedMember(cluster, group, topic, "c3"))
        wait_for(lambda: shares([1, 1, 2], 4), 60, "three members sharing four partitions")
        revoked = [tp for m in members for r in m.revoked for tp in r]
        assert len(revoked) == 1, f"cooperative rebalance should revoke exactly the moved partition, saw {revoked}"
        assert members[2].assignment() == set(revoked)
    finally:
        for m in members:
            m.close()


def test_static_members_restart_without_a_rebalance_and_a_twin_fences_the_older(cluster: LocalCluster) -> None:
    """Brook's consumer with group_instance_id (KIP-345): closing does not leave; the same instance id
    back within the session gets the same partitions in the same generation, the other member untouched;
    a second process with that instance id replaces the running one, whose next poll() raises
    FENCED_INSTANCE_ID."""
    topic, group = "static", "g-static"
    create_topic(cluster, topic, 4)
    members: list[ThreadedMember] = []

    def static(name: str, instance: str) -> ThreadedMember:
        members.append(ThreadedMember(cluster, group, topic, name, instance_id=instance, session_ms=30_000))
        return members[-1]

    def described() -> Any:
        with Admin(cluster.bootstrap_servers) as admin:
            return admin.describe_groups([group])[group]
    try:
        a, b = static("a", "a"), static("b", "b")
        wait_for(lambda: len(a.assignment()) == len(b.assignment()) == 2 and not a.assignment() & b.assignment(),
                 60, "a and b with two partitions each")
        b_owned, a_owned = b.assignment(), a.assignment()
        # What a gave up while the group formed (cooperative rounds, when b joined after a was alone
        # in the first generation) is not the restart's doing: only revocations after this count.
        settled_revocations = len(a.revoked)
        before = described()
        assert sorted(m.group_instance_id for m in before.members) == ["a", "b"], before.members
        b.close()
        b2 = static("b2", "b")
        wait_for(lambda: b2.assignment() == b_owned, 30, lambda: f"b2 to get {b_owned} back, has {b2.assignment()}")
        after = described()
        assert after.generation_id == before.generation_id and after.state == "Stable", (before, after)
        assert a.assignment() == a_owned and not [r for r in a.revoked[settled_revocations:] if r], a.revoked

        b3 = static("b3", "b")
        wait_for(lambda: b2.error is not None, 30, "b2 fenced once b3 took its instance id")
        assert isinstance(b2.error, errors.BrookError) and b2.error.code == errors.ErrorCode.FENCED_INSTANCE_ID, b2.error
        wait_for(lambda: b3.assignment() == b_owned, 30, lambda: f"b3 to hold {b_owned}, has {b3.assignment()}")
        assert described().generation_id == before.generation_id
    finally:
        for m in members:
            m.close()


def test_coordinator_exports_group_stats_to_metrics(cluster: LocalCluster, client: ClusterClient) -> None:
    import urllib.request

    topic, group = "metered", "g-metered"
    create_topic(cluster, topic, 1)
    coord = GroupCoordinatorClient(client, group)
    coord.commit({TP(topic, 0): 0})
    coord.find_coordinator(10)

    def scraped() -> str | None:
        with urllib.request.urlopen(cluster.metrics_url(coord.node_id), timeout=5) as r:
            text = r.read().decode()
        return text if f'group="{group}"' in text else None

    text = wait_for(scraped, 30, "group offsets in the coordinator's metrics", poll_s=0.5)
    assert "brook_consumer_group_committed_offset" in text and "brook_consumer_groups" in text


def _polls_keep_to_their_timeout(consumer: Consumer, for_s: float, what: str) -> int:
    """poll(300 ms) for ``for_s``: each returns nothing within 3 s; how many polls ran."""
    polls, until = 0, time.monotonic() + for_s
    while polls < 3 or time.monotonic() < until:
        started = time.monotonic()
        got = consumer.poll(timeout_ms=300)
        took = time.monotonic() - started
        polls += 1
        assert got == {}, got
        assert took < 3.0, f"poll #{polls} of 300 ms took {took:.1f} s {what}"
    return polls


def test_a_step_of_the_coordinators_wall_clock_moves_no_member(cluster: LocalCluster, client: ClusterClient) -> None:
    """The coordinator's wall clock jumps 10 minutes ahead (NTP after a VM resume, an operator's date -s), then
    back. Sessions are timed on the coordinator's steady clock: the member stays, with its member id and its
    generation, and consumes on. Before, the coordinator expired every member's session at its next tick on a
    step forward (each group rebalanced at once), and a step back kept dead members for as long as the step."""
    topic, group = "wall-clock-step", "g-wall-clock-step"
    create_topic(cluster, topic, 2)
    coord = GroupCoordinatorClient(client, group)
    coord.find_coordinator(10)
    clock = cluster.base_dir / f"clock-{coord.node_id}"
    here = group_stub(cluster, coord.node_id, client)

    def members() -> tuple[str, list[str]]:
        desc = here.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=[group]), timeout=10).groups[0]
        return desc.state, sorted(m.member_id for m in desc.members)

    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                        session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
    seen: list[str] = []

    def drain() -> None:
        for records in consumer.poll(timeout_ms=200).values():
            seen.extend(r.value.decode() for r in records)
    try:
        consumer.subscribe([topic])
        wait_for(lambda: consumer.poll(timeout_ms=200) is not None and len(consumer.assignment()) == 2, 30,
                 "the member to be assigned both partitions")
        before = members()
        assert before[0] == "Stable" and len(before[1]) == 1, before
        for offset in (600, 0):
            wall_clock.step(clock, offset)
            values = [f"{offset}-{i}" for i in range(10)]
            produce(cluster, topic, values, 2)
            deadline = time.monotonic() + 2 * SESSION_MS / 1000  # two session timeouts of timer ticks
            while time.monotonic() < deadline:
                drain()
                now = members()
                assert now == before, f"the group changed after a {offset} s step of its coordinator's clock: {before} -> {now}"
            wait_for(lambda: drain() or set(values) <= set(seen), 30,  # noqa: B023
                     lambda: f"the records produced after the step (saw {sorted(seen)})")
    finally:
        wall_clock.step(clock, 0)
        consumer.close(autocommit=False, timeout_ms=5000)


def test_a_members_poll_keeps_to_its_timeout_while_every_node_is_paused(cluster: LocalCluster) -> None:
    """Kafka's poll(Duration) (KIP-266): while no node answers (every process SIGSTOPped:
    connections open, nothing answered), a member's poll returns empty within its timeout, again
    and again, and the member consumes once the nodes continue. Twice: a member that must join
    (before, the coordinator lookup was retried for the whole rebalance timeout, 5 minutes by
    default) and a member consuming when its fetches time out (before, each poll then refreshed
    metadata for request.timeout.ms per partition)."""
    topic, group = "poll-bound", "g-poll-bound"
    create_topic(cluster, topic, 2)
    values = [f"p{i}" for i in range(20)]
    produce(cluster, topic, values, 2)
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                        request_timeout_ms=3000)
    seen: list[str] = []

    def seen_all(expected: list[str]) -> Callable[[], bool]:
        def check() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                seen.extend(r.value.decode() for r in records)
            return sorted(seen) == sorted(expected)
        return check

    def paused(for_s: float, what: str) -> None:
        for node in cluster.node_ids:
            cluster.pause_node(node)
        try:
            _polls_keep_to_their_timeout(consumer, for_s, what)
        finally:
            for node in cluster.node_ids:
                cluster.resume_node(node)

    try:
        assert consumer.partitions_for_topic(topic) == {0, 1}  # connected, metadata known: then the nodes hang
        consumer.subscribe([topic])
        paused(1.0, "joining, every node paused")
        wait_for(seen_all(values), 90, lambda: f"the 20 records once the nodes continued (saw {sorted(seen)})")
        # Consuming: the fetches in flight time out (request.timeout.ms + fetch.max.wait.ms) while paused.
        paused(6.0, "consuming, every node paused")
        more = [f"q{i}" for i in range(10)]
        produce(cluster, topic, more, 2)
        wait_for(seen_all(values + more), 90, lambda: f"the 10 records produced after (saw {sorted(seen)})")
    finally:
        consumer.close(autocommit=False, timeout_ms=5000)
    cluster.wait_ready(90)


def test_a_joining_members_poll_keeps_to_its_timeout_while_another_member_is_slow_to_rejoin(
        cluster: LocalCluster) -> None:
    """Kafka's consumer keeps its JoinGroup across polls. A member joins a group whose member ``a``
    does not poll for a while (busy with its records; its heartbeats keep it in the group): the
    coordinator holds the join phase open for ``a`` up to its rebalance timeout (here 60 s), and each
    poll(300 ms) of the joining member returns within its timeout meanwhile (before, the first one
    waited out the join phase: a minute). Once ``a`` polls, the two split the partitions."""
    topic, group = "slow-rejoin", "g-slow-rejoin"
    create_topic(cluster, topic, 2)
    config = dict(bootstrap_servers=cluster.bootstrap_servers, group_id=group, auto_offset_reset="earliest",
                  session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500, max_poll_interval_ms=60_000)
    a, b = Consumer(**config), Consumer(**config)
    try:
        a.subscribe([topic])
        wait_for(lambda: (a.poll(timeout_ms=300), len(a.assignment()) == 2)[1], 60, "a owning both partitions")
        b.subscribe([topic])
        polls = _polls_keep_to_their_timeout(b, 3.0, "while member a had not rejoined")
        assert b.assignment() == set(), f"b was assigned {b.assignment()} before a rejoined"
        assert polls >= 3
        # Consumer.wakeup() from another thread ends a long poll waiting on that join phase.
        waker = threading.Timer(1.0, b.wakeup)
        started = time.monotonic()
        waker.start()
        with pytest.raises(WakeupError):
            b.poll(timeout_ms=60_000)
        took = time.monotonic() - started
        assert took < 30, f"b's poll(60 s) waiting on the join phase ended {took:.1f} s after wakeup()"

        def split() -> bool:
            a.poll(timeout_ms=300)
            b.poll(timeout_ms=300)
            return len(a.assignment()) == len(b.assignment()) == 1 and a.assignment() | b.assignment() == {
                TP(topic, 0), TP(topic, 1)}
        wait_for(split, 60, lambda: f"a and b with a partition each (a {a.assignment()}, b {b.assignment()})")
    finally:
        b.close(autocommit=False, timeout_ms=5000)
        a.close(autocommit=False, timeout_ms=5000)


def test_active_members_keep_consuming_when_the_coordinator_broker_is_sigkilled(
        cluster: LocalCluster, client: ClusterClient, tmp_path: Path, workers: list[Worker]) -> None:
    topic = "failover"
    coord, _ = two_members_consuming(cluster, client, tmp_path, workers, topic, "g-failover", "x")
    victim = coord.node_id
    cluster.kill_node(victim, signal.SIGKILL)
    try:
        second = [f"y{i}" for i in range(200)]
        produce(cluster, topic, second, 4)
        try:
            wait_for(lambda: set(second) <= consumed(workers), 60,
                     "records produced after the coordinator died consumed by the group")
        except AssertionError:
            raise AssertionError("\n".join(w.log_tail() for w in workers)) from None
        assert all(w.proc.poll() is None for w in workers), "a member died with the coordinator"
        coord.forget()
        wait_all_committed(coord, topic, 400, "through the new coordinator")
    finally:
        cluster.start_node(victim)
        cluster.wait_ready(90)


# What a frozen coordinator may cost a group: the controller fences its broker (broker.session.timeout.ms,
# 6 s on the launcher), another broker takes its __consumer_offsets partition and replays it, and the
# members, whose calls to the frozen process hang rather than fail, time out, find the new coordinator
# and rejoin (one rebalance). Measured 10-15 s here; the bound leaves room for a slow machine.
FROZEN_COORDINATOR_BOUND_S = 60


def test_a_group_rebalances_and_consumes_while_its_coordinator_is_sigstopped(
        cluster: LocalCluster, client: ClusterClient, tmp_path: Path, workers: list[Worker]) -> None:
    """A gray failure, not a crash: the coordinator's process is SIGSTOPped (its sockets stay open, its
    calls hang) just as a new member joins. Within a bound the group re-forms around another coordinator
    with all three members, consumes what is produced meanwhile and commits it; when the frozen process
    resumes, it is no longer the coordinator, and the group stays as it is."""
    topic, group = "frozen", "g-frozen"
    coord, first = two_members_consuming(cluster, client, tmp_path, workers, topic, group, "p")
    victim = coord.node_id
    everyone = {(topic, p) for p in range(4)}

    def three_members_share_the_partitions() -> bool:
        a = [w.assignment() or set() for w in workers]
        return len(a) == 3 and set().union(*a) == everyone and sum(map(len, a)) == 4 and all(a)

    cluster.pause_node(victim)
    frozen_at = time.monotonic()
    try:
        workers.append(Worker(cluster, tmp_path, "s2", group, topic))  # joins while the coordinator is frozen
        second = [f"q{i}" for i in range(200)]
        produce(cluster, topic, second, 4)
        try:
            wait_for(three_members_share_the_partitions, FROZEN_COORDINATOR_BOUND_S,
                     lambda: f"three members sharing the four partitions, each with some; assignments now "
                             f"{[w.assignment() for w in workers]}", poll_s=0.2)
            reformed_s = time.monotonic() - frozen_at
            wait_for(lambda: set(second) <= consumed(workers), 30,
                     "records produced while the coordinator was frozen consumed by the group")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(w.log_tail() for w in workers)) from None
        print(f"group re-formed with three members {reformed_s:.1f}s after its coordinator was SIGSTOPped")
        assert all(w.proc.poll() is None for w in workers), "a member died while the coordinator was frozen"
    finally:
        cluster.resume_node(victim)
    cluster.wait_ready(90)
    # The resumed process learns it lost the partition; the group neither moves back nor rebalances.
    coord.forget()
    wait_all_committed(coord, topic, 400, "through the new coordinator")
    settled = [w.assignment() for w in workers]
    third = [f"r{i}" for i in range(100)]
    produce(cluster, topic, third, 4)
    wait_for(lambda: set(third) <= consumed(workers), 30, "records produced after the old coordinator resumed consumed")
    assert [w.assignment() for w in workers] == settled, "the group rebalanced when the old coordinator resumed"
    assert set(first + second + third) <= consumed(workers), "records lost"


def test_offsets_are_taken_only_for_partitions_that_exist(cluster: LocalCluster, client: ClusterClient) -> None:
    """As Kafka: UNKNOWN_TOPIC_OR_PARTITION for a partition the cluster does not have (a group cannot be
    made to hold offsets for any number of made-up partitions), and a request naming more partitions
    than the bound is refused whole, changing nothing."""
    create_topic(cluster, "two-parts", 2)
    coord = GroupCoordinatorClient(client, "g-made-up-partitions")
    known, out_of_range, no_topic = TP("two-parts", 1), TP("two-parts", 7), TP("no-such-topic", 0)
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        coord.commit({known: 5, out_of_range: 5, no_topic: 5}, timeout_ms=1500)
    got = coord.committed([known, out_of_range, no_topic])
    assert got[known] is not None and got[known].offset == 5, got
    assert got[out_of_range] is None and got[no_topic] is None, got
    too_many = group_pb2.OffsetCommitRequest(group_id="g-made-up-partitions", generation_id=-1, partitions=[
        group_pb2.OffsetCommitPartition(topic="two-parts", partition=0, offset=9, leader_epoch=-1)] * 1001)
    with pytest.raises(errors.InvalidRequestError, match="at most 1000"):
        coord.call("OffsetCommit", too_many, timeout_ms=10_000)
    assert coord.committed([TP("two-parts", 0)])[TP("two-parts", 0)] is None
    made_up = [f"g-made-up-{i}" for i in range(1001)]  # this coordinator holds far fewer groups
    for rpc, request in (("DescribeGroups", group_pb2.DescribeGroupsRequest(group_ids=made_up)),
                         ("DeleteGroups", group_pb2.DeleteGroupsRequest(group_ids=made_up))):
        with pytest.raises(errors.InvalidRequestError, match="at most 1000"):
            coord.call(rpc, request, timeout_ms=10_000)


def test_the_coordinator_bounds_the_member_metadata_it_holds(cluster: LocalCluster, client: ClusterClient) -> None:
    """A member's protocol metadata stays in the coordinator's memory for its session (up to 30
    minutes): 12 joins of 16 MiB took a broker from 136 to 706 MiB. Over group.member.metadata.max.bytes
    (1 MiB) a join is refused INVALID_REQUEST; past group.coordinator.metadata.max.bytes (4 MiB here) over
    all groups, COORDINATOR_NOT_AVAILABLE, retriable: once those members are gone, joins are taken again."""
    ids: list[str] = []
    node = -1
    for i in range(400):  # groups of one coordinator: the bound is per broker
        coord = GroupCoordinatorClient(client, f"g-heavy-{i}")
        coord.find_coordinator(10)
        node = coord.node_id if node < 0 else node
        if coord.node_id == node:
            ids.append(coord.group_id)
        if len(ids) == 6:
            break
    stub = group_stub(cluster, node, client)
    heavy = b"m" * ((1 << 20) - (64 << 10))  # four fit in 4 MiB with room for the other tests' groups

    def join(group_id: str, metadata: bytes, member_id: str = "") -> Any:
        return stub.JoinGroup.future(group_pb2.JoinGroupRequest(
            group_id=group_id, member_id=member_id, session_timeout_ms=1000, rebalance_timeout_ms=1000,
            protocol_type="consumer", protocols=[group_pb2.GroupProtocol(name="range", metadata=metadata)]),
            timeout=30)

    def member_id(group_id: str) -> str:
        r = join(group_id, b"x").result()
        assert r.error_code == errors.ErrorCode.MEMBER_ID_REQUIRED, r
        return r.member_id

    too_big = join(ids[0], heavy + b"m" * (128 << 10), member_id(ids[0])).result()
    assert too_big.error_code == errors.ErrorCode.INVALID_REQUEST, too_big
    assert "group.member.metadata.max.bytes" in too_big.error_message
    waiting = [join(gid, heavy, member_id(gid)) for gid in ids[:4]]  # 4 MiB less 256 KiB: taken
    refused = join(ids[4], heavy, member_id(ids[4])).result()
    assert refused.error_code == errors.ErrorCode.COORDINATOR_NOT_AVAILABLE, refused
    assert "group.coordinator.metadata.max.bytes" in refused.error_message
    for f in waiting:  # the join phases end; never syncing or heartbeating, the members expire
        assert f.result().error_code in (errors.ErrorCode.NONE, errors.ErrorCode.UNKNOWN_MEMBER_ID), f.result()

    def taken_again() -> bool:
        return join(ids[5], heavy, member_id(ids[5])).result().error_code == errors.ErrorCode.NONE
    wait_for(taken_again, 30, "a heavy join to be taken once the earlier members expired", poll_s=0.5)


def test_join_sync_and_leave_name_at_most_what_a_group_can_hold(cluster: LocalCluster, client: ClusterClient) -> None:
    """Each join checks that the members share a protocol: 40 members offering 100,000 names each held
    the coordinator's lock 3.8 s a join. Over 64 the JoinGroup is refused INVALID_REQUEST (the Kafka
    listener's JoinGroup goes through the same coordinator call); 64 are taken. A SyncGroup's
    assignments and a LeaveGroup's members are one a member: at most 10,000, a group's bound."""
    coord = GroupCoordinatorClient(client, "g-many-protocols")
    coord.find_coordinator(10)
    stub = group_stub(cluster, coord.node_id, client)

    def join(n: int) -> Any:
        return stub.JoinGroup(group_pb2.JoinGroupRequest(
            group_id="g-many-protocols", session_timeout_ms=10_000, protocol_type="consumer",
            protocols=[group_pb2.GroupProtocol(name=f"assignor-{i}", metadata=b"") for i in range(n)]), timeout=30)

    refused = join(65)
    assert refused.error_code == errors.ErrorCode.INVALID_REQUEST, refused
    assert "65 protocols offered, at most 64" in refused.error_message, refused
    # The last test's members may keep the coordinator at its 4 MiB bound for about a second.
    answers: list[Any] = []

    def answered() -> bool:
        answers.append(join(64))
        return answers[-1].error_code != errors.ErrorCode.COORDINATOR_NOT_AVAILABLE
    wait_for(answered, 30, lambda: f"a join taken, last answers {[a.error_message for a in answers[-3:]]}", poll_s=0.5)
    taken = answers[-1]
    assert taken.error_code == errors.ErrorCode.MEMBER_ID_REQUIRED, [(a.error_code, a.error_message) for a in answers]
    # A leader's SyncGroup names one assignment a member, and a group has at most 10,000.
    too_many = stub.SyncGroup(group_pb2.SyncGroupRequest(
        group_id="g-many-protocols", member_id=taken.member_id, generation_id=1,
        assignments=[group_pb2.SyncGroupAssignment(member_id=f"m{i}", assignment=b"") for i in range(10_001)]),
        timeout=30)
    assert too_many.error_code == errors.ErrorCode.INVALID_REQUEST, too_many.error_code
    assert "10001 assignments, a group has at most 10000 members" in too_many.error_message, too_many
    left = stub.LeaveGroup(group_pb2.LeaveGroupRequest(group_id="g-many-protocols",
                                                       member_ids=[f"m{i}" for i in range(10_001)]), timeout=30)
    assert left.error_code == errors.ErrorCode.INVALID_REQUEST and not left.members, left.error_code
    assert "10001 members named, a group has at most 10000" in left.error_message, left.error_message


def test_ids_and_reset_specs_past_their_bounds_are_refused_over_the_wire(cluster: LocalCluster,
                                                                        client: ClusterClient) -> None:
    """A group id longer than 1,024 characters is refused before it is hashed under the coordinator's lock
    (a 7 MB one held it 0.9 s a call), a join's client id past its bound too, and an AlterGroupOffsets
    naming more partitions than a request may (400,000 made-up ones took 3.3 s) before anything is done."""
    coord = GroupCoordinatorClient(client, "g-bounds")
    coord.find_coordinator(10)
    stub = group_stub(cluster, coord.node_id, client)
    long_group = "g" * 100_000
    beat = stub.Heartbeat(group_pb2.HeartbeatRequest(group_id=long_group, member_id="m", generation_id=1), timeout=30)
    assert beat.error_code == errors.ErrorCode.INVALID_GROUP_ID and "longer than 1024" in beat.error_message, beat
    joined = stub.JoinGroup(group_pb2.JoinGroupRequest(
        group_id="g-bounds", session_timeout_ms=10_000, protocol_type="consumer", client_id="c" * 100_000,
        protocols=[group_pb2.GroupProtocol(name="range", metadata=b"")]), timeout=30)
    assert joined.error_code == errors.ErrorCode.INVALID_REQUEST and "client id" in joined.error_message, (
        joined.error_code, joined.error_message)
    with pytest.raises(grpc.RpcError) as refused:
        stub.AlterGroupOffsets(group_pb2.AlterGroupOffsetsRequest(group_id="g-bounds", dry_run=True, specs=[
            group_pb2.OffsetResetSpec(topic="made-up", partition=i, kind=group_pb2.RESET_EARLIEST)
            for i in range(100_000)]), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    assert "names 100000 partitions" in (refused.value.details() or ""), refused.value.details()


def test_a_describe_groups_answer_carries_at_most_32_mib_of_member_metadata(
        cluster: LocalCluster, client: ClusterClient) -> None:
    """Each group id a DescribeGroups names is described again, members' metadata (and, for a consumer
    group, its decoded form) included: 1,000 ids of one large group would have built gigabytes. The
    answer carries at most 32 MiB of it; the groups past that are answered INVALID_REQUEST."""
    from broker.group_coordinator import DESCRIBE_ANSWER_MAX_BYTES
    coord = GroupCoordinatorClient(client, "g-described-often")
    coord.find_coordinator(10)
    stub = group_stub(cluster, coord.node_id, client)
    metadata = b"m" * (900 << 10)

    def join(member_id: str = "") -> Any:
        return stub.JoinGroup(group_pb2.JoinGroupRequest(
            group_id="g-described-often", member_id=member_id, session_timeout_ms=30_000, protocol_type="consumer",
            protocols=[group_pb2.GroupProtocol(name="range", metadata=metadata)]), timeout=30)

    # The coordinator's bound (4 MiB here) may still hold the last test's members until they expire:
    # either join, the one asking for an id too, may be refused COORDINATOR_NOT_AVAILABLE until then. A
    # refused join keeps the id it was given, as a client does: a pending member that never comes back holds
    # the group's join phase until its session ends (30 s, as Kafka's), and so held this test 30 s once.
    seen: list[Any] = []
    given = [""]

    def taken() -> Any:
        r = join(given[0])
        seen.append(r)
        if r.error_code == errors.ErrorCode.MEMBER_ID_REQUIRED:
            given[0] = r.member_id
        return r.error_code == errors.ErrorCode.NONE and r.member_id
    member_id = wait_for(taken, 60, lambda: f"the 900 KiB member to be taken; last answers "
                         f"{[(r.error_code, r.error_message) for r in seen[-3:]]}", poll_s=0.5)
    assert seen[-1].leader == member_id, seen[-1]
    out = stub.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=["g-described-often"] * 25), timeout=30)
    codes = [g.error_code for g in out.groups]
    fits = DESCRIBE_ANSWER_MAX_BYTES // (2 * len(metadata))  # a consumer member's bytes count twice
    assert codes == [errors.ErrorCode.NONE] * fits + [errors.ErrorCode.INVALID_REQUEST] * (25 - fits), codes
    assert all(g.members[0].metadata == metadata for g in out.groups[:fits])
    assert "describe fewer groups a call" in out.groups[-1].error_message, out.groups[-1].error_message
    stub.LeaveGroup(group_pb2.LeaveGroupRequest(group_id="g-described-often", member_ids=[member_id]), timeout=30)


def test_offsets_expire_after_retention_and_stay_gone_after_coordinator_failover(
        cluster: LocalCluster, client: ClusterClient, expiring_commit: float) -> None:
    coord = GroupCoordinatorClient(client, EXPIRING_GROUP)
    tp = TP("expiring", 0)
    retention_s = RETENTION_MINUTES * 60
    if time.monotonic() - expiring_commit < retention_s - 5:
        assert coord.committed([tp])[tp] is not None, "expired before offsets.retention.minutes"
    wait_for(lambda: coord.committed([tp])[tp] is None,
             max(0.0, retention_s - (time.monotonic() - expiring_commit)) + 20, "the offset to expire", poll_s=1)
    desc = coord.call("DescribeGroups", group_pb2.DescribeGroupsRequest(group_ids=[EXPIRING_GROUP]),
                      check=False).groups[0]
    assert desc.state == "Dead", desc
    # The expiry was written as tombstones: a new coordinator replaying the partition agrees.
    coord.find_coordinator(10)
    victim = coord.node_id
    cluster.kill_node(victim, signal.SIGKILL)
    try:
        coord.forget()
        assert coord.committed([tp], timeout_ms=60_000)[tp] is None
        assert coord.node_id != victim, f"answer came from the killed broker {victim}"
    finally:
        cluster.start_node(victim)
        cluster.wait_ready(90)
