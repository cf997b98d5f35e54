"""The properties checked after every simulated step (and after every Raft commit).

Safety, always:
- controller: at most one controller active at a time and per epoch; the state's
  active controller for epoch E is the voter that won Raft term E; the controller
  epoch and the metadata version never go back.
- metadata: per partition, leader epoch and partition epoch never go back; the leader
  is in the ISR (or there is no leader); the ISR is a non-empty subset of the replicas.
- replicas: HW <= LEO everywhere; a leader's HW never goes back while it leads one epoch.
- HW = min LEO over the ISR: a leader's HW is at most the LEO of every current member
  of its maximal ISR, and the committed prefix (below the HW) is identical on the
  leader and on every current ISR member.
- no acknowledged acks=all record is lost: each is on every current ISR member, at its
  offset, with its value. Process crashes keep the page cache; a power loss (rarer)
  drops unflushed writes, and records a power loss took from any replica are counted
  apart instead (acks=all without fsync does not promise to survive that).
"Current" member: up, and registered in the quorum with the incarnation it runs now
(a restarted broker stays in the ISR until its new registration removes it).

Liveness, after all faults end (``check_converged``): one active controller, every
broker unfenced, every partition led by its preferred replica with full ISR (the
controller's periodic preferred-leader election), all replicas of a partition
identical with HW = LEO.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replication.partition import Role

if TYPE_CHECKING:
    from brooksim.cluster import SimBroker, SimCluster
    from brooksim.quorum import Entry


class InvariantError(AssertionError):
    pass


class Invariants:
    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.version = 0
        self.controller_epoch = 0
        self.partition_epochs: dict[tuple[str, int], tuple[int, int]] = {}
        self.leader_hw: dict[tuple[int, str, tuple[str, int]], tuple[int, int]] = {}
        self.active_by_epoch: dict[int, int] = {}

    def fail(self, message: str) -> None:
        raise InvariantError(message)

    # ---- after each Raft commit ----
    def after_commit(self, entry: Entry, result: Any) -> None:
        s = self.sim.quorum.state
        if s.version < self.version:
            self.fail(f"metadata version went back {self.version} -> {s.version}")
        self.version = s.version
        if s.controller_epoch < self.controller_epoch:
            self.fail(f"controller epoch went back {self.controller_epoch} -> {s.controller_epoch}")
        self.controller_epoch = s.controller_epoch
        if s.controller_epoch > 0:
            winner = self.sim.quorum.leader_of_term.get(s.controller_epoch)
            if winner != s.active_controller_id:
                self.fail(f"controller {s.active_controller_id} is active for epoch {s.controller_epoch}, "
                          f"but Raft term {s.controller_epoch} was won by {winner}: a stale ActivateController "
                          f"committed (proposed by {entry.origin})")

    # ---- after each step ----
    def check(self) -> None:
        self._check_controllers()
        self._check_metadata()
        self._check_replicas()
        self._check_acked()

    def _check_controllers(self) -> None:
        active = self.sim.active_controllers()
        if len(active) > 1:
            self.fail(f"controllers {active} are active at the same time")
        for cid, ctl in self.sim.controllers.items():
            term = ctl._active_term
            if term < 0 or not self.sim.quorum.up[cid]:
                continue
            owner = self.active_by_epoch.setdefault(term, cid)
            if owner != cid:
                self.fail(f"controllers {owner} and {cid} both activated in epoch {term}")

    def _check_metadata(self) -> None:
        for topic in self.sim.quorum.state.topics.values():
            for index, p in enumerate(topic.partitions):
                key = (topic.name, index)
                before = self.partition_epochs.get(key, (0, 0))
                if p.leader_epoch < before[0] or p.partition_epoch < before[1]:
                    self.fail(f"{key}: epochs went back {before} -> {(p.leader_epoch, p.partition_epoch)}")
                self.partition_epochs[key] = (p.leader_epoch, p.partition_epoch)
                if not p.isr or not set(p.isr) <= set(p.replicas) or len(set(p.isr)) != len(p.isr):
                    self.fail(f"{key}: ISR {p.isr} is not a non-empty set of replicas {p.replicas}")
                if p.leader != -1 and p.leader not in p.isr:
                    self.fail(f"{key}: leader {p.leader} not in ISR {p.isr}")

    def current(self, bid: int) -> bool:
        b = self.sim.brokers.get(bid)
        reg = self.sim.quorum.state.brokers.get(bid)
        return b is not None and b.up and reg is not None and reg.incarnation_id == b.incarnation

    def _check_replicas(self) -> None:
        sim = self.sim
        for b in sim.brokers.values():
            if not b.up:
                continue
            for key, p in b.partitions.items():
                lg = p.log
                if lg.high_watermark > lg.log_end_offset:
                    self.fail(f"broker {b.node_id} {key}: HW {lg.high_watermark} > LEO {lg.log_end_offset}")
                hw_key = (b.node_id, b.incarnation, key)
                if p.role is Role.LEADER:
                    epoch, hw = sim_get(self.leader_hw, hw_key)
                    if epoch == p.leader_epoch and lg.high_watermark < hw:
                        self.fail(f"leader {b.node_id} {key}: HW went back {hw} -> {lg.high_watermark} "
                                  f"in leader epoch {epoch}")
                    self.leader_hw[hw_key] = (p.leader_epoch, lg.high_watermark)
                    self._check_committed_prefix(b, key)
                else:
                    self.leader_hw.pop(hw_key, None)

    def _check_committed_prefix(self, leader: SimBroker, key: tuple[str, int]) -> None:
        p = leader.partitions[key]
        if not self.current(leader.node_id):
            return
        hw = p.log.high_watermark
        prefix = p.log.records(hw)
        # Members in the leader's view and in the committed ISR: a broker that restarted
        # with a shorter log leaves the committed ISR when it registers again, before the
        # leader hears of it.
        topic = self.sim.quorum.state.topics.get(key[0])
        if topic is None:
            return
        committed = topic.partitions[key[1]]
        if committed.leader != leader.node_id or committed.leader_epoch != p.leader_epoch:
            return  # a deposed leader that has not heard yet: its HW commits nothing new
        committed_isr = committed.isr
        for rid in p.maximal_isr():
            if rid == leader.node_id or rid not in committed_isr or not self.current(rid):
                continue
            f = self.sim.brokers[rid]
            lg = f.logs.get(key)
            leo = lg.log_end_offset if lg is not None else 0
            if leo < hw:
                self.fail(f"{key}: leader {leader.node_id} HW {hw} > LEO {leo} of ISR member {rid}")
            if (lg.records(hw) if lg is not None else []) != prefix:
                self.fail(f"{key}: committed prefix (below HW {hw}) differs between leader {leader.node_id} "
                          f"and ISR member {rid}")

    def _check_acked(self) -> None:
        sim = self.sim
        state = sim.quorum.state
        for key, acked in sim.acked.items():
            topic = state.topics.get(key[0])
            if topic is None:
                continue
            ps = topic.partitions[key[1]]
            exempt = sim.lost_with_last_replica.get(key, set())
            for rid in ps.isr:
                if not self.current(rid):
                    continue
                lg = sim.brokers[rid].logs.get(key)
                for offset, value in acked.items():
                    if offset in exempt:
                        continue
                    got = lg.record_at(offset) if lg is not None else None
                    if got is None or got[1] != value:
                        self.fail(f"{key}: acknowledged acks=all record {value!r} at offset {offset} is "
                                  f"{'missing' if got is None else repr(got[1])} on ISR member {rid}")

    # ---- crashes ----
    def after_power_loss(self, crashed: SimBroker, key: tuple[str, int], end: int, end_before: int) -> None:
        """Offsets a power loss took from a replica are no longer promised, acked before or after.

        acks=all promises survival across replica failures, not across the loss of
        unflushed writes: the broker may still be the last ISR member, be elected before
        its session expires, or the leader may count its last fetch position (Kafka's
        KIP-966 territory). Acked records at those offsets are counted apart
        (``acked_at_risk_power_loss``) instead of being checked.
        """
        if end >= end_before:
            return
        exempt = self.sim.lost_with_last_replica.setdefault(key, set())
        exempt.update(range(end, end_before))
        self.sim.log(f"  {key[0]}-{key[1]}: offsets {end}..{end_before - 1} at risk: broker {crashed.node_id} "
                     f"lost them unflushed")

    # ---- liveness ----
    def converged(self) -> bool:
        try:
            self.check_converged()
        except InvariantError:
            return False
        return True

    def check_converged(self) -> None:
        sim = self.sim
        active = sim.active_controllers()
        if len(active) != 1:
            self.fail(f"no single active controller after healing: active={active}, "
                      f"Raft leader {sim.quorum.leader} term {sim.quorum.term}, "
                      f"state says {sim.quorum.state.active_controller_id} epoch "
                      f"{sim.quorum.state.controller_epoch}")
        state = sim.quorum.state
        for bid in sim.brokers:
            reg = state.brokers.get(bid)
            if reg is None or reg.fenced:
                self.fail(f"broker {bid} is not registered and unfenced after healing")
        for topic in state.topics.values():
            for index, ps in enumerate(topic.partitions):
                key = (topic.name, index)
                if ps.reassigning:
                    self.fail(f"{key}: a reassignment is still in progress after healing: replicas {ps.replicas}, "
                              f"adding {ps.adding}, removing {ps.removing}, ISR {ps.isr}")
                if ps.leader != ps.replicas[0] or sorted(ps.isr) != sorted(ps.replicas):
                    # Leadership returns to the preferred replica (auto.leader.rebalance.enable).
                    self.fail(f"{key}: not healed: leader {ps.leader} ISR {ps.isr} replicas {ps.replicas}")
                leader_log = sim.brokers[ps.leader].logs[key]
                for rid in ps.replicas:
                    lg = sim.brokers[rid].logs[key]
                    if lg.records() != leader_log.records() or lg.high_watermark != lg.log_end_offset:
                        self.fail(f"{key}: replica {rid} (LEO {lg.log_end_offset}, HW {lg.high_watermark}) "
                                  f"differs from leader {ps.leader} (LEO {leader_log.log_end_offset}) after healing")


def sim_get(d: dict[Any, tuple[int, int]], key: Any) -> tuple[int, int]:
    return d.get(key, (-1, -1))
