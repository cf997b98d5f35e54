"""acks=all waiting (DelayedProduce in the produce purgatory) over a real Partition and Log."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.replica_manager import AppendResult, DelayedProduce
from proto import errors
from replication.partition import Partition
from replication.purgatory import DelayedOperationPurgatory
from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import RecordBatchBuilder


@pytest.fixture
def purgatory() -> Iterator[DelayedOperationPurgatory]:
    p = DelayedOperationPurgatory("produce-test")
    yield p
    p.shutdown()


def leader(tmp: Path, min_isr: str = "2") -> Partition:
    lg = Log.open(tmp / "t-0", LogConfig.from_overrides({"min.insync.replicas": min_isr}))
    p = Partition("t", 0, "T", lg, 1, broker_usable=lambda b: True)
    p.make_leader((1, 2), (1, 2), 3, 3, now_ms=0)
    return p


def append_and_wait(p: Partition, purgatory: DelayedOperationPurgatory, timeout_s: float
                    ) -> concurrent.futures.Future:
    b = RecordBatchBuilder()
    b.append(0, None, b"v")
    info = p.append_as_leader(b.build(), acks=-1)
    fut: concurrent.futures.Future = concurrent.futures.Future()
    op = DelayedProduce(p, p.leader_epoch, AppendResult("t", 0, info.first_offset, info.last_offset, -1, 0),
                        fut, time.monotonic() + timeout_s)
    purgatory.watch(op, [p.key])
    return fut


def test_completes_when_the_follower_catches_up(tmp_path: Path, purgatory: DelayedOperationPurgatory) -> None:
    p = leader(tmp_path)
    fut = append_and_wait(p, purgatory, 10)
    assert not fut.done()
    r = p.fetch_for_follower(2, 1, 0, 3, 3, 1 << 20, True, now_ms=5)  # follower reports LEO 1
    assert r.hw_changed
    purgatory.check_and_complete(p.key)
    assert fut.result(1).base_offset == 0


def test_times_out_with_request_timed_out(tmp_path: Path, purgatory: DelayedOperationPurgatory) -> None:
    p = leader(tmp_path)
    fut = append_and_wait(p, purgatory, 0.2)
    with pytest.raises(errors.RequestTimedOutError):
        fut.result(5)
    assert p.log.log_end_offset == 1, "a timed-out acks=all batch stays appended (as in Kafka)"


def test_fails_when_leadership_moves(tmp_path: Path, purgatory: DelayedOperationPurgatory) -> None:
    p = leader(tmp_path)
    fut = append_and_wait(p, purgatory, 10)
    p.make_follower(2, (1, 2), (1, 2), 4, 4)
    purgatory.check_and_complete(p.key)
    with pytest.raises(errors.NotLeaderOrFollowerError):
        fut.result(1)


def test_isr_shrunk_below_min_after_append(tmp_path: Path, purgatory: DelayedOperationPurgatory) -> None:
    p = leader(tmp_path)
    fut = append_and_wait(p, purgatory, 10)
    p.apply_committed_state((1,), 3, 4)  # follower 2 removed: HW = leader LEO, but ISR < 2
    purgatory.check_and_complete(p.key)
    with pytest.raises(errors.BrookError) as e:
        fut.result(1)
    assert e.value.name == "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
