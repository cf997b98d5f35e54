"""The nemesis: a seeded schedule of faults, and the loop that injects, heals and times them.

The schedule (kinds, targets' roles, hold and gap times, which node of a role) comes from
the seed alone, so a seed replays the same schedule; the concrete node a role resolves to
("the active controller", "the leader of partition 2") is looked up at injection time.
One step at a time: inject, hold, heal, then measure how long until the cluster takes
acks=all writes on every partition again (the recovery time), then a quiet gap. A step is
one fault, or with ``overlap`` > 0 sometimes two or three at once (two nodes down: no
quorum and no ISR of 2; all three: a full outage), which only liveness after the heal,
not availability during the step, can survive.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from client import errors
from client.admin import Admin
from tests.chaos.netns import LoopbackNetwork, NamespaceNetwork
from tests.chaos.nodes import ChaosCluster
from tests.chaos.workload import History, Probe

log = logging.getLogger(__name__)

PROCESS_KINDS = ("kill", "pause")
NETWORK_KINDS = ("isolate", "cut", "strand")
SPLIT_ONLY_KINDS = ("strand",)  # faults that need controller-only voters (a split-mode cluster)
TARGETS = ("random", "controller", "leader")
STRAND_TARGETS = ("controller", "random")  # the active controller, or any controller-only voter
SCHEDULE_MAX = 10_000
STEP_FAULTS_MAX = 3


@dataclass(frozen=True)
class Fault:
    kind: str  # kill | pause | isolate | cut | strand (a controller cut from every broker, split mode only)
    target: str  # random | controller | leader (cut: the pair is chosen at random; strand: controller | random)
    pick: int  # which node/partition among the candidates (modulo their number)
    hold_s: float  # how long the fault lasts before it is healed
    gap_s: float  # quiet time after recovery, before the next fault
    with_next: bool = False  # the next fault is injected together with this one (same step)


def schedule(seed: int, duration_s: float, kinds: tuple[str, ...], hold_s: tuple[float, float] = (1.0, 8.0),
             gap_s: tuple[float, float] = (1.0, 5.0), overlap: float = 0.0) -> list[Fault]:
    """Faults whose hold + gap time fills ``duration_s``; the same seed gives the same list.

    ``overlap`` is the chance that a fault shares its step with the next one (at most
    STEP_FAULTS_MAX per step); a step lasts its longest hold.
    """
    rng = random.Random(seed)
    faults: list[Fault] = []
    planned = 0.0
    in_step = 0
    while planned < duration_s and len(faults) < SCHEDULE_MAX:
        kind = rng.choice(kinds)
        target = "random" if kind == "cut" else rng.choice(STRAND_TARGETS if kind == "strand" else TARGETS)
        in_step += 1
        with_next = in_step < STEP_FAULTS_MAX and rng.random() < overlap
        fault = Fault(kind, target, rng.randrange(1 << 16), round(rng.uniform(*hold_s), 2),
                      round(rng.uniform(*gap_s), 2), with_next)
        faults.append(fault)
        if not with_next:
            in_step = 0
            planned += max(f.hold_s for f in _last_step(faults)) + fault.gap_s
    return faults


def _last_step(faults: list[Fault]) -> list[Fault]:
    step = [faults[-1]]
    for f in reversed(faults[:-1]):
        if not f.with_next:
            break
        step.insert(0, f)
    return step


def steps(faults: list[Fault]) -> list[list[Fault]]:
    """The schedule grouped into steps (faults injected together)."""
    out: list[list[Fault]] = []
    current: list[Fault] = []
    for f in faults:
        current.append(f)
        if not f.with_next:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


@dataclass
class StepResult:
    index: int
    kinds: list[str]
    targets: list[str]
    nodes: list[list[int]]
    recovery_s: float | None  # None: not writable again within the bound


class Nemesis:
    def __init__(self, cluster: ChaosCluster, network: NamespaceNetwork | LoopbackNetwork, topic: str,
                 partitions: int, history: History, probe: Probe, recovery_bound_s: float,
                 should_stop: Callable[[], bool]) -> None:
        self.cluster = cluster
        self.network = network
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.probe = probe
        self.recovery_bound_s = recovery_bound_s
        self.should_stop = should_stop
        self.results: list[StepResult] = []

    # ---- target resolution (at injection time; falls back to the seeded random node)
    def _resolve(self, fault: Fault) -> list[int]:
        nodes = self.cluster.node_ids
        fallback = nodes[fault.pick % len(nodes)]
        if fault.kind == "cut":
            a = fallback
            others = [n for n in nodes if n != a]
            return [a, others[(fault.pick >> 8) % len(others)]]
        if fault.kind == "strand":
            return [self._strand_controller(fault), *self.cluster.broker_ids]
        if fault.target == "random":
            return [fallback]
        try:
            with Admin(self.cluster.bootstrap_servers, request_timeout_ms=3000, **self.cluster.client_config) as admin:
                if fault.target == "controller":
                    node = admin.describe_cluster().controller_id
                else:
                    parts = admin.describe_topics([self.topic])[self.topic].partitions
                    node = parts[fault.pick % self.partitions].leader
        except errors.BrookError as exc:
            log.info("could not resolve the %s (%r): node %d instead", fault.target, exc, fallback)
            return [fallback]
        return [node] if node in nodes else [fallback]

    def _strand_controller(self, fault: Fault) -> int:
        """The controller-only voter a strand cuts off: the active controller (target "controller"), else the
        seeded one."""
        brokers = set(self.cluster.broker_ids)
        voters = [n for n in self.cluster.controller_ids if n not in brokers]
        if not voters:
            raise ValueError("a strand needs controller-only voters (--controllers)")
        fallback = voters[fault.pick % len(voters)]
        if fault.target != "controller":
            return fallback
        try:
            with Admin(self.cluster.bootstrap_servers, request_timeout_ms=3000, **self.cluster.client_config) as admin:
                active = admin.describe_cluster().controller_id
        except errors.BrookError as exc:
            log.info("could not resolve the active controller (%r): node %d instead", exc, fallback)
            return fallback
        return active if active in voters else fallback

    def _inject(self, fault: Fault, nodes: list[int]) -> None:
        if fault.kind == "kill":
            self.cluster.kill(nodes[0])
        elif fault.kind == "pause":
            self.cluster.pause(nodes[0])
        elif fault.kind == "isolate":
            self.network.isolate(nodes[0])
        elif fault.kind == "cut":
            self.network.cut(nodes[0], nodes[1])
        elif fault.kind == "strand":  # the controller still reaches the other voters; the brokers reach them too
            for broker in nodes[1:]:
                self.network.cut(nodes[0], broker)
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")

    def heal(self) -> None:
        """Undo every fault: restart killed nodes, resume paused ones, restore the network."""
        self.network.heal()
        for node_id in self.cluster.node_ids:
            if node_id in self.cluster.paused:
                self.cluster.resume(node_id)
            if not self.cluster.is_running(node_id):
                self.cluster.start_node(node_id)

    def run(self, faults: list[Fault], deadline: float) -> None:
        for index, step in enumerate(steps(faults)):
            if time.monotonic() >= deadline or self.should_stop():
                break
            hit: list[list[int]] = []
            for fault in step:  # resolved one after the other: "the controller" after a kill is the new one
                nodes = self._resolve(fault)
                log.info("step %d: %s %s -> nodes %s for %.1f s", index, fault.kind, fault.target, nodes,
                         fault.hold_s)
                self.history.record(e="fault", i=index, nodes=nodes, **asdict(fault))
                self._inject(fault, nodes)
                hit.append(nodes)
            time.sleep(max(f.hold_s for f in step))  # the fault's duration is the point, not a wait
            self.heal()
            self.history.record(e="heal", i=index)
            recovery = self.probe.writable_within(self.recovery_bound_s)
            self.history.record(e="recovered", i=index, s=None if recovery is None else round(recovery, 3))
            log.info("step %d healed; writable again after %s s", index,
                     f"more than {self.recovery_bound_s:.0f}" if recovery is None else f"{recovery:.1f}")
            self.results.append(StepResult(index, [f.kind for f in step], [f.target for f in step], hit, recovery))
            if recovery is None:
                break  # the cluster did not recover: stop injecting, the run fails on liveness
            time.sleep(step[-1].gap_s)
