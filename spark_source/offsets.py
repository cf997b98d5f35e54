"""Driver side: which partitions a query reads and where their offsets stand right now.

Everything is asked of the cluster through ``client.cluster.ClusterClient``: metadata for
partition discovery, ListOffsets -2 (log start), -1 and timestamps, read_committed: "latest" is
the last stable offset (the high watermark while no transaction is open), the end of committed
data, so a plan never reaches past it (nor into a transaction not yet decided).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from client.cluster import ClusterClient
from client.config import READ_COMMITTED
from client.types import TopicPartition
from proto import errors
from spark_source.columns import arrow_schema, decode_to_arrow
from spark_source.options import EARLIEST, LATEST, OffsetSpec, ReadOptions, Subscription
from spark_source.planning import TP, PartitionOffsets

logger = logging.getLogger(__name__)


class OffsetReader:
    """Partition discovery and offset lookups for one query (driver only)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.client = ClusterClient(
            options.bootstrap_servers, request_timeout_ms=options.fetch.request_timeout_ms,
            security=options.fetch.security,
        )
        # Topic -> id of the topics found by the last discovery: a topic deleted and recreated under
        # the same name gets a new id, so offsets planned under the old one mean other records.
        self.topic_ids: dict[str, str] = {}

    @property
    def metadata_version(self) -> int:
        """The version of the metadata the last lookup saw (tasks judge their own answers against it)."""
        return self.client.metadata_snapshot().version

    def close(self) -> None:
        self.client.close()

    # ---- discovery ----
    def partitions(self, *, strict: bool = False) -> set[TP]:
        """The partitions the subscription covers now (fresh metadata every call).

        ``strict`` (a batch read, a new streaming query): a topic named by ``subscribe`` or a
        partition named by ``assign`` that does not exist is an UNKNOWN_TOPIC_OR_PARTITION
        error, as Spark's Kafka source fails on its admin client's describeTopics, instead
        of a query that silently reads nothing. Later micro-batches are lenient: a topic
        deleted mid-query is data loss, reported per failOnDataLoss.
        """
        sub = self.options.subscription
        return self._with_retries(lambda: self._discover(sub, strict), "discover partitions")

    def _discover(self, sub: Subscription, strict: bool = False) -> set[TP]:
        if sub.kind == "assign":
            topics = sorted({t for t, _ in sub.assigned})
            meta = self.client.metadata(topics, refresh=True)
            _raise_refusals(meta, topics, "assign")
            present = {(t, p) for t in topics for p in (meta.partitions_for(t) or [])}
            missing = sorted(set(sub.assigned) - present)
            if missing and strict:
                counts = {t: len(meta.partitions_for(t) or []) for t, _ in missing}
                raise errors.UnknownTopicOrPartitionError(
                    f"option 'assign': partitions {missing} do not exist "
                    f"(partitions per topic now: {counts}; 0 means the topic does not exist)")
            if missing:
                logger.warning("assigned partitions do not exist (any more): %s", missing)
            self._note_ids(meta, topics)
            return set(sub.assigned) & present
        if sub.kind == "subscribe":
            meta = self.client.metadata(list(sub.topics), refresh=True)
            topics = list(sub.topics)
            _raise_refusals(meta, topics, "subscribe")
            unknown = [t for t in topics if meta.partitions_for(t) is None]
            if unknown and strict:
                raise errors.UnknownTopicOrPartitionError(
                    f"option 'subscribe': topic{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(repr(t) for t in unknown)} do{'' if len(unknown) > 1 else 'es'} not exist")
        else:
            meta = self.client.metadata(None, refresh=True)
            topics = [t for t, info in meta.topics.items() if not info.is_internal and sub.matches(t)]
        out: set[TP] = set()
        for topic in topics:
            for p in meta.partitions_for(topic) or []:
                out.add((topic, p))
        self._note_ids(meta, topics)
        return out

    def _note_ids(self, meta: Any, topics: Iterable[str]) -> None:
        self.topic_ids = {t: meta.topics[t].topic_id for t in topics
                          if meta.partitions_for(t) is not None and meta.topics[t].topic_id}

    # ---- offsets ----
    def earliest(self, tps: Iterable[TP]) -> PartitionOffsets:
        return self._list({tp: EARLIEST for tp in tps})

    def latest(self, tps: Iterable[TP]) -> PartitionOffsets:
        """Last stable offsets (high watermarks while no transaction is open): the end (exclusive) of committed
        data."""
        return self._list({tp: LATEST for tp in tps})

    def _list(self, asks: dict[TP, int]) -> PartitionOffsets:
        if not asks:
            return {}
        res = self._with_retries(
            lambda: self.client.list_offsets({TopicPartition(*tp): ts for tp, ts in asks.items()},
                                             isolation_level=READ_COMMITTED),
            "list offsets",
        )
        return {(tp.topic, tp.partition): off for tp, (off, _) in res.items()}

    def resolve(self, spec: OffsetSpec, tps: set[TP], *, what: str) -> PartitionOffsets:
        """Concrete offsets for ``tps`` from a startingOffsets/endingOffsets spec."""
        if spec.kind == "earliest":
            return self.earliest(tps)
        if spec.kind == "latest":
            return self.latest(tps)
        if spec.kind == "offsets":
            return self._resolve_specific(spec, tps, what)
        stamps = spec.timestamps if spec.kind == "timestamps" else {tp: spec.timestamp for tp in tps}
        if spec.kind == "timestamps":  # named as the user gave it (startingOffsets was named: audit)
            self._check_named_all(set(stamps), tps, f"{what}ByTimestamp")
        # Spark: an ending timestamp with no record at or after it ends at the latest offset;
        # a starting one follows startingOffsetsByTimestampStrategy.
        return self._resolve_timestamps(stamps, missing_to_latest=what == "endingOffsets")

    def _check_named_all(self, named: set[TP], tps: set[TP], what: str) -> None:
        # As Spark's Kafka source: per-partition JSON must cover exactly the partitions read,
        # so a typo'd or forgotten partition is an error instead of a silent default.
        if named != tps:
            raise errors.InvalidConfigError(
                f"option '{what}': must name every partition read, and only those. "
                f"Named: {sorted(named)}; partitions read: {sorted(tps)}. Use -2 for earliest, -1 for latest."
            )

    def _resolve_specific(self, spec: OffsetSpec, tps: set[TP], what: str) -> PartitionOffsets:
        self._check_named_all(set(spec.offsets), tps, what)
        need_earliest = {tp for tp, off in spec.offsets.items() if off == EARLIEST}
        need_latest = {tp for tp, off in spec.offsets.items() if off == LATEST}
        out = {tp: off for tp, off in spec.offsets.items() if off >= 0}
        out.update(self.earliest(need_earliest))
        out.update(self.latest(need_latest))
        return out

    def _resolve_timestamps(self, stamps: dict[TP, int], *, missing_to_latest: bool = False) -> PartitionOffsets:
        found = self._list(stamps)
        for tp, off in found.items():
            if off >= 0:
                found[tp] = self._first_at_or_after(tp, off, stamps[tp])
        missing = sorted(tp for tp, off in found.items() if off < 0)
        if missing:
            if self.options.starting_timestamp_strategy == "error" and not missing_to_latest:
                raise errors.OffsetNotAvailableError(
                    f"no record at or after the requested timestamp in {missing}; set "
                    "startingOffsetsByTimestampStrategy=latest to start those at the latest offset"
                )
            found.update(self.latest(missing))
        return found

    def _first_at_or_after(self, tp: TP, offset: int, timestamp_ms: int) -> int:
        """Refine a batch-granular ListOffsets answer to the first record with ts >= the one asked.

        A broker may answer with the start of the first batch whose max timestamp is late
        enough (the batch holds the record); Kafka's meaning is the record's own offset.
        """
        res = self.client.fetch(TopicPartition(*tp), offset, self.options.fetch.max_partition_fetch_bytes,
                                isolation_level=READ_COMMITTED)
        if res.error is not None or not res.records:
            return offset
        batch, _ = decode_to_arrow(res.records, tp[0], tp[1], offset, 2**62, arrow_schema(False),
                                   aborted=res.aborted_transactions)
        if batch is None:
            return offset
        stamps_us = batch.column("timestamp").cast("int64").to_numpy()
        later = (stamps_us >= timestamp_ms * 1000).nonzero()[0]
        return int(batch.column("offset")[int(later[0])].as_py()) if later.size else offset

    def _with_retries(self, fn, what: str):  # type: ignore[no-untyped-def]
        """fetchOffset.numRetries / fetchOffset.retryIntervalMs around one driver lookup."""
        attempts = self.options.fetch_offset_num_retries + 1
        for attempt in range(attempts):
            try:
                return fn()
            except errors.BrookError as exc:
                if not exc.retriable or attempt == attempts - 1:
                    raise
                logger.warning("%s failed (%s); retry %d of %d", what, exc, attempt + 1, attempts - 1)
                time.sleep(self.options.fetch_offset_retry_interval_ms / 1000)
        raise AssertionError("unreachable")


def _raise_refusals(meta: Any, topics: list[str], option: str) -> None:
    """A named topic the caller may not read is an error in every batch, as in Spark's Kafka source
    (TopicAuthorizationException), never an empty read or a "does not exist"."""
    for t in topics:
        info = meta.topics.get(t)
        if info is not None and info.error_code == errors.ErrorCode.TOPIC_AUTHORIZATION_FAILED:
            raise errors.error_for(info.error_code, f"option '{option}': topic {t!r}: {info.error_message}")
