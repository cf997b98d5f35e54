"""The transaction coordinator over real logs: what one coordinator writes to ``__transaction_state``, the next one
loads; a transaction whose markers were not all written when its coordinator went is finished by the next one; a
transaction left open past its timeout is aborted and its producer fenced. The data partition is a real log too, so
the markers' effect is the last stable offset read_committed consumers stop at."""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from leader_logs import LeaderLogs
from waiting import wait_for

from broker import txn_records as rec
from broker.txn_coordinator import MarkerRequest, TransactionCoordinator, TxnConfig
from broker.txn_state import TransactionState, TxnError
from client.types import TopicPartition
from storage.record_batch import RecordBatchBuilder

DATA = TopicPartition("t", 0)


class Disk(LeaderLogs):
    """``__transaction_state-0`` and ``t-0``, led here; markers written straight to ``t-0`` (or refused while its
    leader is "unreachable")."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, (rec.TRANSACTION_STATE_TOPIC, 0), (DATA.topic, DATA.partition))
        self.data = self.log(DATA.topic, DATA.partition)
        self.markers_down = False

    def partition(self, topic: str, partition: int) -> Any:  # the coordinator leads only its own partition
        return super().partition(topic, partition) if topic == rec.TRANSACTION_STATE_TOPIC else None

    def write_markers(self, leader: int, req: MarkerRequest) -> dict[TopicPartition, int]:
        if self.markers_down:
            raise ConnectionError("the partition leader is unreachable")
        for tp in req.partitions:
            assert tp == DATA, tp
            self.data.append_marker_as_leader(req.producer_id, req.producer_epoch, req.commit, req.coordinator_epoch, 0)
            self.data.update_high_watermark(self.data.log_end_offset)
        return dict.fromkeys(req.partitions, 0)

    def produce(self, producer_id: int, epoch: int, sequence: int, value: bytes) -> None:
        b = RecordBatchBuilder(producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                               is_transactional=True)
        b.append(1_000, None, value)
        self.data.append_as_leader(b.build(), 0, transactional=True)
        self.data.update_high_watermark(self.data.log_end_offset)


class Cache:
    def partition(self, topic: str, partition: int) -> Any:
        return types.SimpleNamespace(leader=1) if (topic, partition) == (DATA.topic, DATA.partition) else None


@pytest.fixture()
def disk(tmp_path: Path) -> Iterator[Disk]:
    d = Disk(tmp_path / "data")
    try:
        yield d
    finally:
        d.close()


NOW = [1_000_000]
IDS = iter(range(1000, 2000))


def coordinator(disk: Disk, epoch: int, cache: Any = None, write_markers: Any = None) -> TransactionCoordinator:
    """A coordinator that has taken __transaction_state-0 over at leader epoch ``epoch`` (and loaded it)."""
    c = TransactionCoordinator(node_id=epoch, replica_manager=disk, metadata_cache=cache or Cache(),
                               config=TxnConfig(num_partitions=1), new_producer_id=lambda: next(IDS),
                               write_markers=write_markers or disk.write_markers, clock_ms=lambda: NOW[0])
    c.start()
    c.on_leadership_change(rec.TRANSACTION_STATE_TOPIC, 0, True, epoch)
    wait_for(lambda: not c.state.is_loading(0), what="the load of __transaction_state-0")
    return c


def test_the_next_coordinator_finishes_a_commit_whose_markers_were_not_written(disk: Disk) -> None:
    old = coordinator(disk, 1)
    try:
        code, pid, epoch = old.init_producer_id("app", 60_000)
        assert code == TxnError.NONE
        assert old.add_partitions("app", pid, epoch, [DATA]) == TxnError.NONE
        disk.produce(pid, epoch, 0, b"committed")
        assert disk.data.last_stable_offset == 0  # held at the open transaction's first offset
        disk.markers_down = True
        assert old.end_txn("app", pid, epoch, commit=True) == TxnError.NONE  # answered once PrepareCommit is written
    finally:
        old.stop()  # gone before any marker reached t-0
    assert disk.data.last_stable_offset == 0
    disk.markers_down = False
    new = coordinator(disk, 2)
    try:
        wait_for(lambda: (d := new.describe("app")) != TxnError.COORDINATOR_LOAD_IN_PROGRESS
                 and d.state == TransactionState.COMPLETE_COMMIT, what="the commit completed by the new coordinator")
        assert disk.data.last_stable_offset == disk.data.log_end_offset == 2  # the record and its COMMIT marker
        assert disk.data.aborted_transactions(0, 2) == []
    finally:
        new.stop()
    again = coordinator(disk, 3)  # and a third one loads the completed state, with nothing left to do
    try:
        d = again.describe("app")
        assert d.state == TransactionState.COMPLETE_COMMIT and d.producer_id == pid and d.producer_epoch == epoch
        assert again.state.pending_markers() == []
    finally:
        again.stop()


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced(disk: Disk) -> None:
    c = coordinator(disk, 1)
    try:
        code, pid, epoch = c.init_producer_id("slow", 10_000)
        assert code == TxnError.NONE and c.add_partitions("slow", pid, epoch, [DATA]) == TxnError.NONE
        disk.produce(pid, epoch, 0, b"never committed")
        NOW[0] += 5_000
        assert c.abort_timed_out() == 0
        NOW[0] += 6_000
        assert c.abort_timed_out() == 1
        wait_for(lambda: c.describe("slow").state == TransactionState.COMPLETE_ABORT, what="the abort completed")
        assert disk.data.last_stable_offset == disk.data.log_end_offset == 2
        assert disk.data.aborted_transactions(0, 2) == [(pid, 0)]
        assert c.end_txn("slow", pid, epoch, commit=True) == TxnError.PRODUCER_FENCED
        assert c.describe("slow").producer_epoch == epoch + 1
    finally:
        c.stop()


def test_a_coordinator_that_lost_the_partition_answers_not_coordinator(disk: Disk) -> None:
    c = coordinator(disk, 1)
    try:
        code, pid, epoch = c.init_producer_id("moved", 60_000)
        assert code == TxnError.NONE
        c.on_leadership_change(rec.TRANSACTION_STATE_TOPIC, 0, False, 1)
        assert c.add_partitions("moved", pid, epoch, [DATA]) == TxnError.NOT_COORDINATOR
        assert c.init_producer_id("other", 60_000)[0] == TxnError.NOT_COORDINATOR
    finally:
        c.stop()


OTHER = TopicPartition("u", 0)


class TwoLeaders(Disk):
    """``t-0`` led by broker 1, which can be frozen (a marker request to it waits until thawed), and ``u-0`` by
    broker 2."""

    def __init__(self, path: Path) -> None:
        LeaderLogs.__init__(self, path, (rec.TRANSACTION_STATE_TOPIC, 0), (DATA.topic, 0), (OTHER.topic, 0))
        self.data, self.other = self.log(DATA.topic, 0), self.log(OTHER.topic, 0)
        self.markers_down = False
        self.thawed = threading.Event()
        self.frozen_requests = 0
        self._appending = threading.Lock()  # a leader's senders run at once: each append and its HW move together

    def write_markers(self, leader: int, req: MarkerRequest) -> dict[TopicPartition, int]:
        if leader == 1 and not self.thawed.is_set():
            self.frozen_requests += 1
            self.thawed.wait(30)
        with self._appending:
            for tp in req.partitions:
                lg = self.data if tp == DATA else self.other
                lg.append_marker_as_leader(req.producer_id, req.producer_epoch, req.commit, req.coordinator_epoch, 0)
                lg.update_high_watermark(lg.log_end_offset)
        return dict.fromkeys(req.partitions, 0)


class TwoLeadersCache:
    def partition(self, topic: str, partition: int) -> Any:
        return types.SimpleNamespace(leader={DATA: 1, OTHER: 2}[TopicPartition(topic, partition)])


def test_a_frozen_partition_leader_holds_only_the_transactions_that_touched_it(tmp_path: Path) -> None:
    """Markers went out from one thread, a transaction at a time: a leader that did not answer (frozen: each
    request waited out its 5 s timeout) held every transaction of the coordinator, those of partitions led
    elsewhere too. Each leader has its own senders now."""
    disk = TwoLeaders(tmp_path / "data")
    c = coordinator(disk, 1, TwoLeadersCache(), disk.write_markers)
    try:
        producers = {}
        for tid, tp in (("stuck", DATA), *((f"free-{i}", OTHER) for i in range(5))):
            code, pid, epoch = c.init_producer_id(tid, 60_000)
            assert code == TxnError.NONE and c.add_partitions(tid, pid, epoch, [tp]) == TxnError.NONE
            producers[tid] = (pid, epoch)
        for tid, (pid, epoch) in producers.items():  # the stuck one first
            assert c.end_txn(tid, pid, epoch, commit=True) == TxnError.NONE
        wait_for(lambda: all(c.describe(f"free-{i}").state == TransactionState.COMPLETE_COMMIT for i in range(5)),
                 10, lambda: f"the transactions of u-0 to complete: {[c.describe(f'free-{i}') for i in range(5)]}")
        assert c.describe("stuck").state == TransactionState.PREPARE_COMMIT and disk.frozen_requests == 1
        assert disk.other.last_stable_offset == disk.other.log_end_offset == 5  # five COMMIT markers
        disk.thawed.set()
        wait_for(lambda: c.describe("stuck").state == TransactionState.COMPLETE_COMMIT, 10, "the stuck commit")
    finally:
        disk.thawed.set()
        c.stop()
        disk.close()


def test_a_request_can_wait_for_the_end_of_a_transaction_being_completed(tmp_path: Path) -> None:
    """``when_completed``: what the Kafka listener's AddPartitionsToTxn waits on when a producer's next transaction
    asks while its last one is being completed (answered CONCURRENT_TRANSACTIONS at once, librdkafka tried again only
    after its backoff). A waiter is called once the Complete* record is written, or when the coordinator lets the
    partition go; one that gave up is not called; nothing waits for a transaction that is not in Prepare*."""
    disk = TwoLeaders(tmp_path / "data")
    c = coordinator(disk, 1, TwoLeadersCache(), disk.write_markers)
    try:
        code, pid, epoch = c.init_producer_id("next", 60_000)
        assert code == TxnError.NONE and c.add_partitions("next", pid, epoch, [DATA]) == TxnError.NONE
        assert not c.when_completed("next", lambda: None)  # Ongoing: nothing to wait for
        assert c.end_txn("next", pid, epoch, commit=True) == TxnError.NONE  # its markers wait for frozen broker 1
        assert c.add_partitions("next", pid, epoch, [DATA]) == TxnError.CONCURRENT_TRANSACTIONS
        called: list[str] = []
        assert c.when_completed("next", lambda: called.append("waiter"))
        gave_up = lambda: called.append("gave up")  # noqa: E731
        assert c.when_completed("next", gave_up)
        c.forget_waiter("next", gave_up)
        assert called == []
        disk.thawed.set()
        wait_for(lambda: called == ["waiter"], 10, lambda: f"the waiter called: {called}")
        assert c.describe("next").state == TransactionState.COMPLETE_COMMIT
        assert c.add_partitions("next", pid, epoch, [DATA]) == TxnError.NONE  # the next transaction, at once
        disk.thawed.clear()
        assert c.end_txn("next", pid, epoch, commit=False) == TxnError.NONE
        assert c.when_completed("next", lambda: called.append("released"))
        c.on_leadership_change(rec.TRANSACTION_STATE_TOPIC, 0, False, 1)  # the partition moved away
        assert called == ["waiter", "released"]
    finally:
        disk.thawed.set()
        c.stop()
        disk.close()


def test_markers_waiting_out_a_backoff_go_at_once_to_a_new_leader(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction whose partition leader died waited out its retry backoff after a new leader was named: a 10 s
    stretch without a commit in make chaos-txn (seed 1). Deliveries waiting out a backoff go at once when one of
    their partitions has another leader (here a backoff of 30 s)."""
    from broker import txn_coordinator

    monkeypatch.setattr(txn_coordinator, "MARKER_RETRY_S", 30.0)  # every retry 30 s after the last attempt
    monkeypatch.setattr(txn_coordinator, "MARKER_RETRY_MAX_S", 30.0)
    leaders = {DATA: 1}
    tried: list[int] = []

    class MovingCache:
        def partition(self, topic: str, partition: int) -> Any:
            return types.SimpleNamespace(leader=leaders[TopicPartition(topic, partition)])

    disk = Disk(tmp_path / "data")

    def write_markers(leader: int, req: MarkerRequest) -> dict[TopicPartition, int]:
        tried.append(leader)
        if leader == 1:
            raise ConnectionError("broker 1 is dead")
        return disk.write_markers(leader, req)

    c = coordinator(disk, 1, MovingCache(), write_markers)
    try:
        code, pid, epoch = c.init_producer_id("moved", 60_000)
        assert code == TxnError.NONE and c.add_partitions("moved", pid, epoch, [DATA]) == TxnError.NONE
        assert c.end_txn("moved", pid, epoch, commit=True) == TxnError.NONE
        wait_for(lambda: tried == [1], 10, lambda: f"the attempt at the dead leader: {tried}")  # the next in 30 s
        leaders[DATA] = 2
        wait_for(lambda: c.describe("moved").state == TransactionState.COMPLETE_COMMIT, 5,
                 lambda: f"the commit completed through the new leader: attempts {tried}")
        assert tried[-1] == 2 and disk.data.last_stable_offset == disk.data.log_end_offset == 1
    finally:
        c.stop()
        disk.close()
