"""The controller activation race, driven deterministically on a real 3-voter quorum.

Three ``MetadataRaft`` voters (real pysyncobj, real sockets, one process) with their
``QuorumController``s, whose ticks the test calls itself, so it decides exactly what
happens in which order.

The interleaving that once stopped a cluster for minutes: a voter that is *not* the
leader of term T proposes ``ActivateController(itself, T)``; pysyncobj forwards it to
the real leader of T, which commits it before its own activation. The state then
refuses the real leader's activation as stale. Before the fix the leader proposed
again on every tick, forever (704 journal entries, no active controller). Now it
proposes once, steps down, and the next term's leader activates.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from quorum_helpers import three_voters
from waiting import wait_for

from metadata_quorum import commands as c
from metadata_quorum.controller import MAX_ACTIVATION_ATTEMPTS, ControllerConfig, QuorumController
from metadata_quorum.raft import MetadataRaft

pytestmark = pytest.mark.slow

@pytest.fixture
def voters(tmp_path: Path) -> Iterator[list[tuple[MetadataRaft, QuorumController]]]:
    with three_voters(tmp_path, lambda i, raft, _: QuorumController(ControllerConfig(i, "activation-test"), raft)) as v:
        yield v


def test_a_stale_activation_committed_first_makes_the_leader_step_down_not_loop(
        voters: list[tuple[MetadataRaft, QuorumController]]) -> None:
    rafts = [r for r, _ in voters]

    def leader() -> tuple[int, int] | None:
        found = [(i, r.leadership()[1]) for i, r in enumerate(rafts) if r.leadership()[0]]
        return found[0] if len(found) == 1 else None

    leader_index, term = wait_for(leader, 30, "one Raft leader")
    follower_index = (leader_index + 1) % 3
    follower_id = follower_index + 1
    # The stale activation: a voter claims term T, which it never led. pysyncobj forwards
    # it to T's leader, which commits it before its own controller has ticked even once.
    forwarded = rafts[follower_index].submit(c.ActivateController(follower_id, term))
    result = forwarded.wait(30)
    assert result.ok, result
    assert rafts[leader_index].read(lambda s: (s.active_controller_id, s.controller_epoch)) == (follower_id, term)

    # Now every controller ticks, the leader of T included.
    def someone_active() -> tuple[int, int] | None:
        for _, ctl in voters:
            ctl.tick()
        for i, (raft, ctl) in enumerate(voters):
            if ctl.is_active():
                return i, raft.term
        return None

    active_index, active_term = wait_for(someone_active, 60, "a controller active after the stale activation")
    assert active_term > term, (active_term, term)
    state = rafts[active_index].read(lambda s: (s.active_controller_id, s.controller_epoch))
    assert state == (active_index + 1, active_term)
    # T's leader proposed its activation for T once (bounded), never in a loop.
    attempts = voters[leader_index][1].activation_attempts.get(term, 0)
    assert 1 <= attempts <= MAX_ACTIVATION_ATTEMPTS, attempts
    for _, ctl in voters:
        assert all(n <= MAX_ACTIVATION_ATTEMPTS for n in ctl.activation_attempts.values()), ctl.activation_attempts
    # The active controller serves writes stamped with its epoch.
    active_ctl = voters[active_index][1]
    registered = active_ctl._propose(c.RegisterBroker(7, "inc-7", [["BROKER", "127.0.0.1", 9092]]), 30)
    assert registered.ok, registered

