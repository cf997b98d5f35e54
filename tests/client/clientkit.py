"""Helpers shared by the client tests (a uniquely named module: tests have no packages)."""

from __future__ import annotations

import time

from client.consumer import Consumer
from client.types import ConsumerRecord, TopicPartition

# Published by Kafka's own UtilsTest.testMurmur2 (and the Java implementation's users).
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"1": -1993445489,
    b"12": 126087238,
    b"123": -267702483,
    b"1234": -1614185708,
    b"12345": -1188365604,
}


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 20.0,
                **config: object) -> dict[int, list[ConsumerRecord]]:
    """Read a topic from the beginning until ``expected`` records arrived (or the deadline)."""
    out: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **config) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        total = 0
        while total < expected and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition].extend(records)
                total += len(records)
    return out
