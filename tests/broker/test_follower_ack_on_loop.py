"""A caught-up follower's fetch (the acks=all acknowledgement) is handled on the event loop.

Such a fetch reads nothing: it only reports the follower's log end, which may move the HW and
complete waiting acks=all produces. ReplicaManager.fetch_async does that on the loop instead
of hopping to the replication executor and back (two thread switches on the acks=all path).
It never waits for a partition lock there: with an append holding it, the fetch goes to the
executor as before. And a parked follower fetch woken by an append made on the loop (small
produces are) is read on the loop too, up to LOOP_READ_MAX_BYTES, and so is a consumer's long
poll woken by a commit. Real ReplicaManager, Log and purgatories.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import InProcessBroker
from lockwatch import WaitWatchingLock, held_by_another_thread
from waiting import await_for

from broker.replica_manager import ReplicaManager
from proto import broker_pb2
from replication.partition import LockBusy
from storage.record_batch import RecordBatchBuilder, iter_batches


@pytest.fixture
def rm(tmp_path: Path) -> Iterator[ReplicaManager]:
    with InProcessBroker(tmp_path, {"t": {}}, replicas=(1, 2)) as broker:  # follower 2 in sync, fetching when told
        yield broker.rm


def one_batch() -> bytes:
    b = RecordBatchBuilder()
    b.append(0, None, b"v")
    return b.build()


def follower_fetch(offset: int) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(replica_id=2, replica_epoch=1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                                   partitions=[broker_pb2.FetchPartition(
                                       topic="t", partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
                                       current_leader_epoch=0, last_fetched_epoch=0, log_start_offset=0)])


def start_fetch(rm: ReplicaManager, req: broker_pb2.FetchRequest, hops: list[str]) -> Awaitable[Any]:
    """fetch_async as the broker calls it (no byte budget for replication); each executor read
    it makes is named in ``hops``."""
    async def run(fn: Callable[[], Any]) -> Any:
        result = await asyncio.get_running_loop().run_in_executor(None, fn)
        hops.append("executor")  # once the read is done: a read in flight across hops.clear() counts after it
        return result

    async def reserve(n: int) -> int:
        return 0

    async def fetched() -> tuple[broker_pb2.FetchResponse, int]:
        answer, held = await rm.fetch_async(req, run=run, reserve=reserve, release=lambda n: None,
                                            on_park=lambda: None, on_unpark=lambda: None)
        return answer.to_message(), held
    return fetched()


def fetch(rm: ReplicaManager, req: broker_pb2.FetchRequest) -> tuple[broker_pb2.FetchResponse, list[str]]:
    """fetch_async on a fresh loop; the second value names the executor reads it made."""
    hops: list[str] = []

    async def go() -> broker_pb2.FetchResponse:
        resp, _ = await start_fetch(rm, req, hops)
        return resp
    return asyncio.run(go()), hops


def fetched_not_acknowledged(rm: ReplicaManager) -> tuple[Any, Any]:
    """An acks=all append that follower 2 has fetched but not yet acknowledged: (its future, the partition)."""
    done = rm.append_records("t", 0, one_batch(), acks=-1, timeout_ms=30_000)
    fetch(rm, follower_fetch(0))
    p = rm.partition("t", 0)
    assert p is not None
    return done, p


def test_the_acknowledging_fetch_completes_acks_all_without_an_executor_hop(rm: ReplicaManager) -> None:
    done = rm.append_records("t", 0, one_batch(), acks=-1, timeout_ms=30_000)
    assert not done.done(), "follower 2 has not fetched the batch: acks=all must wait"

    resp, hops = fetch(rm, follower_fetch(0))  # the follower fetches the batch: an executor read
    assert resp.partitions[0].records and hops == ["executor"], (resp, hops)
    assert not done.done(), "the follower has the batch but has not said so yet"

    resp, hops = fetch(rm, follower_fetch(1))  # its next fetch says it has offset 0
    assert hops == [], f"a caught-up follower's fetch reads nothing and must not hop to the executor: {hops}"
    assert resp.partitions[0].error_code == 0 and resp.partitions[0].high_watermark == 1, resp
    assert done.result(timeout=5).base_offset == 0


def test_with_the_partition_lock_held_the_fetch_waits_on_the_executor_not_the_loop(rm: ReplicaManager) -> None:
    done, p = fetched_not_acknowledged(rm)

    with held_by_another_thread(p.lock):  # an append in progress
        with pytest.raises(LockBusy):  # what the loop sees
            p.fetch_for_follower(2, 1, 0, 0, 0, 1 << 20, True, now_ms=1, blocking=False)
        assert p.log.high_watermark == 0, "a refused non-blocking fetch must change nothing"

    release_later = threading.Event()

    def hold_briefly() -> None:
        with p.lock:
            release_later.set()
            threading.Event().wait(0.2)
    t = threading.Thread(target=hold_briefly, daemon=True)
    t.start()
    release_later.wait(5)
    resp, hops = fetch(rm, follower_fetch(1))
    t.join(5)
    assert hops == ["executor"], f"with the lock held the fetch must go to the executor: {hops}"
    assert resp.partitions[0].high_watermark == 1, resp
    assert done.result(timeout=5).base_offset == 0


def test_the_acknowledging_fetch_never_waits_for_the_log_lock(rm: ReplicaManager) -> None:
    # Retention, compaction swaps, truncations and flushes take the log's lock without the
    # partition's. On the loop the fetch try-acquires it once and re-enters it for the epoch
    # lookup and the HW move.
    done, p = fetched_not_acknowledged(rm)
    watched = WaitWatchingLock.install(p.log)
    resp, hops = fetch(rm, follower_fetch(1))
    assert hops == [] and resp.partitions[0].high_watermark == 1, (hops, resp)
    assert watched.waits == [], "the loop's fetch waited for the log lock at:\n" + "\n".join(watched.waits)
    assert done.result(timeout=5).base_offset == 0


def test_with_the_log_lock_held_the_fetch_goes_to_the_executor_at_once(rm: ReplicaManager) -> None:
    done, p = fetched_not_acknowledged(rm)
    outcome: list[BaseException | object] = []

    def attempt() -> None:
        try:
            outcome.append(p.fetch_for_follower(2, 1, 0, 0, 0, 1 << 20, True, now_ms=1, blocking=False))
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome.append(e)

    with held_by_another_thread(p.log.lock):  # retention unlinking a segment, or a compaction swap's fsync
        caller = threading.Thread(target=attempt, daemon=True)  # a wait must not hang the test
        caller.start()
        caller.join(10)
        assert outcome, "the non-blocking fetch waited for the log lock another thread holds"
        assert isinstance(outcome[0], LockBusy), outcome
        assert p.log.high_watermark == 0, "a refused non-blocking fetch must change nothing"
    resp, hops = fetch(rm, follower_fetch(1))
    assert resp.partitions[0].high_watermark == 1, resp
    assert done.result(timeout=5).base_offset == 0


def sized_batches(count: int, value_bytes: int) -> bytes:
    out = b""
    for i in range(count):
        b = RecordBatchBuilder()
        b.append(0, None, bytes([i]) * value_bytes)
        out += b.build()
    return out


def test_an_append_made_on_the_loop_hands_the_parked_follower_its_data_read_on_the_loop(
        rm: ReplicaManager) -> None:
    # The broker appends small produces on its event loop; the parked follower fetch that such an
    # append wakes is read right there (no executor hop), up to LOOP_READ_MAX_BYTES of whole batches.
    from broker.replica_manager import LOOP_READ_MAX_BYTES

    batches = sized_batches(3, LOOP_READ_MAX_BYTES // 2 - 200)  # two fit under the cap, three do not
    hops: list[str] = []
    threadsafe: list[Any] = []  # hand-overs through the loop's self-pipe

    async def scenario() -> broker_pb2.FetchResponse:
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a, **k: (threadsafe.append(a), original(*a, **k))[1]  # type: ignore[method-assign]
        req = follower_fetch(0)
        req.max_wait_ms = 10_000
        parked = asyncio.ensure_future(start_fetch(rm, req, hops))
        # Caught up, its first read (on the loop) finds nothing: it parks.
        await await_for(lambda: rm.fetch_purgatory.watched(("t", 0)), 10, "the follower fetch to park")
        assert not parked.done()
        hops.clear()
        fut = rm.append_records("t", 0, batches, acks=1, timeout_ms=5000, blocking=False)  # on the loop
        assert fut.result(timeout=0).last_offset == 2
        resp, _ = await asyncio.wait_for(parked, 5)
        return resp

    resp = asyncio.run(scenario())
    assert hops == [], f"the woken follower fetch was read on the loop, not re-read on the executor: {hops}"
    assert threadsafe == [], f"woken on the loop's thread, handed over without the self-pipe: {threadsafe}"
    got = [h.base_offset for _, h in iter_batches(resp.partitions[0].records)]
    assert got == [0, 1], f"two whole batches, under the cap (the third comes with the next fetch): {got}"


def consumer_fetch(offset: int, min_bytes: int = 1) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=10_000, min_bytes=min_bytes, max_bytes=1 << 20,
                                   partitions=[broker_pb2.FetchPartition(
                                       topic="t", partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
                                       current_leader_epoch=0)])


def consumer_woken_by_commit(rm: ReplicaManager, req: broker_pb2.FetchRequest,
                             batches: bytes) -> tuple[broker_pb2.FetchResponse, list[str]]:
    """A consumer fetch parked at the HW, woken when follower 2 acknowledges ``batches``: its answer
    and the executor reads it made from the wake on."""
    hops: list[str] = []

    async def scenario() -> broker_pb2.FetchResponse:
        parked = asyncio.ensure_future(start_fetch(rm, req, hops))
        await await_for(lambda: rm.fetch_purgatory.watched(("t", 0)), 10, "the consumer fetch to park")
        rm.append_records("t", 0, batches, acks=1, timeout_ms=5000, blocking=False).result(timeout=0)
        await start_fetch(rm, follower_fetch(0), [])  # follower 2 reads the batches ...
        assert not parked.done(), "nothing is committed yet: the consumer must still wait"
        hops.clear()
        end = rm.partition("t", 0).log.log_end_offset  # type: ignore[union-attr]
        await start_fetch(rm, follower_fetch(end), [])  # ... and says it has them: the HW moves
        resp, _ = await asyncio.wait_for(parked, 5)
        return resp

    return asyncio.run(scenario()), hops


def test_a_consumer_woken_by_a_commit_reads_the_tail_on_the_loop(rm: ReplicaManager) -> None:
    # The data a parked consumer waited for was just written: it is read where the fetch resumes,
    # on the loop, up to LOOP_READ_MAX_BYTES of whole batches (the rest comes with its next fetch).
    from broker.replica_manager import LOOP_READ_MAX_BYTES

    resp, hops = consumer_woken_by_commit(rm, consumer_fetch(0),
                                          sized_batches(3, LOOP_READ_MAX_BYTES // 2 - 200))
    assert hops == [], f"the woken consumer fetch was read on the loop, not on the executor: {hops}"
    assert resp.partitions[0].high_watermark == 3, resp.partitions[0]
    got = [h.base_offset for _, h in iter_batches(resp.partitions[0].records)]
    assert got == [0, 1], f"two whole batches, under the loop's cap: {got}"


def test_an_append_alone_does_not_wake_a_parked_consumer(rm: ReplicaManager) -> None:
    # A consumer reads below the HW: an append that has not committed anything gives it nothing, so it
    # must stay parked (each wake would cost it a read for nothing; this test once caught one of those
    # reads running across the commit). The commit then wakes it with the data.
    hops: list[str] = []

    async def scenario() -> None:
        parked = asyncio.ensure_future(start_fetch(rm, consumer_fetch(0), hops))
        await await_for(lambda: rm.fetch_purgatory.watched(("t", 0)), 10, "the consumer fetch to park")
        for i in range(3):
            rm.append_records("t", 0, one_batch(), acks=1, timeout_ms=5000, blocking=False).result(timeout=0)
            # The append checked the parked fetches before returning: a woken one is done by now.
            assert rm.fetch_purgatory.watched(("t", 0)) == 1, f"append {i} woke the parked consumer"
            await asyncio.sleep(0)
        assert not parked.done()
        await start_fetch(rm, follower_fetch(3), [])  # follower 2 has the 3 batches: the HW moves
        resp, _ = await asyncio.wait_for(parked, 5)
        assert [h.base_offset for _, h in iter_batches(resp.partitions[0].records)] == [0, 1, 2], resp
    asyncio.run(scenario())


def test_a_consumer_asking_more_than_the_loop_reads_is_read_on_the_executor(rm: ReplicaManager) -> None:
    # A min_bytes the bounded read could never satisfy: the read after the wake goes to the executor
    # and the answer carries everything committed.
    from broker.replica_manager import LOOP_READ_MAX_BYTES

    batches = sized_batches(3, LOOP_READ_MAX_BYTES // 2 - 200)
    resp, hops = consumer_woken_by_commit(rm, consumer_fetch(0, min_bytes=LOOP_READ_MAX_BYTES + 1), batches)
    assert hops == ["executor"], f"one executor read after the commit: {hops}"
    got = [h.base_offset for _, h in iter_batches(resp.partitions[0].records)]
    assert got == [0, 1, 2], f"every committed batch: {got}"


def test_an_up_to_date_consumer_reads_and_parks_without_an_executor_hop(rm: ReplicaManager) -> None:
    # A consumer asking at the HW reads nothing (Log.read stops there before any file): that read is
    # made on the loop, so the usual fetch of a consumer that has everything costs no thread switch.
    # One asking below the HW may read a segment from disk: that read goes to the executor.
    rm.append_records("t", 0, one_batch(), acks=1, timeout_ms=5000, blocking=False).result(timeout=0)

    async def scenario() -> tuple[list[str], list[str]]:
        await start_fetch(rm, follower_fetch(0), [])
        await start_fetch(rm, follower_fetch(1), [])  # follower 2 has the batch: the HW is 1
        assert rm.partition("t", 0).log.high_watermark == 1  # type: ignore[union-attr]
        below: list[str] = []
        resp, _ = await start_fetch(rm, consumer_fetch(0), below)
        assert [h.base_offset for _, h in iter_batches(resp.partitions[0].records)] == [0], resp
        at_tail: list[str] = []
        parked = asyncio.ensure_future(start_fetch(rm, consumer_fetch(1), at_tail))
        await await_for(lambda: rm.fetch_purgatory.watched(("t", 0)), 10, "the consumer fetch to park")
        parked.cancel()
        return below, at_tail

    below, at_tail = asyncio.run(scenario())
    assert below == ["executor"], f"a read below the HW goes to the executor: {below}"
    assert at_tail == [], f"a consumer at the HW must read and park without an executor hop: {at_tail}"


def test_a_fetch_from_a_stale_registration_of_the_follower_records_nothing(rm: ReplicaManager) -> None:
    """KIP-903: broker 2 registered again (a new process, broker epoch 5); a fetch still carrying its old
    epoch (the replaced process, or another process with node.id 2) must not move the high watermark."""
    from proto import common_pb2, controller_pb2
    from proto.errors import ErrorCode

    update = controller_pb2.MetadataUpdate(version=2, cluster_id="c", active_controller_id=-1)
    update.brokers.add(node_id=2, incarnation_id="i2-new", broker_epoch=5,
                       endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=2)])
    rm.apply_metadata_delta(rm.metadata_cache.apply(update))
    done, p = fetched_not_acknowledged(rm)  # (fetched with the old epoch: refused too, so fetch again below)

    stale = follower_fetch(1)
    resp, _ = fetch(rm, stale)
    part = resp.partitions[0]
    assert part.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and "stale registration" in part.error_message, part
    assert not part.records and p.log.high_watermark == 0 and not done.done(), "a stale fetch moved the HW"

    current = follower_fetch(0)
    current.replica_epoch = 5
    resp, _ = fetch(rm, current)
    assert resp.partitions[0].error_code == 0 and resp.partitions[0].records, resp
    current.partitions[0].fetch_offset = 1
    newer = broker_pb2.FetchRequest()
    newer.CopyFrom(current)
    newer.replica_epoch = 6  # newer than this leader's metadata (it is behind): accepted, as in Kafka
    resp, _ = fetch(rm, newer)
    assert resp.partitions[0].error_code == 0 and resp.partitions[0].high_watermark == 1, resp
    assert done.result(timeout=5).base_offset == 0
