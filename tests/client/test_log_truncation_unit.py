"""KIP-320 in the consumer without a cluster: the truncation decision, the epochs positions carry, what
a leader change, a fenced fetch and the leader's OffsetsForLeaderEpoch answer do to a position, and
the epochs commits carry. The brokers are fakes that record what the consumer asks; the real cluster
is in test_log_truncation_cluster.py."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import grpc
import pytest

from client import errors
from client.consumer import Consumer
from client.coordinator import offset_commit_request
from client.fetcher import (
    POSITION_TRUNCATED,
    POSITION_UNKNOWN_EPOCH,
    POSITION_VALID,
    CompletedFetch,
    PartitionRecords,
    PartitionState,
    check_position,
)
from client.types import ClusterMetadata, OffsetAndMetadata, PartitionMetadata, TopicMetadata, TopicPartition
from proto import broker_pb2
from proto.errors import ErrorCode
from storage.record_batch import RecordBatchBuilder, build_control_batch

BOOT = "127.0.0.1:1"  # nothing listens: every broker call goes to the fakes below
TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def batch(base_offset: int, n: int, epoch: int) -> bytes:
    builder = RecordBatchBuilder(base_offset=base_offset, partition_leader_epoch=epoch)
    for i in range(n):
        builder.append(1000 + i, None, b"v%d" % (base_offset + i))
    return builder.build()


# ---- the decision ----
@pytest.mark.parametrize(("position", "end_offset", "end_epoch", "outcome"), [
    (20, 25, 3, POSITION_VALID),        # the position's epoch goes on past it on the leader
    (20, 20, 3, POSITION_VALID),        # ... or ends exactly there: nothing read was lost
    (0, 0, 0, POSITION_VALID),
    (20, 10, 3, POSITION_TRUNCATED),    # the epoch ends below the position: truncated from 10 on
    (20, 19, 3, POSITION_TRUNCATED),    # one record short is truncation too
    (20, 10, 1, POSITION_TRUNCATED),    # the leader knows only an older epoch, ending below the position
    (20, 30, 1, POSITION_VALID),        # an older epoch of the leader's that ends past the position
    (20, -1, -1, POSITION_UNKNOWN_EPOCH),  # the leader knows no epoch at or below the position's
    (20, 5, -1, POSITION_UNKNOWN_EPOCH),
    (20, -1, 2, POSITION_UNKNOWN_EPOCH),
])
def test_check_position(position: int, end_offset: int, end_epoch: int, outcome: str) -> None:
    assert check_position(position, end_offset, end_epoch) == outcome


# ---- the epoch a position carries ----
def test_consumed_records_give_the_position_their_batch_epoch() -> None:
    data = batch(0, 3, epoch=4) + batch(3, 2, epoch=7)
    state = PartitionState(position=0)
    part = PartitionRecords(TP, data)
    assert [r.offset for r in part.take(state, 2, None, None)] == [0, 1]
    assert (state.position, state.offset_epoch) == (2, 4)
    assert [r.offset for r in part.take(state, 10, None, None)] == [2, 3, 4]
    assert (state.position, state.offset_epoch) == (5, 7), "the last record read was in the epoch 7 batch"


def test_a_control_batch_passed_over_gives_its_epoch() -> None:
    data = batch(0, 2, epoch=1) + build_control_batch(True, producer_id=7, producer_epoch=0, timestamp_ms=5,
                                                       base_offset=2)
    state = PartitionState(position=0)
    part = PartitionRecords(TP, data)
    part.take(state, 10, None, None)
    part.take(state, 10, None, None)
    assert state.position == 3 and state.offset_epoch is None, "a batch without an epoch leaves none"


def test_raw_batches_move_the_position_with_their_epoch() -> None:
    state = PartitionState(position=1)
    assert PartitionRecords(TP, batch(0, 3, epoch=2) + batch(3, 1, epoch=5)).take_raw(state)
    assert (state.position, state.offset_epoch) == (4, 5)


def test_leader_change_needs_a_check_only_for_a_position_with_an_epoch() -> None:
    st = PartitionState()
    st.seek_validated(10)  # an explicit seek(tp, 10): never checked, as in Kafka
    assert not st.on_leader_epoch(3) and st.leader_epoch == 3 and not st.awaiting_validation
    st.seek_validated(10, 2)
    assert not st.awaiting_validation
    assert st.on_leader_epoch(4) and st.awaiting_validation and st.leader_epoch == 4
    st.seek_unvalidated(12, 1)  # a committed offset with its epoch
    assert st.awaiting_validation and st.divergence is None
    st.seek_unvalidated(12, None)  # a commit without one: nothing to check
    assert not st.awaiting_validation
    st.request_reset(-2)
    assert st.position is None and st.offset_epoch is None and not st.on_leader_epoch(5)


# ---- commits ----
def test_offset_and_metadata_carries_the_epoch_beside_the_tuple() -> None:
    om = OffsetAndMetadata(5, "m", 3)
    assert om == OffsetAndMetadata(5, "m") and hash(om) == hash(OffsetAndMetadata(5, "m"))
    offset, metadata = om
    assert (offset, metadata, om.leader_epoch) == (5, "m", 3)
    assert OffsetAndMetadata(5).leader_epoch is None and OffsetAndMetadata(5, "", -1).leader_epoch is None
    assert pickle.loads(pickle.dumps(om)).leader_epoch == 3
    assert om._replace(offset=6).leader_epoch == 3 and "leader_epoch=3" in repr(om)


def test_commits_carry_the_leader_epoch() -> None:
    req = offset_commit_request("g", {TP: OffsetAndMetadata(5, "x", 3), TP1: 7})
    assert req is not None
    by_tp = {(p.topic, p.partition): (p.offset, p.leader_epoch, p.metadata) for p in req.partitions}
    assert by_tp == {("t", 0): (5, 3, "x"), ("t", 1): (7, -1, "")}


def test_the_consumer_commits_its_positions_epochs_but_not_unchecked_ones() -> None:
    with Consumer(bootstrap_servers=BOOT, group_id="g", enable_auto_commit=False) as consumer:
        consumer.assign([TP, TP1])
        consumer._assignment[TP].seek_validated(20, 4)
        consumer._assignment[TP1].seek_unvalidated(9, 2)  # not checked yet: it may be past a truncation
        offsets = consumer._current_offsets()
        assert offsets == {TP: OffsetAndMetadata(20)} and offsets[TP].leader_epoch == 4


# ---- the consumer against fake brokers ----
class FakeCall:
    """A gRPC future the test completes."""

    def __init__(self, response: Any = None) -> None:
        self.response = response
        self.callbacks: list[Any] = []
        self.cancelled = False

    def done(self) -> bool:
        return self.response is not None

    def result(self, timeout: float | None = None) -> Any:
        return self.response

    def add_done_callback(self, fn: Any) -> None:
        if self.done():
            fn(self)
        else:
            self.callbacks.append(fn)

    def answer(self, response: Any) -> None:
        self.response = response
        for fn in self.callbacks:
            fn(self)

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeBrokers:
    """Leader 1 at ``epoch`` for every partition; OffsetsForLeaderEpoch calls are recorded, answered by
    ``answer(request)`` at once, or left pending when it returns None."""

    def __init__(self, consumer: Consumer, epoch: int, answer: Any) -> None:
        self.epoch = epoch
        self.answer = answer
        self.requests: list[tuple[int, broker_pb2.OffsetsForLeaderEpochRequest]] = []
        self.calls: list[FakeCall] = []
        consumer.cluster.leader_and_epoch = self.leader_and_epoch  # type: ignore[method-assign]
        consumer.cluster.broker_stub = self.broker_stub  # type: ignore[method-assign]

    def leader_and_epoch(self, tp: TopicPartition, **_kw: Any) -> tuple[int, int]:
        return 1, self.epoch

    def broker_stub(self, node: int) -> Any:
        brokers = self

        class Method:
            def future(self, request: Any, timeout: float) -> FakeCall:
                brokers.requests.append((node, request))
                call = FakeCall(brokers.answer(request))
                brokers.calls.append(call)
                return call

        class Stub:
            OffsetsForLeaderEpoch = Method()

        return Stub()


def end_offsets(ends: dict[TopicPartition, tuple[int, int]], code: int = ErrorCode.NONE) -> Any:
    def answer(request: broker_pb2.OffsetsForLeaderEpochRequest) -> broker_pb2.OffsetsForLeaderEpochResponse:
        resp = broker_pb2.OffsetsForLeaderEpochResponse()
        for p in request.partitions:
            epoch, end = ends[TopicPartition(p.topic, p.partition)]
            resp.partitions.add(topic=p.topic, partition=p.partition, error_code=code, leader_epoch=epoch,
                                end_offset=end)
        return resp
    return answer


def consumer_at(reset: str, positions: dict[TopicPartition, tuple[int, int]], leader_epoch: int = 0) -> Consumer:
    """A consumer whose partitions were read up to ``positions`` ({tp: (offset, its epoch)}) from the leader
    at ``leader_epoch``."""
    consumer = Consumer(bootstrap_servers=BOOT, auto_offset_reset=reset)
    consumer.assign(list(positions))
    for tp, (offset, epoch) in positions.items():
        st = consumer._assignment[tp]
        st.seek_validated(offset, epoch)
        st.leader_epoch = leader_epoch
    return consumer


def check(consumer: Consumer) -> None:
    """Two passes of the poll loop's position checks: the first sends, the second takes the answers."""
    consumer._validate_positions()
    consumer._validate_positions()


def new_leader(consumer: Consumer, epoch: int) -> None:
    """The metadata shows a new leader epoch for every partition (what a refresh after a failover finds),
    as the fetcher sees it when it is about to fetch them."""
    for st in consumer._assignment.values():
        if st.on_leader_epoch(epoch):
            consumer._fetcher.leader_changed = True


def test_a_new_leader_checks_positions_in_one_request_per_broker(caplog: pytest.LogCaptureFixture) -> None:
    consumer = consumer_at("earliest", {TP: (20, 0), TP1: (7, 0)})
    with consumer:
        brokers = FakeBrokers(consumer, 1, lambda request: None)  # answers held back
        new_leader(consumer, 1)
        consumer._validate_positions()
        consumer._validate_positions()  # nothing more while the first is unanswered
        assert len(brokers.requests) == 1
        node, request = brokers.requests[0]
        asked = {(p.topic, p.partition): (p.leader_epoch, p.current_leader_epoch) for p in request.partitions}
        assert node == 1 and request.replica_id == -1 and asked == {("t", 0): (0, 1), ("t", 1): (0, 1)}
        # Not fetched meanwhile, and not committed: the positions may be past a truncation.
        assert all(st.awaiting_validation for st in consumer._assignment.values())
        assert consumer._current_offsets() == {}
        resp = end_offsets({TP: (0, 10), TP1: (0, 10)})(request)
        with caplog.at_level(logging.WARNING, logger="client.consumer"):
            brokers.calls[0].answer(resp)
            consumer._validate_positions()
        st0, st1 = consumer._assignment[TP], consumer._assignment[TP1]
        # t-0 was at 20 but epoch 0 ends at 10 on the new leader: on from the divergent offset (Kafka's
        # reset with earliest or latest alike); t-1 at 7 is in the new leader's log.
        assert (st0.position, st0.offset_epoch, st0.awaiting_validation, st0.leader_epoch) == (10, 0, False, 1)
        assert (st1.position, st1.awaiting_validation) == (7, False)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "t-0: log truncation detected" in warnings[0] and "offset 10" in warnings[0]
        consumer._validate_positions()
        assert len(brokers.requests) == 1, "a checked position is not checked again"


def test_a_metadata_refresh_showing_a_new_leader_drops_fetched_records_and_checks() -> None:
    consumer = consumer_at("earliest", {TP: (20, 0), TP1: (5, None)})
    with consumer:
        consumer._buffered[TP] = PartitionRecords(TP, batch(20, 3, 0))  # fetched from the old leader
        consumer._buffered[TP1] = PartitionRecords(TP1, batch(5, 3, 0))
        brokers = FakeBrokers(consumer, 1, lambda request: None)
        parts = {p: PartitionMetadata("t", p, 1, 1, (1, 2), (1, 2)) for p in (0, 1)}
        consumer.cluster._meta = ClusterMetadata("c", 1000, 9, {}, {"t": TopicMetadata("t", "id", False, parts)}, [])
        consumer._validate_positions()
        assert TP not in consumer._buffered, "records of the old leader, past a position being checked"
        assert TP1 in consumer._buffered, "a position without an epoch is not checked: its records stay"
        assert consumer._assignment[TP].awaiting_validation and consumer._assignment[TP1].leader_epoch == 1
        assert [(p.topic, p.partition) for p in brokers.requests[0][1].partitions] == [("t", 0)]


@pytest.mark.parametrize("reset", ["latest", "earliest"])
def test_truncation_resumes_at_the_divergent_offset_whatever_the_reset(reset: str) -> None:
    consumer = consumer_at(reset, {TP: (20, 2)}, leader_epoch=2)
    with consumer:
        FakeBrokers(consumer, 3, end_offsets({TP: (1, 12)}))  # the leader knows epoch 1 only, to 12
        new_leader(consumer, 3)
        check(consumer)
        st = consumer._assignment[TP]
        assert (st.position, st.offset_epoch, st.reset_to) == (12, 1, None)


def test_truncation_with_reset_none_raises_until_seek() -> None:
    consumer = consumer_at("none", {TP: (20, 0), TP1: (7, 0)})
    with consumer:
        brokers = FakeBrokers(consumer, 1, end_offsets({TP: (0, 10), TP1: (0, 10)}))
        new_leader(consumer, 1)
        check(consumer)
        for _ in range(2):  # every poll raises, without asking the broker again
            with pytest.raises(errors.LogTruncationError) as caught:
                consumer._raise_truncations()
            exc = caught.value
            assert isinstance(exc, errors.OffsetOutOfRangeError) and not exc.retriable
            assert exc.positions == {TP: 20}
            assert exc.divergent_offsets == {TP: OffsetAndMetadata(10)} and exc.divergent_offsets[TP].leader_epoch == 0
            assert "t-0" in str(exc) and "divergent offset 10" in str(exc) and "t-1" not in str(exc)
            consumer._validate_positions()
        assert len(brokers.requests) == 1
        assert consumer._assignment[TP].awaiting_validation, "not fetched past the truncation"
        consumer.seek(TP, 10)
        consumer._raise_truncations()  # seek() ends it
        assert not consumer._assignment[TP].awaiting_validation and consumer.position(TP) == 10


def test_a_leader_without_the_positions_epoch_resets_by_policy() -> None:
    consumer = consumer_at("latest", {TP: (20, 5)})
    with consumer:
        FakeBrokers(consumer, 6, end_offsets({TP: (-1, -1)}))
        new_leader(consumer, 6)
        check(consumer)
        st = consumer._assignment[TP]
        assert st.position is None and st.reset_to == -1
    consumer = consumer_at("none", {TP: (20, 5)})
    with consumer:
        FakeBrokers(consumer, 6, end_offsets({TP: (-1, -1)}))
        new_leader(consumer, 6)
        check(consumer)
        with pytest.raises(errors.LogTruncationError, match="knows no leader epoch") as caught:
            consumer._raise_truncations()
        assert caught.value.positions == {TP: 20} and caught.value.divergent_offsets == {}


def test_fenced_check_refreshes_and_asks_the_next_leader() -> None:
    consumer = consumer_at("earliest", {TP: (20, 0)})
    with consumer:
        brokers = FakeBrokers(consumer, 1, end_offsets({TP: (0, 0)}, ErrorCode.FENCED_LEADER_EPOCH))
        new_leader(consumer, 1)
        consumer.cluster._stale = False
        check(consumer)
        st = consumer._assignment[TP]
        assert consumer.cluster._stale, "a fenced check refreshes the metadata"
        assert st.awaiting_validation and st.position == 20 and st.backoff_until > 0
        # The refreshed metadata shows epoch 2: the position is checked against that leader.
        brokers.epoch, brokers.answer = 2, end_offsets({TP: (0, 25)})
        st.backoff_until = 0.0
        check(consumer)
        assert brokers.requests[-1][1].partitions[0].current_leader_epoch == 2
        assert not st.awaiting_validation and st.position == 20 and st.leader_epoch == 2


def test_an_answer_for_a_position_since_moved_is_ignored() -> None:
    consumer = consumer_at("earliest", {TP: (20, 0)})
    with consumer:
        brokers = FakeBrokers(consumer, 1, lambda request: None)
        new_leader(consumer, 1)
        consumer._validate_positions()
        consumer.seek(TP, 3)  # the application moved on meanwhile
        brokers.calls[0].answer(end_offsets({TP: (0, 0)})(brokers.requests[0][1]))
        consumer._validate_positions()
        assert consumer.position(TP) == 3 and not consumer._assignment[TP].awaiting_validation


class Unimplemented(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNIMPLEMENTED

    def details(self) -> str:
        return "Method not found"


class FailingCall(FakeCall):
    def __init__(self, exc: Exception) -> None:
        super().__init__(object())
        self.exc = exc

    def result(self, timeout: float | None = None) -> Any:
        raise self.exc


def test_a_broker_without_offsets_for_leader_epoch_skips_the_check() -> None:
    consumer = consumer_at("none", {TP: (20, 0)})
    with consumer:
        brokers = FakeBrokers(consumer, 1, lambda request: None)
        new_leader(consumer, 1)
        consumer._validate_positions()
        consumer._validations[1] = (FailingCall(Unimplemented()), consumer._validations[1][1])
        consumer._validate_positions()
        st = consumer._assignment[TP]
        assert not st.awaiting_validation and st.position == 20 and len(brokers.requests) == 1
        consumer._raise_truncations()


def test_committed_offset_with_an_epoch_is_checked_first() -> None:
    class Coordinator:
        def committed(self, tps: list[TopicPartition], timeout_ms: int | None = None) -> dict:
            return {TP: OffsetAndMetadata(20, "", 0)}

    consumer = Consumer(bootstrap_servers=BOOT, auto_offset_reset="earliest")
    with consumer:
        consumer._coordinator = Coordinator()  # type: ignore[assignment]
        consumer.assign([TP])
        brokers = FakeBrokers(consumer, 3, end_offsets({TP: (0, 10)}))
        consumer._update_positions()
        assert consumer._assignment[TP].awaiting_validation
        check(consumer)
        (node, request), = brokers.requests
        assert (request.partitions[0].leader_epoch, request.partitions[0].current_leader_epoch) == (0, 3)
        assert consumer.position(TP) == 10


def test_seek_with_an_epoch_is_checked_plain_seek_is_not() -> None:
    consumer = consumer_at("earliest", {TP: (0, 0)}, leader_epoch=1)
    with consumer:
        consumer.seek(TP, OffsetAndMetadata(30, "", 0))
        assert consumer._assignment[TP].awaiting_validation and consumer.position(TP) == 30
        consumer.seek(TP, 30)
        st = consumer._assignment[TP]
        assert not st.awaiting_validation and st.offset_epoch is None


def fetch_answer(tp: TopicPartition, code: int, records: bytes = b"") -> broker_pb2.FetchResponse:
    resp = broker_pb2.FetchResponse()
    resp.partitions.add(topic=tp.topic, partition=tp.partition, error_code=code, high_watermark=30,
                        log_start_offset=0, records=records)
    return resp


def test_fenced_fetch_refreshes_metadata_and_drops_nothing(caplog: pytest.LogCaptureFixture) -> None:
    consumer = consumer_at("earliest", {TP: (20, 0)})
    with consumer:
        st = consumer._assignment[TP]
        st.in_flight, st.fetch_epoch = True, 0
        consumer.cluster._stale = False
        with caplog.at_level(logging.DEBUG, logger="client.consumer"):
            consumer._handle_fetch(CompletedFetch(1, {TP: 20}, fetch_answer(TP, ErrorCode.FENCED_LEADER_EPOCH), None))
        assert consumer.cluster._stale and st.position == 20 and not st.in_flight and st.backoff_until > 0
        assert any("FENCED_LEADER_EPOCH" in r.getMessage() for r in caplog.records)


def test_records_fetched_before_a_leader_change_are_not_returned() -> None:
    consumer = consumer_at("earliest", {TP: (20, 0)})
    with consumer:
        st = consumer._assignment[TP]
        st.in_flight, st.fetch_epoch = True, 0
        new_leader(consumer, 1)  # a refresh showed a new leader while the fetch was in flight
        consumer._handle_fetch(CompletedFetch(1, {TP: 20}, fetch_answer(TP, ErrorCode.NONE, batch(20, 3, 0)), None))
        assert TP not in consumer._buffered and st.position == 20 and not st.in_flight


class RecordingStub:
    def __init__(self) -> None:
        self.requests: list[broker_pb2.FetchRequest] = []

    def Fetch(self, request: broker_pb2.FetchRequest, timeout: float) -> broker_pb2.FetchResponse:
        self.requests.append(request)
        return broker_pb2.FetchResponse()


def test_fetches_carry_the_metadatas_leader_epoch_and_wait_for_the_check() -> None:
    consumer = consumer_at("earliest", {TP: (20, 0), TP1: (5, None)})  # t-1: an explicit seek, no epoch
    with consumer:
        stub = RecordingStub()
        consumer.cluster.leader_and_epoch = lambda tp, **kw: (1, 4)  # type: ignore[method-assign]
        consumer.cluster.broker_stub = lambda node: stub  # type: ignore[method-assign]
        fetcher = consumer._fetcher
        fetcher._unary.active = lambda s: True  # type: ignore[method-assign]  # unary calls, on the pool
        fetcher.send_fetches(consumer._assignment, consumer._buffered)
        fetcher._pool.shutdown(wait=True)
        (request,) = stub.requests
        sent = {(p.topic, p.partition): (p.fetch_offset, p.current_leader_epoch) for p in request.partitions}
        # t-0 has an epoch: checked against the leader at epoch 4 before it is fetched.
        assert sent == {("t", 1): (5, 4)}
        assert consumer._assignment[TP].awaiting_validation and not consumer._assignment[TP].in_flight
