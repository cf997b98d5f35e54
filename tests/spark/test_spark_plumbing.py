"""The data source inside Spark without a cluster: schema, and bad options fail at start."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_schema_is_the_kafka_source_schema(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.read.format("brook").option("bootstrap.servers", "127.0.0.1:1").option("subscribe", "t").load()
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
        ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
    ]
    with_headers = spark.readStream.format("brook").option("includeHeaders", "true").load()
    assert with_headers.schema.fields[-1].dataType.simpleString() == "array<struct<key:string,value:binary>>"


@pytest.mark.parametrize(
    ("opts", "named"),
    [
        ({"subscribe": "t"}, "bootstrap.servers"),
        ({"bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "assign": '{"t":[0]}'}, "subscribe/subscribePattern/assign"),
        ({"bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "endingOffsets": "latest"}, "endingOffsets"),
    ],
)
def test_bad_stream_option_fails_the_query_at_start(spark, tmp_path, opts, named) -> None:  # type: ignore[no-untyped-def]
    df = spark.readStream.format("brook").options(**opts).load()
    with pytest.raises(Exception) as info:
        q = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp")).start()
        try:
            q.awaitTermination(60)
        finally:
            q.stop()
    assert named in str(info.value), str(info.value)[:2000]


def test_bad_batch_option_fails_at_start(spark) -> None:  # type: ignore[no-untyped-def]
    df = (spark.read.format("brook").option("bootstrap.servers", "127.0.0.1:1").option("subscribe", "t")
          .option("startingOffsets", "latest").load())
    with pytest.raises(Exception) as info:
        df.count()
    assert "startingOffsets" in str(info.value), str(info.value)[:2000]


@pytest.mark.parametrize(
    ("select", "opts", "named"),
    [
        ("CAST(id AS STRING) AS key", {"topic": "t"}, "value"),
        ("id AS value", {"topic": "t"}, "value"),
        ("CAST(id AS STRING) AS value", {}, "topic"),
        ("CAST(id AS STRING) AS value|'x' AS partition", {"topic": "t"}, "partition"),
        ("CAST(id AS STRING) AS value", {"topic": "t", "acks": "1"}, "acks"),
    ],
)
def test_bad_write_fails_before_any_task(spark, select, opts, named) -> None:  # type: ignore[no-untyped-def]
    df = spark.range(3).selectExpr(*select.split("|"))
    with pytest.raises(Exception) as info:
        df.write.format("brook").option("bootstrap.servers", "127.0.0.1:1").options(**opts).mode("append").save()
    assert named in str(info.value), str(info.value)[:2000]
