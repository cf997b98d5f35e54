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
was in fact written.
"""

from __future__ import annotations

import concurrent.futures
import logging
import struct
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
from client.types import TopicPartition
from proto import broker_pb2

log = logging.getLogger(__name__)

_PRODUCER_STATE = struct.Struct(">qhi")  # producer id, epoch, base sequence at byte 43
_PRODUCER_STATE_POS = 43
_CRC = struct.Struct(">I")
_CRC_POS = 17
_CRC_START = 21
SEQUENCE_MODULUS = 2**31  # sequences wrap like Kafka's
_OUT_OF_ORDER = (errors.ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, errors.ErrorCode.UNKNOWN_PRODUCER_ID)


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
    producer_id: int = -1
    epoch: int = -1
    next_sequence: dict[TopicPartition, int] = field(default_factory=dict)
    # Partitions where the broker acknowledged a batch under this id. Until then a
    # partition has one batch in flight: a broker takes the first sequence it sees from
    # an unknown producer as the start of its history, and pipelined gRPC requests may
    # reach it out of order.
    acked: set[TopicPartition] = field(default_factory=set)
    reset_needed: bool = True  # no id yet


class Sender(threading.Thread):
    def __init__(self, cluster: ClusterClient, accumulator: RecordAccumulator, config: SenderConfig,
                 *, name: str = "brook-producer-sender") -> None:
        super().__init__(name=name, daemon=True)
        self.cluster = cluster
        self.acc = accumulator
        self.config = config
        self.pid = ProducerIdState() if config.idempotent else None
        self.in_flight_requests: dict[int, int] = {}
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

    # ---- main loop ----
    def run(self) -> None:
        try:
            while self.running or self._has_work():
                if self.force_close:
                    break
                self._run_once()
        except Exception as exc:  # keep the failure visible to every pending future
            log.exception("producer sender thread failed")
            self.fatal_error = exc
        finally:
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
        with self.acc.lock:
            expired = self.acc.expired(now)
        for batch in expired:
            self._fail(batch, errors.RequestTimedOutError(
                f"expiring {batch.record_count} record(s) for {batch.tp.topic}-{batch.tp.partition}: "
                f"delivery.timeout.ms elapsed since batch creation"))
        if self.pid is not None and self.pid.reset_needed and self._has_work():
            # Nothing new goes out under the old id: wait for in-flight requests, then re-init.
            # (Only once there is something to send: an idle producer makes no requests.)
            if self._requests_in_flight():
                self._pause(0.01)
                return
            if not self._init_producer_id():
                self._pause(self.config.retry_backoff_ms / 1000)
                return
        leaders = self._leaders()
        with self.acc.lock:
            ready, wait_s = self.acc.ready(now, self.in_flight_batches.keys())
            requests, unknown = self._drain(ready, leaders)
            if not requests:
                if unknown:
                    wait_s = min(wait_s, self.config.retry_backoff_ms / 1000)
                if self.running or not self._has_work_locked():
                    self.acc.wakeup.wait(min(wait_s, 1.0) if wait_s > 0 else 0.001 if unknown else 1.0)
                else:
                    self.acc.wakeup.wait(0.05)
                return
        for node, batches in requests.items():
            self._send(node, batches)

    def _has_work_locked(self) -> bool:
        return any(self.acc.batches.values()) or any(self.in_flight_requests.values())

    def _requests_in_flight(self) -> bool:
        with self.acc.lock:
            return any(self.in_flight_requests.values())

    def _pause(self, seconds: float) -> None:
        with self.acc.lock:
            self.acc.wakeup.wait(seconds)

    def _init_producer_id(self) -> bool:
        assert self.pid is not None
        try:
            producer_id, epoch = self.cluster.init_producer_id()
        except errors.BrookError as exc:
            log.warning("InitProducerId failed, will retry: %s", exc)
            return False
        with self.acc.lock:
            self.pid.producer_id, self.pid.epoch = producer_id, epoch
            self.pid.next_sequence.clear()
            self.pid.acked.clear()
            self.pid.reset_needed = False
            # Batches sequenced under the old id are sequenced again under the new one.
            for dq in self.acc.batches.values():
                for batch in dq:
                    batch.base_sequence = -1
        log.info("producer id %d epoch %d", producer_id, epoch)
        return True

    def _leaders(self) -> dict[TopicPartition, int]:
        with self.acc.lock:
            tps = [tp for tp, dq in self.acc.batches.items() if dq]
        if not tps:
            return {}
        try:
            meta = self.cluster.metadata(sorted({tp.topic for tp in tps}))
        except errors.BrookError as exc:
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
        for node, tps in by_node.items():
            if self.in_flight_requests.get(node, 0) >= self.config.max_in_flight:
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
            head = self.acc.batches[tp][0]
            window = self._window(tp)
            limit = self.config.max_in_flight
            if self.pid is None or tp not in self.pid.acked:
                # Without sequence numbers nothing would stop a broker from applying two
                # pipelined batches of a partition out of order: one at a time keeps order.
                limit = 1
            if not head.retry and len(window) >= limit:
                continue  # wait until the oldest outstanding batch of this partition completes
            batch_bytes = len(head.payload) if head.payload is not None else head.size_bytes
            if out and size + batch_bytes > self.config.max_request_size:
                break
            batch = self.acc.pop_head(tp)
            size += batch_bytes
            if self.pid is not None and batch.base_sequence < 0:
                seq = self.pid.next_sequence.get(tp, 0)
                batch.base_sequence = seq
                batch.producer_id, batch.producer_epoch = self.pid.producer_id, self.pid.epoch
                self.pid.next_sequence[tp] = (seq + batch.record_count) % SEQUENCE_MODULUS
            self.in_flight_batches.setdefault(tp, []).append(batch)
            # Requests on one channel may be handled out of order by the broker, so a batch
            # sent while an earlier one is unanswered can legitimately see OUT_OF_ORDER_SEQUENCE.
            batch.sent_behind = any(b is not batch and 0 <= b.base_sequence < batch.base_sequence
                                    and not b.completion.event.is_set() for b in window)
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
            payload = batch.build()
            if self.pid is not None:
                payload = stamp_producer_state(payload, batch.producer_id, batch.producer_epoch, batch.base_sequence)
                batch.payload = payload
            batch.attempts += 1
            batch.last_attempt = now
            parts.append(broker_pb2.ProducePartitionData(topic=batch.tp.topic, partition=batch.tp.partition,
                                                         records=payload))
        request = broker_pb2.ProduceRequest(acks=self.config.acks, timeout_ms=self.config.request_timeout_ms,
                                            partitions=parts)
        try:
            stub = self.cluster.broker_stub(node)
        except errors.BrookError as exc:
            self._on_done(node, batches, None, exc)
            return
        self._pool.submit(self._call_produce, node, batches, stub, request)

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
        with self.acc.lock:
            self.in_flight_requests[node] -= 1
            for batch in batches:
                lst = self.in_flight_batches.get(batch.tp)
                if lst is not None:
                    lst.remove(batch)
                    if not lst:
                        del self.in_flight_batches[batch.tp]
            self.acc.wakeup.notify()
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
                self._acked(batch)
                self.acc.complete(batch, part.base_offset, part.log_append_time_ms, None)
            elif part.error_code == errors.ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                self._acked(batch)
                self.acc.complete(batch, -1, -1, None)  # written before; offsets unknown (Kafka does the same)
            else:
                self._on_error(batch, errors.error_for(part.error_code, part.error_message))

    def _acked(self, batch: ProducerBatch) -> None:
        if self.pid is not None and batch.producer_id == self.pid.producer_id:
            with self.acc.lock:
                self.pid.acked.add(batch.tp)

    def _earlier_pending(self, batch: ProducerBatch) -> bool:
        """Is a lower-sequence batch of this partition still in flight or waiting for a retry?"""
        with self.acc.lock:
            if self.pid is not None and self.pid.reset_needed:
                return True
            pending: Iterable[ProducerBatch] = list(self.in_flight_batches.get(batch.tp, ())) + [
                b for b in self.acc.batches.get(batch.tp, ()) if b.retry]
            return any(0 <= b.base_sequence < batch.base_sequence for b in pending)

    def _on_error(self, batch: ProducerBatch, err: errors.BrookError) -> None:
        retriable = err.retriable or (
            err.code in _OUT_OF_ORDER and (batch.sent_behind or self._earlier_pending(batch)))
        now = time.monotonic()
        if retriable and batch.attempts <= self.config.retries and now < batch.deadline and self.running_or_flushing():
            if err.code in REFRESH_CODES:
                self.cluster.request_update()
            log.debug("retrying %s after %s (attempt %d)", batch.tp, err, batch.attempts)
            self.acc.reenqueue(batch)
            return
        self._fail(batch, err)

    def running_or_flushing(self) -> bool:
        return not self.force_close

    def _fail(self, batch: ProducerBatch, err: BaseException) -> None:
        if self.pid is not None and batch.base_sequence >= 0:
            # The broker never saw this sequence: later batches would hit a gap. Start over
            # with a fresh producer id once nothing is in flight.
            with self.acc.lock:
                self.pid.reset_needed = True
        log.warning("failing %d record(s) of %s-%d: %r", batch.record_count, batch.tp.topic, batch.tp.partition, err)
        self.acc.complete(batch, -1, -1, err)
