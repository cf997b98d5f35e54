"""Issue 13 (part 3) source options against a real cluster: unknown topics, subscribePattern,
ending timestamps, minOffsetsPerTrigger/maxTriggerDelay, progress (latestOffset) reporting."""

from __future__ import annotations

import json

import pytest
from waiting import wait_for, while_running

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def batch(spark, brook, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.read.format("brook").option("bootstrap.servers", brook.bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def stream(spark, brook, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("brook").option("bootstrap.servers", brook.bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _offsets(doc: object) -> dict[str, dict[str, int]]:
    return json.loads(doc) if isinstance(doc, str) else (doc or {})  # type: ignore[return-value]


def _total(doc: object) -> int:
    return sum(off for parts in _offsets(doc).values() for off in parts.values())


def test_unknown_topic_fails_clearly_in_batch_and_stream(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    brook.create_topic("known-2p", 2)
    # An unknown topic is retriable (it may be being created): each lookup retries 3 times first.
    quick = {"fetchOffset.retryIntervalMs": "50"}
    with pytest.raises(Exception) as info:
        batch(spark, brook, subscribe="known-2p,no-such-topic", **quick).collect()
    text = str(info.value)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in text and "'no-such-topic' does not exist" in text, text[:2000]
    with pytest.raises(Exception) as info:
        batch(spark, brook, assign=json.dumps({"known-2p": [0, 5]}), **quick).collect()
    text = str(info.value)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in text and "('known-2p', 5)" in text, text[:2000]

    query = (stream(spark, brook, subscribe="no-such-topic", **quick).writeStream.format("memory").queryName("unknown_rows")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        with pytest.raises(Exception) as info:
            query.awaitTermination(120)
        assert "'no-such-topic' does not exist" in str(info.value), str(info.value)[:2000]
    finally:
        query.stop()


def test_subscribe_pattern_matches_whole_names_and_skips_internal_topics(spark, brook) -> None:  # type: ignore[no-untyped-def]
    for name in ("pat-orders", "pat-orders-eu", "xpat-orders"):
        brook.create_topic(name, 1)
        brook.produce(name, [name.encode()])

    def topics(pattern: str) -> set[str]:
        return {r["topic"] for r in batch(spark, brook, subscribePattern=pattern).select("topic").collect()}

    assert topics("pat-orders") == {"pat-orders"}  # not a search: "xpat-orders" and "pat-orders-eu" do not match
    assert topics("pat-orders.*") == {"pat-orders", "pat-orders-eu"}
    assert topics("(?<p>x?)pat-orders") == {"pat-orders", "xpat-orders"}  # Java named-group syntax
    assert "__consumer_offsets" not in topics(".*")


def test_ending_timestamp_options(spark, brook) -> None:  # type: ignore[no-untyped-def]
    topic = "end-by-time"
    brook.create_topic(topic, 1)
    base_ms = 1_700_000_000_000
    with brook.producer() as p:
        futures = [p.send(topic, b"t%d" % i, partition=0, timestamp=base_ms + i * 1000) for i in range(100)]
        p.flush(timeout=30)
        assert [f.result(timeout=30).offset for f in futures] == list(range(100))

    def offsets(**options: str) -> list[int]:
        return sorted(r["offset"] for r in batch(spark, brook, subscribe=topic, **options).select("offset").collect())

    # The ending offset (exclusive) is the first record with timestamp >= the one given: offset 41.
    assert offsets(endingTimestamp=str(base_ms + 40_500)) == list(range(41))
    assert offsets(startingOffsetsByTimestamp=json.dumps({topic: {"0": base_ms + 10_000}}),
                   endingOffsetsByTimestamp=json.dumps({topic: {"0": base_ms + 20_000}})) == list(range(10, 20))
    # No record at or after it: the ending offset is the latest (Spark's rule for ending timestamps).
    assert offsets(endingTimestamp=str(base_ms + 10_000_000)) == list(range(100))
    # Spark's group options are accepted; the read is the same.
    assert offsets(endingTimestamp=str(base_ms + 5_000), **{"kafka.group.id": "reporting"}) == list(range(5))


def test_batch_offsets_the_cluster_cannot_serve_are_refused_by_the_driver(spark, brook) -> None:  # type: ignore[no-untyped-def]
    """The probe's reproduction: a starting offset after the ending one was reported as data loss (and
    skipped with failOnDataLoss=false), an ending offset past the high watermark waited out
    kafkaConsumer.pollTimeoutMs and ended in REQUEST_TIMED_OUT. Both are the query's own options."""
    topic = "sp"
    brook.create_topic(topic, 2)
    brook.produce(topic, [b"%d" % i for i in range(1, 11)], partition=0)
    brook.produce(topic, [b"%d" % i for i in range(11, 16)], partition=1)
    assert brook.high_watermarks(topic) == {0: 10, 1: 5}
    # A short poll timeout: the old code's task gave up on the ending offset 999 after it, not after 2 minutes.
    quick = {"kafkaConsumer.pollTimeoutMs": "3000"}

    def refused(**options: str) -> str:
        with pytest.raises(Exception) as info:
            batch(spark, brook, subscribe=topic, **quick, **options).select("partition", "offset").collect()
        return str(info.value)

    for fail in ("true", "false"):
        text = refused(startingOffsets=json.dumps({topic: {"0": 8, "1": 0}}),
                       endingOffsets=json.dumps({topic: {"0": 3, "1": 5}}), failOnDataLoss=fail)
        assert "beginning offset 8 is after the ending offset 3" in text, text[:3000]
        assert "topic 'sp' partition 0" in text and "went backwards" not in text, text[:3000]
        text = refused(startingOffsets=json.dumps({topic: {"0": 999, "1": 0}}), failOnDataLoss=fail)
        assert "beginning offset 999 is after the ending offset 10" in text, text[:3000]
        text = refused(endingOffsets=json.dumps({topic: {"0": 999, "1": 5}}), failOnDataLoss=fail)
        assert "option 'endingOffsets': ending offset 999 for topic 'sp' partition 0" in text, text[:3000]
        assert "high watermark 10" in text and "REQUEST_TIMED_OUT" not in text, text[:3000]
    # Within the committed records the same options read as asked.
    rows = batch(spark, brook, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 3, "1": 0}}),
                 endingOffsets=json.dumps({topic: {"0": 10, "1": -1}})).select("partition", "offset").collect()
    assert sorted((r["partition"], r["offset"]) for r in rows) == [(0, o) for o in range(3, 10)] + [
        (1, o) for o in range(5)]


def _row_counts(query) -> list[int]:  # type: ignore[no-untyped-def]
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def _wait_batches(query, counts: list[int], what: str) -> None:  # type: ignore[no-untyped-def]
    """Until the query's batches with rows had ``counts`` rows; fails at once if the query died."""
    wait_for(while_running(query, lambda: _row_counts(query) == counts), 120,
             lambda: f"{what}; saw {_row_counts(query)}")


def test_min_offsets_per_trigger_holds_small_batches_back(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = "min-trigger"
    brook.create_topic(topic, 2)
    brook.produce(topic, [b"a%d" % i for i in range(60)])
    df = stream(spark, brook, subscribe=topic, startingOffsets="earliest", minOffsetsPerTrigger="100",
                maxTriggerDelay="1h")
    # A trigger that runs no batch reports its progress once per this interval (10 s by default); the
    # query reads it when it starts.
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "500ms")
    try:
        query = (df.writeStream.format("memory").queryName("min_trigger_rows")
                 .trigger(processingTime="500 milliseconds").option("checkpointLocation", str(tmp_path / "cp")).start())
    finally:
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    try:
        # The first trigger runs at once (as Spark's: the delay counts from the last batch, none yet).
        _wait_batches(query, [60], "the first batch")
        brook.produce(topic, [b"b%d" % i for i in range(50)])
        # The source saw the 50 new records (progress reports its latest offset) and admitted no batch.
        wait_for(while_running(query, lambda: any(_total(p["sources"][0]["latestOffset"]) == 110
                                                 for p in query.recentProgress)),
                 120, "a progress report showing the 50 new records as latest")
        assert _row_counts(query) == [60], _row_counts(query)
        brook.produce(topic, [b"c%d" % i for i in range(50)])  # 100 new records now: enough
        _wait_batches(query, [60, 100], "the second batch")
    finally:
        query.stop()


def test_max_trigger_delay_releases_a_small_batch(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = "max-delay"
    brook.create_topic(topic, 1)
    brook.produce(topic, [b"a%d" % i for i in range(20)])
    df = stream(spark, brook, subscribe=topic, startingOffsets="earliest", minOffsetsPerTrigger="1000000",
                maxTriggerDelay="2s")
    query = (df.writeStream.format("memory").queryName("max_delay_rows").trigger(processingTime="500 milliseconds")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        _wait_batches(query, [20], "the first batch")
        brook.produce(topic, [b"b%d" % i for i in range(7)])
        _wait_batches(query, [20, 7], "the delayed batch of 7 (far below minOffsetsPerTrigger)")
    finally:
        query.stop()


def test_progress_reports_the_latest_offset_beyond_the_batch_end(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """sources[].latestOffset is the high watermark, so latestOffset - endOffset is how far behind each partition is."""
    topic = "behind"
    brook.create_topic(topic, 2)
    acked = brook.produce(topic, [b"x%d" % i for i in range(400)])
    hws = brook.high_watermarks(topic)
    df = stream(spark, brook, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="100")
    query = (df.writeStream.format("memory").queryName("behind_rows").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    assert query.awaitTermination(180), "AvailableNow query did not finish"
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    assert sum(p["numInputRows"] for p in progress) == len(acked)
    first = progress[0]["sources"][0]
    latest = {int(p): off for p, off in _offsets(first["latestOffset"])[topic].items()}
    end = {int(p): off for p, off in _offsets(first["endOffset"])[topic].items()}
    assert latest == hws, (latest, hws)
    behind = {p: latest[p] - end[p] for p in latest}
    assert sum(behind.values()) == len(acked) - 100, behind  # the first batch took 100 of 400
