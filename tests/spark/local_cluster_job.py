"""Run by test_executors_in_separate_processes: the brook source on Spark's local-cluster master.

With ``local-cluster[1,1,1024]`` Spark starts a master, a worker and an executor JVM as
separate processes; tasks (and their Python workers) run there, never in the driver. One
executor proves that (a second cost the suite 15 s of JVM start-up on two cores).
Prints one JSON line: what was read, and how many executors there were.
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = time.monotonic()


def _mark(what: str) -> None:
    print(f"{time.monotonic() - T0:7.1f} s  {what}", file=sys.stderr, flush=True)


def main(bootstrap: str, topic: str) -> None:
    from pyspark.sql import SparkSession

    import spark_source

    spark = (
        SparkSession.builder.master("local-cluster[1,1,1024]")
        .appName("brook-local-cluster")
        .config("spark.ui.enabled", "false")
        # Short-lived JVMs: the client compiler alone starts them sooner (as the suite's session).
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    _mark("session up")
    spark_source.register(spark)

    try:
        batch = (spark.read.format("brook").option("bootstrap.servers", bootstrap).option("subscribe", topic)
                 .option("minPartitions", "4").load())
        rows = batch.select("partition", "offset", "value").collect()
        _mark("batch read done")
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    finally:
        spark.stop()
    print(json.dumps({
        "driver_pid": os.getpid(),
        "executors": executors,
        "batch": sorted([r["partition"], r["offset"], bytes(r["value"]).decode()] for r in rows),
    }))


if __name__ == "__main__":
    main(*sys.argv[1:3])
