"""confluent-kafka (librdkafka) producer and consumer throughput against a Kafka-protocol listener.

Used by ``make bench-client`` to put a client nobody here wrote, over Kafka's own protocol,
next to Brook's client over gRPC on the same cluster. Prints the same summary lines as
``brook perf`` (``N records sent, R records/sec (M MB/sec)``) so the figures line up.
"""

from __future__ import annotations

import os
import time
from typing import Any

from client.perf import PerfResult, pace

REPORT_EVERY_S = 5.0


def produce(config: dict[str, str], topic: str, num_records: int, record_size: int = 100, acks: str = "all",
            extra: dict[str, Any] | None = None, warmup_records: int | None = None) -> int:
    """Produce ``num_records`` as fast as acknowledgements come, after ``warmup_records`` (default: up to
    50,000, as ``brook perf produce``) that are not timed: producer id, metadata and connections first."""
    from confluent_kafka import Producer

    p = Producer({**config, "acks": acks, "linger.ms": 5, "batch.size": 1 << 20, "enable.idempotence": True,
                  "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20,
                  **(extra or {})})
    payload = os.urandom(record_size)
    failed = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    def send(n: int) -> None:
        for _ in range(n):
            while True:
                try:
                    p.produce(topic, payload, on_delivery=on_delivery)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    p.poll(0.01)
            p.poll(0)

    send(min(50_000, num_records) if warmup_records is None else warmup_records)
    if p.flush(120):
        print("confluent-kafka producer: the warm-up records were not delivered")
        return 1
    start = time.perf_counter()
    send(num_records)
    left = p.flush(120)
    elapsed = time.perf_counter() - start
    if left or failed[0]:
        print(f"confluent-kafka producer: {failed[0]} failed, {left} not delivered")
        return 1
    _summary("sent", num_records, record_size, elapsed)
    return 0


def produce_at_rate(config: dict[str, str], topic: str, num_records: int, rate: float, record_size: int = 100,
                    warmup_records: int = 5000) -> PerfResult | None:
    """Latency at a fixed rate (``rate`` records/s), acks=all, idempotent, librdkafka's own batching
    defaults (``linger.ms`` 5): each record's time from ``produce()`` to its acknowledgement as
    librdkafka measures it (``Message.latency()``), so a late ``poll()`` of ours does not count.
    Prints ``brook perf produce``'s summary line; None (and why, printed) when a record failed."""
    from confluent_kafka import Producer

    p = Producer({**config, "acks": "all", "enable.idempotence": True})
    payload = os.urandom(record_size)
    latencies_ms: list[float] = []
    failed = [0]
    keep = [False]  # the warm-up's latencies are not kept

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed[0] += 1
        elif keep[0]:
            latencies_ms.append(msg.latency() * 1000)

    interval = 1.0 / rate
    for measured, count in ((False, warmup_records), (True, num_records)):
        keep[0] = measured
        cpu_start = time.process_time()
        start = time.monotonic()
        for i in range(count):
            if i % 16 == 0:
                pace(start, i, interval)
            p.produce(topic, payload, on_delivery=on_delivery)
            p.poll(0)
        left = p.flush(120)
        elapsed = time.monotonic() - start
        if left or failed[0]:
            print(f"confluent-kafka producer: {failed[0]} failed, {left} not delivered")
            return None
    result = PerfResult(num_records, num_records * record_size, elapsed, latencies_ms, 0,
                        time.process_time() - cpu_start)
    print(f"{result.summary('sent')} [confluent-kafka {_version()}, Kafka listener]", flush=True)
    return result


def consume(config: dict[str, str], topic: str, num_records: int, record_size: int = 100) -> int:
    from confluent_kafka import Consumer, TopicPartition

    # fetch.queue.backoff.ms: librdkafka 2.x postpones a partition's next fetch by 1 s (its default)
    # whenever its local queue is past queued.min.messages, which a reader draining 10,000 at a time
    # keeps hitting: the figure was librdkafka's pause (~230k records/s), not the broker (~1M).
    c = Consumer({**config, "group.id": f"bench-{os.getpid()}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "fetch.max.bytes": 52_428_800,
                  "max.partition.fetch.bytes": 1_048_576, "queued.max.messages.kbytes": 262_144,
                  "fetch.queue.backoff.ms": 0})
    meta = c.list_topics(topic, timeout=30)
    partitions = [TopicPartition(topic, p, 0) for p in meta.topics[topic].partitions]
    c.assign(partitions)
    got = 0
    start = time.perf_counter()
    deadline = start + 600
    while got < num_records and time.perf_counter() < deadline:
        for m in c.consume(10_000, 1.0):
            if m.error() is None:
                got += 1
    elapsed = time.perf_counter() - start
    c.close()
    if got < num_records:
        print(f"confluent-kafka consumer: only {got} of {num_records} records within the deadline")
        return 1
    _summary("received", got, record_size, elapsed)
    return 0


def _summary(verb: str, n: int, record_size: int, elapsed: float) -> None:
    rate = n / elapsed if elapsed > 0 else 0.0
    print(f"{n} records {verb}, {rate:.1f} records/sec ({rate * record_size / 1e6:.2f} MB/sec) "
          f"[confluent-kafka {_version()}, Kafka listener]", flush=True)


def _version() -> str:
    import confluent_kafka

    return str(confluent_kafka.libversion()[0])
