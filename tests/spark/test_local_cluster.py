"""The source with executors in processes of their own: the folder's one SparkSession runs on Spark's
local-cluster master (tests/spark/conftest.py), a master, a worker and an executor JVM beside the driver's, as
on a real Spark cluster. Every Spark test of the suite runs so; this one checks that it does."""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_executors_in_separate_processes_read_from_leaders(spark, brook) -> None:  # type: ignore[no-untyped-def]
    topic = "local-cluster"
    brook.create_topic(topic, 2)
    acked = brook.produce(topic, [b"lc%d" % i for i in range(300)])
    sc = spark.sparkContext
    # local-cluster gives the driver no executor of its own: the memory status lists the driver's block
    # manager and the one executor's.
    assert sc._jsc.sc().getExecutorMemoryStatus().size() - 1 == 1, sc.master
    batch = (spark.read.format("brook").option("bootstrap.servers", brook.bootstrap).option("subscribe", topic)
             .option("minPartitions", "4").load())
    rows = batch.select("partition", "offset", "value").collect()
    assert {(r["partition"], r["offset"]): bytes(r["value"]) for r in rows} == acked
    assert len(rows) == len(acked)

    def _java_ancestor(pid: int) -> int | None:
        """The nearest process above ``pid`` running java, from /proc (defined here, so that cloudpickle sends
        it by value: the executor's workers cannot import this test module)."""
        while pid > 1:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if name == "java":
                return pid
            pid = int(rest[1])  # the parent: the field after the state
        return None

    # Python code of tasks runs in workers under the executor's JVM, not under the driver's.
    jvms = set(sc.parallelize(range(4), 4).map(lambda _: _java_ancestor(os.getpid())).collect())
    driver_jvm = int(sc._jvm.ProcessHandle.current().pid())
    assert jvms and driver_jvm not in jvms and None not in jvms, f"tasks' JVMs {jvms}, the driver's {driver_jvm}"

