"""isolation.level=read_committed in Brook's consumer, without a cluster: fetch answers forged with the
batches a transactional log holds and the aborted transactions a broker names, filtered as Kafka's
consumer filters them (CompletedFetch): aborted batches dropped, committed ones kept, control records
never returned, the position moved past everything skipped. The Spark source's decoder uses the same
filter (spark_source/columns.py)."""

from __future__ import annotations

from typing import Any

import pytest

from client import errors
from client.consumer import Consumer
from client.fetcher import AbortedFilter, CompletedFetch, Fetcher, PartitionRecords, PartitionState
from client.types import TopicPartition
from proto import broker_pb2
from storage.record_batch import RecordBatchBuilder, build_control_batch, iter_batches

BOOT = "127.0.0.1:1"  # nothing listens: nothing here reaches a broker
TP = TopicPartition("t", 0)


def txn(base: int, n: int, pid: int, *, transactional: bool = True) -> bytes:
    """A batch of ``n`` records from producer ``pid`` at ``base`` (values "v<offset>")."""
    b = RecordBatchBuilder(base_offset=base, producer_id=pid, producer_epoch=0, base_sequence=base,
                           is_transactional=transactional)
    for i in range(n):
        b.append(1000 + i, None, b"v%d" % (base + i))
    return b.build()


def plain(base: int, n: int) -> bytes:
    b = RecordBatchBuilder(base_offset=base)
    for i in range(n):
        b.append(1000 + i, None, b"v%d" % (base + i))
    return b.build()


def marker(offset: int, pid: int, *, commit: bool) -> bytes:
    return build_control_batch(commit, producer_id=pid, producer_epoch=0, timestamp_ms=5, base_offset=offset)


def consume(data: bytes, aborted: Any, position: int = 0, limit: int = 1000) -> tuple[list[int], int]:
    """The offsets handed out (in takes of ``limit``) and the position after."""
    state = PartitionState(position=position)
    part = PartitionRecords(TP, data, aborted)
    offsets: list[int] = []
    while True:
        got = part.take(state, limit, None, None)
        if not got:
            break
        offsets += [r.offset for r in got]
        assert all(r.value == b"v%d" % r.offset for r in got)
    assert part.exhausted()
    assert state.position is not None
    return offsets, state.position


# A log of producer 7: a committed transaction [0, 1] (COMMIT at 2), an aborted one [3, 4] (ABORT at 5), then a
# record without a transaction (6) and a committed transaction [7] (COMMIT at 8).
LOG = (txn(0, 2, 7) + marker(2, 7, commit=True) + txn(3, 2, 7) + marker(5, 7, commit=False) + plain(6, 1)
       + txn(7, 1, 7) + marker(8, 7, commit=True))


def test_read_committed_drops_the_aborted_records_and_keeps_the_committed_ones() -> None:
    assert consume(LOG, [(7, 3)]) == ([0, 1, 6, 7], 9)
    assert consume(LOG, [(7, 3)], limit=1) == ([0, 1, 6, 7], 9)


def test_read_uncommitted_returns_every_data_record_and_never_a_control_record() -> None:
    assert consume(LOG, None) == ([0, 1, 3, 4, 6, 7], 9)


def test_an_answer_without_aborted_transactions_drops_nothing_but_the_markers() -> None:
    assert consume(LOG, []) == ([0, 1, 3, 4, 6, 7], 9)


def test_markers_alone_move_the_position_and_return_nothing() -> None:
    data = marker(10, 7, commit=False) + marker(11, 8, commit=True)
    assert consume(data, [(7, 4)], position=10) == ([], 12)
    assert consume(data, None, position=10) == ([], 12)


def test_interleaved_producers_only_the_aborted_one_is_dropped() -> None:
    # Producers 1 and 2 interleave; 1 aborts (its transaction from 0), 2 commits, then 1 starts anew and commits.
    data = (txn(0, 1, 1) + txn(1, 1, 2) + txn(2, 1, 1) + txn(3, 1, 2) + marker(4, 1, commit=False)
            + marker(5, 2, commit=True) + txn(6, 1, 1) + marker(7, 1, commit=True))
    assert consume(data, [(1, 0)]) == ([1, 3, 6], 8)
    # Two producers aborted, listed in any order: the broker's list is taken in first-offset order.
    data = (txn(0, 1, 1) + txn(1, 1, 2) + txn(2, 1, 3) + marker(3, 2, commit=False) + txn(4, 1, 2)
            + marker(5, 1, commit=False) + marker(6, 3, commit=True) + marker(7, 2, commit=False))
    assert consume(data, [(2, 4), (1, 0), (2, 1)]) == ([2], 8)


def test_a_batch_of_an_aborted_producer_before_its_aborted_transaction_is_kept() -> None:
    # Producer 5's earlier transaction [0, 1] committed; only the one from 3 aborted.
    data = txn(0, 2, 5) + marker(2, 5, commit=True) + txn(3, 2, 5) + marker(5, 5, commit=False)
    assert consume(data, [(5, 3)]) == ([0, 1], 6)
    # Without its marker in this answer (the LSO, or the byte bound, cut it off), the earlier one still counts.
    assert consume(txn(0, 2, 5) + txn(3, 2, 5), [(5, 3)]) == ([0, 1], 5)


def test_a_non_transactional_batch_of_an_aborted_producer_is_kept() -> None:
    # Kafka drops only transactional batches of an aborted producer id (an idempotent one under the same id is not).
    data = txn(0, 1, 4) + txn(1, 1, 4, transactional=False) + marker(2, 4, commit=False)
    assert consume(data, [(4, 0)]) == ([1], 3)


def test_an_aborted_producer_continues_after_its_abort_marker() -> None:
    data = txn(0, 1, 9) + marker(1, 9, commit=False) + txn(2, 1, 9) + txn(3, 1, 9) + marker(4, 9, commit=True)
    assert consume(data, [(9, 0)]) == ([2, 3], 5)
    # A second aborted transaction of the same producer in the answer: dropped again from its first offset.
    data = txn(0, 1, 9) + marker(1, 9, commit=False) + txn(2, 1, 9) + marker(3, 9, commit=True) + txn(4, 1, 9) \
        + marker(5, 9, commit=False)
    assert consume(data, [(9, 0), (9, 4)]) == ([2], 6)


def test_a_fetch_from_inside_the_answer_still_reads_the_markers_before_the_position() -> None:
    # Fetched at 2 (the answer starts with the batch holding 2): the ABORT marker at 1 is before the position, but it
    # ends producer 3's aborted transaction, so its next, committed, batch is kept.
    data = txn(0, 1, 3) + marker(1, 3, commit=False) + txn(2, 2, 3) + marker(4, 3, commit=True)
    assert consume(data, [(3, 0)], position=3) == ([3], 5)


def test_take_raw_leaves_out_aborted_and_control_batches() -> None:
    state = PartitionState(position=0)
    raw = PartitionRecords(TP, LOG, [(7, 3)]).take_raw(state)
    assert [h.base_offset for _, h in iter_batches(raw)] == [0, 6, 7]
    assert state.position == 9
    state = PartitionState(position=0)
    assert PartitionRecords(TP, LOG).take_raw(state) == LOG, "read_uncommitted: the answer as it came"
    assert state.position == 9


def test_the_filter_takes_protobuf_aborted_transactions() -> None:
    p = broker_pb2.FetchPartitionResponse(aborted_transactions=[broker_pb2.AbortedTransaction(producer_id=7,
                                                                                               first_offset=3)])
    assert consume(LOG, p.aborted_transactions) == ([0, 1, 6, 7], 9)
    f = AbortedFilter([(7, 3)])
    kept = [h.base_offset for pos, h in iter_batches(LOG) if f.keep(LOG, pos, h)]
    assert kept == [0, 6, 7]


# ---- the consumer ----
def test_isolation_level_config() -> None:
    with Consumer(bootstrap_servers=BOOT) as c:
        assert c._isolation == 0 and c._fetcher.isolation_level == 0  # Kafka's default
    with Consumer(bootstrap_servers=BOOT, isolation_level="read_committed") as c:
        assert c._isolation == 1 and c._fetcher.isolation_level == 1
    with Consumer(config={"isolation.level": "READ_COMMITTED"}, bootstrap_servers=BOOT) as c:
        assert c._isolation == 1
    with pytest.raises(errors.InvalidConfigError, match="isolation.level"):
        Consumer(bootstrap_servers=BOOT, isolation_level="snapshot")


def answer(data: bytes, aborted: list[tuple[int, int]], lso: int) -> broker_pb2.FetchResponse:
    return broker_pb2.FetchResponse(partitions=[broker_pb2.FetchPartitionResponse(
        topic=TP.topic, partition=TP.partition, high_watermark=20, last_stable_offset=lso, log_start_offset=0,
        log_end_offset=20, records=data,
        aborted_transactions=[broker_pb2.AbortedTransaction(producer_id=p, first_offset=f) for p, f in aborted])])


@pytest.mark.parametrize(("isolation", "expected"), [("read_committed", [0, 1, 6, 7]),
                                                    ("read_uncommitted", [0, 1, 3, 4, 6, 7])])
def test_the_consumer_filters_an_answer_by_its_isolation_level(isolation: str, expected: list[int]) -> None:
    with Consumer(bootstrap_servers=BOOT, isolation_level=isolation) as c:
        c.assign([TP])
        st = c._assignment[TP]
        st.seek_validated(0)
        st.in_flight = True
        c._handle_fetch(CompletedFetch(1, {TP: 0}, answer(LOG, [(7, 3)], 9), None))
        got = c._drain(100)
        assert [r.offset for r in got[TP]] == expected
        assert st.position == 9, "past the last marker"


def test_the_fetch_request_carries_the_isolation_level(monkeypatch: pytest.MonkeyPatch) -> None:
    with Consumer(bootstrap_servers=BOOT, isolation_level="read_committed") as c:
        fetcher: Fetcher = c._fetcher
        sent: list[broker_pb2.FetchRequest] = []
        monkeypatch.setattr(c.cluster, "broker_stub", lambda node: object())
        monkeypatch.setattr(fetcher._unary, "active", lambda stub: True)  # a unary call, on the pool
        monkeypatch.setattr(fetcher, "_call_fetch", lambda node, offsets, stub, request: sent.append(request))
        st = PartitionState(position=5, leader_epoch=2)
        fetcher._send(1, [TP], {TP: st})
        fetcher._pool.shutdown(wait=True)
        assert len(sent) == 1 and sent[0].isolation_level == 1 and sent[0].partitions[0].fetch_offset == 5
