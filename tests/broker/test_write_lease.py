"""Which writes a leader takes without its controller session (ReplicaManager.append_records).

A broker that has not reached the controller quorum for broker.session.timeout.ms may have been
replaced as leader. An acks=all write is safe there anyway: the high watermark waits for every
in-sync follower, and they fetch from the new leader once it is elected, so a replaced leader
acknowledges nothing (tests/sim checks this across random faults; the real cluster test is
tests/metadata_quorum/test_quorum_with_brokers.py). An acks=0/1 write has no such guard and is
refused. A broker the controller fenced takes no write at all. A refusal appends nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessBroker

from proto import errors
from storage.record_batch import RecordBatchBuilder


class Switches:
    def __init__(self) -> None:
        self.lease = True
        self.fenced = False


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[InProcessBroker, Switches]]:
    sw = Switches()
    with InProcessBroker(tmp_path, {"t": {}}, lease_valid=lambda: sw.lease, fenced=lambda: sw.fenced) as b:
        yield b, sw


def batch() -> bytes:
    b = RecordBatchBuilder()
    b.append(1_700_000_000_000, None, b"v")
    return b.build()


def append(b: InProcessBroker, acks: int) -> int:
    return b.rm.append_records("t", 0, batch(), acks=acks, timeout_ms=5000).result(5).base_offset


def leo(b: InProcessBroker) -> int:
    return b.rm.leader_partition("t", 0).log.log_end_offset


def test_every_acks_level_is_taken_with_a_controller_session(broker: tuple[InProcessBroker, Switches]) -> None:
    b, _ = broker
    assert [append(b, acks) for acks in (0, 1, -1)] == [0, 1, 2]


def test_without_a_session_only_acks_all_writes_are_taken(broker: tuple[InProcessBroker, Switches]) -> None:
    b, sw = broker
    sw.lease = False
    for acks in (0, 1):
        with pytest.raises(errors.NotLeaderOrFollowerError, match=f"controller quorum.*acks={acks} writes are refused"):
            append(b, acks)
    assert leo(b) == 0, "a refused write appended something"
    assert append(b, -1) == 0
    sw.lease = True
    assert append(b, 1) == 1


def test_a_fenced_broker_takes_no_write(broker: tuple[InProcessBroker, Switches]) -> None:
    b, sw = broker
    sw.fenced = True
    for acks in (0, 1, -1):
        with pytest.raises(errors.NotLeaderOrFollowerError, match="fenced by the controller"):
            append(b, acks)
    assert leo(b) == 0, "a refused write appended something"


def test_an_acks_all_write_timing_out_without_a_session_sends_clients_to_another_leader(tmp_path: Path) -> None:
    """The follower never fetches (it follows the leader the controller elected instead). With a session the
    timeout is REQUEST_TIMED_OUT; without one it is NOT_LEADER_OR_FOLLOWER, which makes clients (Brook's and
    Kafka's) refresh metadata and find the new leader: REQUEST_TIMED_OUT kept them writing here for good."""
    sw = Switches()
    with InProcessBroker(tmp_path, {"t": {}}, replicas=(1, 2), lease_valid=lambda: sw.lease) as b:
        with pytest.raises(errors.RequestTimedOutError, match="acks=all not reached by the ISR in time"):
            b.rm.append_records("t", 0, batch(), acks=-1, timeout_ms=200).result(10)
        sw.lease = False
        with pytest.raises(errors.NotLeaderOrFollowerError, match="controller quorum.*another replica may lead"):
            b.rm.append_records("t", 0, batch(), acks=-1, timeout_ms=200).result(10)
