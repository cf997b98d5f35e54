"""Invariants of the metadata state machine, and what a voter does when one breaks.

Bad input is refused (an error code, nothing changed). A *programming error*, an
exception inside a handler or a state that breaks an invariant, raises
``MetadataInvariantError`` instead of being reported as INVALID_REQUEST; a voter that
meets one while applying a committed command stops (Kafka halts its controller) rather
than stall on the entry or keep serving a state it cannot trust.
"""

from __future__ import annotations

import secrets
import threading
from pathlib import Path

import pytest
from quorum_helpers import free_port
from test_state import cluster, create, epoch_of, part
from waiting import wait_for

from metadata_quorum import commands as c
from metadata_quorum.raft import MetadataRaft
from metadata_quorum.state import MetadataInvariantError
from proto.errors import ErrorCode


def test_a_bug_in_a_handler_is_an_internal_error_not_invalid_request() -> None:
    s = cluster(3)

    def buggy(cmd: c.UnregisterBroker) -> None:
        raise KeyError("a bug")

    s._handlers[c.UnregisterBroker] = buggy  # simulate a programming error in one handler
    with pytest.raises(MetadataInvariantError, match="applying UnregisterBroker failed: KeyError"):
        s.apply(c.UnregisterBroker(1))


def test_a_command_that_leaves_a_broken_partition_raises() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2, 3]])
    # Corrupt the state as a bug elsewhere would (the leader not in the ISR) ...
    part(s, "t").isr = [2, 3]
    # ... and the next command that touches the partition finds out.
    with pytest.raises(MetadataInvariantError, match="leader 1 is not in the ISR"):
        s.apply(c.FenceBroker(3, epoch_of(s, 3)))


def test_malformed_wire_fields_are_still_invalid_request() -> None:
    s = cluster(1)
    before = s.to_snapshot()
    for payload in ({"type": "FenceBroker", "node_id": "1", "broker_epoch": 1},
                    {"type": "CreateTopic", "name": "t", "topic_id": "i", "configs": {"a": 1}, "assignments": [[1]]},
                    {"type": "ChangePartition", "items": [{"topic": "t", "partition": "0", "partition_epoch": 0}]},
                    {"type": "AllocateProducerIds", "broker_id": 1, "broker_epoch": True}):
        assert s.apply(payload).error_code == ErrorCode.INVALID_REQUEST, payload  # type: ignore[arg-type]
    assert s.to_snapshot() == before


@pytest.mark.slow
def test_a_voter_whose_state_machine_breaks_stops_instead_of_stalling(tmp_path: Path) -> None:
    fatal: list[BaseException] = []
    stopped = threading.Event()

    def on_fatal(exc: BaseException) -> None:
        fatal.append(exc)
        stopped.set()

    raft = MetadataRaft(f"127.0.0.1:{free_port()}", [], tmp_path, password=secrets.token_urlsafe(24),
                        on_fatal=on_fatal)
    try:
        raft.wait_bound()
        wait_for(lambda: raft.leadership()[0], 30, "the single voter to lead")
        assert raft.propose(c.RegisterBroker(1, "inc-1", [["BROKER", "h", 1]]), 30).ok

        def buggy(cmd: c.UnregisterBroker) -> None:
            raise ValueError("a bug")

        raft.state._handlers[c.UnregisterBroker] = buggy
        result = raft.propose(c.UnregisterBroker(1), 30)
        assert result.error_code == ErrorCode.UNKNOWN_SERVER_ERROR, result
        assert stopped.wait(10) and isinstance(fatal[0], MetadataInvariantError)
        assert isinstance(raft.failed, MetadataInvariantError)
        # It left the quorum: pysyncobj's tick thread ends instead of re-applying the entry forever.
        wait_for(lambda: not raft._syncobj.tick_thread_alive(), 10, "the voter's Raft thread to stop")
    finally:
        raft.destroy_synchronous()
