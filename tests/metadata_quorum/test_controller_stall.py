"""The active controller does not fence brokers for the time it did not run itself.

One real voter (pysyncobj on loopback) and its QuorumController, ticked by the test on a clock the
test moves: a jump of the clock between two ticks is a stall of the controller (its process stopped,
its host paused), during which no heartbeat could be counted. Before the fix, the first tick after
such a stall found every session run out and fenced every broker, a cluster-wide outage caused by
nobody but the controller.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from quorum_helpers import free_port
from waiting import wait_for

from metadata_quorum.controller import ControllerConfig, QuorumController
from metadata_quorum.raft import MetadataRaft
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
    raft = MetadataRaft(f"127.0.0.1:{free_port()}", [], tmp_path / "v1", password=secrets.token_urlsafe(24))
    clock = Clock()
    try:
        raft.wait_bound()
        ctl = QuorumController(ControllerConfig(1, "stall"), raft, clock=clock)

        def active() -> bool:
            ctl.tick()
            return ctl.is_active()

        wait_for(active, 30, "the single voter to become the active controller")
        yield ctl, clock
    finally:
        raft.destroy_synchronous()


def _register(ctl: QuorumController, broker: int) -> int:
    r = ctl.register_broker(pb.RegisterBrokerRequest(
        node_id=broker, incarnation_id=f"i{broker}", cluster_id="stall",
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
