"""Producer: kafka-python / confluent-kafka shaped, built on a batching accumulator and a sender thread.

    with Producer(bootstrap_servers="127.0.0.1:9092", acks="all", linger_ms=5) as p:
        future = p.send("events", b"payload", key=b"user-1")
        print(future.get(timeout=10))   # RecordMetadata(topic, partition, offset, timestamp, ...)
        p.flush()

``send()`` chooses the partition (explicit, custom partitioner, murmur2 of the key
like Kafka's default partitioner, or KIP-480 sticky for keyless records), appends
the record to the partition's open batch and returns at once with a future; the
sender thread ships batches to partition leaders. See ``PRODUCER_DEFAULTS`` for
every config key (Kafka's names, dots or underscores).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from client import errors
from client.accumulator import (
    RECORD_OVERHEAD_BYTES,
    RecordAccumulator,
    RecordFuture,
    estimate_record_bytes,
    failed_future,
)
from client.cluster import ClusterClient, as_timeout_ms
from client.config import (
    SECURITY_DEFAULTS,
    normalize,
    parse_acks,
    parse_bool,
    parse_codec,
    parse_compression_level,
    require_int,
    security_config,
)
from client.partitioner import Partitioner, StickyPartitionCache, murmur2, to_positive
from client.sender import Sender, SenderConfig
from client.types import ClusterMetadata, TopicPartition

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "bootstrap_servers": "127.0.0.1:9092",
    "client_id": "brook-producer",
    "acks": "all",
    "compression_type": "none",
    "compression_gzip_level": -1,  # KIP-390: levels of the codec compression.type names
    "compression_lz4_level": 9,
    "compression_zstd_level": 3,
    "batch_size": 16384,
    "linger_ms": 5,
    "buffer_memory": 32 * 1024 * 1024,
    "max_block_ms": 60000,
    "max_request_size": 1048576,
    "request_timeout_ms": 30000,
    "delivery_timeout_ms": 120000,
    "retries": 2147483647,
    "retry_backoff_ms": 100,
    "retry_backoff_max_ms": 1000,
    "max_in_flight_requests_per_connection": 5,
    "enable_idempotence": None,  # None = on unless acks/retries/in-flight rule it out (Kafka 3 behaviour)
    "partitioner": None,
    "key_serializer": None,
    "value_serializer": None,
    "metadata_max_age_ms": 300000,
    "allow_auto_create_topics": True,
    "interceptors": None,  # gRPC client interceptors for every broker channel
    **SECURITY_DEFAULTS,
}

Serializer = Callable[[Any], bytes | None]


def _to_bytes(data: Any, what: str, serializer: Serializer | None) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    if serializer is not None:
        raise TypeError(f"{what}_serializer returned {type(data).__name__}: it must return bytes, str or None")
    hint = f" (or set {what}_serializer)" if what in ("key", "value") else ""
    raise TypeError(f"{what} must be bytes, str or None{hint}, got {type(data).__name__}")


def _headers(headers: Any) -> list[tuple[str, bytes | None]]:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(k), _to_bytes(v, "header value", None)) for k, v in items]


class Producer:
    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        cfg = normalize(config, kwargs, PRODUCER_DEFAULTS, what="producer")
        self.config = cfg
        self.acks = parse_acks(cfg["acks"])
        codec = parse_codec(cfg["compression_type"])
        batch_size = require_int(cfg, "batch_size", minimum=1)
        linger_ms = require_int(cfg, "linger_ms")
        buffer_memory = require_int(cfg, "buffer_memory", minimum=1)
        self.max_block_ms = require_int(cfg, "max_block_ms")
        self.max_request_size = require_int(cfg, "max_request_size", minimum=1)
        request_timeout_ms = require_int(cfg, "request_timeout_ms", minimum=1)
        delivery_timeout_ms = require_int(cfg, "delivery_timeout_ms", minimum=1)
        retries = require_int(cfg, "retries")
        retry_backoff_ms = require_int(cfg, "retry_backoff_ms")
        max_in_flight = require_int(cfg, "max_in_flight_requests_per_connection", minimum=1)
        if delivery_timeout_ms < linger_ms + request_timeout_ms:
            raise errors.InvalidConfigError(
                f"delivery.timeout.ms ({delivery_timeout_ms}) must be >= linger.ms + request.timeout.ms "
                f"({linger_ms + request_timeout_ms})")
        self.idempotent = self._idempotence(cfg["enable_idempotence"], max_in_flight, retries)
        partitioner = cfg["partitioner"]
        if partitioner is not None and not callable(partitioner):
            raise errors.InvalidConfigError("partitioner must be callable(key_bytes, all_partitions, available)")
        self._partitioner: Partitioner | None = partitioner
        self._key_serializer: Serializer | None = cfg["key_serializer"]
        self._value_serializer: Serializer | None = cfg["value_serializer"]
        self._sticky = StickyPartitionCache()
        self._partition_cache: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[int, TopicPartition]]] = {}
        self._cache_meta: ClusterMetadata | None = None
        self._closed = False
        self._close_lock = threading.Lock()

        self.cluster = ClusterClient(
            cfg["bootstrap_servers"],
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=require_int(cfg, "retry_backoff_max_ms"),
            metadata_max_age_ms=require_int(cfg, "metadata_max_age_ms", minimum=1),
            allow_auto_topic_creation=parse_bool(cfg, "allow_auto_create_topics"),
            interceptors=cfg["interceptors"],
            security=security_config(cfg),
        )
        self._accumulator = RecordAccumulator(
            batch_size=batch_size,
            linger_ms=linger_ms,
            buffer_memory=buffer_memory,
            compression=codec,
            compression_level=parse_compression_level(cfg, codec),
            max_block_ms=self.max_block_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
        )
        self._sender = Sender(
            self.cluster,
            self._accumulator,
            SenderConfig(
                acks=self.acks,
                request_timeout_ms=request_timeout_ms,
                max_request_size=self.max_request_size,
                max_in_flight=max_in_flight,
                retries=retries,
                retry_backoff_ms=retry_backoff_ms,
                idempotent=self.idempotent,
            ),
            name=f"{cfg['client_id']}-sender",
        )
        # send() of an ordinary record in one compiled call (storage/_record_walk.c Appender), when the
        # extension is built and no custom partitioner has to see each record.
        self._appender: Any = None
        # Where send() hands the serialized record: the Python path, or the compiled appender below.
        self._deliver: Callable[..., RecordFuture] = self._send_serialized
        appender = self._accumulator.appender
        if appender is not None and partitioner is None:
            appender.cluster = self.cluster
            appender.meta = self._cache_meta
            appender.max_request_size = self.max_request_size
            appender.sticky = self._sticky.current  # keyless records follow the Python path's choice
            appender.enabled = 1
            self._appender = appender
            if type(self).send is Producer.send:  # not where a subclass has its own send()
                # This instance's send() is the compiled one (after the serializers, if any); it hands
                # what it does not take to the Python path past the serializers (same signature and
                # errors as send(), nothing serialized twice).
                appender.fallback = self._send_serialized
                if self._key_serializer is None and self._value_serializer is None:
                    self.send = appender.produce  # type: ignore[method-assign]
                else:
                    self._deliver = appender.produce
        self._sender.start()

    def _idempotence(self, setting: Any, max_in_flight: int, retries: int) -> bool:
        conflicts = []
        if self.acks != -1:
            conflicts.append("acks must be all")
        if max_in_flight > 5:
            conflicts.append("max.in.flight.requests.per.connection must be <= 5")
        if retries == 0:
            conflicts.append("retries must be > 0")
        if setting is None:
            return not conflicts  # Kafka 3: on by default, quietly off when other configs rule it out
        enabled = parse_bool({"enable_idempotence": setting}, "enable_idempotence")
        if enabled and conflicts:
            raise errors.InvalidConfigError("enable.idempotence=true requires: " + "; ".join(conflicts))
        return enabled

    # ---- send ----
    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        on_delivery: Callable[[Any, BaseException | None], Any] | None = None,
    ) -> RecordFuture:
        """Queue one record; returns a future of its RecordMetadata.

        ``timestamp`` is milliseconds since the epoch (default: now). Blocks only
        while waiting for the topic's metadata or for buffer memory, up to
        ``max.block.ms``. Raises ProducerClosedError after close().
        """
        if self._closed or self._sender.fatal_error is not None:
            self._check_sendable()
        if self._key_serializer is not None:
            key = self._key_serializer(key)
        if self._value_serializer is not None:
            value = self._value_serializer(value)
        return self._deliver(topic, value, key, headers, partition, timestamp, on_delivery=on_delivery)

    def _check_sendable(self) -> None:
        if self._closed:
            raise errors.ProducerClosedError("send() after close()")
        if self._sender.fatal_error is not None:
            raise errors.ProducerClosedError(f"the sender thread failed: {self._sender.fatal_error!r}")

    def _send_serialized(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        on_delivery: Callable[[Any, BaseException | None], Any] | None = None,
    ) -> RecordFuture:
        """send() past the serializers: ``key`` and ``value`` are what they returned (or the caller's)."""
        if self._closed or self._sender.fatal_error is not None:
            self._check_sendable()
        # Hot path: no per-record work beyond what the record needs (see client/perf.py).
        if key is not None and key.__class__ is not bytes:
            key = _to_bytes(key, "key", self._key_serializer)
        if value is not None and value.__class__ is not bytes:
            value = _to_bytes(value, "value", self._value_serializer)
        key_size = -1 if key is None else len(key)
        value_size = -1 if value is None else len(value)
        size = RECORD_OVERHEAD_BYTES + (key_size if key_size > 0 else 0) + (value_size if value_size > 0 else 0)
        if headers:
            header_list = _headers(headers)
            size = estimate_record_bytes(key, value, header_list)
        else:
            header_list = ()
        cached = self._partition_cache.get(topic) if self.cluster._meta is self._cache_meta else None
        if cached is None:
            cached = self._partitions(topic)
        all_parts, available, tps = cached
        if partition is not None:
            if partition not in all_parts:
                raise errors.UnknownTopicOrPartitionError(
                    f"partition {partition} of topic {topic!r} does not exist (it has {len(all_parts)})")
        elif self._partitioner is not None:
            partition = self._partitioner(key, all_parts, available)
        elif key is not None:
            partition = all_parts[to_positive(murmur2(key)) % len(all_parts)]
        if size > self.max_request_size or size > self._accumulator.buffer_memory:
            future = failed_future(TopicPartition(topic, -1 if partition is None else partition),
                                   errors.MessageTooLargeError(
                f"the record is {size} bytes when serialized, larger than max.request.size "
                f"({self.max_request_size}) or buffer.memory ({self._accumulator.buffer_memory})"))
        elif partition is not None:
            tp = tps.get(partition) or TopicPartition(topic, partition)
            future = self._accumulator.append(tp, timestamp, key, value, header_list, size, key_size, value_size)
        else:
            # KIP-480: stick to one partition until its batch fills (or is sent), then move on.
            sticky = self._sticky.partition(topic, all_parts, available)
            tp = tps.get(sticky)
            future = None if tp is None else self._accumulator.append(
                tp, timestamp, key, value, header_list, size, key_size, value_size, allow_new_batch=False)
            if future is None:
                sticky = self._sticky.next_partition(topic, all_parts, available, sticky)
                future = self._accumulator.append(tps[sticky], timestamp, key, value, header_list, size,
                                                  key_size, value_size)
        assert future is not None
        if on_delivery is not None:
            future.add_delivery_callback(on_delivery)
        return future

    def _partitions(self, topic: str) -> tuple[tuple[int, ...], tuple[int, ...], dict[int, TopicPartition]]:
        """(all partitions, partitions with a leader, {p: TopicPartition}) of ``topic``.

        Waits up to max.block.ms for the topic to appear in metadata.
        """
        deadline = time.monotonic() + self.max_block_ms / 1000
        refresh = False
        while True:
            try:
                remaining_ms = as_timeout_ms(deadline - time.monotonic())
                meta = self.cluster.metadata([topic], refresh=refresh, timeout_ms=remaining_ms)
                info = meta.topics.get(topic)
                if info is not None and info.error_code == errors.ErrorCode.NONE and info.partitions:
                    break
                err: errors.BrookError = (errors.error_for(info.error_code, info.error_message)
                                          if info is not None and info.error_code else
                                          errors.UnknownTopicOrPartitionError(f"topic {topic!r} has no partitions"))
                if not err.retriable:
                    raise err
            except errors.BrookError as exc:
                if not exc.retriable:
                    raise
                err = exc
            if time.monotonic() >= deadline:
                raise errors.error_for(err.code, f"topic {topic!r} not present in metadata after "
                                                 f"max.block.ms={self.max_block_ms}: {err.message}")
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            refresh = True
        parts = tuple(sorted(info.partitions))
        available = tuple(p for p in parts if info.partitions[p].leader >= 0)
        snapshot = self.cluster.metadata_snapshot()
        appender = self._appender
        if snapshot is not self._cache_meta:
            self._partition_cache = {}
            self._cache_meta = snapshot
            if appender is not None:
                # Before the new snapshot is named: a send meanwhile finds it unlike the cluster's
                # (or finds no partitions) and takes this path.
                appender.keyed.clear()
                appender.meta = snapshot
        entry = (parts, available, {p: TopicPartition(topic, p) for p in parts})
        self._partition_cache[topic] = entry
        if appender is not None and appender.meta is snapshot:
            appender.keyed[topic] = tuple(entry[2][p] for p in parts)
        return entry

    def partitions_for(self, topic: str) -> list[int]:
        return list(self._partitions(topic)[0])

    # ---- flush / close ----
    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait for it to complete (success or failure)."""
        acc = self._accumulator
        with acc.lock:
            acc.flushes_in_progress += 1
            acc.wakeup.notify()
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            for batch in acc.incomplete_batches():
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not batch.completion.event.wait(remaining):
                    raise errors.RequestTimedOutError(f"flush() did not complete within {timeout} s")
        finally:
            with acc.lock:
                acc.flushes_in_progress -= 1

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued (waiting up to ``timeout`` s, default forever), then release everything.

        Records still unsent when the timeout runs out fail with ProducerClosedError.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            if self._appender is not None:
                self._appender.enabled = 0  # send() raises from here on
        acc = self._accumulator
        with acc.lock:
            acc.closing = True
            self._sender.running = False
            acc.wakeup.notify_all()
            acc.space.notify_all()
        self._sender.join(timeout)
        if self._sender.is_alive():
            self._sender.force_close = True
            self._sender.wakeup()
            # Ends the sender's retry waits (InitProducerId against brokers that do not answer) and
            # cancels its calls: close() keeps to its timeout, as Kafka's close(Duration) does.
            self.cluster.close()
            self._sender.join(5)
        acc.abort_all(errors.ProducerClosedError("producer closed before the record was acknowledged"))
        self.cluster.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def metrics(self) -> dict[str, Any]:
        acc = self._accumulator
        with acc.lock:
            return {
                "buffer_used_bytes": acc.used_bytes,
                "incomplete_batches": len(acc.incomplete),
                "queued_batches": sum(len(d) for d in acc.batches.values()),
                "idempotent": self.idempotent,
            }
