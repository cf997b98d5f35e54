"""Writing to Brook from Spark (batch and streaming) and reading it back."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _read(spark, brook, topic: str, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.read.format("brook").option("bootstrap.servers", brook.bootstrap).option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_write_round_trip_with_headers_and_partitions(spark, brook) -> None:  # type: ignore[no-untyped-def]
    topic = "write-rt"
    brook.create_topic(topic, 3)
    rows = [
        (f"k{i}".encode() if i % 5 else None, f"value-{i}", [("n", str(i).encode()), ("e", None)] if i % 2 else None,
         i % 3)
        for i in range(500)
    ]
    df = spark.createDataFrame(
        rows, "key binary, value string, headers array<struct<key:string,value:binary>>, partition int")
    df.write.format("brook").option("bootstrap.servers", brook.bootstrap).option("topic", topic).mode("append").save()

    back = _read(spark, brook, topic, includeHeaders="true").collect()
    assert len(back) == 500
    got = (
        (r["key"] and bytes(r["key"]), bytes(r["value"]).decode(),
         None if r["headers"] is None else [(h["key"], h["value"] and bytes(h["value"])) for h in r["headers"]],
         r["partition"])
        for r in back
    )
    want = sorted(((k, v, h, p) for k, v, h, p in rows), key=repr)
    assert sorted(got, key=repr) == want
    # Within each Brook partition, the records of one Spark task keep the task's row order
    # (two tasks write concurrently, so only each task's own subsequence is ordered).
    half = df.rdd.glom().map(len).collect()
    assert len(half) == 2 and sum(half) == 500, half
    first_task = {f"value-{i}" for i in range(half[0])}
    for p in range(3):
        in_log = [bytes(r["value"]).decode() for r in sorted(back, key=lambda r: r["offset"]) if r["partition"] == p]
        for mine in (first_task, None):
            seq = [v for v in in_log if (v in first_task) == (mine is not None)]
            assert seq == sorted(seq, key=lambda v: int(v.split("-")[1])), (p, seq[:10])


def test_stream_write_copies_a_topic(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src, dst = "copy-src", "copy-dst"
    brook.create_topic(src, 2)
    brook.create_topic(dst, 2)
    acked = brook.produce(src, [b"s%d" % i for i in range(400)], keys=[b"k%d" % (i % 10) for i in range(400)])
    query = (
        spark.readStream.format("brook").option("bootstrap.servers", brook.bootstrap).option("subscribe", src)
        .option("startingOffsets", "earliest").load()
        .selectExpr("key", "value", "CAST(NULL AS STRING) AS topic")
        .writeStream.format("brook").option("bootstrap.servers", brook.bootstrap).option("topic", dst)
        .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start()
    )
    assert query.awaitTermination(120), "copy query did not finish"
    assert query.exception() is None, query.exception()
    copied = _read(spark, brook, dst).collect()
    assert sorted(bytes(r["value"]) for r in copied) == sorted(acked.values())
    # Same key -> same partition (the producer's murmur2 partitioner, as Kafka's).
    by_key: dict[bytes, set[int]] = {}
    for r in copied:
        by_key.setdefault(bytes(r["key"]), set()).add(r["partition"])
    assert all(len(parts) == 1 for parts in by_key.values()), by_key


def test_write_to_missing_topic_fails_the_job(spark, brook) -> None:  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception) as info:
        df.write.format("brook").option("bootstrap.servers", brook.bootstrap).option("topic", "no-such-topic") \
            .option("max.block.ms", "3000").option("delivery.timeout.ms", "3000").option("request.timeout.ms", "2000").mode("append").save()
    assert "no-such-topic" in str(info.value) or "UNKNOWN_TOPIC" in str(info.value), str(info.value)[:3000]


def test_offsets_removed_by_retention_fail_or_are_skipped(spark, brook) -> None:  # type: ignore[no-untyped-def]
    import time

    from client.cluster import ClusterClient
    from client.types import TopicPartition

    topic = "retention-loss"
    # By size: the oldest segments go and a tail stays (past retention.ms the whole log would go, as in Kafka).
    brook.create_topic(topic, 1, configs={"segment.bytes": "2048", "retention.bytes": "8192"})
    brook.produce(topic, [b"r" * 100 + b"%d" % i for i in range(300)], batch_size=1024)
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + 60
    with ClusterClient(brook.bootstrap) as client:
        while (earliest := client.list_offsets({tp: -2})[tp][0]) == 0:
            assert time.monotonic() < deadline, "retention never removed a segment"
            time.sleep(0.3)
    start = json.dumps({topic: {"0": 0}})
    with pytest.raises(Exception) as info:
        _read(spark, brook, topic, startingOffsets=start).count()
    assert "failOnDataLoss" in str(info.value), str(info.value)[:3000]
    rows = _read(spark, brook, topic, startingOffsets=start, failOnDataLoss="false").select("offset").collect()
    offsets = sorted(r["offset"] for r in rows)
    hw = brook.high_watermarks(topic)[0]
    assert hw == 300 and offsets and offsets[0] >= earliest, (offsets[:3], earliest)
    assert offsets == list(range(offsets[0], 300)), "not the contiguous tail from the new log start"
