"""Executor side: read one offset range straight from the partition leader as Arrow batches.

Runs inside Spark's Python workers, possibly on another machine than the driver: it
rebuilds everything from the pickled input partition (bootstrap servers and settings),
never from driver memory. Python workers are reused across tasks, so one ClusterClient
per bootstrap string is kept per worker process (bounded, oldest closed first) instead of
reconnecting for every task.

Each fetch is one request: an error comes back at once (``ClusterClient.fetch`` would retry
a retriable one such as UNKNOWN_TOPIC_OR_PARTITION for up to request.timeout.ms) and is
judged here against fresh metadata: a partition whose topic was deleted, or deleted and
recreated (another topic id than the planned one), after its range was planned is data loss
(failOnDataLoss) at once; anything else is retried with a backoff until
kafkaConsumer.pollTimeoutMs passes without progress. Brook's Fetch names a topic, not its id,
so records are yielded only once the leader that served them still shows the planned topic
id (one small Metadata call to that broker per fetch that returned records): a topic
recreated on the same leader is never read at the deleted topic's offsets.

Fetches are read_committed (Kafka's isolation level): the leader serves nothing past the last
stable offset, and the records of aborted transactions are dropped (``client.fetcher.AbortedFilter``),
so a query sees only committed data, as the driver plans it (spark_source/offsets.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pyarrow as pa

from client.cluster import REFRESH_CODES, ClusterClient, rpc_error
from client.config import READ_COMMITTED
from client.types import FetchResult, TopicPartition
from proto import broker_pb2, errors
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
    """What one task reads: records [from_offset, until_offset) of one partition.

    ``topic_id`` is the id of the topic the offsets were planned in ("" skips the check) and
    ``metadata_version`` the version of the driver's metadata then: an answer older than that
    cannot tell whether the topic changed since.
    """

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    fetch: FetchSettings
    topic_id: str = ""
    metadata_version: int = -1


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


_TOPIC_CHECK_INTERVAL_S = 1.0  # between metadata lookups while a leader answers with nothing
_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.05, 1.0  # between fetches after a retriable error


def read_range(task: RangeTask) -> Iterator[pa.RecordBatch]:
    """Yield the committed records of the range as Arrow batches (one per fetch response)."""
    yield from _RangeReader(task).batches()


class _RangeReader:
    def __init__(self, task: RangeTask) -> None:
        self.task = task
        self.settings = task.fetch
        self.client = _client(task.fetch)
        self.tp = TopicPartition(task.topic, task.partition)
        self.offset = task.from_offset
        self.last_progress = time.monotonic()
        self.failures = 0  # retries since the last progress (their backoff grows)
        self.next_topic_check = 0.0
        self.seen_metadata = self.client.metadata_snapshot()

    def batches(self) -> Iterator[pa.RecordBatch]:
        task = self.task
        # A range planned with its topic's id is checked against fresh metadata first: the topic may
        # have been deleted, or recreated with records at these offsets that are not the planned ones.
        if task.topic_id and self.offset < task.until_offset and self._lost(refresh=True):
            return
        schema = arrow_schema(self.settings.include_headers)
        while self.offset < task.until_offset:
            res, leader = _fetch_once(self.client, self.tp, self.offset, self.settings)
            if self.client.metadata_snapshot() is not self.seen_metadata:
                # The fetch looked its leader up afresh (after NOT_LEADER, ...): if that metadata shows
                # the topic recreated, the answer came from the new topic's log and is not the plan's.
                self.seen_metadata = self.client.metadata_snapshot()
                if self._lost(refresh=False):
                    return
            if res.error is not None:
                self._after_error(res.error)
                continue
            if res.log_start_offset > self.offset:
                # Only possible if the log start moved between the request and the read.
                data_loss(f"{task.topic}-{task.partition}: offsets {self.offset}..{res.log_start_offset - 1} "
                          "are gone", self.settings)
                self.offset = res.log_start_offset
                continue
            batch, result = decode_to_arrow(
                res.records, task.topic, task.partition, self.offset, task.until_offset, schema,
                aborted=res.aborted_transactions,
            )
            if result.batches == 0:
                # Nothing at an offset the plan has records at: a new leader whose high watermark is still
                # behind, or a recreated topic whose new log is shorter. Fresh metadata tells which.
                if self._topic_changed():
                    return
                self._check_stalled(res.high_watermark)
                continue
            if task.topic_id and batch is not None and batch.num_rows:
                # Brook's Fetch names a topic, not its id: the leader may have answered from a topic recreated
                # since the plan, holding other records at these offsets. Its own metadata says which.
                verdict = self._served_from_planned_topic(leader)
                if verdict is None:
                    continue  # the leader cannot tell now: fetch again
                if not verdict:
                    return
            self.offset = max(self.offset, result.next_offset)
            self.last_progress = time.monotonic()
            self.failures = 0
            if batch is not None and batch.num_rows:
                yield batch

    def _after_error(self, err: Exception) -> None:
        """Go on after a fetch error (moving ``offset`` past lost records), or raise."""
        if not isinstance(err, errors.BrookError):
            raise err
        if err.code == errors.ErrorCode.OFFSET_OUT_OF_RANGE:
            # A recreated topic's new log does not hold the planned offsets: that, not retention.
            if self._topic_changed():
                return
            earliest, _ = self.client.list_offsets({self.tp: -2})[self.tp]
            if self.offset < earliest:
                data_loss(f"{self.tp.topic}-{self.tp.partition}: offsets {self.offset}..{earliest - 1} were removed",
                          self.settings)
                self.offset = earliest
                return
            # Above the log end: a new leader has less data than was committed before (unclean
            # election) or is still catching up its high watermark; wait within the poll timeout.
            self._check_stalled(-1)
            return
        if not err.retriable:
            raise err
        if err.code == errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            # As Spark's Kafka source: a topic deleted after the range was planned is data loss, not a
            # timeout. Told by one metadata refresh, not by request.timeout.ms of retries.
            if self._lost(refresh=True):
                return
            # Still in the metadata: a leader that has not applied the topic yet, or leadership moving.
        elif err.code in REFRESH_CODES or err.code == errors.ErrorCode.REQUEST_TIMED_OUT:
            # The next fetch looks the leader up afresh: one that does not answer (stopped, cut off) has likely been
            # replaced, and asking it again cost request.timeout.ms a try until kafkaConsumer.pollTimeoutMs failed
            # the task (the client's consumer refreshes on any retriable error too).
            self.client.request_update()
        self._retry_later()

    def _retry_later(self) -> None:
        """Back off before the next fetch (raising once kafkaConsumer.pollTimeoutMs passed without progress)."""
        self.failures += 1
        self._check_stalled(-1, pause_s=min(_BACKOFF_MAX_S, _BACKOFF_MIN_S * 2 ** min(self.failures - 1, 10)))

    def _topic_changed(self) -> bool:
        """After an answer that does not fit the plan: is the topic gone or recreated? Asked of a broker
        at once, then at most once a second while such answers go on (ranges planned with a topic id)."""
        if not self.task.topic_id or time.monotonic() < self.next_topic_check:
            return False
        self.next_topic_check = time.monotonic() + _TOPIC_CHECK_INTERVAL_S
        return self._lost(refresh=True)

    def _served_from_planned_topic(self, leader: int) -> bool | None:
        """True when ``leader`` still has the planned topic id (its answer came from the planned log);
        False when the topic is gone or another one there (reported as data loss, the range skipped);
        None when it cannot tell now (no answer, or metadata older than the plan): fetch again."""
        task = self.task
        try:
            version, code, topic_id = _leader_view(self.client, leader, task.topic, self.settings)
            if code not in (errors.ErrorCode.NONE, errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
                raise errors.error_for(code, f"topic {task.topic!r} on broker {leader}")
        except errors.BrookError as exc:
            if not exc.retriable:
                raise  # e.g. TOPIC_AUTHORIZATION_FAILED
            self._after_error(exc)
            return None
        if version < task.metadata_version:
            self.client.request_update()  # a broker behind the plan may not lead the partition any more
            self._retry_later()
            return None
        if code == errors.ErrorCode.NONE and topic_id == task.topic_id:
            return True
        what = ("the topic no longer exists" if code != errors.ErrorCode.NONE else
                f"topic {task.topic!r} was deleted and recreated after this range was planned (topic id "
                f"{task.topic_id} then, {topic_id} now)")
        self._report_lost(what)
        return False

    def _lost(self, *, refresh: bool) -> bool:
        """Report (per failOnDataLoss) and skip the rest of the range when its partition is gone or its
        topic was recreated; False while the topic is the planned one (or the metadata cannot tell)."""
        what = _partition_gone(self.client, self.task, refresh=refresh)
        self.seen_metadata = self.client.metadata_snapshot()
        if what is None:
            return False
        self._report_lost(what)
        return True

    def _report_lost(self, what: str) -> None:
        """Data loss of the rest of the range (raises with failOnDataLoss=true, else skips it)."""
        task = self.task
        data_loss(f"{task.topic}-{task.partition}: {what}, so offsets {self.offset}..{task.until_offset - 1} "
                  "cannot be read", self.settings)
        self.offset = task.until_offset

    def _check_stalled(self, high_watermark: int, pause_s: float = 0.01) -> None:
        """Raise when the range has made no progress for kafkaConsumer.pollTimeoutMs."""
        task = self.task
        waited_ms = (time.monotonic() - self.last_progress) * 1000
        if waited_ms > task.fetch.poll_timeout_ms:
            raise errors.RequestTimedOutError(
                f"{task.topic}-{task.partition}: no records at offset {self.offset} for {waited_ms:.0f} ms "
                f"(high watermark {high_watermark}, reading up to {task.until_offset}); "
                "raise kafkaConsumer.pollTimeoutMs if the cluster is slow"
            )
        # The fetch itself long-polls (fetch.max.wait.ms); this pause bounds a hot loop when the broker
        # answers at once with nothing, and backs off after errors.
        time.sleep(pause_s)


def _fetch_once(
    client: ClusterClient, tp: TopicPartition, offset: int, settings: FetchSettings
) -> tuple[FetchResult, int]:
    """One Fetch of ``tp`` from its leader: (the result, the leader's node id or -1). Every error,
    retriable or not, comes back in the result."""
    leader = -1
    try:
        leader = client.leader_for(tp)
        timeout_s = (settings.request_timeout_ms + settings.fetch_max_wait_ms) / 1000
        return client.fetch_from(leader, tp, offset, settings.max_partition_fetch_bytes,
                                 max_wait_ms=settings.fetch_max_wait_ms, timeout_s=timeout_s,
                                 isolation_level=READ_COMMITTED), leader
    except grpc.RpcError as exc:
        return FetchResult(b"", -1, -1, rpc_error(exc, f"Fetch {tp}")), leader
    except errors.BrookError as exc:
        return FetchResult(b"", -1, -1, exc), leader


def _leader_view(client: ClusterClient, leader: int, topic: str, settings: FetchSettings) -> tuple[int, int, str]:
    """(metadata version, error code, topic id) of ``topic`` as broker ``leader`` itself has it now.

    A broker applies a metadata update to its cache before it swaps a recreated topic's logs (both
    under one lock): a leader that still shows the planned id after answering a fetch answered it
    from the planned topic's log. Raises a BrookError when the broker does not answer.
    """
    try:
        resp = client.broker_stub(leader).Metadata(
            broker_pb2.MetadataRequest(topics=[topic]), timeout=settings.request_timeout_ms / 1000)
    except grpc.RpcError as exc:
        raise rpc_error(exc, f"Metadata from broker {leader}") from None
    info = next((t for t in resp.topics if t.name == topic), None)
    if info is None:
        return resp.metadata_version, errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ""
    return resp.metadata_version, info.error_code, info.topic_id


def _partition_gone(client: ClusterClient, task: RangeTask, *, refresh: bool) -> str | None:
    """Why the range's partition cannot be read any more ("the topic no longer exists", "the partition
    no longer exists", "topic 't' was deleted and recreated ..."), or None while it can (or the
    metadata cannot tell now: older than the plan, or no broker answered; the caller retries).

    ``refresh``: ask a broker; else judge only the metadata the client holds, which can only show
    a new topic id (a topic missing from it is merely not looked up yet).
    """
    topic = task.topic
    if refresh:
        try:
            meta = client.metadata([topic], refresh=True)
        except errors.BrookError as exc:
            if not exc.retriable:
                raise
            logger.debug("%s-%d: metadata refresh failed (%s); retrying the fetch", topic, task.partition, exc)
            return None
    else:
        meta = client.metadata_snapshot()
    if meta.version < task.metadata_version:
        return None  # from a broker that has not applied what the driver planned with
    info = meta.topics.get(topic)
    if info is None or info.error_code == errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return "the topic no longer exists" if refresh else None
    if info.error_code != errors.ErrorCode.NONE:
        err = errors.error_for(info.error_code, info.error_message or f"topic {topic!r}")
        if not err.retriable:
            raise err  # e.g. TOPIC_AUTHORIZATION_FAILED: an error of its own, not data loss
        return None
    if task.topic_id and info.topic_id and info.topic_id != task.topic_id:
        return (f"topic {topic!r} was deleted and recreated after this range was planned (topic id "
                f"{task.topic_id} then, {info.topic_id} now)")
    if task.partition not in info.partitions:
        return "the partition no longer exists" if refresh else None
    return None
