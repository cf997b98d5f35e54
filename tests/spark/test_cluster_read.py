"""The brook source against a real 3-node cluster: streaming and batch reads, limits, discovery."""

from __future__ import annotations

import json
import threading
import time

import pytest
from waiting import wait_for as wait_until
from waiting import while_running

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def stream(spark, brook, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("brook").option("bootstrap.servers", brook.bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def end_offsets(progress: dict) -> dict[str, dict[str, int]]:
    end = progress["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else end


class BackgroundProducer:
    """Produces chunks with acks=all until stopped; remembers every acknowledged record."""

    def __init__(self, brook, topic: str, *, chunks: int, chunk: int = 100, pause_s: float = 0.05) -> None:  # type: ignore[no-untyped-def]
        self.acked: dict[tuple[int, int], bytes] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(brook, topic, chunks, chunk, pause_s), daemon=True)

    def start(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def _run(self, brook, topic: str, chunks: int, chunk: int, pause_s: float) -> None:  # type: ignore[no-untyped-def]
        try:
            with brook.producer() as p:
                for c in range(chunks):
                    if self._stop.is_set():
                        return
                    values = [f"{topic}-{c:04d}-{i:04d}".encode() for i in range(chunk)]
                    futures = [p.send(topic, v, key=f"k{i % 7}".encode()) for i, v in enumerate(values)]
                    p.flush(timeout=60)
                    for v, f in zip(values, futures, strict=True):
                        md = f.result(timeout=60)
                        self.acked[(md.partition, md.offset)] = v
                    time.sleep(pause_s)
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float = 120) -> dict[tuple[int, int], bytes]:
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "producer thread did not finish"
        assert self.error is None, f"producer failed: {self.error!r}"
        return dict(self.acked)


def test_stream_exactly_once_into_parquet_across_restart(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = "eo-parquet"
    brook.create_topic(topic, 3)
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")
    # Runs until stopped (bounded by its chunk count): production spans both query runs.
    producer = BackgroundProducer(brook, topic, chunks=3000, chunk=50, pause_s=0.1)

    def start_query():  # type: ignore[no-untyped-def]
        df = stream(spark, brook, subscribe=topic, startingOffsets="earliest").select("partition", "offset", "value")
        return (df.writeStream.format("parquet").option("path", out).option("checkpointLocation", cp)
                .trigger(processingTime="300 milliseconds").start())

    def through(hw: dict[int, int]) -> bool:
        # The query's own progress, not a Spark job per poll: a batch's progress comes once the sink committed it.
        progress = query.lastProgress
        if not progress or not progress["sources"][0]["endOffset"]:
            return False
        end = end_offsets(progress).get(topic, {})
        return all(end.get(str(p), -1) >= off for p, off in hw.items())

    query = start_query()
    producer.start()
    try:
        wait_until(while_running(query, lambda: any(p["numInputRows"] for p in query.recentProgress)), 90,
                   "first rows in the parquet sink")
    finally:
        query.stop()
    assert producer.running, f"the producer should still be producing at the restart (error: {producer.error!r})"
    query = start_query()
    try:
        acked = producer.join()
        hw = brook.high_watermarks(topic)
        wait_until(while_running(query, lambda: through(hw)), 90,
                   lambda: f"the query through {hw}, last progress {query.lastProgress}")
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    rows = spark.read.parquet(out).collect()
    keys = [(r["partition"], r["offset"]) for r in rows]
    assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} duplicate rows"
    got = {(r["partition"], r["offset"]): bytes(r["value"]) for r in rows}
    assert got == acked, f"missing {len(set(acked) - set(got))}, unexpected {len(set(got) - set(acked))}"


def test_max_offsets_per_trigger_caps_every_micro_batch(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = "capped"
    brook.create_topic(topic, 2)
    acked = brook.produce(topic, [b"c%d" % i for i in range(1000)])
    df = stream(spark, brook, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="150")
    query = (df.select("partition", "offset").writeStream.format("memory").queryName("capped_rows")
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    assert query.awaitTermination(120), "AvailableNow query did not finish"
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes and max(sizes) <= 150, sizes
    assert sum(sizes) == 1000 and len(sizes) == 7, sizes
    rows = {(r["partition"], r["offset"]) for r in spark.sql("SELECT * FROM capped_rows").collect()}
    assert rows == set(acked)


def test_available_now_reads_what_was_committed_at_start_and_stops(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = "avail-now"
    brook.create_topic(topic, 2)
    brook.produce(topic, [b"a%d" % i for i in range(600)])
    before = brook.high_watermarks(topic)
    producer = BackgroundProducer(brook, topic, chunks=400, chunk=50, pause_s=0.05).start()
    wait_until(lambda: sum(brook.high_watermarks(topic).values()) > 600, 30, "background production")
    df = stream(spark, brook, subscribe=topic, startingOffsets="earliest")
    query = (df.select("partition", "offset").writeStream.format("memory").queryName("avail_rows")
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    finished = query.awaitTermination(120)
    still_producing = producer.running
    producer.join()
    assert finished, "AvailableNow query did not stop"
    assert still_producing, "producer stopped first: the test proves nothing"
    end = {int(p): off for p, off in end_offsets(query.lastProgress)[topic].items()}
    rows = [(r["partition"], r["offset"]) for r in spark.sql("SELECT * FROM avail_rows").collect()]
    assert len(rows) == len(set(rows)), "duplicates"
    assert set(rows) == {(p, o) for p, e in end.items() for o in range(e)}, "not exactly [0, end) per partition"
    assert all(end[p] >= before[p] for p in before), (end, before)
    after = brook.high_watermarks(topic)
    assert sum(after.values()) > sum(end.values()), "records committed later were read"


def test_min_partitions_yields_that_many_tasks(spark, brook) -> None:  # type: ignore[no-untyped-def]
    topic = "min-parts"
    brook.create_topic(topic, 2)
    acked = brook.produce(topic, [b"m%d" % i for i in range(300)])
    df = (spark.read.format("brook").option("bootstrap.servers", brook.bootstrap).option("subscribe", topic)
          .option("minPartitions", "5").load())
    assert df.rdd.getNumPartitions() == 5
    rows = df.select("partition", "offset", "value").collect()
    assert {(r["partition"], r["offset"]): bytes(r["value"]) for r in rows} == acked
    assert len(rows) == len(acked)


def test_new_partitions_and_new_matching_topics_are_picked_up(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    brook.create_topic("grow-a", 1)
    expected = {("grow-a", p, o) for (p, o) in brook.produce("grow-a", [b"g%d" % i for i in range(50)])}
    df = stream(spark, brook, subscribePattern="grow-.*", startingOffsets="earliest")
    query = (df.select("topic", "partition", "offset").writeStream.format("memory").queryName("grow_rows")
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="300 milliseconds").start())

    def seen() -> set:
        return {(r["topic"], r["partition"], r["offset"]) for r in spark.sql("SELECT * FROM grow_rows").collect()}

    try:
        wait_until(while_running(query, lambda: seen() == expected), 60, lambda: f"first 50 rows, have {len(seen())}")
        brook.add_partitions("grow-a", 3)
        brook.create_topic("grow-b", 2)
        brook.create_topic("other-c", 1)  # does not match the pattern
        for p in (1, 2):
            expected |= {("grow-a", pp, o) for (pp, o) in brook.produce("grow-a", [b"n%d" % i for i in range(20)],
                                                                        partition=p)}
        expected |= {("grow-b", p, o) for (p, o) in brook.produce("grow-b", [b"b%d" % i for i in range(30)])}
        brook.produce("other-c", [b"x"])
        wait_until(while_running(query, lambda: seen() == expected), 60,
                   lambda: f"{len(expected)} rows; missing {sorted(expected - seen())[:5]}, extra {sorted(seen() - expected)[:5]}")
    finally:
        query.stop()
    assert query.exception() is None, query.exception()


def test_never_reads_above_the_high_watermark(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from client.cluster import ClusterClient
    from client.types import TopicPartition

    topic = "hw-bound"
    brook.create_topic(topic, 1, rf=3)
    brook.produce(topic, [b"c%d" % i for i in range(100)])
    tp = TopicPartition(topic, 0)
    with ClusterClient(brook.bootstrap) as client:
        part = client.metadata([topic], refresh=True).topics[topic].partitions[0]
        active = brook.cluster.describe_cluster().active_controller_id
        follower = next(r for r in part.replicas if r != part.leader and r != active)
        # Made before the pause: its metadata is cached, so no request goes to the hung node.
        producer = brook.producer(acks=1, enable_idempotence=False)
        producer.partitions_for(topic)
        brook.cluster.pause_node(follower)
        try:
            # acks=1: the leader appends, but the HW cannot pass what the paused ISR member has.
            for i in range(50):
                producer.send(topic, b"u%d" % i, partition=0)
            producer.flush(timeout=30)
            res = wait_until(lambda: (r := client.fetch(tp, 0, 1 << 20)).log_end_offset == 150 and r, 20,
                             "leader LEO 150")
            assert res.high_watermark == 100, f"precondition: HW {res.high_watermark} should stay 100"
            # A hung node costs a metadata request its whole timeout: keep that short.
            batch = (spark.read.format("brook").option("bootstrap.servers", brook.bootstrap)
                     .option("request.timeout.ms", "3000").option("subscribe", topic).load()
                     .select("offset").collect())
            query = (stream(spark, brook, subscribe=topic, startingOffsets="earliest", **{"request.timeout.ms": "3000"})
                     .select("offset")
                     .writeStream.format("memory").queryName("hw_rows")
                     .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
            assert query.awaitTermination(60)
            streamed = spark.sql("SELECT offset FROM hw_rows").collect()
            hw_after = client.fetch(tp, 0, 1024).high_watermark
        finally:
            brook.cluster.resume_node(follower)
            producer.close(timeout=10)
    assert hw_after == 100, f"HW moved during the test ({hw_after}); the check below would prove nothing"
    assert sorted(r["offset"] for r in batch) == list(range(100))
    assert sorted(r["offset"] for r in streamed) == list(range(100))
    wait_until(lambda: brook.high_watermarks(topic)[0] == 150, 60, "HW to reach 150 after resume")
    again = spark.read.format("brook").option("bootstrap.servers", brook.bootstrap).option("subscribe", topic).load()
    assert again.count() == 150


def test_starting_offsets_by_timestamp_and_ending_offsets(spark, brook) -> None:  # type: ignore[no-untyped-def]
    topic = "by-time"
    brook.create_topic(topic, 1)
    base_ms = 1_700_000_000_000
    with brook.producer() as p:
        futures = [p.send(topic, b"t%d" % i, partition=0, timestamp=base_ms + i * 1000) for i in range(100)]
        p.flush(timeout=30)
        assert [f.result(timeout=30).offset for f in futures] == list(range(100))

    def read(**options: str) -> list[int]:
        reader = spark.read.format("brook").option("bootstrap.servers", brook.bootstrap).option("subscribe", topic)
        for k, v in options.items():
            reader = reader.option(k, v)
        return sorted(r["offset"] for r in reader.load().select("offset").collect())

    # The first record with timestamp >= base + 40.5 s is offset 41.
    by_ts = json.dumps({topic: {"0": base_ms + 40_500}})
    assert read(startingOffsetsByTimestamp=by_ts, endingOffsets=json.dumps({topic: {"0": 60}})) == list(range(41, 60))
    assert read(startingTimestamp=str(base_ms + 98_000)) == [98, 99]
    with pytest.raises(Exception) as info:
        read(startingTimestamp=str(base_ms + 500_000))
    assert "startingOffsetsByTimestampStrategy" in str(info.value), str(info.value)[:2000]
    assert read(startingTimestamp=str(base_ms + 500_000), startingOffsetsByTimestampStrategy="latest") == []


def test_assign_with_per_partition_offsets(spark, brook) -> None:  # type: ignore[no-untyped-def]
    topic = "assigned"
    brook.create_topic(topic, 3)
    for p in range(3):
        brook.produce(topic, [b"a%d" % i for i in range(30)], partition=p)
    size_1 = 30
    rows = (spark.read.format("brook").option("bootstrap.servers", brook.bootstrap)
            .option("assign", json.dumps({topic: [1]})).option("startingOffsets", json.dumps({topic: {"1": 5}}))
            .load().select("partition", "offset").collect())
    assert sorted((r["partition"], r["offset"]) for r in rows) == [(1, o) for o in range(5, size_1)]
    # With subscribe, per-partition JSON must name every partition read.
    with pytest.raises(Exception) as info:
        (spark.read.format("brook").option("bootstrap.servers", brook.bootstrap).option("subscribe", topic)
         .option("startingOffsets", json.dumps({topic: {"0": -2}})).load().count())
    assert "startingOffsets" in str(info.value) and "every partition" in str(info.value), str(info.value)[:2000]
