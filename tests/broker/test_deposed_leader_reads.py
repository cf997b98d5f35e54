"""A leader cut from the active controller is fenced and replaced without hearing of it: its consumers at the end
of the log waited there for records that never came (tests/faults/test_split_asymmetric_cuts.py: two partitions'
tailing consumers read nothing in 45 s after such a cut, while their new leaders took every write). Without a
controller session, and with no follower fetching any more, such a leader now answers a consumer at the end of
the log NOT_LEADER_OR_FOLLOWER, which sends it to fresh metadata; what it holds is still served, and nothing
changes while either condition is missing (the active controller cut from every broker, with followers still
fetching; the only replica of a partition)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessBroker

from proto import broker_pb2
from proto.errors import ErrorCode
from storage.record_batch import RecordBatchBuilder


class _Lease:
    valid = True

    def __call__(self) -> bool:
        return self.valid


def _batch(n: int) -> bytes:
    b = RecordBatchBuilder()
    for i in range(n):
        b.append(0, None, b"v%d" % i)
    return b.build()


def _fetch(b: InProcessBroker, offset: int, replica_id: int = -1) -> broker_pb2.FetchPartitionResponse:
    req = broker_pb2.FetchRequest(replica_id=replica_id, replica_epoch=1, max_wait_ms=0, min_bytes=1,
                                  max_bytes=1 << 20, partitions=[broker_pb2.FetchPartition(
                                      topic="t", partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
                                      current_leader_epoch=0, last_fetched_epoch=0 if replica_id >= 0 else -1,
                                      log_start_offset=0)])
    answer, _, _ = b.rm._read_once(req)
    return answer.to_message().partitions[0]


@pytest.fixture
def lease() -> _Lease:
    return _Lease()


@pytest.fixture
def led(tmp_path: Path, lease: _Lease) -> Iterator[InProcessBroker]:
    """Broker 1 leads t-0 with follower 2 in sync; 3 records committed (the follower fetched them)."""
    with InProcessBroker(tmp_path, {"t": {}}, replicas=(1, 2), lease_valid=lease) as b:
        b.rm.append_records("t", 0, _batch(3), acks=1, timeout_ms=5000).result(5)
        _fetch(b, 0, replica_id=2)
        _fetch(b, 3, replica_id=2)  # caught up: the HW moves to 3
        assert b.rm.partition("t", 0).log.high_watermark == 3
        yield b


def _follower_silent_for(b: InProcessBroker, ms: int) -> None:
    b.rm.partition("t", 0).followers[2].last_fetch_time_ms -= ms


def test_without_a_session_and_without_followers_a_consumer_at_the_end_is_sent_to_fresh_metadata(
        led: InProcessBroker, lease: _Lease) -> None:
    lease.valid = False
    _follower_silent_for(led, led.rm.deposed_after_ms + 1000)
    at_end = _fetch(led, 3)
    assert at_end.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, at_end
    behind = _fetch(led, 0)  # what this replica holds is still served
    assert behind.error_code == ErrorCode.NONE and behind.records, behind


def test_followers_still_fetching_keep_a_leader_without_a_session_serving(led: InProcessBroker,
                                                                           lease: _Lease) -> None:
    """The active controller cut from every broker: no broker has a session, nothing moved."""
    lease.valid = False
    _follower_silent_for(led, led.rm.deposed_after_ms // 2)
    at_end = _fetch(led, 3)
    assert at_end.error_code == ErrorCode.NONE and not at_end.records, at_end


def test_a_session_keeps_a_leader_without_followers_serving(led: InProcessBroker) -> None:
    """Followers that stopped (crashed, cut from this broker) are the ISR's business, not the consumers'."""
    _follower_silent_for(led, led.rm.deposed_after_ms + 1000)
    at_end = _fetch(led, 3)
    assert at_end.error_code == ErrorCode.NONE and not at_end.records, at_end


def test_the_only_replica_keeps_serving_without_a_session(tmp_path: Path, lease: _Lease) -> None:
    lease.valid = False
    with InProcessBroker(tmp_path, {"t": {}}, lease_valid=lease) as b:
        at_end = _fetch(b, 0)
        assert at_end.error_code == ErrorCode.NONE, at_end
