"""The active controller does not fence brokers for the time it did not run itself.

One real voter (pysyncobj on loopback) and its QuorumController, ticked by the test on a clock the
test moves: a jump of the clock between two ticks is a stall of the controller (its process stopped,
its host paused), during which no heartbeat could be counted. Before the fix, the first tick after
such a stall found every session run out and fenced every broker, a cluster-wide outage caused by
nobody but the controller.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from quorum_helpers import single_voter
from waiting import wait_for

from metadata_quorum.controller import ControllerConfig, QuorumController
from proto import common_pb2
from proto import controller_pb2 as pb

SESSION_S = 9.0  # ControllerConfig's broker.session.timeout.ms
INTERVAL_S = 2.0  # ... and broker.heartbeat.interval.ms


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def voter(tmp_path) -> Iterator[tuple[QuorumController, Clock]]:  # type: ignore[no-untyped-def]
    clock = Clock()
    with single_voter(tmp_path / "v1", ControllerConfig(1, "stall"), clock=clock) as ctl:
        yield ctl, clock


def _register(ctl: QuorumController, broker: int, *, supported: int = 0, incarnation: str = "") -> int:
    r = ctl.register_broker(pb.RegisterBrokerRequest(
        node_id=broker, incarnation_id=incarnation or f"i{broker}", cluster_id="stall",
        previous_incarnation_id=f"i{broker}" if incarnation else "", supported_metadata_level=supported,
        endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19000 + broker)]), 30)
    _heartbeat(ctl, broker, r.broker_epoch)
    assert not _fenced(ctl, broker)
    return r.broker_epoch


def _heartbeat(ctl: QuorumController, broker: int, epoch: int) -> None:
    ctl.heartbeat(pb.BrokerHeartbeatRequest(node_id=broker, broker_epoch=epoch,
                                            current_metadata_version=1 << 40), 30)


def _fenced(ctl: QuorumController, broker: int) -> bool:
    return ctl.raft.read(lambda s: s.brokers[broker].fenced)


def _tick_for(ctl: QuorumController, clock: Clock, seconds: float, step_s: float = 0.1) -> None:
    """Tick as the node does, every ``step_s`` of the test's clock, for ``seconds``."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now += step_s
        ctl.tick()


def _settle(ctl: QuorumController) -> None:
    """Wait until any fencing proposed by the last ticks has been applied."""
    wait_for(lambda: not ctl._fencing or (ctl.tick() or False), 30, "the proposed fencing to be applied")


def test_a_stall_of_the_controller_fences_no_broker_and_a_silent_one_is_still_fenced(
        voter: tuple[QuorumController, Clock]) -> None:
    ctl, clock = voter
    epochs = {b: _register(ctl, b) for b in (1, 2)}
    _tick_for(ctl, clock, 1.0)

    clock.now += 30.0  # stopped for 30 s: no heartbeat and no tick could run
    ctl.tick()
    _settle(ctl)
    assert not _fenced(ctl, 1) and not _fenced(ctl, 2), \
        "the first tick after the controller's own 30 s stall fenced brokers that could not be heard"

    # After the stall, broker 1 heartbeats as usual and broker 2 stays silent: a running controller
    # still fences a silent broker once its session runs out, counting only time it ran.
    end = clock.now + SESSION_S + 2 * INTERVAL_S
    while clock.now < end and not _fenced(ctl, 2):
        _heartbeat(ctl, 1, epochs[1])
        _tick_for(ctl, clock, INTERVAL_S / 2)
        _settle(ctl)
    assert _fenced(ctl, 2), "a broker silent for a whole session after the stall was not fenced"
    assert not _fenced(ctl, 1), "a heartbeating broker was fenced"


def test_a_slow_tick_thread_still_fences_a_dead_broker(voter: tuple[QuorumController, Clock]) -> None:
    """Ticks 3 s apart (one heartbeat interval plus 1 s): leases age 2 s a tick, not 0."""
    ctl, clock = voter
    _register(ctl, 1)
    ticks = 0
    while not _fenced(ctl, 1):
        assert ticks < 10, f"a dead broker is not fenced after {ticks} ticks 3 s apart"
        clock.now += INTERVAL_S + 1.0
        ctl.tick()
        _settle(ctl)
        ticks += 1
    assert ticks >= SESSION_S / INTERVAL_S, f"fenced after {ticks} ticks: too soon"


def test_heartbeats_counted_during_a_held_tick_thread_are_not_pushed_past_now(
        voter: tuple[QuorumController, Clock]) -> None:
    """Only the tick thread was held: heartbeats went on and their leases are fresh; extending them
    must not move a lease into the future, where a later silence would go unseen for longer."""
    ctl, clock = voter
    epoch = _register(ctl, 1)
    clock.now += 20.0
    _heartbeat(ctl, 1, epoch)
    ctl.tick()
    assert ctl._leases[1] <= clock.now
    _tick_for(ctl, clock, SESSION_S + 1.0)
    _settle(ctl)
    assert _fenced(ctl, 1), "a broker silent for a session after its last heartbeat was not fenced"


def test_a_move_no_live_target_can_lead_is_not_proposed_at_every_tick(voter: tuple[QuorumController, Clock]) -> None:
    """A shrink onto a replica that is in the ISR but stopped (the partition offline): completing it would be refused
    when applied (no live target replica can lead). The controller proposed it at every tick, ten refused entries a
    second written to the log for as long as the broker stayed down (audit: 295 a second for 30 partitions). Now it
    waits, and completes the move once the broker is back."""
    from metadata_quorum import commands as c
    from metadata_quorum import features

    ctl, clock = voter
    ctl.update_features(pb.UpdateFeaturesRequest(name=features.METADATA_VERSION,
                                                 level=features.REPLICATION_FACTOR_CHANGE), 30)
    epochs = {b: _register(ctl, b, supported=features.SUPPORTED_MAX) for b in (1, 2)}
    ctl.create_topics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
        name="t", assignments=[pb.ReplicaList(replicas=[1, 2])])]), 30)
    for silent in (2, 1):  # broker 2 leaves the ISR, then broker 1, the last one, stops: the partition is offline
        while not _fenced(ctl, silent):
            for b in epochs:
                if b != silent and not _fenced(ctl, b):
                    _heartbeat(ctl, b, epochs[b])
            _tick_for(ctl, clock, INTERVAL_S / 2)
            _settle(ctl)
    part = ctl.raft.read(lambda s: s.topics["t"].partitions[0])
    assert (part.leader, part.isr) == (-1, [1]), part
    moved = ctl.alter_reassignments(pb.AlterPartitionReassignmentsRequest(partitions=[
        pb.ReassignablePartition(topic="t", partition=0, replicas=[1])]), 30)
    assert moved.results[0].error_code == 0, moved
    proposed: list[object] = []
    submit = ctl._submit
    ctl._submit = lambda cmd: (proposed.append(cmd), submit(cmd))[1]  # type: ignore[method-assign]
    try:
        _tick_for(ctl, clock, 3.0)
        assert not [p for p in proposed if isinstance(p, c.CompleteReassignment)], proposed
        # Broker 1 comes back (a new incarnation, as after a restart): the move completes, led by it.
        _register(ctl, 1, supported=features.SUPPORTED_MAX, incarnation="i1-again")
        wait_for(lambda: (ctl.tick() or True) and ctl.raft.read(
            lambda s: (s.topics["t"].partitions[0].replicas, s.topics["t"].partitions[0].leader)) == ([1], 1), 30,
            "the move completed once broker 1 was back")
    finally:
        del ctl._submit
