"""Records written by Kafka's own clients over the Kafka listener are read by Brook's Spark source, and the reverse."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_spark_reads_what_librdkafka_wrote_and_kafka_python_reads_what_spark_wrote(spark, brook) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka import Producer
    from kafka import KafkaConsumer, TopicPartition

    topic, back_topic = "kafka-interop-in", "kafka-interop-out"
    brook.create_topic(topic, 2)
    brook.create_topic(back_topic, 1)
    kafka_bootstrap = brook.cluster.kafka_bootstrap_servers
    p = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all", "enable.idempotence": True,
                  "compression.type": "zstd", "linger.ms": 5})
    for i in range(300):
        p.produce(topic, f"v{i}".encode(), key=f"k{i % 7}".encode(), headers=[("i", str(i).encode())],
                  partition=i % 2)
    assert p.flush(60) == 0

    rows = (spark.read.format("brook").option("bootstrap.servers", brook.bootstrap).option("subscribe", topic)
            .option("includeHeaders", "true").load().collect())
    got = sorted((bytes(r["key"]).decode(), bytes(r["value"]).decode(), [(h["key"], bytes(h["value"]))
                                                                         for h in r["headers"]]) for r in rows)
    assert got == sorted((f"k{i % 7}", f"v{i}", [("i", str(i).encode())]) for i in range(300))

    df = spark.createDataFrame([(f"s{i}".encode(), f"spark-{i}") for i in range(100)], "key binary, value string")
    df.write.format("brook").option("bootstrap.servers", brook.bootstrap).option("topic", back_topic) \
        .mode("append").save()
    c = KafkaConsumer(bootstrap_servers=kafka_bootstrap.split(","), enable_auto_commit=False,
                      consumer_timeout_ms=20_000)
    tp = TopicPartition(back_topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    seen = []
    for m in c:
        seen.append((m.key, m.value.decode()))
        if len(seen) == 100:
            break
    c.close()
    assert sorted(seen) == sorted((f"s{i}".encode(), f"spark-{i}") for i in range(100))
