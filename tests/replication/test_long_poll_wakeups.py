"""Who wakes a parked long-poll fetch or a waiting append, and who does not.

A follower's long poll is woken by new data (an append) or a role change, never by a
high-watermark move alone: each acks=all commit moves the HW, and waking every other
follower's parked fetch for it only makes them re-read nothing. A consumer's long poll
is woken by HW moves too (that is when data becomes visible to it). Real Partition, Log
and purgatory; the waiters are the asyncio-future ones ReplicaManager.fetch_async parks
(woken through the event loop, holding no thread). Also: an
idempotent batch that overtook its predecessor (pipelined gRPC requests run on any
worker thread) waits for it, boundedly, instead of being refused at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.replica_manager import _append_in_sequence, _AsyncDataWaiter, _wake_seq
from proto import errors
from replication.partition import Partition
from replication.purgatory import DelayedOperation, DelayedOperationPurgatory
from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import RecordBatchBuilder


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


class Parked:
    """A parked long poll as the broker's loop sees it: woken once its future has a result."""

    def __init__(self, p: Partition, loop: asyncio.AbstractEventLoop, for_follower: bool) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.op = _AsyncDataWaiter({p: _wake_seq(p, for_follower)}, for_follower, loop, self.future)

    def woken(self) -> bool:
        self.loop.run_until_complete(asyncio.sleep(0))  # run the call_soon_threadsafe completions
        return self.future.done()


@pytest.fixture
def purgatory() -> Iterator[DelayedOperationPurgatory]:
    p = DelayedOperationPurgatory("fetch-test")
    yield p
    p.shutdown()


def leader_of_three(tmp: Path) -> Partition:
    lg = Log.open(tmp / "t-0", LogConfig.from_overrides({"min.insync.replicas": "2"}))
    p = Partition("t", 0, "T", lg, 1, broker_usable=lambda b: True)
    p.make_leader((1, 2, 3), (1, 2, 3), 3, 3, now_ms=0)
    return p


def append_one(p: Partition) -> None:
    b = RecordBatchBuilder()
    b.append(0, None, b"v")
    p.append_as_leader(b.build(), acks=-1)


def park(p: Partition, purgatory: DelayedOperationPurgatory, loop: asyncio.AbstractEventLoop, *,
         for_follower: bool) -> Parked:
    waiter = Parked(p, loop, for_follower)
    assert not purgatory.watch(waiter.op, [p.key]), "nothing changed yet: the waiter must park"
    return waiter


def test_hw_move_wakes_consumers_but_not_caught_up_followers(tmp_path: Path, purgatory: DelayedOperationPurgatory,
                                                             loop: asyncio.AbstractEventLoop) -> None:
    p = leader_of_three(tmp_path)
    append_one(p)
    r2 = p.fetch_for_follower(2, 1, 0, 3, 3, 1 << 20, True, now_ms=1)  # follower 2 caught up to LEO 1
    assert not r2.hw_changed, "follower 3 is still at 0, so the HW cannot move yet"
    follower2 = park(p, purgatory, loop, for_follower=True)
    consumer = park(p, purgatory, loop, for_follower=False)

    r3 = p.fetch_for_follower(3, 1, 0, 3, 3, 1 << 20, True, now_ms=2)  # follower 3 catches up: HW 0 -> 1
    assert r3.hw_changed and p.log.high_watermark == 1
    purgatory.check_and_complete(p.key)

    assert consumer.woken(), "offset 0 became visible to consumers: their long poll must answer"
    assert not follower2.woken(), "a HW move gives a caught-up follower nothing to fetch"
    assert purgatory.watched(p.key) == 1

    append_one(p)
    purgatory.check_and_complete(p.key)
    assert follower2.woken(), "new data must wake the follower's long poll"


def test_role_change_wakes_a_parked_follower_fetch(tmp_path: Path, purgatory: DelayedOperationPurgatory,
                                                   loop: asyncio.AbstractEventLoop) -> None:
    p = leader_of_three(tmp_path)
    follower2 = park(p, purgatory, loop, for_follower=True)
    p.make_follower(2, (1, 2, 3), (1, 2, 3), 4, 4)
    purgatory.check_and_complete(p.key)
    assert follower2.woken(), "a parked follower fetch must answer NOT_LEADER once leadership moves"


def test_change_racing_with_registration_is_not_lost(tmp_path: Path, purgatory: DelayedOperationPurgatory,
                                                     loop: asyncio.AbstractEventLoop) -> None:
    p = leader_of_three(tmp_path)
    waiter = Parked(p, loop, True)
    append_one(p)  # lands after the snapshot, before the waiter is watched
    assert purgatory.watch(waiter.op, [p.key]), "the append after the snapshot must complete the waiter at once"
    assert waiter.woken()


class _Deadline(DelayedOperation):
    def __init__(self, deadline_s: float) -> None:
        super().__init__(deadline_s)
        self.expired = threading.Event()

    def _try_complete(self) -> bool:
        return False

    def _on_expire(self) -> None:
        self.expired.set()


def wait_for(event: threading.Event, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if event.wait(0.05):
            return True
    return False


def test_reaper_expires_an_earlier_deadline_registered_after_a_later_one(
        purgatory: DelayedOperationPurgatory) -> None:
    late = _Deadline(time.monotonic() + 600)
    purgatory.watch(late, ["k"])
    early = _Deadline(time.monotonic() + 0.2)
    purgatory.watch(early, ["k"])
    assert wait_for(early.expired, 10), "the reaper slept past a new earliest deadline"
    assert not late.expired.is_set()


def test_reaper_expires_operations_behind_a_completed_one(purgatory: DelayedOperationPurgatory) -> None:
    first = _Deadline(time.monotonic() + 0.1)
    purgatory.watch(first, ["k"])
    first.cancel()  # done before its deadline, as most acks=all waits are
    second = _Deadline(time.monotonic() + 0.3)
    purgatory.watch(second, ["k"])  # registered without waking the reaper (not the earliest)
    assert wait_for(second.expired, 10), "an operation queued behind a completed one never expired"
    assert not first.expired.is_set(), "a completed operation must not expire"


# ---- idempotent batches that overtook their predecessor (pipelined gRPC requests) ----

def idempotent_batch(base_sequence: int, count: int, producer_id: int = 7) -> bytes:
    b = RecordBatchBuilder(producer_id=producer_id, producer_epoch=0, base_sequence=base_sequence)
    for i in range(count):
        b.append(0, None, b"v%d" % (base_sequence + i))
    return b.build()


def append_async(p: Partition, records: bytes, max_wait_s: float) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            with p.lock:
                out.append(_append_in_sequence(p, records, 1, max_wait_s))
        except errors.BrookError as e:
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def wait_parked(p: Partition, t: threading.Thread) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and t.is_alive() and not p.appended._waiters:  # type: ignore[attr-defined]
        time.sleep(0.01)
    assert t.is_alive() and p.appended._waiters, "the overtaking batch should be waiting for its predecessor"  # type: ignore[attr-defined]


def test_batch_ahead_of_its_predecessor_waits_for_it_and_lands_after_it(tmp_path: Path) -> None:
    p = leader_of_three(tmp_path)
    with p.lock, pytest.raises(errors.OutOfOrderSequenceNumberError):
        _append_in_sequence(p, idempotent_batch(5, 5), 1, 0.0)  # no waiting allowed: refused as before
    assert p.log.log_end_offset == 0
    t, out = append_async(p, idempotent_batch(5, 5), 30)
    wait_parked(p, t)
    with p.lock:
        first = _append_in_sequence(p, idempotent_batch(0, 5), 1, 30)
    t.join(10)
    assert not t.is_alive() and len(out) == 1 and not isinstance(out[0], Exception), out
    assert (first.first_offset, out[0].first_offset) == (0, 5), (first, out)  # type: ignore[attr-defined]
    assert p.log.log_end_offset == 10


def test_missing_predecessor_is_refused_after_the_bounded_wait(tmp_path: Path) -> None:
    p = leader_of_three(tmp_path)
    with p.lock:
        _append_in_sequence(p, idempotent_batch(0, 5), 1, 0.0)
        with pytest.raises(errors.OutOfOrderSequenceNumberError):
            _append_in_sequence(p, idempotent_batch(10, 5), 1, 0.2)  # sequences 5-9 never come
    assert p.log.log_end_offset == 5, "a refused batch changes nothing"


def test_leadership_loss_wakes_a_waiting_batch_with_not_leader(tmp_path: Path) -> None:
    p = leader_of_three(tmp_path)
    t, out = append_async(p, idempotent_batch(5, 5), 30)
    wait_parked(p, t)
    p.make_follower(2, (1, 2, 3), (1, 2, 3), 4, 4)
    t.join(10)
    assert not t.is_alive() and len(out) == 1 and isinstance(out[0], errors.NotLeaderOrFollowerError), out


# ---- a woken follower fetch is read where it was woken (Kafka's purgatory completion) ----

def inline_waiter(p: Partition, loop: asyncio.AbstractEventLoop,
                  reads: list[int]) -> tuple[_AsyncDataWaiter, asyncio.Future[object]]:
    def read_inline() -> object:
        reads.append(threading.get_ident())
        return ({p: _wake_seq(p, True)}, ("read", p.log.log_end_offset))
    fut: asyncio.Future[object] = loop.create_future()
    return _AsyncDataWaiter({p: _wake_seq(p, True)}, True, loop, fut, read_inline), fut  # type: ignore[arg-type]


def test_a_follower_fetch_is_read_by_the_thread_whose_append_wakes_it(
        tmp_path: Path, purgatory: DelayedOperationPurgatory, loop: asyncio.AbstractEventLoop) -> None:
    p = leader_of_three(tmp_path)
    reads: list[int] = []
    op, fut = inline_waiter(p, loop, reads)
    assert not purgatory.watch(op, [p.key])
    appender = threading.Thread(target=lambda: (append_one(p), purgatory.check_and_complete(p.key)))
    appender.start()
    appender.join(10)
    loop.run_until_complete(asyncio.sleep(0))
    assert fut.done() and fut.result()[1] == ("read", 1), "the loop must get the read, not only a wake-up"
    assert reads == [appender.ident], "read once, by the appending thread (no hop through an executor)"


def test_a_wake_on_the_loop_thread_reads_nothing_there(
        tmp_path: Path, purgatory: DelayedOperationPurgatory, loop: asyncio.AbstractEventLoop) -> None:
    p = leader_of_three(tmp_path)
    reads: list[int] = []
    op, fut = inline_waiter(p, loop, reads)
    append_one(p)  # lands before registration: the loop thread itself completes it while watching
    assert purgatory.watch(op, [p.key])
    loop.run_until_complete(asyncio.sleep(0))
    assert fut.done() and fut.result() is None and reads == [], "disk reads never run on the event loop"
