"""The transaction coordinator's state machine against Kafka's TransactionCoordinator / TransactionMetadata
(core/src/main/scala/kafka/coordinator/transaction/), and its replay from the records it writes."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest

from broker import txn_records as rec
from broker import txn_state as ts
from broker.txn_state import TransactionState as S
from broker.txn_state import TxnError as E
from client.types import TopicPartition as TP

P = 50  # __transaction_state partitions
TID = "txn-a"


class Pids:
    def __init__(self, start: int = 1000) -> None:
        self._it = itertools.count(start)
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return next(self._it)


@pytest.fixture
def st() -> ts.TransactionCoordinatorState:
    return ts.TransactionCoordinatorState(P, owned=range(P))


def done(st: ts.TransactionCoordinatorState, t: ts.Transition | E) -> ts.Completed:
    assert isinstance(t, ts.Transition), t
    return st.complete(t)


def init(st: ts.TransactionCoordinatorState, tid: str = TID, now: int = 0, pids: Pids | None = None,
         timeout: int = 60_000, expected: tuple[int, int] | None = None) -> ts.Completed:
    return done(st, st.init_producer_id(tid, timeout, now, pids or Pids(), expected))


def ongoing(st: ts.TransactionCoordinatorState, tid: str = TID, now: int = 0,
            parts: tuple[tuple[str, int], ...] = (("t", 0), ("t", 1))) -> tuple[int, int]:
    c = init(st, tid, now)
    done(st, st.add_partitions(tid, c.producer_id, c.producer_epoch, parts, now))
    return c.producer_id, c.producer_epoch


def loaded(records: list[tuple[bytes, bytes | None]], partitions: int = P, **kw: int
           ) -> tuple[ts.TransactionCoordinatorState, list[ts.PendingMarkers]]:
    fresh = ts.TransactionCoordinatorState(partitions, **kw)
    for p in range(partitions):
        fresh.begin_load(p)
    for key, value in records:
        fresh.load(key, value)
    markers = [m for p in range(partitions) for m in fresh.finish_load(p)]
    return fresh, markers


def value(state: int, pid: int = 7, epoch: int = 3, parts: rec.Partitions | None = None, timeout: int = 60_000,
          update: int = 10, start: int = -1) -> bytes:
    return rec.encode_value(rec.TxnLogValue(pid, epoch, timeout, state, parts, update, start))


# ---- tables and codes ---------------------------------------------------------------------------


def test_states_codes_and_transitions_are_kafkas() -> None:
    assert [(s.value, s.kafka_name) for s in S] == [
        (0, "Empty"), (1, "Ongoing"), (2, "PrepareCommit"), (3, "PrepareAbort"), (4, "CompleteCommit"),
        (5, "CompleteAbort"), (6, "Dead"), (7, "PrepareEpochFence")]
    assert S.from_name("PrepareAbort") == S.PREPARE_ABORT and S.from_name("prepareabort") is None
    # TransactionMetadata.scala's validPreviousStates, state by state
    prev = ts.VALID_PREVIOUS_STATES
    assert prev[S.EMPTY] == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert prev[S.ONGOING] == {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert prev[S.PREPARE_COMMIT] == {S.ONGOING}
    assert prev[S.PREPARE_ABORT] == {S.ONGOING, S.PREPARE_EPOCH_FENCE}
    assert prev[S.COMPLETE_COMMIT] == {S.PREPARE_COMMIT}
    assert prev[S.COMPLETE_ABORT] == {S.PREPARE_ABORT}
    assert prev[S.DEAD] == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert prev[S.PREPARE_EPOCH_FENCE] == {S.ONGOING}
    assert ts.can_transition(S.ONGOING, S.PREPARE_COMMIT) and not ts.can_transition(S.EMPTY, S.PREPARE_COMMIT)


def test_error_codes_match_kafkas_numbering() -> None:
    from kio.schema.errors import ErrorCode  # an independent copy of Kafka's Errors

    for e in E:
        assert ErrorCode[e.name.lower()].value == e.value, e


def test_error_for_version_and_append_errors() -> None:
    fenced = E.PRODUCER_FENCED
    assert ts.error_for_version(fenced, ts.API_INIT_PRODUCER_ID, 3) == E.INVALID_PRODUCER_EPOCH
    assert ts.error_for_version(fenced, ts.API_INIT_PRODUCER_ID, 4) == fenced
    for api in (ts.API_ADD_PARTITIONS_TO_TXN, ts.API_ADD_OFFSETS_TO_TXN, ts.API_END_TXN):
        assert ts.error_for_version(fenced, api, 1) == E.INVALID_PRODUCER_EPOCH
        assert ts.error_for_version(fenced, api, 2) == fenced
    assert ts.error_for_version(E.CONCURRENT_TRANSACTIONS, ts.API_END_TXN, 0) == E.CONCURRENT_TRANSACTIONS
    # TransactionStateManager.appendTransactionToLog's mapping
    assert ts.append_error(7) == E.COORDINATOR_NOT_AVAILABLE  # REQUEST_TIMED_OUT
    assert ts.append_error(6) == E.NOT_COORDINATOR  # NOT_LEADER_OR_FOLLOWER
    assert ts.append_error(10) == E.UNKNOWN_SERVER_ERROR  # MESSAGE_TOO_LARGE
    assert ts.append_error(87) == 87


# ---- InitProducerId -----------------------------------------------------------------------------


def test_init_new_id_gets_fresh_producer_and_epoch_zero(st: ts.TransactionCoordinatorState) -> None:
    pids = Pids(42)
    t = st.init_producer_id(TID, 60_000, 5, pids)
    assert isinstance(t, ts.Transition) and t.kind == ts.TransitionKind.INIT_PRODUCER_ID and t.created
    assert t.partition == rec.partition_for(TID, P)
    assert rec.parse_record(t.key, t.value) == (TID, rec.TxnLogValue(42, 0, 60_000, 0, None, 5, -1))
    c = st.complete(t)
    assert (c.error, c.producer_id, c.producer_epoch, c.markers) == (E.NONE, 42, 0, None)
    m = st.get(TID)
    assert m is not None and (m.state, m.producer_epoch, m.last_producer_epoch, m.pending_state) == (S.EMPTY, 0, -1, None)
    assert len(st) == 1 and TID in st and "other" not in st


def test_init_validation(st: ts.TransactionCoordinatorState) -> None:
    pids = Pids()
    assert st.init_producer_id("", 1000, 0, pids) == E.INVALID_REQUEST
    assert st.init_producer_id("x" * 40_000, 1000, 0, pids) == E.INVALID_REQUEST
    assert st.init_producer_id("bad\udc80", 1000, 0, pids) == E.INVALID_REQUEST  # no UTF-8 for it
    assert st.init_producer_id(TID, 0, 0, pids) == E.INVALID_TRANSACTION_TIMEOUT
    assert st.init_producer_id(TID, 900_001, 0, pids) == E.INVALID_TRANSACTION_TIMEOUT
    assert st.init_producer_id(TID, 5000, 0, pids, max_timeout_ms=4000) == E.INVALID_TRANSACTION_TIMEOUT
    assert st.init_producer_id(TID, 1000, 0, pids, expected=(5, -1)) == E.INVALID_REQUEST  # KafkaApis
    assert pids.calls == 0 and len(st) == 0
    assert isinstance(st.init_producer_id(TID, 900_000, 0, pids, expected=(-1, -1)), ts.Transition)


def test_init_existing_bumps_epoch_and_takes_new_timeout(st: ts.TransactionCoordinatorState) -> None:
    pids = Pids()
    first = init(st, pids=pids)
    second = init(st, now=9, pids=pids, timeout=1234)
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1) and pids.calls == 1
    m = st.get(TID)
    assert m is not None and m.timeout_ms == 1234 and m.last_update_ms == 9
    assert m.last_producer_id == first.producer_id  # prepareTransitionTo: prevProducerId = producerId
    # from CompleteCommit and CompleteAbort too
    for commit in (True, False):
        pid, epoch = ongoing(st)
        c = done(st, st.end_txn(TID, pid, epoch, commit, 20))
        assert c.markers is not None
        done(st, st.markers_written(TID, pid, epoch, 21))
        assert st.get(TID).state == (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)  # type: ignore[union-attr]
        again = init(st, now=22)
        assert (again.producer_id, again.producer_epoch) == (pid, epoch + 1)


def test_epoch_exhaustion_rotates_the_producer_id() -> None:
    # TransactionMetadata.isEpochExhausted: epoch >= Short.MaxValue - 1
    key = rec.encode_key(TID)
    st, _ = loaded([(key, value(S.COMPLETE_COMMIT, pid=7, epoch=32765, parts=()))])
    pids = Pids(500)
    c = init(st, pids=pids)
    assert (c.producer_id, c.producer_epoch, pids.calls) == (7, 32766, 0)  # 32765 is not exhausted yet
    c = init(st, pids=pids)
    assert (c.producer_id, c.producer_epoch, pids.calls) == (500, 0, 1)  # prepareProducerIdRotation
    m = st.get(TID)
    assert m is not None and (m.last_producer_id, m.last_producer_epoch) == (7, -1)


def test_kip360_expected_producer_id_and_epoch(st: ts.TransactionCoordinatorState) -> None:
    pids = Pids(100)
    c = init(st, pids=pids)
    pid = c.producer_id
    # the producer's own epoch: bumped, and the old one kept as the last epoch
    c = init(st, pids=pids, expected=(pid, 0))
    assert (c.producer_id, c.producer_epoch) == (pid, 1)
    assert st.get(TID).last_producer_epoch == 0  # type: ignore[union-attr]
    # a retry of that call (its answer lost): the same epoch again, no bump
    c = init(st, pids=pids, expected=(pid, 0))
    assert (c.producer_id, c.producer_epoch) == (pid, 1)
    # any other epoch or producer id is fenced (prepareIncrementProducerEpoch / isValidProducerId)
    assert st.init_producer_id(TID, 1000, 0, pids, expected=(pid, 5)) == E.PRODUCER_FENCED
    assert st.init_producer_id(TID, 1000, 0, pids, expected=(pid + 1, 1)) == E.PRODUCER_FENCED
    # an unknown id with an expected pair: epoch -1 metadata accepts it (recovering from UNKNOWN_PRODUCER_ID)
    c = init(st, "fresh", pids=pids, expected=(55, 3))
    assert c.producer_epoch == 0 and c.producer_id not in (55, pid)


def test_kip360_retry_after_rotation() -> None:
    st, _ = loaded([(rec.encode_key(TID), value(S.EMPTY, pid=7, epoch=32766))])
    pids = Pids(900)
    c = init(st, pids=pids, expected=(7, 32766))
    assert (c.producer_id, c.producer_epoch) == (900, 0)
    m = st.get(TID)
    assert m is not None and (m.last_producer_id, m.last_producer_epoch) == (7, 32766)  # recordLastEpoch
    # the retry names the old id and its exhausted epoch: the previous producer id matches, no second rotation
    c = init(st, pids=pids, expected=(7, 32766))
    assert (c.producer_id, c.producer_epoch, pids.calls) == (900, 0, 1)
    # an exhausted epoch that is not the current one, with a matching id: fenced, never a crash
    st2, _ = loaded([(rec.encode_key(TID), value(S.EMPTY, pid=7, epoch=32766))])
    assert st2.init_producer_id(TID, 1000, 0, pids, expected=(7, 3)) == E.PRODUCER_FENCED


def test_init_while_ongoing_fences_and_aborts_first(st: ts.TransactionCoordinatorState) -> None:
    pid, epoch = ongoing(st, now=100)
    t = st.init_producer_id(TID, 30_000, 200, Pids())
    assert isinstance(t, ts.Transition) and t.kind == ts.TransitionKind.FENCE_ABORT
    assert t.reply == E.CONCURRENT_TRANSACTIONS
    _, v = rec.parse_record(t.key, t.value)
    assert v is not None and (v.status, v.producer_epoch, v.timeout_ms) == (S.PREPARE_ABORT, epoch + 1, 60_000)
    c = st.complete(t)
    assert c.error == E.CONCURRENT_TRANSACTIONS  # the client backs off and retries
    assert c.markers == ts.PendingMarkers(TID, pid, epoch + 1, False, frozenset({TP("t", 0), TP("t", 1)}))
    # the old producer is fenced; anything else waits for the markers
    assert st.add_partitions(TID, pid, epoch, [("t", 2)], 201) == E.PRODUCER_FENCED
    assert st.end_txn(TID, pid, epoch, True, 201) == E.PRODUCER_FENCED
    assert st.init_producer_id(TID, 30_000, 201, Pids()) == E.CONCURRENT_TRANSACTIONS
    done(st, st.markers_written(TID, pid, epoch + 1, 202))
    c = init(st, now=203, timeout=30_000)
    assert (c.producer_id, c.producer_epoch) == (pid, epoch + 2)


def test_init_in_prepare_states_is_concurrent(st: ts.TransactionCoordinatorState) -> None:
    pid, epoch = ongoing(st)
    done(st, st.end_txn(TID, pid, epoch, True, 1))
    assert st.init_producer_id(TID, 1000, 2, Pids()) == E.CONCURRENT_TRANSACTIONS
    # also when loaded in PrepareAbort
    st2, markers = loaded([(rec.encode_key(TID), value(S.PREPARE_ABORT, parts=(("t", (0,)),)))])
    assert st2.init_producer_id(TID, 1000, 2, Pids()) == E.CONCURRENT_TRANSACTIONS
    assert markers == [ts.PendingMarkers(TID, 7, 3, False, frozenset({TP("t", 0)}))]


def test_concurrent_requests_while_a_write_is_pending(st: ts.TransactionCoordinatorState) -> None:
    c = init(st)
    pid, epoch = c.producer_id, c.producer_epoch
    t = st.add_partitions(TID, pid, epoch, [("t", 0)], 1)
    assert isinstance(t, ts.Transition) and st.get(TID).pending_state == S.ONGOING  # type: ignore[union-attr]
    assert st.init_producer_id(TID, 1000, 1, Pids()) == E.CONCURRENT_TRANSACTIONS
    assert st.add_partitions(TID, pid, epoch, [("t", 1)], 1) == E.CONCURRENT_TRANSACTIONS
    assert st.end_txn(TID, pid, epoch, True, 1) == E.CONCURRENT_TRANSACTIONS
    assert st.expire_ids(10**12) == [] and st.expired(10**12) == []
    # producer checks come before the pending check (handleAddPartitionsToTransaction, endTransaction)
    assert st.add_partitions(TID, pid, epoch + 1, [("t", 1)], 1) == E.PRODUCER_FENCED
    assert st.end_txn(TID, pid + 1, epoch, True, 1) == E.INVALID_PRODUCER_ID_MAPPING
    # a new id being created is pending too
    t2 = st.init_producer_id("new", 1000, 1, Pids())
    assert isinstance(t2, ts.Transition)
    assert st.init_producer_id("new", 1000, 1, Pids()) == E.CONCURRENT_TRANSACTIONS
    st.complete(t)
    st.complete(t2)
    assert st.get(TID).pending_state is None  # type: ignore[union-attr]


# ---- AddPartitionsToTxn / AddOffsetsToTxn -------------------------------------------------------


def test_add_partitions_paths(st: ts.TransactionCoordinatorState) -> None:
    assert st.add_partitions(TID, 1, 0, [("t", 0)], 0) == E.INVALID_PRODUCER_ID_MAPPING  # unknown id
    c = init(st, now=0)
    pid, epoch = c.producer_id, c.producer_epoch
    assert st.add_partitions(TID, pid + 1, epoch, [("t", 0)], 1) == E.INVALID_PRODUCER_ID_MAPPING
    assert st.add_partitions(TID, pid, epoch - 1, [("t", 0)], 1) == E.PRODUCER_FENCED
    assert st.add_partitions(TID, pid, epoch + 1, [("t", 0)], 1) == E.PRODUCER_FENCED  # Kafka compares with !=
    assert st.add_partitions("", pid, epoch, [("t", 0)], 1) == E.INVALID_REQUEST
    t = st.add_partitions(TID, pid, epoch, [("t", 0), ("u", 3)], 10)
    assert isinstance(t, ts.Transition)
    _, v = rec.parse_record(t.key, t.value)
    assert v == rec.TxnLogValue(pid, epoch, 60_000, S.ONGOING, (("t", (0,)), ("u", (3,))), 10, 10)
    st.complete(t)
    # already all there: no write (the optimisation in handleAddPartitionsToTransaction)
    assert st.add_partitions(TID, pid, epoch, [("u", 3)], 11) == E.NONE
    t = st.add_partitions(TID, pid, epoch, [("t", 0), ("t", 5)], 20)
    assert isinstance(t, ts.Transition)
    st.complete(t)
    m = st.get(TID)
    assert m is not None and m.partitions == {TP("t", 0), TP("t", 5), TP("u", 3)}
    assert (m.txn_start_ms, m.last_update_ms) == (10, 20)  # the start stays
    # Prepare*: concurrent (the markers are being written)
    done(st, st.end_txn(TID, pid, epoch, False, 30))
    assert st.add_partitions(TID, pid, epoch, [("t", 9)], 31) == E.CONCURRENT_TRANSACTIONS
    done(st, st.markers_written(TID, pid, epoch, 32))
    # CompleteAbort -> Ongoing: a new transaction, a new start, only the new partitions
    done(st, st.add_partitions(TID, pid, epoch, [("v", 1)], 40))
    m = st.get(TID)
    assert m is not None and (m.state, m.partitions, m.txn_start_ms) == (S.ONGOING, {TP("v", 1)}, 40)


def test_add_partitions_bounds() -> None:
    st = ts.TransactionCoordinatorState(P, owned=range(P), max_partitions=5, max_value_bytes=200)
    c = init(st)
    pid, epoch = c.producer_id, c.producer_epoch
    assert st.add_partitions(TID, pid, epoch, [("t", i) for i in range(6)], 1) == E.INVALID_REQUEST
    done(st, st.add_partitions(TID, pid, epoch, [("t", i) for i in range(4)], 1))
    assert st.add_partitions(TID, pid, epoch, [("u", 0), ("u", 1)], 2) == E.INVALID_REQUEST  # 6 in all
    assert st.add_partitions(TID, pid, epoch, [("x" * 150, 0)], 2) == E.INVALID_REQUEST  # record > 200 bytes
    for bad in ([("t", -1)], [("t", 2**31)], [("", 0)], [(None, 0)], [("t", "0")]):
        assert st.add_partitions(TID, pid, epoch, bad, 2) == E.INVALID_REQUEST  # type: ignore[arg-type]
    assert st.get(TID).partitions == {TP("t", i) for i in range(4)}  # type: ignore[union-attr]
    # a huge request stops at the bound instead of being read whole
    def endless() -> Iterator[tuple[str, int]]:
        for i in itertools.count():
            yield ("t", i)

    assert st.add_partitions(TID, pid, epoch, endless(), 3) == E.INVALID_REQUEST


def test_add_offsets_adds_the_groups_offsets_partition(st: ts.TransactionCoordinatorState) -> None:
    c = init(st)
    done(st, st.add_offsets(TID, c.producer_id, c.producer_epoch, 17, 1))
    assert st.get(TID).partitions == {TP("__consumer_offsets", 17)}  # type: ignore[union-attr]
    assert st.add_offsets(TID, c.producer_id, c.producer_epoch - 1, 17, 1) == E.PRODUCER_FENCED


# ---- EndTxn and markers -------------------------------------------------------------------------


def test_end_txn_commit_markers_and_retries(st: ts.TransactionCoordinatorState) -> None:
    pid, epoch = ongoing(st, now=5)
    t = st.end_txn(TID, pid, epoch, True, 50)
    assert isinstance(t, ts.Transition) and t.kind == ts.TransitionKind.END_TXN
    _, v = rec.parse_record(t.key, t.value)
    assert v is not None and (v.status, v.partitions, v.start_ms, v.last_update_ms) == (
        S.PREPARE_COMMIT, (("t", (0, 1)),), 5, 50)
    c = st.complete(t)
    assert c.error == E.NONE and c.markers == ts.PendingMarkers(TID, pid, epoch, True, frozenset({TP("t", 0), TP("t", 1)}))
    m = st.get(TID)
    assert m is not None and (m.state, m.pending_state) == (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)
    assert st.pending_markers() == [c.markers]
    # retries while the markers are written: concurrent (pending Complete*), whatever the result asked
    assert st.end_txn(TID, pid, epoch, True, 51) == E.CONCURRENT_TRANSACTIONS
    assert st.end_txn(TID, pid, epoch, False, 51) == E.CONCURRENT_TRANSACTIONS
    t = st.markers_written(TID, pid, epoch, 60)
    assert isinstance(t, ts.Transition) and t.kind == ts.TransitionKind.COMPLETE
    assert st.pending_markers() == []  # its Complete* write is in flight
    assert st.markers_written(TID, pid, epoch, 60) == E.CONCURRENT_TRANSACTIONS
    _, v = rec.parse_record(t.key, t.value)
    assert v is not None and (v.status, v.partitions, v.start_ms, v.last_update_ms) == (S.COMPLETE_COMMIT, (), 5, 60)
    assert st.complete(t) == ts.Completed(E.NONE, pid, epoch)
    m = st.get(TID)
    assert m is not None and (m.state, m.partitions, m.pending_state) == (S.COMPLETE_COMMIT, frozenset(), None)
    # a retry of the finished commit is answered OK without a write; an abort of it is INVALID_TXN_STATE
    assert st.end_txn(TID, pid, epoch, True, 61) == E.NONE
    assert st.end_txn(TID, pid, epoch, False, 61) == E.INVALID_TXN_STATE
    assert st.markers_written(TID, pid, epoch, 62) == E.INVALID_TXN_STATE


def test_end_txn_abort_and_errors(st: ts.TransactionCoordinatorState) -> None:
    assert st.end_txn(TID, 1, 0, True, 0) == E.INVALID_PRODUCER_ID_MAPPING
    c = init(st)
    pid, epoch = c.producer_id, c.producer_epoch
    assert st.end_txn(TID, pid, epoch, True, 1) == E.INVALID_TXN_STATE  # Empty: nothing to end
    assert st.end_txn(TID, pid, epoch, False, 1) == E.INVALID_TXN_STATE
    done(st, st.add_partitions(TID, pid, epoch, [("t", 0)], 1))
    assert st.end_txn(TID, pid + 1, epoch, True, 2) == E.INVALID_PRODUCER_ID_MAPPING
    assert st.end_txn(TID, pid, epoch + 1, True, 2) == E.PRODUCER_FENCED
    assert st.end_txn("", pid, epoch, True, 2) == E.INVALID_REQUEST
    c2 = done(st, st.end_txn(TID, pid, epoch, False, 3))
    assert c2.markers is not None and not c2.markers.commit
    assert st.markers_written(TID, pid, epoch + 1, 4) == E.PRODUCER_FENCED
    assert st.markers_written(TID, pid + 1, epoch, 4) == E.INVALID_PRODUCER_ID_MAPPING
    assert st.markers_written("nobody", pid, epoch, 4) == E.INVALID_PRODUCER_ID_MAPPING
    done(st, st.markers_written(TID, pid, epoch, 4))
    assert st.end_txn(TID, pid, epoch, False, 5) == E.NONE
    assert st.end_txn(TID, pid, epoch, True, 5) == E.INVALID_TXN_STATE


def test_mismatched_end_in_prepare_without_pending_is_invalid_txn_state() -> None:
    # Kafka's endTransaction: PrepareCommit + abort -> INVALID_TXN_STATE, PrepareCommit + commit ->
    # CONCURRENT_TRANSACTIONS. Reachable here only while the id is pending markers; a loaded (not yet
    # finished) partition answers COORDINATOR_LOAD_IN_PROGRESS.
    st = ts.TransactionCoordinatorState(P)
    st.begin_load(rec.partition_for(TID, P))
    st.load(rec.encode_key(TID), value(S.PREPARE_COMMIT, parts=(("t", (0,)),)))
    assert st.end_txn(TID, 7, 3, True, 0) == E.COORDINATOR_LOAD_IN_PROGRESS
    st.finish_load(rec.partition_for(TID, P))
    assert st.end_txn(TID, 7, 3, False, 0) == E.CONCURRENT_TRANSACTIONS


# ---- write failures -----------------------------------------------------------------------------


def test_failed_writes_restore_the_state(st: ts.TransactionCoordinatorState) -> None:
    # a new id whose first write failed is forgotten
    t = st.init_producer_id(TID, 1000, 0, Pids())
    assert isinstance(t, ts.Transition)
    st.abort(t)
    assert st.get(TID) is None and len(st) == 0
    c = init(st)
    pid, epoch = c.producer_id, c.producer_epoch
    before = st.get(TID)
    for request in (lambda: st.init_producer_id(TID, 5, 1, Pids()),
                    lambda: st.add_partitions(TID, pid, epoch, [("t", 0)], 1)):
        t = request()
        assert isinstance(t, ts.Transition)
        st.abort(t)
        assert st.get(TID) == before
    done(st, st.add_partitions(TID, pid, epoch, [("t", 0)], 2))
    before = st.get(TID)
    t = st.end_txn(TID, pid, epoch, True, 3)
    assert isinstance(t, ts.Transition)
    st.abort(t)
    assert st.get(TID) == before
    st.abort(t)  # twice: ignored
    assert st.complete(t).error == E.NOT_COORDINATOR  # a transition no longer in flight is stale
    # a failed Complete* write: the markers are written, so the id stays pending and the write is retried
    done(st, st.end_txn(TID, pid, epoch, True, 4))
    t = st.markers_written(TID, pid, epoch, 5)
    assert isinstance(t, ts.Transition)
    st.abort(t)
    m = st.get(TID)
    assert m is not None and (m.state, m.pending_state) == (S.PREPARE_COMMIT, S.COMPLETE_COMMIT)
    assert [mk.transactional_id for mk in st.pending_markers()] == [TID]
    done(st, st.markers_written(TID, pid, epoch, 6))
    assert st.get(TID).state == S.COMPLETE_COMMIT  # type: ignore[union-attr]


def test_failed_fence_keeps_the_bumped_epoch_and_reuses_it(st: ts.TransactionCoordinatorState) -> None:
    # TransactionCoordinator.endTransaction bumps the epoch in memory before the append; on failure
    # hasFailedEpochFence keeps the next fence from bumping again (prepareFenceProducerEpoch).
    pid, epoch = ongoing(st, now=0)
    t = st.init_producer_id(TID, 1000, 10, Pids())
    assert isinstance(t, ts.Transition) and t.producer_epoch == epoch + 1
    st.abort(t)
    m = st.get(TID)
    assert m is not None and (m.state, m.producer_epoch, m.failed_epoch_fence, m.pending_state) == (
        S.ONGOING, epoch + 1, True, None)
    assert st.add_partitions(TID, pid, epoch, [("t", 3)], 11) == E.PRODUCER_FENCED  # the old producer stays fenced
    [t] = st.expired(10**9)
    assert t.kind == ts.TransitionKind.FENCE_ABORT and t.producer_epoch == epoch + 1 and t.reply == E.NONE
    c = st.complete(t)
    assert c.markers is not None and c.markers.producer_epoch == epoch + 1
    assert not st.get(TID).failed_epoch_fence  # type: ignore[union-attr]


# ---- timeouts and expiry ------------------------------------------------------------------------


def test_timed_out_transactions_are_aborted_with_a_bumped_epoch(st: ts.TransactionCoordinatorState) -> None:
    c = init(st, timeout=1000)
    pid, epoch = c.producer_id, c.producer_epoch
    done(st, st.add_partitions(TID, pid, epoch, [("t", 0)], 100))
    init(st, "idle", timeout=1000)  # Empty: never times out
    assert st.expired(1100) == []  # TransactionStateManager.timedOutTransactions: start + timeout < now
    [t] = st.expired(1101)
    assert t.transactional_id == TID and t.kind == ts.TransitionKind.FENCE_ABORT and t.reply == E.NONE
    assert st.expired(1101) == []  # pending now
    c = st.complete(t)
    assert c.error == E.NONE and c.markers == ts.PendingMarkers(TID, pid, epoch + 1, False, frozenset({TP("t", 0)}))
    assert st.end_txn(TID, pid, epoch, True, 1102) == E.PRODUCER_FENCED  # the timed-out producer is fenced
    done(st, st.markers_written(TID, pid, epoch + 1, 1103))
    assert st.get(TID).state == S.COMPLETE_ABORT  # type: ignore[union-attr]
    assert st.expired(10**9) == []


def test_idle_ids_expire_with_a_tombstone() -> None:
    st = ts.TransactionCoordinatorState(P, owned=range(P), id_expiration_ms=1000)
    init(st, "empty", now=0)
    pid, epoch = ongoing(st, "busy", now=0)
    init(st, "recent", now=500)
    assert st.expire_ids(999) == []
    [t] = st.expire_ids(1000)  # last update <= now - transactional.id.expiration.ms
    assert (t.transactional_id, t.kind, t.value, t.target) == ("empty", ts.TransitionKind.EXPIRE_ID, None, None)
    assert t.key == rec.encode_key("empty")
    assert st.get("empty").pending_state == S.DEAD  # type: ignore[union-attr]
    assert st.init_producer_id("empty", 1000, 1000, Pids()) == E.CONCURRENT_TRANSACTIONS
    st.abort(t)
    assert st.get("empty").pending_state is None  # type: ignore[union-attr]
    [t] = st.expire_ids(1000)
    assert st.complete(t).error == E.NONE
    assert st.get("empty") is None and st.describe("empty") == E.TRANSACTIONAL_ID_NOT_FOUND
    assert [x.transactional_id for x in st.expire_ids(1500)] == ["recent"]  # Ongoing never expires


# ---- ownership and loading ----------------------------------------------------------------------


def test_ownership_and_loading_errors() -> None:
    st = ts.TransactionCoordinatorState(P)
    p = rec.partition_for(TID, P)
    assert st.init_producer_id(TID, 1000, 0, Pids()) == E.NOT_COORDINATOR
    assert st.add_partitions(TID, 1, 0, [], 0) == E.NOT_COORDINATOR
    assert st.end_txn(TID, 1, 0, True, 0) == E.NOT_COORDINATOR
    assert st.describe(TID) == E.NOT_COORDINATOR
    st.begin_load(p)
    assert st.init_producer_id(TID, 1000, 0, Pids()) == E.COORDINATOR_LOAD_IN_PROGRESS
    assert st.describe(TID) == E.COORDINATOR_LOAD_IN_PROGRESS
    assert st.list_transactions().error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert st.finish_load(p) == []
    c = init(st)
    t = st.add_partitions(TID, c.producer_id, c.producer_epoch, [("t", 0)], 1)
    assert isinstance(t, ts.Transition)
    st.unload(p)  # leadership moved while the write was in flight
    assert st.complete(t).error == E.NOT_COORDINATOR and len(st) == 0
    assert st.init_producer_id(TID, 1000, 0, Pids()) == E.NOT_COORDINATOR
    with pytest.raises(ValueError):
        st.begin_load(P)
    with pytest.raises(ValueError):
        st.finish_load(p)


def test_load_replays_last_record_wins_and_tombstones() -> None:
    key = rec.encode_key(TID)
    records = [
        (key, value(S.EMPTY, pid=7, epoch=0)),
        (key, value(S.ONGOING, pid=7, epoch=0, parts=(("t", (0, 1)),), start=5)),
        (rec.encode_key("gone"), value(S.EMPTY)),
        (rec.encode_key("gone"), None),
        (key, value(S.ONGOING, pid=7, epoch=0, parts=(("t", (0, 1)), ("u", (2,))), start=5, update=20)),
    ]
    st, markers = loaded(records)
    assert markers == [] and len(st) == 1 and st.get("gone") is None
    m = st.get(TID)
    assert m is not None
    assert (m.producer_id, m.producer_epoch, m.state, m.partitions, m.txn_start_ms, m.last_update_ms) == (
        7, 0, S.ONGOING, {TP("t", 0), TP("t", 1), TP("u", 2)}, 5, 20)
    assert (m.last_producer_epoch, m.last_producer_id) == (-1, -1)  # not in a v0 record (as Kafka's load)
    # an Empty record's partitions are ignored (readTxnRecordValue)
    st, _ = loaded([(key, value(S.EMPTY, parts=(("t", (0,)),)))])
    assert st.get(TID).partitions == frozenset()  # type: ignore[union-attr]


def test_load_of_prepare_states_lists_markers_and_completes() -> None:
    records = [(rec.encode_key("c"), value(S.PREPARE_COMMIT, pid=1, epoch=2, parts=(("t", (0,)),), start=1)),
               (rec.encode_key("a"), value(S.PREPARE_ABORT, pid=3, epoch=4, parts=(("t", (1,)),), start=1)),
               (rec.encode_key("x"), value(S.COMPLETE_COMMIT, pid=5, parts=(), start=1))]
    st, markers = loaded(records)
    assert sorted(markers, key=lambda m: m.transactional_id) == [
        ts.PendingMarkers("a", 3, 4, False, frozenset({TP("t", 1)})),
        ts.PendingMarkers("c", 1, 2, True, frozenset({TP("t", 0)}))]
    assert st.get("c").pending_state == S.COMPLETE_COMMIT  # type: ignore[union-attr]
    c = done(st, st.markers_written("c", 1, 2, 100))
    assert c.error == E.NONE and st.get("c").state == S.COMPLETE_COMMIT  # type: ignore[union-attr]
    assert [m.transactional_id for m in st.pending_markers()] == ["a"]


def test_load_rejects_bad_records_and_keeps_state() -> None:
    st = ts.TransactionCoordinatorState(P)
    p = rec.partition_for(TID, P)
    st.begin_load(p)
    key = rec.encode_key(TID)
    st.load(key, value(S.EMPTY, pid=7, epoch=1))
    with pytest.raises(rec.UnknownVersionError):
        st.load(key, b"\x00\x09" + value(S.EMPTY)[2:])
    with pytest.raises(rec.UnknownVersionError):
        st.load(b"\x00\x05\x00\x01t", value(S.EMPTY))
    for status in (S.DEAD, S.PREPARE_EPOCH_FENCE):
        with pytest.raises(rec.TxnRecordError, match="never written"):
            st.load(key, value(status))
    with pytest.raises(rec.TxnRecordError, match="epoch -1"):
        st.load(key, value(S.EMPTY, epoch=-1))
    with pytest.raises(rec.TxnRecordError):
        st.load(key, value(S.EMPTY)[:-1])
    other = next(f"id{i}" for i in itertools.count() if rec.partition_for(f"id{i}", P) != p)
    with pytest.raises(rec.TxnRecordError, match="not being loaded"):
        st.load(rec.encode_key(other), value(S.EMPTY))
    st.finish_load(p)
    m = st.get(TID)
    assert m is not None and (m.producer_id, m.producer_epoch) == (7, 1) and len(st) == 1


def test_reload_drops_previous_state_of_the_partition(st: ts.TransactionCoordinatorState) -> None:
    init(st)
    p = rec.partition_for(TID, P)
    st.begin_load(p)
    assert st.get(TID) is None
    st.finish_load(p)
    assert st.describe(TID) == E.TRANSACTIONAL_ID_NOT_FOUND


# ---- DescribeTransactions / ListTransactions ----------------------------------------------------


def test_describe_and_list(st: ts.TransactionCoordinatorState) -> None:
    assert st.describe("") == E.INVALID_REQUEST
    assert st.describe(TID) == E.TRANSACTIONAL_ID_NOT_FOUND
    pid, epoch = ongoing(st, now=100, parts=(("u", 2), ("t", 1), ("t", 0)))
    init(st, "other", now=0, pids=Pids(5000))
    d = st.describe(TID)
    assert d == ts.TxnDescription(TID, pid, epoch, S.ONGOING, 60_000, 100, (("t", (0, 1)), ("u", (2,))))
    everything = st.list_transactions()
    assert everything.error == E.NONE and sorted(everything.transactions) == sorted([
        (TID, pid, "Ongoing"), ("other", st.get("other").producer_id, "Empty")])  # type: ignore[union-attr]
    only = st.list_transactions(["Ongoing", "Bogus"])
    assert only.transactions == ((TID, pid, "Ongoing"),) and only.unknown_state_filters == ("Bogus",)
    assert st.list_transactions(["Bogus"]).transactions == ()  # a filter of only unknown states matches nothing
    assert st.list_transactions(producer_id_filter=[pid]).transactions == ((TID, pid, "Ongoing"),)
    # ListTransactions v1's duration filter: excluded when now - start <= duration
    assert st.list_transactions(["Ongoing"], duration_filter_ms=50, now_ms=150).transactions == ()
    assert st.list_transactions(["Ongoing"], duration_filter_ms=50, now_ms=151).transactions == (
        (TID, pid, "Ongoing"),)


# ---- replay equals the live path ----------------------------------------------------------------


def _persisted(m: ts.TransactionMetadata) -> tuple:
    return (m.producer_id, m.timeout_ms, m.state, m.partitions, m.txn_start_ms, m.last_update_ms, m.pending_state)


def _random_run(seed: int) -> set[S]:
    """A random sequence of requests, timers and failed writes; then the records written are replayed into a
    fresh state, which must equal the live one. Returns the states the run went through."""
    rng = random.Random(seed)
    seen: set[S] = set()
    partitions = 3
    st = ts.TransactionCoordinatorState(partitions, owned=range(partitions), max_timeout_ms=2000,
                                        id_expiration_ms=6000, max_partitions=6)
    ids = [f"txn-{i}" for i in range(6)]
    pids = Pids()
    now = 0
    written: list[tuple[bytes, bytes | None]] = []
    known: dict[str, tuple[int, int]] = {}  # what each producer was told
    markers: dict[str, ts.PendingMarkers] = {}
    stats = {"written": 0, "failed": 0, "fence": 0, "expired": 0}

    def write(t: ts.Transition) -> ts.Completed | None:
        if t.kind == ts.TransitionKind.EXPIRE_ID:
            stats["expired"] += 1
        if t.kind == ts.TransitionKind.FENCE_ABORT:
            stats["fence"] += 1
        if rng.random() < 0.15:
            st.abort(t)
            stats["failed"] += 1
            return None
        c = st.complete(t)
        assert c.error in (E.NONE, E.CONCURRENT_TRANSACTIONS)
        written.append((t.key, t.value))
        stats["written"] += 1
        if c.markers is not None:
            markers[t.transactional_id] = c.markers
        if t.kind == ts.TransitionKind.COMPLETE:
            markers.pop(t.transactional_id, None)
        return c

    def producer(tid: str) -> tuple[int, int]:
        pid, epoch = known.get(tid, (rng.randrange(1000, 1010), 0))
        roll = rng.random()
        if roll < 0.1:
            return pid, epoch + rng.choice((-1, 1))  # stale or guessed epoch
        if roll < 0.15:
            return pid + 1, epoch
        return pid, epoch

    for _ in range(300):
        now += rng.randrange(0, 700)
        tid = rng.choice(ids)
        op = rng.random()
        result: ts.Transition | E
        if op < 0.2:
            expected = known.get(tid) if rng.random() < 0.3 else None
            result = st.init_producer_id(tid, rng.choice((500, 1500, 2000)), now, pids, expected)
            if isinstance(result, ts.Transition):
                c = write(result)
                if c is not None and c.error == E.NONE:
                    known[tid] = (c.producer_id, c.producer_epoch)
            continue
        if op < 0.5:
            pid, epoch = producer(tid)
            parts = [(rng.choice("tuv"), rng.randrange(3)) for _ in range(rng.randrange(0, 3))]
            result = (st.add_offsets(tid, pid, epoch, rng.randrange(3), now) if rng.random() < 0.1
                      else st.add_partitions(tid, pid, epoch, parts, now))
        elif op < 0.7:
            pid, epoch = producer(tid)
            result = st.end_txn(tid, pid, epoch, rng.random() < 0.5, now)
        elif op < 0.85:
            if tid in markers:
                m = markers[tid]
                result = st.markers_written(tid, m.producer_id, m.producer_epoch, now)
            else:
                result = E.NONE
        elif op < 0.95:
            for t in st.expired(now):
                write(t)
            continue
        else:
            for t in st.expire_ids(now):
                if write(t) is not None:
                    known.pop(t.transactional_id, None)
            continue
        if isinstance(result, ts.Transition):
            write(result)
        # between requests nothing is in flight: only Prepare* ids are pending (their markers)
        for tid2 in ids:
            m2 = st.get(tid2)
            if m2 is not None:
                seen.add(m2.state)
                assert (m2.pending_state is not None) == (m2.state in ts.PREPARE_STATES)

    replayed, resend = loaded(written, partitions)
    assert len(replayed) == len(st)
    assert {m.transactional_id for m in resend} == {m.transactional_id for m in st.pending_markers()}
    for tid in ids:
        live, back = st.get(tid), replayed.get(tid)
        assert (live is None) == (back is None), tid
        if live is None or back is None:
            continue
        assert _persisted(live) == _persisted(back), tid
        # a fence whose write failed leaves the epoch bumped in memory only (Kafka's hasFailedEpochFence)
        assert live.producer_epoch == back.producer_epoch or (
            live.failed_epoch_fence and live.producer_epoch == back.producer_epoch + 1), tid
    assert stats["written"] > 50
    return seen


@pytest.mark.parametrize("seed", range(40))
def test_replaying_the_written_records_gives_the_live_state(seed: int) -> None:
    _random_run(seed)


def test_the_random_runs_reach_every_state() -> None:
    # the replay property is only as good as the states the runs visit
    seen = set().union(*(_random_run(seed) for seed in range(5)))
    assert seen == {S.EMPTY, S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}


