"""The demo's Spark job: a streaming aggregation over a Brook topic.

``make demo`` (deploy/local/demo.py) starts a cluster, produces demo data and calls
``run_demo``. The job counts records and bytes per key over everything committed when it
starts (``Trigger.AvailableNow``), then prints the table and returns it.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def run_demo(
    spark: Any,
    bootstrap: str,
    topic: str,
    *,
    checkpoint_dir: str | Path | None = None,
    timeout_s: float = 300.0,
    out: Any = None,
    security: Mapping[str, str] | None = None,
) -> list[tuple[str | None, int, int]]:
    """Count records and value bytes per key of ``topic``; returns [(key, count, bytes)] sorted by key."""
    from pyspark.sql import functions as F

    import spark_source

    spark_source.register(spark)
    out = out or sys.stdout
    with tempfile.TemporaryDirectory(prefix="brook-demo-") as tmp:
        checkpoint = str(checkpoint_dir or Path(tmp) / "checkpoint")
        reader = (
            spark.readStream.format("brook")
            .option("bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
        )
        for key, value in (security or {}).items():  # kafka.security.protocol, kafka.ssl.*, as Spark's Kafka source
            reader = reader.option(f"kafka.{key}", value)
        events = reader.load()
        counts = events.groupBy(F.col("key").cast("string").alias("key")).agg(
            F.count("*").alias("records"), F.sum(F.length("value")).alias("value_bytes")
        )
        table = "brook_demo_counts"
        query = (
            counts.writeStream.outputMode("complete")
            .format("memory")
            .queryName(table)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            if not query.awaitTermination(timeout_s):
                raise TimeoutError(f"demo query did not finish within {timeout_s} s")
        finally:
            query.stop()
        if query.exception() is not None:
            raise RuntimeError(f"demo query failed: {query.exception()}")
        rows = spark.sql(f"SELECT key, records, value_bytes FROM {table} ORDER BY key").collect()
        spark.catalog.dropTempView(table)
    result = [(r["key"], int(r["records"]), int(r["value_bytes"] or 0)) for r in rows]
    total = sum(c for _, c, _ in result)
    print(f"Records per key in topic {topic!r} (Spark streaming, Trigger.AvailableNow):", file=out)
    print(f"{'key':<24} {'records':>10} {'value bytes':>12}", file=out)
    for key, count, size in result:
        print(f"{key if key is not None else '(null)':<24} {count:>10} {size:>12}", file=out)
    print(f"{'total':<24} {total:>10}", file=out)
    return result
