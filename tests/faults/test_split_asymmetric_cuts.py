"""Split mode under partial network cuts: acks=all writes resume within a bound, nothing acknowledged is lost.

A real split-mode cluster: brokers 1-3 and controller voters 4-6, each a ``brook-server`` process in a network
namespace of its own (tests/chaos/netns.py, nodes.py), one topic with 3 partitions, RF 3 and
``min.insync.replicas=2``. For each partial cut, one idempotent acks=all writer per partition runs across the
fault, and a consumer per partition that was reading before it. Writes count as resumed once every partition has
acknowledged records sent HOLD_S after the cut (by then the fault has been noticed: leases run out, followers fall
out of sync); that must happen within RESUME_BOUND_S, and no partition may go longer than that without an
acknowledged write. Within that bound too, each consumer must read records acknowledged after the hold. Then the cut heals, every replica must be
back in the ISR, and every partition is read back: every acknowledged record once, in order, and the replicas'
segment files equal below the high watermark.

1. A partition leader cut from the other brokers, still reaching the controllers. It kept heartbeating, so it
   was never fenced; its followers could not fetch, so it shrank the ISR to itself alone, and with
   min.insync.replicas=2 every acks=all write was refused until the network healed. The controller now moves
   leadership to a live in-sync follower instead of taking a shrink below min.insync.replicas
   (QuorumController._move_instead_of_shrinking).
2. A leader cut from the active controller only. The controller fenced it and elected new leaders, but the old
   one never heard: it took acks=all writes that no follower fetched and answered REQUEST_TIMED_OUT, so producers
   retried there until the network healed. Without a controller session such a timeout is now answered
   NOT_LEADER_OR_FOLLOWER, which sends clients to fresh metadata (DelayedProduce). When it is a group's
   coordinator, the group's next commit times out the same way (NOT_COORDINATOR) and its member finds the new one:
   the group reads and commits again (guarded here, it already did). Its consumers at the end of
   the log long-polled it for good too (read nothing in 45 s): without a session and with no follower fetching,
   it now answers them NOT_LEADER_OR_FOLLOWER (ReplicaManager._deposed_leader).
3. The active controller cut from every broker, still leading the quorum. It fenced every broker (every partition
   offline in the metadata, no ISR change, election or topic creation until the heal), while brokers without a
   session kept taking acks=all writes (their followers still fetch, so nothing is lost); the writes guard that no
   "fix" of 2 stops them. Now it asks the other voters whether brokers reach them, and hands leadership to one
   that says so instead of fencing (QuorumController._cut_off_from_brokers): no broker is fenced, and metadata
   changes go on during the cut (a topic is created and written).
4. The active controller cut from one other voter only: the quorum keeps its leader and term (pre-vote), and the
   cut voter follows it again after the heal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from faultkit import assert_every_acknowledged_record_once_in_order, partition_consumer, read_until
from waiting import wait_for

from broker.group_records import OFFSETS_TOPIC, partition_for_group
from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.security import SecurityConfig
from metadata_quorum.client import ControllerClient
from proto import controller_pb2
from tests.chaos.netns import NamespaceNetwork, namespaces_unavailable_reason
from tests.chaos.nodes import ChaosCluster
from tests.chaos.run import TOPIC, compare_replicas

_REASON = namespaces_unavailable_reason()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_REASON is not None, reason=f"network namespaces unavailable: {_REASON}")]

BROKERS = (1, 2, 3)
CONTROLLERS = (4, 5, 6)
PARTITIONS = 3
# A cut follower leaves the ISR after replica.lag.time.max.ms; a broker that cannot heartbeat is fenced after
# broker.session.timeout.ms (6 s, LocalCluster's dev default): both well inside the bound on a loaded machine.
OVERRIDES = {"replica.lag.time.max.ms": "2000"}
RESUME_BOUND_S = 45.0
HEAL_BOUND_S = 45.0
START_BOUND_S = 90.0
FRESH_ACKS = 3  # acknowledged records sent after the cut, per partition, that count as "writes resumed"
# Writes count only once sent this long after the cut: by then a broker that cannot heartbeat has been fenced
# (broker.session.timeout.ms, 6 s) and a follower that cannot fetch has left the ISR, so what is measured is the
# cluster's answer to the fault, not the moments before it is noticed.
HOLD_S = 10.0


def _failure(exc: BaseException) -> str:
    """An exception a writer or reader met, as its failure message shows it: when, what."""
    return f"{time.monotonic():.1f}: {type(exc).__name__}: {exc}"[:200]

@dataclass
class _Writer:
    """One partition's idempotent acks=all writer: one record at a time, each acknowledged or failed."""

    cluster: ChaosCluster
    partition: int
    tag: str
    stop: threading.Event = field(default_factory=threading.Event)
    acked: list[bytes] = field(default_factory=list)
    ack_sent_at: list[float] = field(default_factory=list)  # when each acknowledged record was sent
    ack_at: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def run(self) -> None:
        with Producer(bootstrap_servers=self.cluster.bootstrap_servers, acks="all", enable_idempotence=True,
                      linger_ms=0, request_timeout_ms=3000, delivery_timeout_ms=8000, retry_backoff_ms=100,
                      max_block_ms=5000, **self.cluster.client_config) as producer:
            i = 0
            while not self.stop.is_set():
                value = b"%s-%d-%06d" % (self.tag.encode(), self.partition, i)
                i += 1
                sent = time.monotonic()
                try:
                    producer.send(TOPIC, value, partition=self.partition).get(timeout=20)
                except Exception as exc:  # noqa: BLE001 - a failed send may or may not be in the log: both fine
                    self.failures.append(_failure(exc))
                    continue
                self.acked.append(value)
                self.ack_sent_at.append(sent)
                self.ack_at.append(time.monotonic())

    def acked_sent_after(self, t: float) -> int:
        return sum(1 for s in self.ack_sent_at if s > t)

    def longest_gap(self, since: float, until: float) -> float:
        times = [since, *[t for t in self.ack_at if since < t < until], until]
        return max(b - a for a, b in zip(times, times[1:], strict=False))


@dataclass
class _Reader:
    """One partition's tailing consumer, started before the fault: what it has read, as it read it."""

    cluster: ChaosCluster
    partition: int
    stop: threading.Event = field(default_factory=threading.Event)
    seen: set[bytes] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)

    def run(self) -> None:
        with partition_consumer(self.cluster, TOPIC, self.partition) as consumer:
            while not self.stop.is_set():
                try:
                    for records in consumer.poll(timeout_ms=200).values():
                        self.seen.update(r.value for r in records)
                except Exception as exc:  # noqa: BLE001 - a retriable error while the cluster settles: shown if it lasts
                    self.failures.append(_failure(exc))

    def read_of(self, writer: _Writer, sent_after: float) -> int:
        """How many of ``writer``'s records acknowledged and sent after ``sent_after`` it has read."""
        return sum(1 for v, s in zip(writer.acked, writer.ack_sent_at, strict=False) if s > sent_after and v in self.seen)


class _Split:
    def __init__(self, cluster: ChaosCluster, network: NamespaceNetwork) -> None:
        self.cluster = cluster
        self.network = network
        self.controller = ControllerClient(
            [(cluster.addrs[c].host, cluster.addrs[c].controller_port) for c in CONTROLLERS], timeout_s=5.0,
            security=SecurityConfig.from_config(cluster.client_config))

    def describe(self) -> controller_pb2.DescribeClusterResponse | None:
        try:
            return self.controller.call("DescribeCluster", controller_pb2.DescribeClusterRequest(), timeout_s=5.0)
        except Exception:  # noqa: BLE001 - no active controller for a moment: asked again
            return None

    def partitions(self) -> dict[int, controller_pb2.PartitionRecord]:
        d = self.describe()
        return {p.partition: p for p in (d.partitions if d else []) if p.topic == TOPIC}

    def show(self) -> str:
        d = self.describe()
        if d is None:
            return "(no active controller answered)"
        parts = ", ".join(f"p{p.partition}: leader {p.leader} isr {list(p.isr)}" for p in d.partitions
                          if p.topic == TOPIC)
        fenced = [b.node_id for b in d.brokers if b.fenced]
        return f"active controller {d.active_controller_id}, fenced brokers {fenced}, {parts}"

    def healthy(self) -> bool:
        d = self.describe()
        if d is None or d.active_controller_id < 0 or any(b.fenced for b in d.brokers):
            return False
        if {b.node_id for b in d.brokers} != set(BROKERS):
            return False
        parts = [p for p in d.partitions if p.topic == TOPIC]
        return len(parts) == PARTITIONS and all(p.leader >= 0 and len(p.isr) == len(BROKERS) for p in parts)

    def active_controller(self) -> int:
        return wait_for(lambda: (d := self.describe()) is not None and d.active_controller_id > 0
                        and d.active_controller_id, 30, "an active controller")

    def leader(self, partition: int) -> int:
        return wait_for(lambda: (p := self.partitions().get(partition)) is not None and p.leader >= 0 and p.leader,
                        30, f"a leader of {TOPIC}-{partition}")


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Split]:
    network = NamespaceNetwork([*BROKERS, *CONTROLLERS])
    cluster: ChaosCluster | None = None
    s: _Split | None = None
    try:
        cluster = ChaosCluster(tmp_path_factory.mktemp("split-cuts"), network, nodes=len(BROKERS),
                               controllers=len(CONTROLLERS), overrides=OVERRIDES)
        cluster.start()
        s = _Split(cluster, network)
        wait_for(lambda: cluster.all_serving() and (d := s.describe()) is not None
                 and sorted(b.node_id for b in d.brokers if not b.fenced) == list(BROKERS),
                 START_BOUND_S, lambda: f"the split cluster serving, every broker unfenced ({s.show()})", poll_s=0.5)
        with Admin(cluster.bootstrap_servers, request_timeout_ms=30_000, **cluster.client_config) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"},
                                          replica_assignments=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])])
        wait_for(s.healthy, START_BOUND_S, lambda: f"{TOPIC} led with full ISRs ({s.show()})", poll_s=0.3)
        yield s
    finally:
        if s is not None:
            s.controller.close()
        if cluster is not None:
            cluster.teardown()
        network.close()


def _across_fault(split: _Split, name: str, fault: Callable[[], str]) -> None:
    """Writers on every partition; ``fault()`` cuts (and says what it cut); writes must resume on every partition
    within RESUME_BOUND_S; heal; full ISRs again; every acknowledged record read back once, in order."""
    cluster = split.cluster
    wait_for(split.healthy, HEAL_BOUND_S, lambda: f"{name}: full ISRs before the fault ({split.show()})", poll_s=0.3)
    writers = [_Writer(cluster, p, name) for p in range(PARTITIONS)]
    readers = [_Reader(cluster, p) for p in range(PARTITIONS)]
    threads = [threading.Thread(target=x.run, daemon=True) for x in [*writers, *readers]]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: all(w.acked for w in writers), 30, "every writer acknowledged before the fault")
        wait_for(lambda: all(r.read_of(w, 0.0) for r, w in zip(readers, writers, strict=True)), 30,
                 "every reader reading before the fault")
        what = fault()
        cut_at = time.monotonic()
        before = split.show()
        try:
            held = cut_at + HOLD_S
            wait_for(lambda: all(w.acked_sent_after(held) >= FRESH_ACKS for w in writers), HOLD_S + RESUME_BOUND_S,
                     lambda: (f"{name}: acks=all writes taken again on every partition within {RESUME_BOUND_S:.0f} s "
                              f"of the cut ({what}) held {HOLD_S:.0f} s; acknowledged after that per partition "
                              f"{[w.acked_sent_after(held) for w in writers]}; last failures "
                              f"{[w.failures[-1:] for w in writers]}; before: {before}; now: {split.show()}"),
                     poll_s=0.1)
            # Reads too: a consumer that was reading before the cut reads what is acknowledged after it.
            wait_for(lambda: all(r.read_of(w, held) >= FRESH_ACKS for r, w in zip(readers, writers, strict=True)),
                     RESUME_BOUND_S,
                     lambda: (f"{name}: records acknowledged after the cut ({what}) read by a consumer that was "
                              f"reading before it, within {RESUME_BOUND_S:.0f} s; read per partition "
                              f"{[r.read_of(w, held) for r, w in zip(readers, writers, strict=True)]}; last failures "
                              f"{[r.failures[-1:] for r in readers]}; now: {split.show()}"), poll_s=0.1)
            read_by = time.monotonic() - held
            gaps = [w.longest_gap(cut_at, time.monotonic()) for w in writers]
            assert max(gaps) <= RESUME_BOUND_S, (
                f"{name}: no acks=all write acknowledged for {max(gaps):.1f} s (per partition {gaps}) after the cut "
                f"({what}); the bound is {RESUME_BOUND_S:.0f} s; now: {split.show()}")
            during = split.show()
        finally:
            split.network.heal()
        healed_at = time.monotonic()
        wait_for(split.healthy, HEAL_BOUND_S, lambda: f"{name}: full ISRs after the heal ({split.show()})",
                 poll_s=0.3)
        in_sync = time.monotonic() - healed_at
        mark = [len(w.acked) for w in writers]
        wait_for(lambda: all(len(w.acked) > m for w, m in zip(writers, mark, strict=True)), RESUME_BOUND_S,
                 lambda: f"{name}: writes after the heal ({split.show()})")
    finally:
        for x in [*writers, *readers]:
            x.stop.set()
        for t in threads:
            t.join(30)
    exits = cluster.unexpected_exits()
    assert not exits, f"{name}: nodes exited: {exits}"
    hws = {}
    for w in writers:
        with partition_consumer(cluster, TOPIC, w.partition) as consumer:
            read = read_until(consumer, TOPIC, partition=w.partition, describe=split.show)
        assert_every_acknowledged_record_once_in_order(read, w.acked, f"{name}: {TOPIC}-{w.partition}")
        hws[w.partition] = len(read)
    diverged = compare_replicas({b: cluster.data_dir(b) for b in BROKERS}, hws)
    assert not diverged, f"{name}: replicas differ below the high watermark: {diverged}"
    print(f"{name}: {what}; longest stretch without an acknowledged write per partition "
          f"{[round(g, 1) for g in gaps]} s; records acknowledged after the hold read by the tailing consumers "
          f"{read_by:.1f} s after it; during: {during}); full ISRs {in_sync:.1f} s after the heal; "
          f"{[len(w.acked) for w in writers]} acknowledged, {[len(w.failures) for w in writers]} failed sends")


def test_leader_cut_from_the_other_brokers(split: _Split) -> None:
    def fault() -> str:
        leader = split.leader(0)
        for b in BROKERS:
            if b != leader:
                split.network.cut(leader, b)
        return f"broker {leader} (leader of p0) cut from the other brokers"
    _across_fault(split, "leader-cut", fault)


def test_broker_cut_from_the_active_controller(split: _Split) -> None:
    def fault() -> str:
        active, leader = split.active_controller(), split.leader(1)
        split.network.cut(leader, active)
        return f"broker {leader} (leader of p1) cut from the active controller {active}"
    _across_fault(split, "broker-controller-cut", fault)


def test_active_controller_cut_from_the_brokers(split: _Split) -> None:
    def fault() -> str:
        active = split.active_controller()
        for b in BROKERS:
            split.network.cut(active, b)
        return f"active controller {active} cut from every broker"
    _across_fault(split, "controller-brokers-cut", fault)


HANDOVER_BOUND_S = 30.0  # a session (6 s), asking the other voters (at most 2 s each), the hand-over, activation


def test_active_controller_cut_from_the_brokers_hands_over_and_metadata_goes_on(split: _Split) -> None:
    cluster = split.cluster
    wait_for(split.healthy, HEAL_BOUND_S, lambda: f"full ISRs before the fault ({split.show()})", poll_s=0.3)
    active = split.active_controller()
    seen: list[str] = []  # each different view of the cluster the controllers gave during the cut
    fenced_seen: set[int] = set()

    def handed_over() -> int | None:
        d = split.describe()
        if d is None:
            return None
        fenced_seen.update(b.node_id for b in d.brokers if b.fenced)
        view = split.show()
        if not seen or seen[-1] != view:
            seen.append(view)
        return d.active_controller_id if d.active_controller_id not in (active, -1, 0) else None

    for b in BROKERS:
        split.network.cut(active, b)
    cut_at = time.monotonic()
    try:
        new_active = wait_for(handed_over, HANDOVER_BOUND_S,
                              lambda: f"controller {active}, cut from every broker, handing over to another voter; "
                                      f"views seen: {seen}", poll_s=0.2)
        took = time.monotonic() - cut_at
        topic = f"cut-off-{int(cut_at)}"
        with Admin(cluster.bootstrap_servers, request_timeout_ms=30_000, **cluster.client_config) as admin:
            admin.create_topics([NewTopic(topic, 1, 3)])
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", request_timeout_ms=5000,
                      delivery_timeout_ms=30_000, **cluster.client_config) as producer:
            offset = producer.send(topic, b"written during the cut").get(timeout=40).offset
        created_by = time.monotonic() - cut_at
        handed_over()
    finally:
        split.network.heal()
    assert not fenced_seen, (f"brokers {sorted(fenced_seen)} were fenced although voters they reach could take over "
                             f"from controller {active}; views seen: {seen}")
    wait_for(split.healthy, HEAL_BOUND_S, lambda: f"full ISRs after the heal ({split.show()})", poll_s=0.3)
    exits = cluster.unexpected_exits()
    assert not exits, f"nodes exited: {exits}"
    print(f"controller-cut-off: controller {active} cut from every broker handed over to {new_active} in {took:.1f} s; "
          f"topic {topic} created and written (offset {offset}) {created_by:.1f} s after the cut; no broker fenced")


@dataclass
class _GroupMember:
    """A consumer group's only member, subscribed to TOPIC from the start: it commits what it read after each poll
    that read something."""

    cluster: ChaosCluster
    group: str
    stop: threading.Event = field(default_factory=threading.Event)
    seen: set[bytes] = field(default_factory=set)
    commit_sent_at: list[float] = field(default_factory=list)  # when each acknowledged commit was sent
    failures: list[str] = field(default_factory=list)

    def run(self) -> None:
        with Consumer(bootstrap_servers=self.cluster.bootstrap_servers, group_id=self.group,
                      auto_offset_reset="earliest", enable_auto_commit=False, request_timeout_ms=5000,
                      fetch_max_wait_ms=100, **self.cluster.client_config) as consumer:
            consumer.subscribe([TOPIC])
            while not self.stop.is_set():
                try:
                    got = consumer.poll(timeout_ms=200)
                    for records in got.values():
                        self.seen.update(r.value for r in records)
                    if got:
                        sent = time.monotonic()
                        consumer.commit()
                        self.commit_sent_at.append(sent)
                except Exception as exc:  # noqa: BLE001 - a retriable error while the cluster settles: shown if it lasts
                    self.failures.append(_failure(exc))


def test_group_coordinator_cut_from_the_active_controller(split: _Split) -> None:
    """A group's coordinator (the leader of its __consumer_offsets partition) cut from the active controller only:
    fenced and replaced without hearing of it. Its group must read and commit again within the bound."""
    cluster = split.cluster
    wait_for(split.healthy, HEAL_BOUND_S, lambda: f"full ISRs before the fault ({split.show()})", poll_s=0.3)
    with Admin(cluster.bootstrap_servers, request_timeout_ms=30_000, **cluster.client_config) as admin:
        admin.list_group_offsets("warm-up")  # creates __consumer_offsets
        offsets_partitions = len(admin.describe_topics([OFFSETS_TOPIC])[OFFSETS_TOPIC].partitions)

    def offsets_leaders() -> dict[int, int] | None:
        d = split.describe()
        found = {p.partition: p.leader for p in (d.partitions if d else []) if p.topic == OFFSETS_TOPIC}
        return found if len(found) == offsets_partitions and all(v > 0 for v in found.values()) else None
    leaders = wait_for(offsets_leaders, 30, "every __consumer_offsets partition led")
    group = next(g for g in (f"cut-group-{i}" for i in range(1000))
                 if leaders[partition_for_group(g, offsets_partitions)] in BROKERS)
    coordinator = leaders[partition_for_group(group, offsets_partitions)]
    writers = [_Writer(cluster, p, "group-cut") for p in range(PARTITIONS)]
    member = _GroupMember(cluster, group)
    threads = [threading.Thread(target=x.run, daemon=True) for x in [*writers, member]]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: member.commit_sent_at, 60, lambda: f"the group's first commit (failures {member.failures[-2:]})")
        active = split.active_controller()
        split.network.cut(coordinator, active)
        cut_at = time.monotonic()
        held = cut_at + HOLD_S
        try:
            def read_and_committed_again() -> bool:
                fresh = [v for w in writers for v, s in zip(w.acked, w.ack_sent_at, strict=False) if s > held]
                return sum(v in member.seen for v in fresh) >= FRESH_ACKS and any(s > held for s in member.commit_sent_at)
            wait_for(read_and_committed_again, HOLD_S + RESUME_BOUND_S,
                     lambda: (f"group {group}: records acknowledged after the cut of its coordinator {coordinator} from "
                              f"the active controller {active} read and committed within {RESUME_BOUND_S:.0f} s of "
                              f"the hold; commits after it {sum(s > held for s in member.commit_sent_at)}; last "
                              f"failures {member.failures[-2:]}; now: {split.show()}"), poll_s=0.2)
            resumed = time.monotonic() - cut_at
        finally:
            split.network.heal()
        wait_for(split.healthy, HEAL_BOUND_S, lambda: f"full ISRs after the heal ({split.show()})", poll_s=0.3)
    finally:
        for x in [*writers, member]:
            x.stop.set()
        for t in threads:
            t.join(30)
    exits = cluster.unexpected_exits()
    assert not exits, f"nodes exited: {exits}"
    print(f"group-coordinator-cut: coordinator {coordinator} cut from the active controller {active}; the group read "
          f"and committed again {resumed:.1f} s after the cut; {len(member.commit_sent_at)} commits, "
          f"{len(member.failures)} failures")


CUT_S = 20.0  # how long the active controller stays cut from one other voter


def test_active_controller_cut_from_one_voter_keeps_its_leadership(split: _Split) -> None:
    """The active controller cut from one other voter only. That voter hears no leader, and pysyncobj's elections
    made it a candidate at a higher term every election timeout; the third voter, which can reach both, took each
    higher term and deposed the leader it could still hear: the quorum changed leader over and over while the cut
    lasted, every change a stretch without metadata writes. With pre-vote (metadata_quorum/prevote.py) the cut
    voter asks first whether it could win; the third voter, hearing from a leader, says no, and nobody's term moves.
    When the cut heals the voter follows the leader again at the unchanged term."""
    cluster = split.cluster
    wait_for(split.healthy, HEAL_BOUND_S, lambda: f"full ISRs before the fault ({split.show()})", poll_s=0.3)
    active = split.active_controller()
    other = next(c for c in CONTROLLERS if c != active)

    def quorum() -> controller_pb2.DescribeQuorumResponse | None:
        try:
            r = split.controller.describe_quorum(timeout_s=3.0)
        except Exception:  # noqa: BLE001 - no voter answered for a moment: asked again
            return None
        return r if r.responder_is_active else None
    start = wait_for(quorum, 30, "the active controller's view of the quorum")
    seen: list[tuple[int, int]] = []  # (leader, term) as each poll saw it, changes only
    split.network.cut(active, other)
    cut_at = time.monotonic()
    try:
        while time.monotonic() - cut_at < CUT_S:
            q = quorum()
            if q is not None and (not seen or seen[-1] != (q.leader_id, q.term)):
                seen.append((q.leader_id, q.term))
            time.sleep(0.2)
        with Admin(cluster.bootstrap_servers, request_timeout_ms=30_000, **cluster.client_config) as admin:
            admin.create_topics([NewTopic(f"voter-cut-{int(cut_at)}", 1, 3)])  # metadata writes go on
    finally:
        split.network.heal()
    assert seen == [(active, start.term)], (
        f"the quorum's leader or term moved while controller {active} was cut from voter {other} only: "
        f"(leader, term) went {[(start.leader_id, start.term), *seen]}")

    def rejoined() -> bool:
        q = quorum()
        return q is not None and q.leader_id == active and q.term == start.term and all(
            v.lag <= 1 and v.last_contact_ms_ago < 2000 for v in q.voters)
    wait_for(rejoined, HEAL_BOUND_S, lambda: f"voter {other} following controller {active} again ({quorum()})",
             poll_s=0.3)
    exits = cluster.unexpected_exits()
    assert not exits, f"nodes exited: {exits}"
