"""The producer's sender thread: drains ready batches into one Produce request per broker.

Per loop: expire batches past ``delivery.timeout.ms``; get a producer id when
idempotence is on; look up partition leaders (refreshing metadata when a response
said the leader moved); take the head batch of every ready partition led by each
broker (up to ``max.request.size`` per request, at most
``max.in.flight.requests.per.connection`` requests outstanding per broker); send
them asynchronously. Responses complete batches on gRPC's callback thread: success
resolves the futures, retriable errors put the batch back (in sequence order) for
another attempt after ``retry.backoff.ms``, other errors fail it with the server's
message.

Idempotence: every batch gets (producer id, epoch, base sequence) the first time it
is drained; the bytes are stamped with them (and the CRC recomputed) so a retry is
byte-identical and the broker's ProducerStateManager drops it if the first attempt
was in fact written. A batch keeps its sequence for as long as any attempt of it may
have been written.

Brokers require a producer they have no state for to start at sequence 0, and the
sequence to continue without gaps; gRPC may apply pipelined requests out of order, so
a batch that overtook an earlier one is refused with OUT_OF_ORDER_SEQUENCE_NUMBER (or
UNKNOWN_PRODUCER_ID on a log that may have lost producer state). Such a batch is
retried, in sequence order, after the earlier ones. A refusal no earlier batch can
explain means the partition's sequence is broken there (the broker lost the
producer's state, or an earlier batch failed for good): nothing from that batch on
can have been written under the partition's epoch, so once none of the partition's
batches is in flight, its unacknowledged batches are sequenced again from 0 under a
bumped epoch (KIP-360; InitProducerId with the current id and epoch). Other
partitions keep their epoch and sequences.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from crc32c import crc32c

from client import errors
from client.accumulator import ProducerBatch, RecordAccumulator
from client.cluster import REFRESH_CODES, ClusterClient, rpc_error
from client.streams import RequestStream, UnaryFallback
from client.types import TopicPartition
from proto import broker_pb2

log = logging.getLogger(__name__)

EPOCH_MAX = 32766  # producer epochs are int16; past this a fresh producer id is needed

_PRODUCER_STATE = struct.Struct(">qhi")  # producer id, epoch, base sequence at byte 43
_PRODUCER_STATE_POS = 43
_CRC = struct.Struct(">I")
_CRC_POS = 17
_CRC_START = 21
SEQUENCE_MODULUS = 2**31  # sequences wrap like Kafka's
_OUT_OF_ORDER = (errors.ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, errors.ErrorCode.UNKNOWN_PRODUCER_ID)

# The sender sleeps until a batch's linger.ms is up, a timer of a millisecond or two. Linux lets a
# sleeping thread's timer fire up to the thread's "timer slack" late (50 us by default) so that it can
# batch wake-ups; a batch then went out 90-130 us after its linger at the median (measured, 2-core
# machine), on every batch. The sender's own slack is 1 us (prctl PR_SET_TIMERSLACK, this thread only).
SENDER_TIMER_SLACK_NS = 1000
_PR_SET_TIMERSLACK = 29


def sharpen_timers(slack_ns: int = SENDER_TIMER_SLACK_NS) -> bool:
    """Set the calling thread's timer slack (Linux); False where that cannot be done (nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, slack_ns, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # no libc to ask, or one without prctl
        return False


def _precedes(a: ProducerBatch, b: ProducerBatch) -> bool:
    """Was ``a`` sequenced before ``b`` under the same producer id and epoch?"""
    same_epoch = (a.producer_id, a.producer_epoch) == (b.producer_id, b.producer_epoch)
    return same_epoch and 0 <= a.base_sequence < b.base_sequence


def stamp_producer_state(payload: bytes, producer_id: int, epoch: int, base_sequence: int) -> bytes:
    """Write producer id/epoch/base sequence into a built batch and fix its CRC-32C."""
    buf = bytearray(payload)
    _PRODUCER_STATE.pack_into(buf, _PRODUCER_STATE_POS, producer_id, epoch, base_sequence)
    _CRC.pack_into(buf, _CRC_POS, crc32c(memoryview(buf)[_CRC_START:]))
    return bytes(buf)


@dataclass
class SenderConfig:
    acks: int
    request_timeout_ms: int
    max_request_size: int
    max_in_flight: int
    retries: int
    retry_backoff_ms: int
    idempotent: bool


@dataclass
class ProducerIdState:
    producer_id: int = -1  # the newest (id, epoch) the cluster gave us
    epoch: int = -1
    next_sequence: dict[TopicPartition, int] = field(default_factory=dict)
    # The (id, epoch) each partition's sequences run under: a partition moves to a newer
    # epoch only when its own sequence is reset, so the others never wait for it.
    partition_ids: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    # Partitions whose sequence broke: no batch goes out for them until it is reset.
    resets: set[TopicPartition] = field(default_factory=set)
    reset_needed: bool = True  # no id yet
    bump_needed: bool = False  # a reset partition already runs under the newest epoch


class Sender(threading.Thread):
    def __init__(self, cluster: ClusterClient, accumulator: RecordAccumulator, config: SenderConfig,
                 *, name: str = "brook-producer-sender") -> None:
        super().__init__(name=name, daemon=True)
        self.cluster = cluster
        self.acc = accumulator
        self.config = config
        self.pid = ProducerIdState() if config.idempotent else None
        self.in_flight_requests: dict[int, int] = {}
        # Broker quotas (KIP-219): a response with throttle_time_ms mutes that broker until then.
        self.throttled_until: dict[int, float] = {}
        self._throttle_wait_s = 0.0
        self.throttle_time_ms_total = 0  # summed throttle_time_ms of every response (for tests, metrics)
        self.in_flight_batches: dict[TopicPartition, list[ProducerBatch]] = {}
        # Per partition, every batch sent since the oldest one not yet completed, in send
        # order. Its length bounds how many batches can be written after a batch whose
        # answer is still outstanding: the broker remembers the last 5 batches of a
        # producer, so a retry of that batch is recognised as a duplicate only if at most
        # 4 were written after it. gRPC (unlike Kafka's one TCP connection) may complete
        # requests out of order, so the per-broker request limit alone does not ensure it.
        self.unsettled: dict[TopicPartition, deque[ProducerBatch]] = {}
        self.running = True
        self.force_close = False
        self._drain_start: dict[int, int] = {}
        self.fatal_error: BaseException | None = None
        # Requests run as blocking calls on these threads (grpc's future() API would start
        # and stop a polling thread per request when traffic is light). The in-flight
        # accounting bounds how many are queued here.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(32, 4 * config.max_in_flight), thread_name_prefix=f"{name}-io")
        # Requests go over one ProduceStream per broker (a stream message costs both ends about a
        # third of a unary call); brokers that do not serve it (an older version) get unary calls.
        self._sessions: dict[int, RequestStream] = {}
        # Brokers that answered ProduceStream UNIMPLEMENTED (or had none free) get unary calls for a while.
        self._unary = UnaryFallback("ProduceStream", self._pool, self._call_produce, self._not_sent)
        self._retired: list[RequestStream] = []  # replaced sessions still answering what they were sent
        self._name = name

    # ---- main loop ----
    def run(self) -> None:
        sharpen_timers()
        try:
            while self.running or self._has_work():
                if self.force_close:
                    break
                self._run_once()
        except Exception as exc:  # keep the failure visible to every pending future
            log.exception("producer sender thread failed")
            self.fatal_error = exc
            if self.acc.appender is not None:
                self.acc.appender.enabled = 0  # send() raises from here on (its Python path checks fatal_error)
        finally:
            for session in [*self._sessions.values(), *self._retired]:
                if self.force_close:
                    session.cancel()
                else:
                    session.retire()  # nothing is in flight on it any more
            self._pool.shutdown(wait=not self.force_close, cancel_futures=self.force_close)
            err = self.fatal_error or errors.ProducerClosedError("producer closed before the record was sent")
            self.acc.abort_all(err)

    def _has_work(self) -> bool:
        with self.acc.lock:
            return any(self.acc.batches.values()) or any(self.in_flight_requests.values())

    def wakeup(self) -> None:
        with self.acc.lock:
            self.acc.wakeup.notify()

    def _run_once(self) -> None:
        now = time.monotonic()
        for node, session in list(self._sessions.items()):
            if session.cancel_if_overdue(now):
                del self._sessions[node]
            elif session.old() and session.idle():
                session.retire()  # unused for a while: it would hold one of the broker's max.produce.streams
                del self._sessions[node]
        if self._retired:
            self._retired = [s for s in self._retired if s.answering() and not s.cancel_if_overdue(now)]
        with self.acc.lock:
            expired = self.acc.expired(now)
        for batch in expired:
            self._fail(batch, errors.RequestTimedOutError(
                f"expiring {batch.record_count} record(s) for {batch.tp.topic}-{batch.tp.partition}: "
                f"delivery.timeout.ms elapsed since batch creation"))
        if self.pid is not None:
            with self.acc.lock:
                self._reset_partitions()
            # Only once there is something to send: an idle producer makes no requests.
            if (self.pid.reset_needed or self.pid.bump_needed) and self._has_work():
                if not self._init_producer_id():
                    self._pause(self.config.retry_backoff_ms / 1000)
                    return
                with self.acc.lock:
                    self._reset_partitions()
        leaders = self._leaders()
        with self.acc.lock:
            ready, wait_s = self.acc.ready(now, self.in_flight_batches.keys())
            requests, unknown = self._drain(ready, leaders)
            if not requests:
                if unknown:
                    wait_s = min(wait_s, self.config.retry_backoff_ms / 1000)
                if self._throttle_wait_s > 0:
                    wait_s = min(wait_s, self._throttle_wait_s) if wait_s > 0 else self._throttle_wait_s
                if self.running or not self._has_work_locked():
                    if wait_s > 0:  # until the time ready() named, not that long after this loop's work
                        timeout = min(now + wait_s - time.monotonic(), 1.0)
                    else:
                        timeout = 0.001 if unknown else 1.0
                    if timeout > 0:
                        self.acc.wakeup.wait(timeout)
                else:
                    self.acc.wakeup.wait(0.05)
                return
        for node, batches in requests.items():
            self._send(node, batches)

    def _has_work_locked(self) -> bool:
        return any(self.acc.batches.values()) or any(self.in_flight_requests.values())

    def _pause(self, seconds: float) -> None:
        with self.acc.lock:
            self.acc.wakeup.wait(seconds)

    def _init_producer_id(self) -> bool:
        """A first producer id, or (KIP-360) the current one with a bumped epoch.

        The bump is local, as Kafka's idempotent producer does it: brokers no longer bump
        the epoch of a producer id a caller names (anyone could fence anyone). Only an
        exhausted epoch asks for a fresh id.
        """
        assert self.pid is not None
        if not self.pid.reset_needed and 0 <= self.pid.epoch < EPOCH_MAX:
            with self.acc.lock:
                self.pid.epoch += 1
                self.pid.reset_needed = self.pid.bump_needed = False
            log.info("producer id %d: epoch bumped to %d", self.pid.producer_id, self.pid.epoch)
            return True
        try:
            producer_id, epoch = self.cluster.init_producer_id()
        except errors.BrookError as exc:
            log.warning("InitProducerId failed, will retry: %s", exc)
            return False
        with self.acc.lock:
            self.pid.producer_id, self.pid.epoch = producer_id, epoch
            self.pid.reset_needed = self.pid.bump_needed = False
        log.info("producer id %d epoch %d", producer_id, epoch)
        return True

    def _reset_partitions(self) -> None:
        """Restart broken partitions at sequence 0 under the newest epoch. Caller holds acc.lock.

        Waits per partition until none of its batches is in flight: then every batch of it
        with a sequence is queued here and none of them can have been written (the broker
        refused the first of them, and needs it before any later one), so sequencing them
        again cannot write a record twice. Needs an epoch newer than the partition's.
        """
        assert self.pid is not None
        newest = (self.pid.producer_id, self.pid.epoch)
        for tp in list(self.pid.resets):
            if self.in_flight_batches.get(tp):
                continue
            if self.pid.partition_ids.get(tp) == newest:
                self.pid.bump_needed = True
                continue
            for batch in self.acc.batches.get(tp, ()):
                batch.base_sequence = -1
            self.pid.partition_ids.pop(tp, None)
            self.pid.next_sequence.pop(tp, None)
            self.pid.resets.discard(tp)
            log.info("%s-%d: sequences restart at 0 under producer id %d epoch %d",
                     tp.topic, tp.partition, *newest)

    def _leaders(self) -> dict[TopicPartition, int]:
        with self.acc.lock:
            tps = [tp for tp, dq in self.acc.batches.items() if dq]
        if not tps:
            return {}
        try:
            meta = self.cluster.metadata(sorted({tp.topic for tp in tps}))
        except errors.BrookError as exc:
            if exc.code == errors.ErrorCode.SASL_AUTHENTICATION_FAILED:
                # The credentials are refused (wrong, or the user was deleted or its password changed): the
                # waiting records fail with that now, as Kafka's producer fails them with its
                # AuthenticationException, rather than each timing out after delivery.timeout.ms.
                with self.acc.lock:
                    refused = self.acc.take_queued()
                for batch in refused:
                    self._fail(batch, exc)
                return {}
            log.warning("metadata refresh failed: %s", exc)
            return {}
        return {tp: meta.leader_for(tp) for tp in tps}

    # ---- drain (caller holds acc.lock) ----
    def _drain(self, ready: list[TopicPartition], leaders: dict[TopicPartition, int]
               ) -> tuple[dict[int, list[ProducerBatch]], bool]:
        by_node: dict[int, list[TopicPartition]] = {}
        unknown = False
        for tp in ready:
            node = leaders.get(tp, -1)
            if node < 0:
                unknown = True
                continue
            by_node.setdefault(node, []).append(tp)
        if unknown:
            self.cluster.request_update()
        requests: dict[int, list[ProducerBatch]] = {}
        now = time.monotonic()
        self._throttle_wait_s = 0.0
        for node, tps in by_node.items():
            if self.in_flight_requests.get(node, 0) >= self.config.max_in_flight:
                self.acc.held_by_in_flight = True
                continue
            throttled_s = self.throttled_until.get(node, 0.0) - now
            if throttled_s > 0:
                self._throttle_wait_s = max(self._throttle_wait_s, throttled_s)
                continue
            batches = self._drain_node(node, tps)
            if batches:
                requests[node] = batches
                self.in_flight_requests[node] = self.in_flight_requests.get(node, 0) + 1
        return requests, unknown

    def _drain_node(self, node: int, tps: list[TopicPartition]) -> list[ProducerBatch]:
        # Rotate the starting partition so a busy partition cannot starve the others.
        start = self._drain_start.get(node, 0) % len(tps)
        self._drain_start[node] = start + 1
        size = 0
        out: list[ProducerBatch] = []
        for tp in tps[start:] + tps[:start]:
            if self.pid is not None and tp in self.pid.resets:
                continue  # its sequence restarts first (see _reset_partitions)
            head = self.acc.batches[tp][0]
            window = self._window(tp)
            # Without sequence numbers nothing would stop a broker from applying two
            # pipelined batches of a partition out of order: one at a time keeps order.
            # With them the broker refuses a batch that overtook an earlier one, and it is
            # retried after it.
            limit = self.config.max_in_flight if self.pid is not None else 1
            if not head.retry and len(window) >= limit:
                self.acc.held_by_in_flight = True
                continue  # wait until the oldest outstanding batch of this partition completes
            batch_bytes = len(head.payload) if head.payload is not None else head.size_bytes
            if out and size + batch_bytes > self.config.max_request_size:
                break
            batch = self.acc.pop_head(tp)
            size += batch_bytes
            if self.pid is not None and batch.base_sequence < 0:
                ids = self.pid.partition_ids.setdefault(tp, (self.pid.producer_id, self.pid.epoch))
                seq = self.pid.next_sequence.get(tp, 0)
                batch.base_sequence = seq
                batch.producer_id, batch.producer_epoch = ids
                self.pid.next_sequence[tp] = (seq + batch.record_count) % SEQUENCE_MODULUS
            self.in_flight_batches.setdefault(tp, []).append(batch)
            # Requests on one channel may be handled out of order by the broker, so a batch
            # sent while an earlier one is unanswered can legitimately see OUT_OF_ORDER_SEQUENCE.
            batch.sent_behind = any(b is not batch and _precedes(b, batch) and not b.completion.event.is_set()
                                    for b in window)
            if not batch.retry:
                window.append(batch)
                self.unsettled[tp] = window
            out.append(batch)
        return out

    def _window(self, tp: TopicPartition) -> deque[ProducerBatch]:
        """The partition's unsettled batches, trimmed of completed ones at the front. Caller holds the lock."""
        window = self.unsettled.get(tp)
        if window is None:
            return deque()
        while window and window[0].completion.event.is_set():
            window.popleft()
        if not window:
            del self.unsettled[tp]
        return window

    # ---- send / receive ----
    def _send(self, node: int, batches: list[ProducerBatch]) -> None:
        now = time.monotonic()
        parts = []
        for batch in batches:
            if self.pid is None:
                payload = batch.build()
            else:
                # Stamped as it is built (one checksum, no copy); a retry under another sequence or
                # epoch is stamped again.
                state = (batch.producer_id, batch.producer_epoch, batch.base_sequence)
                payload = batch.build(state)
                if batch.stamped != state:
                    payload = batch.payload = stamp_producer_state(payload, *state)
                    batch.stamped = state
            batch.attempts += 1
            batch.last_attempt = batch.completion.sent_at = now
            parts.append(broker_pb2.ProducePartitionData(topic=batch.tp.topic, partition=batch.tp.partition,
                                                         records=payload))
        request = broker_pb2.ProduceRequest(acks=self.config.acks, timeout_ms=self.config.request_timeout_ms,
                                            partitions=parts)
        try:
            stub = self.cluster.broker_stub(node)
        except errors.BrookError as exc:
            self._on_done(node, batches, None, exc)
            return
        if self._unary.active(stub) or not self._send_on_stream(node, stub, batches, request):
            self._pool.submit(self._call_produce, node, batches, stub, request)

    def _send_on_stream(self, node: int, stub: Any, batches: list[ProducerBatch], request: Any) -> bool:
        """Send on the broker's ProduceStream, opening one if needed; False to send it unary instead."""
        session = self._sessions.get(node)
        if session is not None and (session.stub is not stub or session.old()):
            session.retire()  # a new channel (the broker moved), or an old token: it answers what it has
            self._retired.append(session)
            session = None
        if session is not None and session.send(batches, request):
            return True
        # None yet, or it ended since the sender last looked: a new one (its thread opens the stream).
        session = self._sessions[node] = RequestStream(
            node, stub, "ProduceStream", f"Produce to broker {node}", self.config.request_timeout_ms / 1000 + 1,
            self._on_done, self._unary, name=f"{self._name}-stream-{node}")
        return session.send(batches, request)

    def _not_sent(self, node: int, batches: list[ProducerBatch], exc: Exception) -> None:
        self._on_done(node, batches, None, errors.error_for(
            errors.ErrorCode.NETWORK_EXCEPTION, f"Produce to broker {node}: {exc}"))

    def _call_produce(self, node: int, batches: list[ProducerBatch], stub: Any,
                      request: broker_pb2.ProduceRequest) -> None:
        """Runs on a pool thread: a blocking call keeps gRPC from starting a polling thread per request."""
        try:
            response = stub.Produce(request, timeout=self.config.request_timeout_ms / 1000 + 1)
        except grpc.RpcError as exc:
            self._on_done(node, batches, None, rpc_error(exc, f"Produce to broker {node}"))
        except Exception as exc:  # e.g. the channel was closed under us
            self._on_done(node, batches, None, errors.error_for(
                errors.ErrorCode.NETWORK_EXCEPTION, f"Produce to broker {node}: {exc!r}"))
        else:
            self._on_done(node, batches, response, None)

    def _on_done(self, node: int, batches: list[ProducerBatch], response: broker_pb2.ProduceResponse | None,
                 transport_error: errors.BrookError | None) -> None:
        # Each batch stays in in_flight_batches until it is completed or queued again, so
        # that no other thread sees it as neither in flight nor pending (see _earlier_pending
        # and _reset_partitions).
        with self.acc.lock:
            self.in_flight_requests[node] -= 1
            if response is not None and response.throttle_time_ms > 0:
                self.throttled_until[node] = time.monotonic() + response.throttle_time_ms / 1000
                self.throttle_time_ms_total += response.throttle_time_ms
        try:
            self._settle(node, batches, response, transport_error)
        finally:
            # At most one wake-up per answer, once its batches are complete (a request slot and
            # their partitions' windows are free now), and only if a batch waits for that: a
            # sender lingering on a batch wakes on its own (retries and failures wake it anyway).
            with self.acc.lock:
                if self.acc.held_by_in_flight or not self.running or (self.pid is not None and self.pid.resets):
                    self.acc.wakeup.notify()  # (a partition's sequence reset also waits for its answers)

    def _settle(self, node: int, batches: list[ProducerBatch], response: broker_pb2.ProduceResponse | None,
                transport_error: errors.BrookError | None) -> None:
        if transport_error is not None:
            self.cluster.request_update()
            for batch in batches:
                self._on_error(batch, transport_error)
            return
        assert response is not None
        by_tp = {(p.topic, p.partition): p for p in response.partitions}
        for batch in batches:
            part = by_tp.get(batch.tp)
            if part is None:
                self._on_error(batch, errors.error_for(
                    errors.ErrorCode.NETWORK_EXCEPTION, f"Produce response from {node} lacks {batch.tp}"))
            elif part.error_code == errors.ErrorCode.NONE:
                self._release(batch)
                self.acc.complete(batch, part.base_offset, part.log_append_time_ms, None, wake=False)
            elif part.error_code == errors.ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                self._release(batch)
                # written before; offsets unknown (Kafka does the same)
                self.acc.complete(batch, -1, -1, None, wake=False)
            else:
                self._on_error(batch, errors.error_for(part.error_code, part.error_message))

    def _release(self, batch: ProducerBatch) -> None:
        with self.acc.lock:
            self._release_locked(batch)

    def _release_locked(self, batch: ProducerBatch) -> None:
        """``batch`` is no longer in flight. No wake-up here: every caller's next step wakes the sender
        (the answer's one wake-up, a re-enqueue, or a completion)."""
        lst = self.in_flight_batches.get(batch.tp)
        if lst is not None and batch in lst:
            lst.remove(batch)
            if not lst:
                del self.in_flight_batches[batch.tp]

    def _earlier_pending(self, batch: ProducerBatch) -> bool:
        """Is a lower-sequence batch of this partition still in flight or waiting for a retry?"""
        with self.acc.lock:
            pending: Iterable[ProducerBatch] = list(self.in_flight_batches.get(batch.tp, ())) + [
                b for b in self.acc.batches.get(batch.tp, ()) if b.retry]
            return any(_precedes(b, batch) for b in pending)

    def _sequence_refused(self, batch: ProducerBatch) -> None:
        """OUT_OF_ORDER_SEQUENCE_NUMBER / UNKNOWN_PRODUCER_ID: retry after the earlier batches, or reset."""
        assert self.pid is not None
        if not (batch.sent_behind or self._earlier_pending(batch)):
            # No earlier batch can explain it: the partition's sequence is broken at this
            # batch, which was not written. Restart the partition's sequences (KIP-360).
            with self.acc.lock:
                if self.pid.partition_ids.get(batch.tp) == (batch.producer_id, batch.producer_epoch):
                    self.pid.resets.add(batch.tp)
            log.info("%s-%d: sequence %d refused with nothing earlier pending; resetting the partition's "
                     "sequences", batch.tp.topic, batch.tp.partition, batch.base_sequence)

    def _on_error(self, batch: ProducerBatch, err: errors.BrookError) -> None:
        retriable = err.retriable
        if err.code in _OUT_OF_ORDER and self.pid is not None and batch.base_sequence >= 0:
            self._sequence_refused(batch)
            retriable = True  # refused, so not written: safe to send again (in order, or re-sequenced)
        now = time.monotonic()
        if retriable and batch.attempts <= self.config.retries and self.running_or_flushing():
            if now < batch.deadline:
                if err.code in REFRESH_CODES:
                    self.cluster.request_update()
                log.debug("retrying %s after %s (attempt %d)", batch.tp, err, batch.attempts)
                with self.acc.lock:
                    self._release_locked(batch)
                    self.acc.reenqueue_locked(batch)
                return
            # Out of time, not out of retries: the application is told it timed out, as Kafka's producer
            # tells it (a fault that outlasted delivery.timeout.ms showed as OutOfOrderSequenceNumber).
            err = errors.RequestTimedOutError(
                f"expiring {batch.record_count} record(s) for {batch.tp.topic}-{batch.tp.partition}: "
                f"delivery.timeout.ms elapsed since batch creation (the last attempt: {err.message})")
        self._fail(batch, err)

    def running_or_flushing(self) -> bool:
        return not self.force_close

    def _fail(self, batch: ProducerBatch, err: BaseException) -> None:
        # A sequenced batch failing for good may leave a gap (if it was not written): the
        # next batch of the partition is then refused with nothing earlier pending, which
        # resets the partition's sequences (see _sequence_refused).
        self._release(batch)
        log.warning("failing %d record(s) of %s-%d: %r", batch.record_count, batch.tp.topic, batch.tp.partition, err)
        self.acc.complete(batch, -1, -1, err)
