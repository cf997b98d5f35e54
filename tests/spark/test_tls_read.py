"""The brook source over mTLS: Spark's Kafka-source security options reach every connection.

A real 3-node cluster with mTLS on every listener; the batch read and the streaming read
(driver offsets and executor fetches) pass ``kafka.security.protocol`` / ``kafka.ssl.*``
exactly as a job written for Spark's Kafka source would; without them the read fails.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from client.admin import Admin, NewTopic
from client.producer import Producer
from deploy.local.cluster import LocalCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "tls-events"
RECORDS = 300


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("spark-tls"), nodes=3, tls=True) as cluster:
        with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=cluster.security) as admin:
            admin.create_topics([NewTopic(TOPIC, 3, 3)])
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all",
                      **{k.replace(".", "_"): v for k, v in cluster.client_config.items()}) as producer:
            for i in range(RECORDS):
                producer.send(TOPIC, f"v{i}".encode(), key=f"k{i % 7}".encode())
            producer.flush(60)
        yield cluster


def _reader(spark, cluster: LocalCluster, *, secure: bool):  # type: ignore[no-untyped-def]
    reader = (spark.read.format("brook").option("kafka.bootstrap.servers", cluster.bootstrap_servers)
              .option("subscribe", TOPIC).option("request.timeout.ms", "2000"))
    if secure:
        for key, value in cluster.client_config.items():
            reader = reader.option(f"kafka.{key}", value)
    return reader


def test_batch_read_over_mtls(spark, tls_cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    rows = _reader(spark, tls_cluster, secure=True).load().selectExpr("CAST(value AS STRING) AS v").collect()
    assert sorted(r.v for r in rows) == sorted(f"v{i}" for i in range(RECORDS))


def test_streaming_read_over_mtls(spark, tls_cluster: LocalCluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    stream = (spark.readStream.format("brook").option("kafka.bootstrap.servers", tls_cluster.bootstrap_servers)
              .option("subscribe", TOPIC).option("startingOffsets", "earliest"))
    for key, value in tls_cluster.client_config.items():
        stream = stream.option(f"kafka.{key}", value)
    query = (stream.load().selectExpr("CAST(value AS STRING) AS v").writeStream.format("memory")
             .queryName("tls_stream").option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(300), "the AvailableNow query did not finish"
    finally:
        query.stop()
    assert spark.sql("SELECT COUNT(*) AS n FROM tls_stream").collect()[0].n == RECORDS


def test_read_without_security_options_fails(spark, tls_cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark wraps the Python error in its own
        _reader(spark, tls_cluster, secure=False).load().collect()
    text = str(info.value)
    assert "NETWORK_EXCEPTION" in text or "REQUEST_TIMED_OUT" in text or "UNAVAILABLE" in text, text[-2000:]
