"""The producer's record accumulator: per-partition batches, lightweight futures, buffer memory.

``send()`` appends a record to the open batch of its partition (a
``storage.record_batch.RecordBatchBuilder``) and gets back a ``RecordFuture``: a
small object pointing at the batch and the record's offset delta, so there is one
completion (event, error, base offset) per batch rather than per record. The sender
thread drains ready batches (full, lingered long enough, or flushed) and completes
them from broker responses.

Memory: every record reserves its estimated size against ``buffer.memory`` until its
batch completes; ``append`` blocks up to ``max.block.ms`` when the buffer is full.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from client import errors
from client.types import RecordMetadata, TopicPartition
from storage import record_walk
from storage.record_batch import BATCH_HEADER_SIZE, RecordBatchBuilder

log = logging.getLogger(__name__)

RECORD_OVERHEAD_BYTES = 21  # Kafka's upper bound for a record's varints and attributes
Headers = Sequence[tuple[str, bytes | None]]
DeliveryCallback = Callable[[RecordMetadata | None, BaseException | None], None]


def estimate_record_bytes(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    size = RECORD_OVERHEAD_BYTES + (len(key) if key else 0) + (len(value) if value else 0)
    for hkey, hvalue in headers:
        size += 10 + len(hkey) + (len(hvalue) if hvalue else 0)
    return size


class BatchCompletion:
    """The outcome of one batch, shared by the futures of all its records."""

    __slots__ = ("event", "error", "base_offset", "log_append_time_ms", "callbacks", "lock", "topic", "partition",
                 "opened_at", "sent_at", "completed_at", "dispatched")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.event = threading.Event()
        self.error: BaseException | None = None
        self.base_offset = -1
        self.log_append_time_ms = -1
        self.callbacks: list[tuple[RecordFuture, Callable[[RecordFuture], Any]]] | None = None
        self.lock = threading.Lock()
        # time.monotonic() when its batch was opened, last sent and completed (0.0: not yet): perf tools measure
        # latency with them, and split it into the wait in the producer and the request's round trip.
        self.opened_at = 0.0
        self.sent_at = 0.0
        self.completed_at = 0.0
        self.dispatched = False  # callbacks ran (or run at once when added)

    def add_callback(self, future: RecordFuture, fn: Callable[[RecordFuture], Any]) -> None:
        with self.lock:
            if not self.dispatched:
                if self.callbacks is None:
                    self.callbacks = []
                self.callbacks.append((future, fn))
                return
        _run_callback(fn, future)

    def complete(self, base_offset: int, log_append_time_ms: int, error: BaseException | None, *,
                 dispatch: bool = True) -> bool:
        """Set the outcome (futures' get() returns from now on); run the callbacks unless the caller
        dispatches them itself, in order (see Accumulator.complete). False if it was already complete."""
        with self.lock:
            if self.event.is_set():
                return False
            self.base_offset = base_offset
            self.log_append_time_ms = log_append_time_ms
            self.error = error
            self.completed_at = time.monotonic()
            self.event.set()
        if dispatch:
            self.dispatch()
        return True

    def dispatch(self) -> None:
        with self.lock:
            self.dispatched = True
            callbacks, self.callbacks = self.callbacks, None
        for future, fn in callbacks or ():
            _run_callback(fn, future)


def _run_callback(fn: Callable[[RecordFuture], Any], future: RecordFuture) -> None:
    try:
        fn(future)
    except Exception:  # a user callback must not kill the sender thread
        log.exception("producer callback %r raised", fn)


class _PyRecordFutureBase:
    """A record future's fields: the reference for the compiled RecordFutureBase
    (storage/_record_walk.c), which the batch's records writer makes for each record it appends
    without running Python code."""

    __slots__ = ("_completion", "_delta", "_timestamp", "_key_size", "_value_size")

    def __init__(self, completion: BatchCompletion, delta: int, timestamp: int, key_size: int, value_size: int):
        self._completion = completion
        self._delta = delta
        self._timestamp = timestamp
        self._key_size = key_size
        self._value_size = value_size


# The compiled future base, built with the compiled records writer (an older build has neither:
# the producer then takes the Python path).
_COMPILED_FUTURE = getattr(record_walk._compiled, "RecordFutureBase", None)
_FAST_APPEND = _COMPILED_FUTURE is not None
# The compiled send() of an ordinary record (storage/_record_walk.c Appender), built with them.
_APPENDER = getattr(record_walk._compiled, "Appender", None) if _FAST_APPEND else None


class RecordFuture(_COMPILED_FUTURE if _FAST_APPEND else _PyRecordFutureBase):  # type: ignore[misc]
    """Future of one record's RecordMetadata (concurrent.futures-like, plus kafka-python's get())."""

    __slots__ = ()

    def done(self) -> bool:
        return self._completion.event.is_set()

    def cancel(self) -> bool:
        return False  # records already handed to the accumulator cannot be taken back

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self.done()

    def _wait(self, timeout: float | None) -> BatchCompletion:
        c = self._completion
        if not c.event.wait(timeout):
            raise errors.RequestTimedOutError(f"record not acknowledged within {timeout} s")
        return c

    def result(self, timeout: float | None = None) -> RecordMetadata:
        c = self._wait(timeout)
        if c.error is not None:
            raise c.error
        return self._metadata(c)

    get = result  # kafka-python's spelling

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._wait(timeout).error

    @property
    def completed_at(self) -> float:
        """time.monotonic() when the record's batch completed (0.0 while pending)."""
        return self._completion.completed_at

    @property
    def batch_outcome(self) -> BatchCompletion:
        """The outcome every record of this record's batch shares (``error``, ``completed_at``): what a
        tool measuring many records keeps, one object a batch instead of one a record."""
        return self._completion

    def _metadata(self, c: BatchCompletion) -> RecordMetadata:
        offset = c.base_offset + self._delta if c.base_offset >= 0 else -1
        timestamp = c.log_append_time_ms if c.log_append_time_ms >= 0 else self._timestamp
        return RecordMetadata(c.topic, c.partition, offset, timestamp, self._key_size, self._value_size)

    def add_done_callback(self, fn: Callable[[RecordFuture], Any]) -> None:
        self._completion.add_callback(self, fn)

    def add_callback(self, fn: Callable[[RecordMetadata], Any]) -> RecordFuture:
        """kafka-python style: ``fn(metadata)`` on success."""
        self.add_done_callback(lambda f: f._completion.error is None and fn(f._metadata(f._completion)))
        return self

    def add_errback(self, fn: Callable[[BaseException], Any]) -> RecordFuture:
        """kafka-python style: ``fn(exception)`` on failure."""
        self.add_done_callback(lambda f: f._completion.error is not None and fn(f._completion.error))
        return self

    def add_delivery_callback(self, fn: DeliveryCallback) -> RecordFuture:
        """confluent-kafka style: ``fn(metadata_or_None, error_or_None)``."""

        def deliver(f: RecordFuture) -> None:
            c = f._completion
            fn(None, c.error) if c.error is not None else fn(f._metadata(c), None)

        self.add_done_callback(deliver)
        return self


def failed_future(tp: TopicPartition, error: BaseException) -> RecordFuture:
    completion = BatchCompletion(tp.topic, tp.partition)
    completion.complete(-1, -1, error)
    return RecordFuture(completion, 0, -1, -1, -1)


class ProducerBatch:
    """An open (appendable) or closed batch of one partition, plus its send/retry state."""

    __slots__ = (
        "tp", "builder", "append_future", "completion", "created", "deadline", "size_bytes", "_record_count",
        "closed", "attempts", "last_attempt", "retry", "base_sequence", "producer_id", "producer_epoch", "payload",
        "stamped", "sent_behind",
    )

    def __init__(self, tp: TopicPartition, builder: RecordBatchBuilder, now: float, delivery_timeout_s: float):
        self.tp = tp
        self.builder = builder
        # The compiled writer's append of a record without headers, future included (None: Python path,
        # also where the builder has the Python writer); the compiled Appender appends through it too.
        self.append_future = getattr(builder.records_writer, "append_future", None) if _FAST_APPEND else None
        self.completion = BatchCompletion(tp.topic, tp.partition)
        self.completion.opened_at = self.created = now
        self.deadline = now + delivery_timeout_s
        self.size_bytes = 0  # header + records, reserved against buffer.memory until completion
        self._record_count = 0  # once built (the builder counts until then)
        self.closed = False
        self.attempts = 0
        self.last_attempt = 0.0
        self.retry = False
        self.base_sequence = -1
        self.producer_id = -1
        self.producer_epoch = -1
        self.payload: bytes | None = None  # built bytes, kept for retries
        self.stamped: tuple[int, int, int] | None = None  # the producer state payload carries (idempotence)
        self.sent_behind = False  # a lower-sequence batch was unanswered when this one was last sent

    @property
    def record_count(self) -> int:
        return self._record_count if self.builder is None else self.builder.record_count

    def build(self, producer_state: tuple[int, int, int] | None = None) -> bytes:
        """The batch's bytes, built once (with ``producer_state`` in its header if given) and kept."""
        if self.payload is None:
            self.closed = True
            self.append_future = None
            self._record_count = self.builder.record_count
            self.payload = self.builder.build(producer_state)
            self.stamped = producer_state
            self.builder = None  # type: ignore[assignment]  # free the record buffers
        return self.payload


class _BufferAccount:
    """Where buffer.memory is counted without the compiled Appender (which counts it otherwise)."""

    __slots__ = ("used_bytes",)

    def __init__(self) -> None:
        self.used_bytes = 0


class RecordAccumulator:
    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: int,
        buffer_memory: int,
        compression: int,
        max_block_ms: int,
        delivery_timeout_ms: int,
        retry_backoff_ms: int = 100,
        compression_level: int | None = None,
    ) -> None:
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000.0
        self.buffer_memory = buffer_memory
        self.compression = compression
        self.compression_level = compression_level
        self.max_block_s = max_block_ms / 1000.0
        self.delivery_timeout_s = delivery_timeout_ms / 1000.0
        self.retry_backoff_s = retry_backoff_ms / 1000.0
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)  # the sender waits here
        self.space = threading.Condition(self.lock)  # send() waits here for buffer memory
        self.batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        self.open_batches: dict[TopicPartition, ProducerBatch] = {}  # the appendable tail batch per partition
        self.incomplete: set[ProducerBatch] = set()
        # Callbacks run in each partition's send order, as Kafka guarantees, although responses
        # (and retries) complete batches on several threads in any order: batches in creation order,
        # and the partitions whose callbacks some thread is running right now.
        self._callback_order: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._dispatching: set[TopicPartition] = set()
        # The compiled send() path (None without the extension), which holds the buffer accounting
        # (used_bytes) for both paths; the producer connects it to its metadata and enables it.
        self.appender: Any = None if _APPENDER is None else _APPENDER(
            self.lock, self.open_batches, RecordFuture, batch_size, buffer_memory, RECORD_OVERHEAD_BYTES)
        self.account: Any = self.appender if self.appender is not None else _BufferAccount()
        self.space_waiters = 0
        self.flushes_in_progress = 0
        self.closing = False
        # Set by ready() and the sender's drain (under ``lock``): a batch waits for an answer (its
        # partition or broker has as many requests in flight as allowed), so answers must wake
        # the sender; when nothing waits for one, an answer needs no wake-up.
        self.held_by_in_flight = False

    @property
    def used_bytes(self) -> int:
        """Bytes of buffer.memory reserved by queued records (read and written under ``lock``)."""
        return self.account.used_bytes

    @used_bytes.setter
    def used_bytes(self, value: int) -> None:
        self.account.used_bytes = value

    # ---- append (application threads) ----
    def append(
        self,
        tp: TopicPartition,
        timestamp: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        size: int,
        key_size: int = -1,
        value_size: int = -1,
        *,
        allow_new_batch: bool = True,
    ) -> RecordFuture | None:
        """Append one record (``timestamp`` None: now); None when ``allow_new_batch`` is False and a
        new batch would be needed.

        The hot path of ``send()``: one lock, one dict lookup, one call of the compiled writer.
        """
        # acquire/release, not `with`: on CPython 3.11 the with statement doubles this hot path's lock cost.
        lock = self.lock
        lock.acquire()
        try:
            batch = self.open_batches.get(tp)
            if batch is None or batch.size_bytes + size > self.batch_size:
                if self.closing:
                    raise errors.ProducerClosedError("producer is closed")
                if batch is not None:
                    self._close(batch)  # full: ready for the sender regardless of linger
                    self.wakeup.notify()
                if not allow_new_batch:
                    return None
                size += BATCH_HEADER_SIZE  # the new batch's header is reserved with its first record
                batch = self._new_batch(tp)
            account = self.account
            used = account.used_bytes + size
            if used <= self.buffer_memory:
                account.used_bytes = used
            else:
                self._reserve(size)
            future = None
            if batch.append_future is not None and not headers:
                # One call: the record encoded and its future made in C (None: the builder's own
                # append names the error or converts the key or value).
                future = batch.append_future(RecordFuture, batch.completion, timestamp, key, value)
            if future is None:
                if timestamp is None:
                    timestamp = int(time.time() * 1000)
                try:
                    delta = batch.builder.append(timestamp, key, value, headers)
                except errors.BrookError:
                    self.used_bytes -= size  # refused (a timestamp beyond a varlong): nothing was added
                    raise
                future = RecordFuture(batch.completion, delta, timestamp, key_size, value_size)
            batch.size_bytes += size
            if batch.size_bytes >= self.batch_size:
                self._close(batch)
                self.wakeup.notify()
            return future
        finally:
            lock.release()

    def _close(self, batch: ProducerBatch) -> None:
        """No more appends to ``batch``. Caller holds ``lock``."""
        batch.closed = True
        if self.open_batches.get(batch.tp) is batch:
            del self.open_batches[batch.tp]

    def _reserve(self, size: int) -> None:
        if self.used_bytes + size <= self.buffer_memory:
            self.used_bytes += size
            return
        deadline = time.monotonic() + self.max_block_s
        self.space_waiters += 1
        self.wakeup.notify()  # drain now rather than after linger: someone is blocked
        try:
            while self.used_bytes + size > self.buffer_memory:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closing:
                    raise errors.BufferExhaustedError(
                        f"failed to allocate {size} bytes within max.block.ms={int(self.max_block_s * 1000)} "
                        f"(buffer.memory={self.buffer_memory}, in use {self.used_bytes})"
                    )
                self.space.wait(remaining)
            self.used_bytes += size
        finally:
            self.space_waiters -= 1

    def _new_batch(self, tp: TopicPartition) -> ProducerBatch:
        builder = RecordBatchBuilder(self.compression, compression_level=self.compression_level)
        batch = ProducerBatch(tp, builder, time.monotonic(), self.delivery_timeout_s)
        self.open_batches[tp] = batch
        dq = self.batches.get(tp)
        if dq is None:
            dq = self.batches[tp] = deque()
        dq.append(batch)
        self.incomplete.add(batch)
        self._callback_order.setdefault(tp, deque()).append(batch)
        if len(dq) == 1:
            self.wakeup.notify()  # the sender must start this batch's linger clock
        return batch

    # ---- sender side ----
    def ready(self, now: float, in_flight_tps: Iterable[TopicPartition]) -> tuple[list[TopicPartition], float]:
        """Partitions whose head batch may be sent now, and seconds until the next one may be.

        Caller holds ``lock``. A partition with a batch being retried waits until none of
        its batches is in flight, so retries never overtake or get overtaken.
        """
        busy = set(in_flight_tps)
        urgent = self.flushes_in_progress > 0 or self.closing or self.space_waiters > 0
        ready: list[TopicPartition] = []
        next_s = 1.0
        self.held_by_in_flight = False
        for tp, dq in self.batches.items():
            if not dq:
                continue
            head = dq[0]
            if head.retry:
                if tp in busy:
                    self.held_by_in_flight = True  # an answer must wake the sender for it
                    continue
                wait = head.last_attempt + self.retry_backoff_s - now
                if wait > 0:
                    next_s = min(next_s, wait)
                    continue
                ready.append(tp)
                continue
            if head.closed or len(dq) > 1 or urgent:
                ready.append(tp)
                continue
            wait = head.created + self.linger_s - now
            if wait <= 0:
                ready.append(tp)
            else:
                next_s = min(next_s, wait)
        return ready, max(0.0, next_s)

    def pop_head(self, tp: TopicPartition) -> ProducerBatch:
        """Caller holds ``lock``."""
        batch = self.batches[tp].popleft()
        self._close(batch)
        return batch

    def reenqueue(self, batch: ProducerBatch) -> None:
        """Put a batch back for a retry, before newer batches of its partition, in sequence order."""
        with self.lock:
            self.reenqueue_locked(batch)

    def reenqueue_locked(self, batch: ProducerBatch) -> None:
        """``reenqueue`` for a caller holding ``lock``."""
        batch.retry = True
        dq = self.batches.setdefault(batch.tp, deque())
        index = 0
        # Batches whose sequence was reset (-1) are sent in queue order after the sequenced ones.
        while index < len(dq) and dq[index].retry and 0 <= dq[index].base_sequence < batch.base_sequence:
            index += 1
        dq.insert(index, batch)
        self.wakeup.notify()

    def expired(self, now: float) -> list[ProducerBatch]:
        """Remove and return queued batches past delivery.timeout.ms. Caller holds ``lock``."""
        return self.take_queued(now)

    def take_queued(self, due_by: float = float("inf")) -> list[ProducerBatch]:
        """Remove and return the queued batches (not those in flight) whose deadline is at or before ``due_by``:
        every one by default. Caller holds ``lock``."""
        out: list[ProducerBatch] = []
        for dq in self.batches.values():
            while dq and dq[0].deadline <= due_by:
                batch = dq.popleft()
                self._close(batch)
                out.append(batch)
        return out

    def complete(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int,
                 error: BaseException | None, *, wake: bool = True) -> None:
        """Finish a batch: release its memory, then resolve its futures and callbacks. ``wake=False``
        for a caller that wakes the sender itself once it has completed every batch of an answer."""
        with self.lock:
            if batch in self.incomplete:
                self.incomplete.discard(batch)
                self.used_bytes -= batch.size_bytes
                self.space.notify_all()
        batch.completion.complete(base_offset, log_append_time_ms, error, dispatch=False)
        self._dispatch_in_order(batch.tp)
        # Only now: the sender's per-partition window (Sender._window) counts a batch as
        # outstanding until its completion is set, so a wakeup sent before that could find
        # the window still full and sleep until the next linger or 1 s timeout.
        if wake:
            with self.lock:
                self.wakeup.notify()

    def _dispatch_in_order(self, tp: TopicPartition) -> None:
        """Run the callbacks of the partition's completed batches that no earlier batch holds back.

        One thread at a time per partition runs them; a completion arriving meanwhile is picked up by
        that thread, which checks the head again under the lock before it stops (the completing thread
        set the event before it looked whether someone is dispatching, under the same lock)."""
        with self.lock:
            if tp in self._dispatching:
                return
            self._dispatching.add(tp)
        try:
            while True:
                with self.lock:
                    order = self._callback_order.get(tp)
                    if not order or not order[0].completion.event.is_set():
                        if order is not None and not order:
                            del self._callback_order[tp]
                        self._dispatching.discard(tp)
                        return
                    head = order.popleft()
                head.completion.dispatch()
        except BaseException:
            with self.lock:
                self._dispatching.discard(tp)
            raise

    def has_unsent(self) -> bool:
        with self.lock:
            return any(self.batches.values())

    def incomplete_batches(self) -> list[ProducerBatch]:
        with self.lock:
            return list(self.incomplete)

    def abort_all(self, error: BaseException) -> None:
        with self.lock:
            pending = list(self.incomplete)
            for dq in self.batches.values():
                dq.clear()
            self.open_batches.clear()
        for batch in pending:
            self.complete(batch, -1, -1, error)
