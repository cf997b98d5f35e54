"""The figures MetadataState keeps as records are applied, and DescribeCluster's view, against a recount.

The state keeps per-broker replica, preferred-leader and leader counts, the partition and offline
totals and the set of partitions being reassigned, so the controller reads them in O(1) or
O(brokers) under the state lock instead of walking every partition. DescribeCluster's view
(metadata_quorum/cluster_view.py) keeps its own records from the keys each apply touched. Both
must always equal what a full walk of the state gives: random histories (topics made, grown,
deleted and made again with the same id, leader and ISR changes, reassignments, brokers fenced,
shut down, re-registered and unregistered, unclean elections, snapshots restored, older ones too)
check it after every step. Pure: no clock, no socket.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from metadata_quorum import commands as c
from metadata_quorum import features
from metadata_quorum.cluster_view import ClusterView, broker_record, partition_record, topic_record
from metadata_quorum.election import NO_LEADER
from metadata_quorum.state import MetadataState
from proto import controller_pb2 as pb

BROKERS = range(1, 7)
NAMES = [f"t{i}" for i in range(8)]


def recount(s: MetadataState) -> dict[str, Any]:
    """The figures from a walk of every partition (what the queries did before they were kept)."""
    replicas: dict[int, int] = {}
    preferred: dict[int, int] = {}
    leading: dict[int, int] = {}
    moving: list[tuple[str, int]] = []
    total = 0
    for t in s.topics.values():
        for i, p in enumerate(t.partitions):
            total += 1
            for r in p.replicas:
                replicas[r] = replicas.get(r, 0) + 1
            preferred[p.replicas[0]] = preferred.get(p.replicas[0], 0) + 1
            leading[p.leader] = leading.get(p.leader, 0) + 1
            if p.adding or p.removing:
                moving.append((t.name, i))
    return {"total": total, "replicas": replicas, "preferred": preferred, "leading": leading,
            "offline": leading.get(NO_LEADER, 0), "moving": sorted(moving)}


def kept(s: MetadataState) -> dict[str, Any]:
    """The same figures as the state keeps them (the private maps too: no zero entries left behind)."""
    ids = set(s._replicas_on) | set(s._preferred_on) | set(s._leading) | set(BROKERS) | {NO_LEADER}
    assert all(v > 0 for m in (s._replicas_on, s._preferred_on, s._leading) for v in m.values())
    assert sorted(s._reassigning) == sorted((s.topics[n].topic_id, i) for n, i in recount(s)["moving"])
    return {"total": s.partition_count(),
            "replicas": {b: s.replica_count(b) for b in ids if s.replica_count(b)},
            "preferred": {b: s.preferred_leader_count(b) for b in ids if s.preferred_leader_count(b)},
            "leading": {b: s.leadership_count(b) for b in ids if s.leadership_count(b)},
            "offline": s.offline_partitions(),
            "moving": [(n, i) for n, i, _ in s.reassignments()]}


def full_answer(s: MetadataState, cluster_id: str, min_insync: int) -> pb.DescribeClusterResponse:
    """DescribeCluster as it was built before the view: every record from the state, in its order."""
    return pb.DescribeClusterResponse(
        cluster_id=cluster_id, active_controller_id=s.active_controller_id, default_min_insync_replicas=min_insync,
        metadata_version=s.version, brokers=[broker_record(b) for b in s.brokers.values()],
        topics=[topic_record(t) for t in s.topics.values()],
        partitions=[partition_record(t, i, p) for t in s.topics.values() for i, p in enumerate(t.partitions)])


class History:
    """Random commands against one state, valid most of the time (refusals must change nothing)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.state = MetadataState(changelog_max_keys=200)
        self.applied: list[Any] = []
        self.snapshots: list[dict[str, Any]] = []
        self.deleted_ids: list[str] = []
        self.next_id = 0
        self.term = 0
        self.accepted: dict[str, int] = {}  # command type -> how many were applied (not refused)
        self.most_partitions = 0
        self.reused_ids = 0  # creates naming the id of a deleted topic

    def apply(self, cmd: Any) -> None:
        self.applied.append(cmd)
        result = self.state.apply(cmd)
        ok = result.ok and not (isinstance(cmd, c.ChangePartition) and result.value[0].error_code)
        if ok:
            self.accepted[type(cmd).__name__] = self.accepted.get(type(cmd).__name__, 0) + 1
        self.most_partitions = max(self.most_partitions, self.state.partition_count())

    def _broker(self) -> int:
        return self.rng.choice(list(BROKERS))

    def _epoch(self, b: int) -> int:
        broker = self.state.brokers.get(b)
        return broker.broker_epoch if broker is not None else 1

    def _partition(self) -> tuple[str, int, Any] | None:
        if not self.state.topics:
            return None
        t = self.state.topics[self.rng.choice(sorted(self.state.topics))]
        i = self.rng.randrange(len(t.partitions))
        return t.name, i, t.partitions[i]

    def _assignments(self, count: int, rf: int) -> list[list[int]]:
        registered = sorted(self.state.brokers) or [1]
        return [self.rng.sample(registered, min(rf, len(registered))) for _ in range(count)]

    def step(self) -> str:
        """One random command (or a snapshot restore); returns what it was."""
        rng, s = self.rng, self.state
        action = rng.choices(
            ["register", "fence", "unfence", "shutdown", "unregister", "create", "grow", "delete", "isr", "leader",
             "move", "cancel", "complete", "unclean", "cluster_unclean", "activate", "restore", "restore_old",
             "level5"],
            [2, 3, 8, 2, 1, 8, 4, 2, 8, 4, 5, 2, 6, 2, 1, 1, 1, 1, 0.3])[0]
        if action == "register":
            b = self._broker()
            self.apply(c.RegisterBroker(b, f"inc-{b}-{rng.randrange(3)}", [["BROKER", "h", 9000 + b]],
                                        rng.choice(["", "r1", "r2"])))
        elif action in ("fence", "unfence", "shutdown"):
            b = self._broker()
            kind = {"fence": c.FenceBroker, "unfence": c.UnfenceBroker, "shutdown": c.BeginControlledShutdown}[action]
            self.apply(kind(b, self._epoch(b) - (rng.random() < 0.1)))
        elif action == "unregister":
            self.apply(c.UnregisterBroker(self._broker()))
        elif action == "create":
            if self.deleted_ids and rng.random() < 0.3:
                topic_id = rng.choice(self.deleted_ids)  # an id used before: the view must not mix them
                self.reused_ids += topic_id not in s.topics_by_id
            else:
                self.next_id += 1
                topic_id = f"id-{self.next_id}"
            self.apply(c.CreateTopic(rng.choice(NAMES), topic_id, {},
                                     self._assignments(rng.randint(1, 6), rng.randint(1, 3))))
        elif action == "grow":
            if s.topics:
                t = s.topics[rng.choice(sorted(s.topics))]
                self.apply(c.CreatePartitions(t.name, t.topic_id, len(t.partitions),
                                              self._assignments(rng.randint(1, 3), t.partitions[0].replication_factor)))
        elif action == "delete":
            if s.topics:
                t = s.topics[rng.choice(sorted(s.topics))]
                self.deleted_ids.append(t.topic_id)
                self.apply(c.DeleteTopic(t.name, t.topic_id))
        elif action in ("isr", "leader") and (found := self._partition()):
            name, i, p = found
            eligible = [r for r in p.replicas if r in s.brokers and s.brokers[r].eligible]
            if action == "isr":
                isr = [r for r in p.replicas if r == p.leader or (r in eligible and rng.random() < 0.6)]
                item = c.PartitionChangeItem(name, i, p.partition_epoch, new_isr=isr or None)
            else:
                leader = rng.choice(eligible or [p.leader])
                isr = list(dict.fromkeys([leader] + [r for r in p.isr if r in p.replicas]))
                item = c.PartitionChangeItem(name, i, p.partition_epoch - (rng.random() < 0.1), new_isr=isr,
                                             new_leader=leader)
            self.apply(c.ChangePartition([item]))
        elif action == "move" and (found := self._partition()):
            name, i, p = found
            # From level 5 a move may change the partition's replica count (refused below it).
            size = p.replication_factor if rng.random() < 0.6 else rng.randint(1, 4)
            self.apply(c.AlterReassignment(name, i, p.partition_epoch,
                                           rng.sample(sorted(s.brokers) or [1], min(len(s.brokers) or 1, size))))
        elif action == "level5":
            self.apply(c.UpdateFeature(features.METADATA_VERSION, features.REPLICATION_FACTOR_CHANGE))
        elif action == "cancel" and (found := self._partition()):
            name, i, p = found
            self.apply(c.AlterReassignment(name, i, p.partition_epoch, None))
        elif action == "complete" and s.reassignments():
            name, i, p = rng.choice(s.reassignments())
            for r in p.target:  # the new replicas live (as a move waits for), then in sync
                if r in s.brokers and s.brokers[r].fenced:
                    self.apply(c.UnfenceBroker(r, self._epoch(r)))
            p = s.topics[name].partitions[i]
            catching_up = [r for r in p.target if r not in p.isr and s.brokers.get(r) and s.brokers[r].eligible]
            if catching_up and p.leader != NO_LEADER:
                self.apply(c.ChangePartition([c.PartitionChangeItem(name, i, p.partition_epoch,
                                                                    new_isr=p.isr + catching_up)]))
            self.apply(c.CompleteReassignment(name, i, s.topics[name].partitions[i].partition_epoch))
        elif action == "unclean" and s.topics:
            t = s.topics[rng.choice(sorted(s.topics))]
            self.apply(c.AlterConfigs(t.name, t.topic_id, {"unclean.leader.election.enable": rng.choice(["true",
                                                                                                          "false"])}))
        elif action == "cluster_unclean":
            self.apply(c.AlterClusterConfigs({"unclean.leader.election.enable": rng.choice(["true", "false"])}, []))
        elif action == "activate":
            self.term += 1
            self.apply(c.ActivateController(100 + self.term % 3, self.term))
        elif action == "restore":
            snap = s.to_snapshot()
            self.snapshots.append(snap)
            s.restore(snap)  # what a follower installing the leader's snapshot does, in place
        elif action == "restore_old" and self.snapshots:
            s.restore(rng.choice(self.snapshots))  # back in time: every figure recounted
        return action


@pytest.mark.parametrize("seed", range(16))
def test_kept_figures_and_describe_cluster_equal_a_recount_after_every_step(seed: int) -> None:
    h = History(seed)
    lock = threading.RLock()

    def read(fn: Callable[[MetadataState], Any]) -> Any:
        with lock:
            return fn(h.state)

    view = ClusterView(read, reload_slice=3)  # small slices: reloads take several holds
    for b in BROKERS:
        h.apply(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "h", 9000 + b]], ""))
        h.apply(c.UnfenceBroker(b, h._epoch(b)))
    actions = []
    for step in range(500):
        actions.append(h.step())
        assert kept(h.state) == recount(h.state), (seed, step, actions[-5:])
        if step % 3 == 0 or actions[-1].startswith("restore"):  # also let changes pile up between calls
            answer = view.describe("cid", 2)
            assert answer == full_answer(h.state, "cid", 2), (seed, step, actions[-5:])
    # The history did what it is for (each kind of change applied, not only refused).
    assert {"restore"} <= set(actions)
    assert {"CreateTopic", "CreatePartitions", "DeleteTopic", "ChangePartition", "AlterReassignment",
            "CompleteReassignment", "FenceBroker", "UnfenceBroker", "RegisterBroker"} <= set(h.accepted), h.accepted
    assert h.most_partitions >= 10 and h.reused_ids > 0
    # Replayable: the same commands on a new state give the same state and the same figures.
    if "restore_old" not in actions:  # (an old snapshot restored is no command: nothing to replay)
        replayed = MetadataState()
        for cmd in h.applied:
            replayed.apply(cmd)
        assert replayed == h.state
        assert kept(replayed) == kept(h.state)
    # And a state made from a snapshot counts the same.
    assert kept(MetadataState.from_snapshot(h.state.to_snapshot())) == recount(h.state)


def test_the_view_catches_up_with_changes_applied_between_its_holds() -> None:
    """Commands applied between the holds of one DescribeCluster (as Raft applies them while the view
    loads slice by slice): the answer is the state as of the call's last hold."""
    h = History(99)
    for b in BROKERS:
        h.apply(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "h", 9000 + b]], ""))
        h.apply(c.UnfenceBroker(b, h._epoch(b)))
    for _ in range(60):
        h.step()
    meddle = [True]

    def read(fn: Callable[[MetadataState], Any]) -> Any:
        if meddle[0]:
            for _ in range(2):
                h.step()
        return fn(h.state)

    views = [ClusterView(read, reload_slice=size) for size in (1, 4, 50)]
    for _ in range(40):
        for view in views:
            meddle[0] = True
            answer = view.describe("cid", 1)
            meddle[0] = False  # the state as the call's last hold saw it
            assert answer == full_answer(h.state, "cid", 1)
        if h.rng.random() < 0.1:
            h.state.restore(h.state.to_snapshot())


def test_a_snapshot_restored_before_every_hold_ends_in_one_whole_load() -> None:
    """The loop is bounded: when each sliced load is undone by a restore, the last resort loads all at once."""
    h = History(7)
    for b in BROKERS:
        h.apply(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "h", 9000 + b]], ""))
        h.apply(c.UnfenceBroker(b, h._epoch(b)))
    for i in range(5):
        h.apply(c.CreateTopic(f"r{i}", f"rid-{i}", {}, [[1, 2], [2, 3], [3, 4]]))
    holds = [0]

    def read(fn: Callable[[MetadataState], Any]) -> Any:
        holds[0] += 1
        h.state.restore(h.state.to_snapshot())
        return fn(h.state)

    view = ClusterView(read, reload_slice=2)
    assert view.describe("cid", 1) == full_answer(h.state, "cid", 1)
    assert view.most_copied_in_one_hold == h.state.partition_count() + len(h.state.topics)
    assert holds[0] < 100


def test_a_second_reader_of_one_state_loads_everything() -> None:
    h = History(5)
    for b in BROKERS:
        h.apply(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "h", 9000 + b]], ""))
        h.apply(c.UnfenceBroker(b, h._epoch(b)))
    first, second = ClusterView(lambda fn: fn(h.state)), ClusterView(lambda fn: fn(h.state))
    for _ in range(50):
        h.step()
        for view in (first, second):  # each takes the keys from the other: both must still be right
            assert view.describe("cid", 1) == full_answer(h.state, "cid", 1)


def test_the_change_set_stays_bounded_without_a_reader() -> None:
    """No DescribeCluster for a long time while topics come and go: the keys the view has not taken stay
    under the state's size (then it loads everything once, and is right)."""
    s = MetadataState()
    view = ClusterView(lambda fn: fn(s))
    epoch = s.apply(c.RegisterBroker(1, "i", [["BROKER", "h", 9001]])).value
    s.apply(c.UnfenceBroker(1, epoch))
    view.describe("cid", 1)
    for i in range(300):
        s.apply(c.CreateTopic(f"t{i}", f"id{i}", {}, [[1]] * 20))
        s.apply(c.DeleteTopic(f"t{i}", f"id{i}"))
        assert len(s._unseen) <= s.partition_count() + len(s.topics) + 1024
    assert view.describe("cid", 1) == full_answer(s, "cid", 1)


def test_a_call_that_fails_half_way_leaves_no_half_view_behind() -> None:
    h = History(11)
    for b in BROKERS:
        h.apply(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "h", 9000 + b]], ""))
        h.apply(c.UnfenceBroker(b, h._epoch(b)))
    for i in range(4):
        h.apply(c.CreateTopic(f"f{i}", f"fid-{i}", {}, [[1, 2]] * 5))
    holds = [0]

    def read(fn: Callable[[MetadataState], Any]) -> Any:
        holds[0] += 1
        if holds[0] == 3:  # the second slice of the first load
            raise RuntimeError("a bug")
        return fn(h.state)

    view = ClusterView(read, reload_slice=4)
    with pytest.raises(RuntimeError):
        view.describe("cid", 1)
    assert view.describe("cid", 1) == full_answer(h.state, "cid", 1)
