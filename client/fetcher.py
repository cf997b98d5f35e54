"""The consumer's fetcher: pipelined Fetch requests (one in flight per broker, many partitions each)
and lazily decoded partition record buffers.

Requests go as messages of one FetchStream per broker (client/streams.py; unary Fetch calls to a
broker without one free); their completions land in a queue that the consumer's thread drains in
``poll()``. Right after handing records to the application the consumer sends the next fetches,
so the brokers work while the application processes (prefetch).

Leader epochs (KIP-320): each partition's position carries the leader epoch of the record before it
(``PartitionState.offset_epoch``: the partition leader epoch of that record's batch, or the epoch a
committed offset or a ListOffsets answer came with) and the leader epoch of the partition the
position was last checked against (``PartitionState.leader_epoch``, from the client's metadata).
Fetches send the latter as ``current_leader_epoch``, so a broker that leads at another epoch than the
client believes answers FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH instead of serving it; the
consumer then refreshes its metadata. When the metadata shows a new leader epoch for a partition
whose position has an epoch, the partition is not fetched until the consumer has checked the
position against the new leader (OffsetsForLeaderEpoch, ``check_position``): a log truncated below
it (an unclean leader election) is detected instead of read past.

Transactions (``isolation.level``): a read_committed fetch reads up to the partition's last stable offset
and its answer names the aborted transactions among the records (producer id, first offset);
``AbortedFilter`` drops their batches as Kafka's consumer does (``CompletedFetch``). Control batches
(transaction markers) are never handed out, at either level; the position moves past them and past
dropped batches.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from client import errors
from client.cluster import ClusterClient, rpc_error
from client.streams import RequestStream, UnaryFallback
from client.types import ConsumerRecord, TopicPartition
from proto import broker_pb2
from storage.record_batch import (
    ATTR_CONTROL,
    CONTROL_TYPE_ABORT,
    BatchHeader,
    Buffer,
    decode_batch,
    iter_batches,
    parse_control_record,
)
from storage.record_decode import decode_batch_tuples

log = logging.getLogger(__name__)

Deserializer = Callable[[bytes | None], Any]


@dataclass
class PartitionState:
    position: int | None = None  # next offset to hand to the application; None = to be resolved
    reset_to: int | None = None  # pending seek_to_beginning (-2) / seek_to_end (-1)
    paused: bool = False
    in_flight: bool = False
    backoff_until: float = 0.0
    high_watermark: int = -1
    log_start_offset: int = -1
    # KIP-320. The leader epoch of the record before `position` (its batch's partition leader epoch, or
    # the epoch of the committed offset / ListOffsets answer the position came from); None = unknown,
    # and then the position is never checked for truncation (an explicit seek(offset), as in Kafka).
    offset_epoch: int | None = None
    # The partition's leader epoch (from metadata) the position was checked against and is fetched
    # at: a fetch's current_leader_epoch. -1 = none yet.
    leader_epoch: int = -1
    awaiting_validation: bool = False  # not fetched until OffsetsForLeaderEpoch has confirmed the position
    validating: bool = False  # that request is in flight
    fetch_epoch: int = -1  # the current_leader_epoch the fetch in flight was sent with
    # The check found the log truncated under the position and auto.offset.reset=none: (divergent
    # offset, or None when the leader knows no epoch at or below the position's; the last epoch the
    # logs share). Raised by every poll() until seek() or another leader.
    divergence: tuple[int | None, int] | None = None

    def seek_validated(self, offset: int, offset_epoch: int | None = None) -> None:
        """A position that needs no check: an explicit seek, a reset the leader answered at
        ``leader_epoch``, the divergent offset a check found."""
        self.position = offset
        self.offset_epoch = offset_epoch if offset_epoch is not None and offset_epoch >= 0 else None
        self.reset_to = None
        self.awaiting_validation = self.validating = False
        self.divergence = None

    def seek_unvalidated(self, offset: int, offset_epoch: int | None) -> None:
        """A position from elsewhere (a committed offset, ``seek(tp, OffsetAndMetadata)``): checked
        against the current leader before it is fetched, when it has an epoch."""
        self.seek_validated(offset, offset_epoch)
        self.awaiting_validation = self.offset_epoch is not None

    def request_reset(self, target: int) -> None:
        """Resolve the position again with ListOffsets (-2 earliest, -1 latest)."""
        self.position = None
        self.offset_epoch = None
        self.reset_to = target
        self.awaiting_validation = self.validating = False
        self.divergence = None

    def on_leader_epoch(self, epoch: int) -> bool:
        """The metadata shows leader epoch ``epoch`` (another than ``leader_epoch``): fetch at it from now
        on, after checking the position against that leader if the position has an epoch (KIP-320's
        validation on a leader change). True when the position now waits for that check."""
        self.leader_epoch = epoch
        self.validating = False  # a check in flight was against the previous leader: its answer is ignored
        self.divergence = None
        self.awaiting_validation = self.position is not None and self.offset_epoch is not None and epoch >= 0
        return self.awaiting_validation


# What OffsetsForLeaderEpoch's answer says about a position (check_position).
POSITION_VALID = "valid"
POSITION_TRUNCATED = "truncated"  # the leader's log ends the position's epoch below the position
POSITION_UNKNOWN_EPOCH = "unknown-epoch"  # the leader knows no epoch at or below the position's


def check_position(position: int, end_offset: int, end_epoch: int) -> str:
    """KIP-320's check of a consumer position against the leader's answer to OffsetsForLeaderEpoch(the
    position's epoch): ``end_offset`` is where the largest epoch <= the position's that the leader knows
    (``end_epoch``) ends in its log. The records the consumer read before ``position`` are in the
    leader's log only if that end is at or past the position; below it, the log was truncated (or
    replaced by a diverging one after an unclean election) from ``end_offset`` on: the divergent
    offset. Kafka's SubscriptionState.maybeCompleteValidation makes the same three cases."""
    if end_offset < 0 or end_epoch < 0:
        return POSITION_UNKNOWN_EPOCH
    if end_offset < position:
        return POSITION_TRUNCATED
    return POSITION_VALID


class AbortedFilter:
    """read_committed: which batches of one fetch answer of a partition to hand out, as Kafka's consumer decides
    (``CompletedFetch.nextFetchedRecord``). Built from the answer's aborted transactions, then asked about every
    batch of the answer in order (``keep``).

    The aborted transactions are taken in first-offset order: once a batch with a producer id reaches one's
    first offset (its last offset at or past it), that producer is aborted, and its transactional batches are
    dropped until its ABORT marker. A producer's batches before its aborted transaction's first offset (an
    earlier, committed transaction) are kept; so are non-transactional batches. Control batches are never
    handed out.
    """

    __slots__ = ("_pending", "_aborted")

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        # Smallest first offset last (popped first); a stable sort keeps the answer's order on a tie.
        self._pending = sorted(aborted, key=lambda a: a[1], reverse=True)
        self._aborted: set[int] = set()

    def keep(self, buf: Buffer, pos: int, header: BatchHeader) -> bool:
        """Is the batch at ``pos`` of ``buf`` (its header ``header``) one whose records are handed out?"""
        producer_id = header.producer_id
        if producer_id < 0:
            return not header.attributes & ATTR_CONTROL
        pending = self._pending
        while pending and pending[-1][1] <= header.last_offset:
            self._aborted.add(pending.pop()[0])
        if header.attributes & ATTR_CONTROL:
            if producer_id in self._aborted and _is_abort_marker(buf, pos):
                self._aborted.discard(producer_id)
            return False
        return not (header.is_transactional and producer_id in self._aborted)


def _is_abort_marker(buf: Buffer, pos: int) -> bool:
    """Is the control batch at ``pos`` an ABORT marker (its first record's control type)?"""
    records = decode_batch(buf, pos)[1]
    return bool(records) and parse_control_record(records[0])[0] == CONTROL_TYPE_ABORT


def aborted_filter(aborted: Iterable[Any] | None) -> AbortedFilter | None:
    """The filter of a read_committed answer's ``aborted_transactions`` (protobuf AbortedTransaction messages or
    (producer id, first offset) pairs); None (nothing filtered, read_uncommitted) for None."""
    if aborted is None:
        return None
    return AbortedFilter((a.producer_id, a.first_offset) if hasattr(a, "producer_id") else (a[0], a[1])
                         for a in aborted)


class PartitionRecords:
    """Whole batches fetched for one partition, decoded one batch at a time as the app consumes.

    A batch is decoded straight into ConsumerRecord tuples (storage/record_decode.py: in C
    when the extension is built); ``take`` hands them out from the position on. ``aborted``: a
    read_committed answer's aborted transactions (see ``AbortedFilter``); None for read_uncommitted.
    """

    __slots__ = ("tp", "data", "batches", "current", "index", "increasing", "epoch", "filter")

    def __init__(self, tp: TopicPartition, data: bytes, aborted: Iterable[Any] | None = None) -> None:
        self.tp = tp
        self.data = data
        self.batches = iter_batches(data)
        self.current: list[ConsumerRecord] = []
        self.index = 0
        self.increasing = True  # offsets of `current` strictly increase
        self.epoch: int | None = None  # partition leader epoch of the batch `current` came from
        self.filter = aborted_filter(aborted)

    def take(self, state: PartitionState, limit: int, key_des: Deserializer | None,
             value_des: Deserializer | None) -> list[ConsumerRecord]:
        """Up to ``limit`` records at or after the position; advances the position past them."""
        out: list[ConsumerRecord] = []
        while len(out) < limit:
            if self.index >= len(self.current):
                if not self._next_batch(state):
                    break
                continue
            position = state.position
            assert position is not None
            end = min(len(self.current), self.index + limit - len(out))
            chunk = self.current[self.index:end]
            self.index = end
            if not (self.increasing and chunk[0].offset >= position):
                # Records before the position (a fetch from inside a batch) are skipped.
                # With increasing offsets only the first chunk of a batch can hold any.
                chunk = [r for r in chunk if r.offset >= position]
                if not chunk:
                    continue
            if key_des is None and value_des is None:
                out += chunk
            else:
                for r in chunk:
                    out.append(ConsumerRecord(
                        r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type,
                        key_des(r.key) if key_des else r.key,
                        value_des(r.value) if value_des else r.value, r.headers))
            state.position = max(position, chunk[-1].offset + 1)
            state.offset_epoch = self.epoch  # KIP-320: the epoch of the record before the position
        return out

    def _next_batch(self, state: PartitionState) -> bool:
        # Finishing a batch moves the position past its last offset: compacted-away
        # offsets and control batches are not records to wait for.
        if self.current:
            last = self.current[-1].offset
            if state.position is not None and state.position <= last:
                state.position = last + 1
                state.offset_epoch = self.epoch
        self.current, self.index = [], 0
        topic, partition = self.tp
        filt = self.filter
        for pos, header in self.batches:
            # read_committed: every batch goes through the filter, those before the position too (its markers).
            keep = filt is None or filt.keep(self.data, pos, header)
            if state.position is not None and header.next_offset <= state.position:
                continue  # wholly before the position (e.g. fetched from inside a batch)
            epoch = header.partition_leader_epoch if header.partition_leader_epoch >= 0 else None
            if header.attributes & ATTR_CONTROL or not keep:
                # A transaction marker, or (read_committed) a batch of an aborted transaction: skipped.
                state.position = max(state.position or 0, header.next_offset)
                state.offset_epoch = epoch
                continue
            _, records, self.increasing = decode_batch_tuples(self.data, pos, ConsumerRecord, topic, partition)
            self.current = records
            self.epoch = epoch
            if not records:
                state.position = max(state.position or 0, header.next_offset)
                state.offset_epoch = epoch
                continue
            return True
        self.data = b""
        return False

    def take_raw(self, state: PartitionState) -> bytes:
        """All complete batches not wholly before the position; moves the position past them. read_committed:
        without the batches of aborted transactions and the control batches (the position moves past them too)."""
        filt = self.filter
        runs: list[tuple[int, int]] = []  # [start, end) of the batches handed out, adjacent ones merged
        for pos, header in self.batches:
            keep = filt is None or filt.keep(self.data, pos, header)
            if state.position is not None and header.next_offset <= state.position:
                continue
            state.position = header.next_offset
            state.offset_epoch = header.partition_leader_epoch if header.partition_leader_epoch >= 0 else None
            if not keep:
                continue
            if runs and runs[-1][1] == pos:
                runs[-1] = (runs[-1][0], pos + header.size)
            else:
                runs.append((pos, pos + header.size))
        data, self.data = self.data, b""
        if len(runs) == 1:
            return data[runs[0][0]:runs[0][1]]
        with memoryview(data) as view:
            return b"".join(view[start:end] for start, end in runs)

    def exhausted(self) -> bool:
        return not self.data and self.index >= len(self.current)


@dataclass
class CompletedFetch:
    node: int
    offsets: dict[TopicPartition, int]  # what was asked, to drop answers made stale by seek()
    response: broker_pb2.FetchResponse | None
    error: errors.BrookError | None


class Fetcher:
    def __init__(self, cluster: ClusterClient, *, fetch_min_bytes: int, fetch_max_wait_ms: int,
                 fetch_max_bytes: int, max_partition_fetch_bytes: int, request_timeout_ms: int,
                 retry_backoff_ms: int, isolation_level: int = 0) -> None:
        self.cluster = cluster
        self.isolation_level = isolation_level  # 0 read_uncommitted, 1 read_committed
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.cond = threading.Condition()
        self.completed: deque[CompletedFetch] = deque()
        self._woken = False  # notify() before wait() began: the wait returns at once
        self.leader_changed = False  # send_fetches held a partition back for a position check (KIP-320)
        # One fetch per broker at a time: the stream it went on, or the unary call's future.
        self.in_flight: dict[int, RequestStream | concurrent.futures.Future[None]] = {}
        self._streams: dict[int, RequestStream] = {}
        # Broker quotas (KIP-219): no fetch to a broker before its last throttle_time_ms has passed.
        self.throttled_until: dict[int, float] = {}
        self.throttle_time_ms_total = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="brook-fetch")
        self._unary = UnaryFallback("FetchStream", self._pool, self._call_fetch, self._not_sent)

    def send_fetches(self, assignment: dict[TopicPartition, PartitionState],
                     buffered: dict[TopicPartition, PartitionRecords], timeout_ms: int | None = None) -> None:
        """Send a fetch to each leader of fetchable partitions that has none in flight. A metadata
        refresh this needs takes at most ``timeout_ms`` (what is left of the poll), and once one found
        no broker, the other partitions wait for the next poll rather than try again each."""
        now = time.monotonic()
        for node, stream in list(self._streams.items()):
            if stream.cancel_if_overdue(now):  # its fetch completes with the timeout
                del self._streams[node]
            elif node not in self.in_flight and stream.old():
                # Not used for a while (the broker leads none of our partitions any more): it would
                # hold one of the broker's max.fetch.streams and a thread here for nothing.
                stream.retire()
                del self._streams[node]
        by_node: dict[int, list[TopicPartition]] = {}
        no_broker = False
        for tp, st in assignment.items():
            if (st.position is None or st.paused or st.in_flight or st.awaiting_validation or tp in buffered
                    or now < st.backoff_until):
                continue
            if no_broker:
                st.backoff_until = now + self.retry_backoff_s
                continue
            try:
                node, epoch = self.cluster.leader_and_epoch(tp, timeout_ms=timeout_ms)
            except errors.BrookError as exc:
                if not exc.retriable:
                    raise
                self.cluster.request_update()
                st.backoff_until = now + self.retry_backoff_s
                no_broker = exc.code in (errors.ErrorCode.NETWORK_EXCEPTION, errors.ErrorCode.REQUEST_TIMED_OUT)
                continue
            if epoch != st.leader_epoch and st.on_leader_epoch(epoch):
                self.leader_changed = True
                continue  # a new leader: the consumer checks the position against it first (KIP-320)
            if node not in self.in_flight and now >= self.throttled_until.get(node, 0.0):
                by_node.setdefault(node, []).append(tp)
        for node, tps in by_node.items():
            self._send(node, tps, assignment)

    def _send(self, node: int, tps: list[TopicPartition], assignment: dict[TopicPartition, PartitionState]) -> None:
        offsets = {tp: assignment[tp].position for tp in tps}
        # current_leader_epoch: a broker that leads at another epoch than our metadata says fences the
        # fetch (FENCED_LEADER_EPOCH, or UNKNOWN_LEADER_EPOCH while it has not applied ours) rather
        # than serve a log we have not checked our position against.
        request = broker_pb2.FetchRequest(
            replica_id=-1, replica_epoch=-1, max_wait_ms=self.fetch_max_wait_ms, min_bytes=self.fetch_min_bytes,
            max_bytes=self.fetch_max_bytes, isolation_level=self.isolation_level,
            partitions=[broker_pb2.FetchPartition(
                topic=tp.topic, partition=tp.partition, fetch_offset=offset,
                partition_max_bytes=self.max_partition_fetch_bytes, current_leader_epoch=assignment[tp].leader_epoch,
                last_fetched_epoch=-1, log_start_offset=-1) for tp, offset in offsets.items()],
        )
        try:
            stub = self.cluster.broker_stub(node)
        except errors.BrookError as exc:
            self._complete(CompletedFetch(node, offsets, None, exc))  # type: ignore[arg-type]
            return
        for tp in tps:
            st = assignment[tp]
            st.in_flight = True
            st.fetch_epoch = st.leader_epoch
        if not self._unary.active(stub):
            stream = self._streams.get(node)
            if stream is not None and (stream.stub is not stub or stream.old()):
                stream.retire()  # idle (this broker has no fetch in flight): a new channel, or an old token
                stream = None
            if stream is None or not stream.send(offsets, request):
                # None yet, or it ended since the last fetch: a new one (its thread opens the stream).
                stream = self._streams[node] = RequestStream(
                    node, stub, "FetchStream", f"Fetch from broker {node}", self._timeout_s(), self._answered,
                    self._unary, name=f"brook-fetch-stream-{node}")
                if not stream.send(offsets, request):  # it ended at once (e.g. its channel closed)
                    stream = None
            if stream is not None:
                self.in_flight[node] = stream
                return
        self.in_flight[node] = self._pool.submit(self._call_fetch, node, offsets, stub, request)

    def _timeout_s(self) -> float:
        return (self.request_timeout_ms + self.fetch_max_wait_ms) / 1000

    def _not_sent(self, node: int, offsets: dict[TopicPartition, int], exc: Exception) -> None:
        self._complete(CompletedFetch(node, offsets, None, errors.error_for(
            errors.ErrorCode.NETWORK_EXCEPTION, f"Fetch from broker {node}: {exc}")))

    def _call_fetch(self, node: int, offsets: dict[TopicPartition, int], stub: Any,
                    request: broker_pb2.FetchRequest) -> None:
        """On a pool thread: blocking calls, so gRPC does not start a polling thread per fetch."""
        try:
            response = stub.Fetch(request, timeout=self._timeout_s())
        except grpc.RpcError as exc:
            self._complete(CompletedFetch(node, offsets, None, rpc_error(exc, f"Fetch from broker {node}")))
        except Exception as exc:  # cancelled on close
            self._complete(CompletedFetch(node, offsets, None, errors.error_for(
                errors.ErrorCode.NETWORK_EXCEPTION, f"Fetch from broker {node}: {exc!r}")))
        else:
            self._answered(node, offsets, response, None)

    def _answered(self, node: int, offsets: dict[TopicPartition, int], response: broker_pb2.FetchResponse | None,
                  error: errors.BrookError | None) -> None:
        if response is not None and response.throttle_time_ms > 0:
            self.throttled_until[node] = time.monotonic() + response.throttle_time_ms / 1000
            self.throttle_time_ms_total += response.throttle_time_ms
        self._complete(CompletedFetch(node, offsets, response, error))

    def _complete(self, done: CompletedFetch) -> None:
        with self.cond:
            self.completed.append(done)
            self.cond.notify_all()

    def wait(self, timeout_s: float) -> None:
        with self.cond:
            if not self.completed and not self._woken and timeout_s > 0:
                self.cond.wait(timeout_s)
            self._woken = False

    def notify(self) -> None:
        """End a ``wait`` now, or the next one at once if none is under way (``Consumer.wakeup``, an
        answered position check)."""
        with self.cond:
            self._woken = True
            self.cond.notify_all()

    def take_completed(self) -> list[CompletedFetch]:
        with self.cond:
            done = list(self.completed)
            self.completed.clear()
        for c in done:
            self.in_flight.pop(c.node, None)
        return done

    def close(self) -> None:
        """Drop queued fetches and end the streams; running unary ones end when the consumer closes its channels."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for stream in self._streams.values():
            stream.cancel()
        self._streams.clear()
        self.in_flight.clear()
