"""A streaming query keeps reading, exactly once, while a partition leader moves away."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_stream_follows_a_leader_change(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from client.cluster import ClusterClient

    topic = "failover"
    brook.create_topic(topic, 2, rf=3)
    acked = brook.produce(topic, [b"f%d" % i for i in range(300)])
    query = (spark.readStream.format("brook").option("bootstrap.servers", brook.bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest").load()
             .select("partition", "offset", "value").writeStream.format("memory").queryName("failover_rows")
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="300 milliseconds").start())

    def rows() -> list:
        return spark.sql("SELECT * FROM failover_rows").collect()

    def wait_rows(n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(rows()) < n:
            # A query that ended says why at once: it was polled for the whole timeout and reported as
            # "0 of 300 rows" when Spark had failed its start ("Python worker failed to connect back").
            assert query.isActive, f"the query ended with {len(rows())} of {n} rows: {query.exception()}"
            assert time.monotonic() < deadline, f"{len(rows())} of {n} rows after {timeout_s} s"
            time.sleep(0.3)

    stopped = None
    try:
        wait_rows(300, 60)
        with ClusterClient(brook.bootstrap) as client:
            stopped = client.metadata([topic], refresh=True).topics[topic].partitions[0].leader
        brook.cluster.stop_node(stopped, timeout_s=30)  # controlled shutdown: leadership moves
        acked.update(brook.produce(topic, [b"g%d" % i for i in range(300)]))
        wait_rows(600, 90)
    finally:
        query.stop()
        if stopped is not None:
            brook.cluster.start_node(stopped)
            brook.cluster.wait_ready(60)
    assert query.exception() is None, query.exception()
    got = [((r["partition"], r["offset"]), bytes(r["value"])) for r in rows()]
    assert len(got) == len(dict(got)), "duplicates"
    assert dict(got) == acked
