"""Executor side: read one offset range straight from the partition leader as Arrow batches.

Runs inside Spark's Python workers, possibly on another machine than the driver: it
rebuilds everything from the pickled input partition (bootstrap servers and settings),
never from driver memory. Python workers are reused across tasks, so one ClusterClient
per bootstrap string is kept per worker process (bounded, oldest closed first) instead of
reconnecting for every task.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from client.cluster import ClusterClient
from client.types import TopicPartition
from proto import errors
from spark_source.columns import arrow_schema, decode_to_arrow
from spark_source.options import FetchSettings

logger = logging.getLogger(__name__)

_MAX_CACHED_CLIENTS = 4
_clients: OrderedDict[tuple[str, int, object], ClusterClient] = OrderedDict()
_clients_lock = threading.Lock()


def _client(settings: FetchSettings) -> ClusterClient:
    key = (settings.bootstrap_servers, settings.request_timeout_ms, settings.security)
    with _clients_lock:
        client = _clients.get(key)
        if client is not None:
            _clients.move_to_end(key)
            return client
        client = ClusterClient(settings.bootstrap_servers, request_timeout_ms=settings.request_timeout_ms,
                               security=settings.security)
        _clients[key] = client
        while len(_clients) > _MAX_CACHED_CLIENTS:
            _, old = _clients.popitem(last=False)
            old.close()
        return client


@dataclass(frozen=True)
class RangeTask:
    """What one task reads: records [from_offset, until_offset) of one partition."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    fetch: FetchSettings


class DataLossError(errors.BrookError):
    """Offsets the query should read are gone (retention, or a truncated/recreated partition)."""

    code = errors.ErrorCode.OFFSET_OUT_OF_RANGE


def data_loss(message: str, settings: FetchSettings) -> None:
    """Fail (failOnDataLoss=true) or log and let the caller skip past the gap."""
    if settings.fail_on_data_loss:
        raise DataLossError(
            message + ". Some data may have been lost: removed by retention, or the partition was "
            "truncated, deleted or recreated. Set the source option failOnDataLoss=false to skip it and go on."
        )
    logger.warning("%s; skipping (failOnDataLoss=false)", message)


def read_range(task: RangeTask) -> Iterator[pa.RecordBatch]:
    """Yield the committed records of the range as Arrow batches (one per fetch response)."""
    settings = task.fetch
    client = _client(settings)
    tp = TopicPartition(task.topic, task.partition)
    schema = arrow_schema(settings.include_headers)
    offset = task.from_offset
    last_progress = time.monotonic()
    while offset < task.until_offset:
        res = client.fetch(tp, offset, settings.max_partition_fetch_bytes, max_wait_ms=settings.fetch_max_wait_ms)
        if res.error is not None:
            offset = _after_error(client, tp, offset, task, res.error, last_progress)
            continue
        if res.log_start_offset > offset:
            # Only possible if the log start moved between the request and the read.
            data_loss(f"{task.topic}-{task.partition}: offsets {offset}..{res.log_start_offset - 1} are gone", settings)
            offset = res.log_start_offset
            continue
        batch, result = decode_to_arrow(
            res.records, task.topic, task.partition, offset, task.until_offset, schema
        )
        if result.batches == 0:
            _check_stalled(task, offset, res.high_watermark, last_progress)
            continue
        offset = max(offset, result.next_offset)
        last_progress = time.monotonic()
        if batch is not None and batch.num_rows:
            yield batch


def _after_error(
    client: ClusterClient, tp: TopicPartition, offset: int, task: RangeTask, err: Exception, last_progress: float
) -> int:
    """The offset to continue at after a fetch error, or raise."""
    if isinstance(err, errors.BrookError) and err.code == errors.ErrorCode.OFFSET_OUT_OF_RANGE:
        earliest, _ = client.list_offsets({tp: -2})[tp]
        if offset < earliest:
            data_loss(f"{tp.topic}-{tp.partition}: offsets {offset}..{earliest - 1} were removed", task.fetch)
            return earliest
        # Above the log end: a new leader has less data than was committed before (unclean
        # election) or is still catching up its high watermark; wait within the poll timeout.
        _check_stalled(task, offset, -1, last_progress)
        return offset
    if isinstance(err, errors.BrookError) and err.code == errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        gone = _gone(client, tp)
        if gone:
            # As Spark's Kafka source: a topic deleted after the range was planned is data loss, not a
            # timeout; with failOnDataLoss=false the rest of the range reads as empty.
            data_loss(f"{tp.topic}-{tp.partition}: the {gone} no longer exists, so offsets {offset}.."
                      f"{task.until_offset - 1} cannot be read", task.fetch)
            return task.until_offset
        # Still in the metadata: a leader that has not applied the topic yet, or leadership moving.
        _check_stalled(task, offset, -1, last_progress)
        return offset
    if isinstance(err, errors.BrookError) and err.retriable:
        _check_stalled(task, offset, -1, last_progress)
        return offset
    raise err


def _gone(client: ClusterClient, tp: TopicPartition) -> str | None:
    """"topic" or "partition" when fresh metadata no longer has it; None while it exists (or the
    metadata cannot be had now: retried as the fetch error is)."""
    try:
        meta = client.metadata([tp.topic], refresh=True)
    except errors.BrookError as exc:
        if not exc.retriable:
            raise
        logger.debug("%s-%d: metadata refresh failed (%s); retrying the fetch", tp.topic, tp.partition, exc)
        return None
    info = meta.topics.get(tp.topic)
    if info is None or info.error_code == errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return "topic"
    if info.error_code != errors.ErrorCode.NONE:
        err = errors.error_for(info.error_code, info.error_message or f"topic {tp.topic!r}")
        if not err.retriable:
            raise err  # e.g. TOPIC_AUTHORIZATION_FAILED: an error of its own, not data loss
        return None
    return None if tp.partition in info.partitions else "partition"


def _check_stalled(task: RangeTask, offset: int, high_watermark: int, last_progress: float) -> None:
    """Raise when the range has made no progress for kafkaConsumer.pollTimeoutMs."""
    waited_ms = (time.monotonic() - last_progress) * 1000
    if waited_ms > task.fetch.poll_timeout_ms:
        raise errors.RequestTimedOutError(
            f"{task.topic}-{task.partition}: no records at offset {offset} for {waited_ms:.0f} ms "
            f"(high watermark {high_watermark}, reading up to {task.until_offset}); "
            "raise kafkaConsumer.pollTimeoutMs if the cluster is slow"
        )
    # The fetch itself long-polls (fetch.max.wait.ms); this pause only bounds a hot loop
    # when the broker answers at once with nothing.
    time.sleep(0.01)
