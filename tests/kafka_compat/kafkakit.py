"""Helpers for driving unmodified Kafka clients (kcat, confluent-kafka, kafka-python, aiokafka)
against a LocalCluster's KAFKA listener (a unique module name: tests/ has no packages)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from client.admin import Admin
from client.consumer import Consumer as BrookConsumer
from client.types import ConsumerRecord, TopicPartition
from deploy.local.cluster import LocalCluster
from deploy.local.tools import debian_tool

KCAT_TIMEOUT_S = 60.0
# librdkafka settings that keep a stuck test short: a bounded delivery timeout, so a stuck produce fails the
# test instead of hanging it. The metadata refresh stays librdkafka's own (5 minutes): a 1 s refresh once hid
# that a consumer could not look up topics by id, and a client must find a moved leader from its errors.
RDKAFKA_TEST_DEFAULTS = {
    "message.timeout.ms": 60_000,
    "socket.timeout.ms": 10_000,
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kcat_binary() -> tuple[str | None, str]:
    """kcat from Debian's package (installed when root, as in CI); (None, why) otherwise."""
    return debian_tool("kcat", "kcat")


def kcat(binary: str, config: Mapping[str, Any], args: Iterable[str], *, stdin: str | None = None,
         timeout_s: float = KCAT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run kcat with librdkafka-style ``config`` (bootstrap.servers becomes -b, the rest -X k=v)."""
    cmd = [binary, "-b", str(config["bootstrap.servers"])]
    for k, v in config.items():
        if k != "bootstrap.servers":
            cmd += ["-X", f"{k}={v}"]
    cmd += list(args)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout_s)


def rdkafka_config(cluster_config: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {**cluster_config, **RDKAFKA_TEST_DEFAULTS, **extra}


def rdkafka_read_all(config: Mapping[str, Any], topic: str, partitions: int, expected: int,
                     timeout_s: float = 30.0) -> dict[int, list[Any]]:
    """confluent-kafka: read ``topic`` from the beginning (manual assignment) until ``expected``
    messages arrived; {partition: [Message, ...]}. Fails at the deadline saying what it saw."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as RdTopicPartition

    out: dict[int, list[Any]] = {p: [] for p in range(partitions)}
    consumer = Consumer(rdkafka_config(config, **{"group.id": unique("reader"), "enable.auto.commit": False}))
    try:
        consumer.assign([RdTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        total = 0
        errors: list[str] = []
        deadline = time.monotonic() + timeout_s
        while total < expected and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error():
                    errors.append(str(msg.error()))
                    continue
                out[msg.partition()].append(msg)
                total += 1
        assert total >= expected, f"confluent-kafka read {total} of {expected} records of {topic}; errors {errors[-5:]}"
        return out
    finally:
        consumer.close()


def brook_read_all(cluster: LocalCluster, topic: str, partitions: int, expected: int,
                   timeout_s: float = 30.0) -> dict[int, list[ConsumerRecord]]:
    """Brook's own client (gRPC BROKER listener): read ``topic`` from the beginning."""
    out: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
    kw = {k.replace(".", "_"): v for k, v in cluster.client_config.items()}
    with BrookConsumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest", **kw) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        total = 0
        deadline = time.monotonic() + timeout_s
        while total < expected and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition].extend(records)
                total += len(records)
    assert total >= expected, f"Brook's consumer read {total} of {expected} records of {topic}"
    return out


def partition_leader(admin: Admin, topic: str, partition: int = 0) -> int:
    return admin.describe_topics([topic])[topic].partitions[partition].leader


def in_sync(admin: Admin, topic: str, replicas: int) -> bool:
    """Every partition of ``topic`` has a leader and ``replicas`` in-sync replicas."""
    try:
        parts = admin.describe_topics([topic])[topic].partitions.values()
    except Exception:  # noqa: BLE001 - "not yet" while a node restarts
        return False
    return all(p.leader >= 0 and len(p.isr) == replicas for p in parts)


def brook_batch_headers(cluster: LocalCluster, topic: str, partitions: int, expected_records: int,
                        timeout_s: float = 30.0) -> dict[int, list[Any]]:
    """The stored RecordBatch headers of ``topic`` (read undecoded through Brook's client), to
    check what a Kafka producer really wrote: codec, producer id, sequences."""
    from storage.record_batch import iter_batches

    headers: dict[int, list[Any]] = {p: [] for p in range(partitions)}
    kw = {k.replace(".", "_"): v for k, v in cluster.client_config.items()}
    with BrookConsumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest", **kw) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        total = 0
        deadline = time.monotonic() + timeout_s
        while total < expected_records and time.monotonic() < deadline:
            for tp, raw in consumer.poll_batches(timeout_ms=500).items():
                for _pos, h in iter_batches(raw):
                    headers[tp.partition].append(h)
                    total += h.record_count
    assert total >= expected_records, f"read {total} of {expected_records} records of {topic} as batches"
    return headers

