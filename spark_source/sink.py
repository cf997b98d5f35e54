"""Writing DataFrames to Brook: ``df.write`` / ``df.writeStream`` ``.format("brook")``.

Columns, as Spark's Kafka sink: ``value`` (binary or string, required), ``key`` (binary or
string), ``topic`` (string; the ``topic`` option overrides it), ``partition`` (int; else
the producer's partitioner: murmur2 of the key, sticky for keyless records) and
``headers`` (array<struct<key: string, value: binary>>). Other columns are ignored.

Every task runs its own idempotent producer with acks=all, and the task only succeeds once
every one of its records is acknowledged by the full ISR.

What is guaranteed on retries (at-least-once, never lost):
- Inside one task attempt, the producer's own retries (a timeout, a leader change) never
  duplicate or reorder records of a partition: the idempotent producer's sequence numbers
  let the leader drop a batch it already has.
- A task attempt that fails and is retried by Spark writes all its rows again with a new
  producer id: rows the failed attempt had already got acknowledged are then written twice.
  The same holds for a streaming micro-batch that is re-run after a driver restart before it
  was recorded as committed. Brook has no transactions, so exactly-once into Brook is not
  offered; downstream readers de-duplicate by a key if they need exactly-once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from proto import errors
from spark_source.options import WriteOptions, parse_write_options

logger = logging.getLogger(__name__)


@dataclass
class BrookCommitMessage(WriterCommitMessage):
    records: int
    topics: tuple[str, ...]


def _check_schema(schema: StructType, options: WriteOptions) -> None:
    """Fail at start, naming the column, when the DataFrame cannot be written."""
    fields = {f.name.lower(): f.dataType for f in schema.fields}

    def bad(column: str, why: str) -> errors.BrookError:
        return errors.InvalidConfigError(f"column '{column}': {why}")

    if "value" not in fields:
        raise bad("value", "required (binary or string)")
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], BinaryType | StringType):
            raise bad(name, f"must be binary or string, got {fields[name].simpleString()}")
    if "topic" in fields and not isinstance(fields["topic"], StringType):
        raise bad("topic", f"must be string, got {fields['topic'].simpleString()}")
    if options.topic is None and "topic" not in fields:
        raise errors.InvalidConfigError("no topic: give the 'topic' option or a 'topic' column")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise bad("partition", f"must be int, got {fields['partition'].simpleString()}")
    if "headers" in fields:
        t = fields["headers"]
        ok = (
            isinstance(t, ArrayType)
            and isinstance(t.elementType, StructType)
            and [f.name for f in t.elementType.fields] == ["key", "value"]
            and isinstance(t.elementType.fields[0].dataType, StringType)
            and isinstance(t.elementType.fields[1].dataType, BinaryType)
        )
        if not ok:
            raise bad("headers", f"must be array<struct<key:string,value:binary>>, got {t.simpleString()}")


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    for i, field in enumerate(batch.schema):
        if field.name.lower() == name:
            return batch.column(i).to_pylist()
    return None


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> BrookCommitMessage:
    """Produce every row of ``batches``; returns once all are acknowledged, else raises."""
    from client.producer import Producer

    failures: list[BaseException] = []
    failures_lock = threading.Lock()

    def on_delivery(_meta: object, exc: BaseException | None) -> None:
        if exc is not None:
            with failures_lock:
                if len(failures) < 10:  # bounded: the first few explain the failure
                    failures.append(exc)

    producer = Producer(
        bootstrap_servers=options.bootstrap_servers,
        acks="all",
        enable_idempotence=True,
        linger_ms=options.linger_ms,
        batch_size=options.batch_size,
        compression_type=options.compression_type,
        request_timeout_ms=options.request_timeout_ms,
        delivery_timeout_ms=options.delivery_timeout_ms,
        max_block_ms=options.max_block_ms,
        allow_auto_create_topics=False,
        **{k.replace(".", "_"): v for k, v in options.security.to_config().items()},
    )
    count = 0
    topics: set[str] = set()
    try:
        for batch in batches:
            n = batch.num_rows
            values = _column(batch, "value")
            assert values is not None
            keys = _column(batch, "key") or [None] * n
            parts = _column(batch, "partition") or [None] * n
            headers = _column(batch, "headers") or [None] * n
            row_topics = [options.topic] * n if options.topic else _column(batch, "topic")
            assert row_topics is not None
            for i in range(n):
                topic = row_topics[i]
                if topic is None:
                    raise errors.InvalidRecordError("null topic in the 'topic' column and no 'topic' option")
                hdrs = [(h["key"], h["value"]) for h in headers[i]] if headers[i] else None
                producer.send(topic, values[i], key=keys[i], headers=hdrs, partition=parts[i],
                              on_delivery=on_delivery)
                topics.add(topic)
            count += n
            if failures:
                break
        producer.flush(timeout=options.delivery_timeout_ms / 1000 + 5)
    finally:
        producer.close(timeout=options.delivery_timeout_ms / 1000 + 5)
    if failures:
        raise errors.BrookError(
            f"{len(failures)}+ records were not acknowledged; first: {failures[0]!r}",
            code=getattr(failures[0], "code", errors.ErrorCode.UNKNOWN_SERVER_ERROR),
        )
    return BrookCommitMessage(count, tuple(sorted(topics)))


def _log_outcome(messages: list, what: str) -> None:
    done = [m for m in messages if isinstance(m, BrookCommitMessage)]
    logger.info("%s: %d tasks wrote %d records", what, len(done), sum(m.records for m in done))


class BrookBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = parse_write_options(options)
        _check_schema(schema, self.options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BrookCommitMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list) -> None:
        _log_outcome(messages, "batch write committed")

    def abort(self, messages: list) -> None:
        _log_outcome(messages, "batch write aborted (records already acknowledged stay in Brook)")


class BrookStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = parse_write_options(options)
        _check_schema(schema, self.options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BrookCommitMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 (Spark's name)
        _log_outcome(messages, f"micro-batch {batchId} committed")

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803
        _log_outcome(messages, f"micro-batch {batchId} aborted (acknowledged records stay in Brook)")
