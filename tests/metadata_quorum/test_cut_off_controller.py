"""An active controller that hears no broker: it hands leadership to a voter that brokers reach, or fences as before.

Three real ``MetadataRaft`` voters (pysyncobj, real sockets, one process) with their ``QuorumController``s, whose
ticks the test calls itself. Brokers are registered on the active controller, then heartbeat nobody: for the
active controller that looks the same whether it is cut off from the brokers or they are all down. What tells the
two apart is whether brokers reach the other voters (``note_broker_contact``: a broker's search for the active
controller, naming itself). The gRPC side of it (DescribeQuorum's ``caller_broker_id`` and
``responder_hears_brokers``) is checked at the end; the whole path across a real network cut is
tests/faults/test_split_asymmetric_cuts.py.
"""

from __future__ import annotations

import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from quorum_helpers import in_process_service, register_on, three_voters
from waiting import wait_for

from broker.authorizer import EMPTY_INDEX, Authorizer, AuthorizerConfig
from broker.principal import AUTH_CERTIFICATE, Authentication, Principal, node_principal
from metadata_quorum.controller import ControllerConfig, QuorumController
from metadata_quorum.raft import MetadataRaft
from proto import controller_pb2 as pb

pytestmark = pytest.mark.slow

SESSION_MS = 2000
CLUSTER = "cut-off-test"


@pytest.fixture
def voters(tmp_path: Path) -> Iterator[list[tuple[MetadataRaft, QuorumController]]]:
    controllers: list[QuorumController] = []

    def controller(node_id: int, raft: MetadataRaft, addresses: list[str]) -> QuorumController:
        def hearing() -> list[str]:
            """What node.py's probe of the other voters answers, without gRPC."""
            return [addresses[i] for i, ctl in enumerate(controllers) if i != node_id - 1 and ctl.hears_brokers()]

        config = ControllerConfig(node_id, CLUSTER, broker_session_timeout_ms=SESSION_MS,
                                  broker_heartbeat_interval_ms=500)
        controllers.append(QuorumController(config, raft, voters_hearing_brokers=hearing))
        return controllers[-1]

    with three_voters(tmp_path, controller) as v:
        yield v


def _tick_all(voters: list[tuple[MetadataRaft, QuorumController]]) -> tuple[int] | None:
    """Tick every controller; (the index of the active one,) if exactly one is."""
    for _, ctl in voters:
        ctl.tick()
    active = [i for i, (_, ctl) in enumerate(voters) if ctl.is_active()]
    return (active[0],) if len(active) == 1 else None


def _fenced(raft: MetadataRaft) -> list[int]:
    return raft.read(lambda s: sorted(b.node_id for b in s.brokers.values() if b.fenced))


def test_an_active_controller_that_hears_no_broker_hands_over_to_a_voter_brokers_reach(
        voters: list[tuple[MetadataRaft, QuorumController]]) -> None:
    (first,) = wait_for(lambda: _tick_all(voters), 30, "an active controller")
    register_on(voters[first][1], (1, 2), CLUSTER)
    reached = (first + 1) % 3
    first_term = voters[first][0].term

    def handed_over() -> tuple[int] | None:
        voters[reached][1].note_broker_contact()  # the brokers ask this voter which controller is active
        active = _tick_all(voters)
        return active if active is not None and active != (first,) else None

    started = time.monotonic()
    (now_active,) = wait_for(handed_over, 30, lambda: f"leadership handed over from voter {first + 1} "
                          f"(fenced on it: {_fenced(voters[first][0])})", poll_s=0.05)
    took = time.monotonic() - started
    assert now_active == reached, f"leadership went to voter {now_active + 1}, not voter {reached + 1}, whom brokers reach"
    assert voters[now_active][0].term > first_term
    assert _fenced(voters[now_active][0]) == [], (
        f"brokers fenced although a voter they reach took over: {_fenced(voters[now_active][0])}")
    # The new controller started their sessions afresh: heartbeats to it keep them unfenced.
    deadline = time.monotonic() + SESSION_MS / 1000 * 2
    ctl = voters[now_active][1]
    while time.monotonic() < deadline:
        register_on(ctl, (1, 2), CLUSTER)
        _tick_all(voters)
        time.sleep(0.1)
    assert _fenced(voters[now_active][0]) == []
    assert ctl.is_active()
    assert voters[first][1].cut_off_outcomes == {"handed_over": 1}, voters[first][1].cut_off_outcomes
    print(f"handed over after {took:.1f}s of a {SESSION_MS / 1000:.0f}s session")


def test_an_active_controller_fences_brokers_no_voter_hears(
        voters: list[tuple[MetadataRaft, QuorumController]]) -> None:
    (first,) = wait_for(lambda: _tick_all(voters), 30, "an active controller")
    register_on(voters[first][1], (1, 2), CLUSTER)
    term = voters[first][0].term
    wait_for(lambda: _tick_all(voters) is not None and _fenced(voters[first][0]) == [1, 2], 30,
             lambda: f"both silent brokers fenced (fenced: {_fenced(voters[first][0])})", poll_s=0.05)
    assert voters[first][1].is_active() and voters[first][0].term == term, (
        "the active controller handed leadership over although no voter hears brokers")
    assert voters[first][1].cut_off_outcomes == {"fenced": 1}, voters[first][1].cut_off_outcomes


def test_a_voter_counts_a_broker_only_by_that_brokers_identity(tmp_path: Path) -> None:
    def context(who: Principal) -> types.SimpleNamespace:
        return types.SimpleNamespace(brook_authentication=Authentication(who, AUTH_CERTIFICATE, "10.0.0.7:5000"),
                                     time_remaining=lambda: None)

    authorizer = Authorizer(AuthorizerConfig(True, frozenset(), False), lambda: EMPTY_INDEX)
    with in_process_service(tmp_path, CLUSTER, authorizer, {}) as service:
        ctl = service._controller
        ctl._broker_heard_at = None  # in_process_service's registrations count, in-process: start from none
        probe = pb.DescribeQuorumRequest(caller_broker_id=3)
        service.DescribeQuorum(probe, context(Principal("User", "alice")))
        service.DescribeQuorum(probe, context(node_principal(4)))
        service.DescribeQuorum(pb.DescribeQuorumRequest(), context(node_principal(3)))
        assert not ctl.hears_brokers(), "counted a caller that is not the broker it named"
        answer = service.DescribeQuorum(pb.DescribeQuorumRequest(any_voter=True), context(node_principal(3)))
        assert not answer.responder_hears_brokers
        service.DescribeQuorum(probe, context(node_principal(3)))
        assert ctl.hears_brokers()
        answer = service.DescribeQuorum(pb.DescribeQuorumRequest(any_voter=True), context(node_principal(1)))
        assert answer.responder_hears_brokers
