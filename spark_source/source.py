"""The ``brook`` Spark data source: batch read, stream read, batch and stream write.

Driver side (``reader``/``streamReader`` objects): options are validated, partitions
discovered, offsets resolved and planned into ranges. Executor side (``read``): each task
rebuilds its own client from the pickled ``BrookInputPartition`` and fetches its range
from the partition leader (``fetcher.read_range``), yielding Arrow record batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from proto import errors
from spark_source.columns import spark_schema
from spark_source.fetcher import RangeTask, data_loss, read_range
from spark_source.offsets import OffsetReader
from spark_source.options import EARLIEST, LATEST, FetchSettings, OffsetSpec, ReadOptions, parse_read_options
from spark_source.planning import (
    TP,
    OffsetRange,
    PartitionOffsets,
    from_json_offsets,
    plan_ranges,
    rate_limit,
    recreated_topics,
    to_json_offsets,
)

logger = logging.getLogger(__name__)


class BrookInputPartition(InputPartition):
    """One Spark task: a range of one partition plus everything needed to fetch it."""

    def __init__(self, task: RangeTask) -> None:
        super().__init__(task)
        self.task = task

    def __repr__(self) -> str:
        t = self.task
        return f"BrookInputPartition({t.topic}-{t.partition} [{t.from_offset}, {t.until_offset}))"


def _input_partitions(
    ranges: Sequence[OffsetRange], fetch: FetchSettings, metadata_version: int
) -> list[BrookInputPartition]:
    return [
        BrookInputPartition(
            RangeTask(r.topic, r.partition, r.from_offset, r.until_offset, fetch, r.topic_id, metadata_version)
        )
        for r in ranges
    ]


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, BrookInputPartition):
        # Spark plans one InputPartition(None) when partitions() found nothing to read.
        assert partition.value is None, f"not a brook partition: {partition!r}"
        return
    yield from read_range(partition.task)


def _check_ranges(start: PartitionOffsets, end: PartitionOffsets, options: ReadOptions) -> PartitionOffsets:
    """Clamp ranges whose end lies before their start (offsets went backwards: data loss)."""
    fixed = dict(start)
    for tp, until in end.items():
        frm = start[tp]
        if until < frm:
            data_loss(f"{tp[0]}-{tp[1]}: end offset {until} is before start offset {frm} (the offsets went "
                      "backwards: the partition was truncated, or its topic deleted and recreated; or the query's "
                      "startingOffsets named an offset past its end)", options.fetch)
            fixed[tp] = until
    return fixed


def _option_name(spec: OffsetSpec, *, ending: bool) -> str:
    """The option a starting/ending spec came from, for messages."""
    side = "ending" if ending else "starting"
    if spec.kind == "timestamps":
        return f"{side}OffsetsByTimestamp"
    if spec.kind == "timestamp":
        return f"{side}Timestamp"
    return f"{side}Offsets"


def _given(spec: OffsetSpec, tp: TP) -> bool:
    """Whether the user chose ``tp``'s offset (an offset or a timestamp) rather than earliest/latest."""
    if spec.kind == "offsets":
        return spec.offsets.get(tp, LATEST) not in (EARLIEST, LATEST)
    return spec.kind in ("timestamps", "timestamp")


def _check_batch_ranges(
    start: PartitionOffsets, end: PartitionOffsets, latest: PartitionOffsets, options: ReadOptions
) -> PartitionOffsets:
    """A batch read's ranges against what the user asked for and what the cluster holds.

    ``latest`` holds the high watermarks of the partitions whose ending offset the user gave as a
    number: one past it is refused at once (a task would wait kafkaConsumer.pollTimeoutMs for
    records that are not there). A beginning offset after the ending one is a contradiction in
    the user's own options, refused whatever failOnDataLoss says, as by Spark's Kafka source
    ("Beginning offset ... is after the ending offset ..."); it is data loss (``_check_ranges``)
    only when both came from the cluster (earliest and latest), which only a log truncated or
    recreated between the two lookups can do.
    """
    assert options.ending is not None
    end_option = _option_name(options.ending, ending=True)
    start_option = _option_name(options.starting, ending=False)
    for tp in sorted(end):
        until = end[tp]
        if tp in latest and until > latest[tp]:
            raise errors.InvalidConfigError(
                f"option '{end_option}': ending offset {until} for topic {tp[0]!r} partition {tp[1]} is past the "
                f"partition's high watermark {latest[tp]} (the end of its committed records); ask for at most "
                f"{latest[tp]}, or -1 (latest)")
    from_cluster: PartitionOffsets = {}
    for tp in sorted(end):
        frm, until = start[tp], end[tp]
        if until >= frm:
            continue
        if not _given(options.starting, tp) and not _given(options.ending, tp):
            from_cluster[tp] = frm
            continue
        end_says = f"option '{end_option}'" if _given(options.ending, tp) else "latest: the high watermark"
        if not _given(options.starting, tp):
            # Only the ending offset was the user's: it is below the log start (the audit's message blamed an
            # option 'startingOffsets' that was never given).
            raise errors.InvalidConfigError(
                f"option '{end_option}': ending offset {until} for topic {tp[0]!r} partition {tp[1]} is before the "
                f"partition's earliest offset {frm} (the records before it were removed): ask for at least {frm} "
                "(not data loss: failOnDataLoss=false does not skip it)")
        raise errors.InvalidConfigError(
            f"option '{start_option}': beginning offset {frm} is after the ending offset {until} ({end_says}) for "
            f"topic {tp[0]!r} partition {tp[1]}. You either provided an invalid starting offset, or the topic has "
            "been damaged (not data loss: failOnDataLoss=false does not skip it)")
    fixed = dict(start)
    fixed.update(_check_ranges(from_cluster, {tp: end[tp] for tp in from_cluster}, options))
    return fixed


def _brief(offsets: dict[int, int], limit: int = 8) -> str:
    """Per-partition offsets for a message, cut short past ``limit`` partitions."""
    items = sorted(offsets.items())
    shown = ", ".join(f"{p}: {o}" for p, o in items[:limit])
    return "{" + shown + (f", ... ({len(items)} partitions)" if len(items) > limit else "") + "}"


class BrookDataSource(DataSource):
    """``spark.read/readStream.format("brook")`` and ``df.write/writeStream.format("brook")``."""

    @classmethod
    def name(cls) -> str:
        return "brook"

    def schema(self) -> StructType:
        include = str(self.options.get("includeheaders", "false")).strip().lower() == "true"
        return spark_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BrookBatchReader(parse_read_options(dict(self.options), streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return BrookStreamReader(parse_read_options(dict(self.options), streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_source.sink import BrookBatchWriter

        return BrookBatchWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark_source.sink import BrookStreamWriter

        return BrookStreamWriter(dict(self.options), schema)


class BrookBatchReader(DataSourceReader):
    """``spark.read``: startingOffsets (default earliest) to endingOffsets (default latest = HW)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        assert self.options.ending is not None
        reader = OffsetReader(self.options)
        try:
            tps = reader.partitions(strict=True)
            ids, version = dict(reader.topic_ids), reader.metadata_version
            start = reader.resolve(self.options.starting, tps, what="startingOffsets")
            end = reader.resolve(self.options.ending, tps, what="endingOffsets")
            # Ending offsets the user gave as numbers, against the high watermarks now.
            latest = reader.latest(tp for tp in tps if self.options.ending.kind == "offsets"
                                   and _given(self.options.ending, tp))
        finally:
            reader.close()
        start = _check_batch_ranges(start, end, latest, self.options)
        ranges = plan_ranges(
            start,
            end,
            min_partitions=self.options.min_partitions,
            max_records_per_partition=self.options.max_records_per_partition,
            topic_ids=ids,
        )
        logger.info("batch read of %d partitions planned as %d tasks", len(tps), len(ranges))
        return _input_partitions(ranges, self.options.fetch, version)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition)


class BrookStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches over committed data with admission control.

    Lives in one long-lived Python process on the driver for the whole query, so it keeps
    a client and what it learnt between calls; the checkpoint holds only offsets (in the Kafka
    source's shape, no topic ids). The ids of the topics whose offsets the query holds are
    remembered here: a topic deleted and recreated under its name while the query runs has a new
    id, and its offsets are then those of another log. That is data loss (failOnDataLoss=true
    fails the query, naming the topic); with failOnDataLoss=false the new topic is read from its
    earliest offset. After a restart the ids are learnt afresh, and a recreation in between is
    seen only as offsets that went backwards, as by Spark's Kafka source.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._reader: OffsetReader | None = None
        self._target: PartitionOffsets | None = None  # Trigger.AvailableNow: HWs at start
        self._new_starts: PartitionOffsets = {}  # where partitions found after the start begin
        self._latest_seen: PartitionOffsets = {}  # high watermarks at the last latestOffset (uncapped)
        self._reported_gone: set[TP] = set()  # data loss is reported once per partition
        self._last_trigger_s: float | None = None  # monotonic time of the last batch admitted (minOffsetsPerTrigger)
        self._topic_ids: dict[str, str] = {}  # topic -> id of the topic the query's offsets belong to
        # Partitions of topics found recreated, with the new topic's earliest offsets: where the batch that
        # starts at ``_reset_from`` (the old topic's offsets) reads them from, instead of those offsets.
        self._reset_from: frozenset | None = None
        self._reset_starts: PartitionOffsets = {}

    @property
    def reader(self) -> OffsetReader:
        if self._reader is None:
            self._reader = OffsetReader(self.options)
        return self._reader

    def initialOffset(self) -> dict:
        tps = self.reader.partitions(strict=True)
        self._topic_ids = dict(self.reader.topic_ids)
        start = self.reader.resolve(self.options.starting, tps, what="startingOffsets")
        logger.info("new query starts at %s", start)
        return to_json_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self.reader.partitions()
        self._target = self.reader.latest(tps)
        logger.info("Trigger.AvailableNow: reading up to the high watermarks %s", self._target)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json_offsets(start)
        present = self.reader.partitions()
        recreated = self._check_recreated(begin, present)
        gone = sorted(set(begin) - present)
        if gone and not set(gone) <= self._reported_gone:
            self._reported_gone |= set(gone)
            data_loss(f"partitions {gone} no longer exist", self.options.fetch)
        current = present & set(self._target) if self._target is not None else present
        latest = self.reader.latest(current)
        self._latest_seen = dict(latest)
        if self._target is not None:
            latest = {tp: min(off, self._target[tp]) for tp, off in latest.items()}
        new = sorted(tp for tp in current if tp not in begin)
        if new:
            # Partitions that appeared after the query started: read them from their start.
            self._new_starts.update(self._starts_of_new(tp for tp in new if tp not in self._new_starts))
            logger.info("picked up new partitions %s", new)
        full_start = {tp: self._start_of(tp, begin) for tp in current}
        full_start = _check_ranges(full_start, latest, self.options)
        _log_behind(full_start, self._latest_seen)
        if self._delay_batch(full_start, latest):
            return start  # an unchanged offset: Spark runs no batch this trigger
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(full_start, latest, limit.max_rows)
        else:
            end = dict(latest)
        # Partitions not read this time (gone from metadata, or outside the AvailableNow
        # target) keep their offsets, so they are never mistaken for new ones and re-read; but
        # those of a recreated topic that it lacks now are dropped, new if they come back.
        for tp, off in begin.items():
            if tp[0] not in recreated:
                end.setdefault(tp, off)
        return to_json_offsets(end)

    def _check_recreated(self, begin: PartitionOffsets, present: set[TP]) -> set[str]:
        """Topics of ``begin`` that were deleted and recreated since their offsets were planned (a new
        topic id): data loss per failOnDataLoss; when it is skipped, the new topic's partitions start at
        their earliest offsets. Also learns the ids of topics seen for the first time."""
        key = frozenset(begin.items())
        if key != self._reset_from:  # the batch the last resets were for has been planned and run
            self._reset_from, self._reset_starts = None, {}
        now = self.reader.topic_ids
        changed = recreated_topics(self._topic_ids, now, {t for t, _ in begin})
        for topic, (old, new) in changed.items():
            held = {p: off for (t, p), off in begin.items() if t == topic}
            data_loss(f"topic {topic!r} was deleted and recreated: its offsets {_brief(held)} belong to the "
                      f"deleted topic (topic id {old}), the topic now is another one (topic id {new})",
                      self.options.fetch)
            fresh = self.reader.earliest(tp for tp in present if tp[0] == topic)
            logger.warning("reading the recreated topic %r from its earliest offsets %s", topic,
                           _brief({p: off for (_, p), off in fresh.items()}))
            self._reset_from = key
            self._reset_starts.update(fresh)
        for topic, topic_id in now.items():
            self._topic_ids[topic] = topic_id
        return set(changed)

    def _start_of(self, tp: TP, begin: PartitionOffsets) -> int:
        if tp in self._reset_starts:
            return self._reset_starts[tp]
        return begin[tp] if tp in begin else self._new_starts[tp]

    def _delay_batch(self, start: PartitionOffsets, latest: PartitionOffsets) -> bool:
        """minOffsetsPerTrigger/maxTriggerDelay, as Spark's KafkaMicroBatchStream.delayBatch: hold the
        batch back while fewer than the minimum new records are available, unless maxTriggerDelay
        has passed since the last batch. Trigger.AvailableNow never waits (it would never end)."""
        low = self.options.min_offsets_per_trigger
        if low is None or self._target is not None:
            return False
        now = time.monotonic()
        if self._last_trigger_s is None or (now - self._last_trigger_s) * 1000 >= self.options.max_trigger_delay_ms:
            self._last_trigger_s = now
            return False
        available = sum(max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest)
        if available < low:
            logger.debug("delaying the batch: %d new records < minOffsetsPerTrigger %d", available, low)
            return True
        self._last_trigger_s = now
        return False

    def _starts_of_new(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Where partitions added while the query runs (or topics a pattern newly matches) are read from: their
        earliest offsets. One that is not 0 lost records before the query could read them: data loss, as Spark's
        Kafka source reports it ("Added partition ... starts from ... instead of 0"). It was read from there
        without a word, failOnDataLoss=true or not (Spark source audit)."""
        starts = self.reader.earliest(tps)
        for (topic, partition), offset in sorted(starts.items()):
            if offset > 0:
                data_loss(f"added partition {topic}-{partition} starts at offset {offset}, not 0: its records "
                          f"before it were removed before the query read them", self.options.fetch)
        return starts

    def reportLatestOffset(self) -> dict | None:
        # The true high watermarks (not capped by maxOffsetsPerTrigger or the AvailableNow
        # target): StreamingQueryProgress.sources[].latestOffset minus endOffset is then how
        # far each partition is behind. Python data sources cannot report custom source
        # metrics (Spark's Kafka source's min/avg/maxOffsetsBehindLatest): there is no
        # metrics() hook in pyspark.sql.datasource.
        return to_json_offsets(self._latest_seen) if self._latest_seen else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = from_json_offsets(start)
        until = from_json_offsets(end)
        missing = [tp for tp in until if tp not in begin and tp not in self._new_starts]
        if missing:  # a restarted query replaying a planned batch: resolve as when planned
            self._new_starts.update(self._starts_of_new(missing))
        if any(t not in self._topic_ids and off > begin.get((t, p), -1) for (t, p), off in until.items()):
            # A restarted query replaying a planned batch: the checkpoint has no topic ids, so the tasks
            # check against the topics as they are now.
            self.reader.partitions()
            for topic, topic_id in self.reader.topic_ids.items():
                self._topic_ids.setdefault(topic, topic_id)
        resets = self._reset_starts if frozenset(begin.items()) == self._reset_from else {}
        frm: dict[TP, int] = {
            tp: resets[tp] if tp in resets else begin.get(tp, self._new_starts.get(tp, 0)) for tp in until
        }
        frm = _check_ranges(frm, until, self.options)
        ranges = plan_ranges(
            frm,
            until,
            min_partitions=self.options.min_partitions,
            max_records_per_partition=self.options.max_records_per_partition,
            topic_ids=self._topic_ids,
        )
        return _input_partitions(ranges, self.options.fetch, self.reader.metadata_version)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition)

    def commit(self, end: dict) -> None:
        # Offsets live in Spark's checkpoint; nothing is committed to the cluster. Starts
        # of new partitions at or below the committed end are no longer needed.
        done = from_json_offsets(end)
        for tp in [tp for tp in self._new_starts if tp in done]:
            del self._new_starts[tp]

    def stop(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _log_behind(start: PartitionOffsets, latest: PartitionOffsets) -> None:
    """Offsets behind latest per partition, in the driver log (the progress shows latestOffset/endOffset)."""
    if not latest or not logger.isEnabledFor(logging.INFO):
        return
    behind = {tp: max(0, off - start.get(tp, off)) for tp, off in latest.items()}
    values = list(behind.values())
    logger.info("offsets behind latest: min %d, avg %.1f, max %d (%d partitions)", min(values),
                sum(values) / len(values), max(values), len(values))


def register(spark) -> None:  # type: ignore[no-untyped-def]
    """Make ``format("brook")`` available in ``spark``."""
    spark.dataSource.register(BrookDataSource)


__all__ = ["BrookDataSource", "BrookInputPartition", "register", "errors"]
