"""Transaction throughput: how many transactions a second a local 3-node cluster commits, and how long a commit
takes, with librdkafka's transactional producer (confluent-kafka) on the Kafka listener.

``--producers`` producers (threads of one process, each its own librdkafka client and transactional id) each run
begin, ``--records`` records of 100 bytes spread over two partitions, commit, as fast as they can for
``--seconds``, on a topic of RF 3 (acks=all, as transactions need). Prints the committed transactions a second
and the commit_transaction() latency (p50, p99, max), then reads the topic read_committed from the start to check
that every committed record is there once. Figures depend on the machine and what else runs on it: nothing is
asserted on them.

    python -m deploy.local.txn_bench [--producers 8] [--seconds 20] [--records 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from client.admin import Admin, NewTopic
from deploy.local.cluster import LocalCluster

TOPIC = "bench-txn"
PARTITIONS = 6


def _producer(conf: dict[str, Any], index: int, records: int, until: float, latencies: list[float],
              committed: list[int], errors: list[str]) -> None:
    from confluent_kafka import KafkaException, Producer

    p = Producer({**conf, "transactional.id": f"bench-txn-{index}", "linger.ms": 1})
    try:
        p.init_transactions(30)
        n = 0
        while time.monotonic() < until:
            p.begin_transaction()
            for r in range(records):
                p.produce(TOPIC, b"%d-%d-%d" % (index, n, r) + b"x" * 90, partition=(index + r % 2) % PARTITIONS)
            started = time.perf_counter()
            p.commit_transaction(30)
            latencies.append(time.perf_counter() - started)
            n += 1
        committed.append(n * records)
    except KafkaException as exc:
        errors.append(f"producer {index}: {exc}")
    finally:
        p.flush(10)


def _read_committed(conf: dict[str, Any], expected: int, timeout_s: float = 120.0) -> tuple[int, int]:
    """(records read, distinct) from the start of every partition until ``expected`` or the deadline."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**conf, "group.id": "bench-txn-check", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    seen: set[bytes] = set()
    total = 0
    try:
        c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + timeout_s
        while total < expected and time.monotonic() < deadline:
            for m in c.consume(10_000, 0.5):
                if not m.error():
                    total += 1
                    seen.add(m.value())
    finally:
        c.close()
    return total, len(seen)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.txn_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--records", type=int, default=4, help="records per transaction")
    args = parser.parse_args(argv)
    if args.producers < 1 or args.seconds <= 0 or args.records < 1:
        parser.error("--producers and --records must be at least 1, --seconds positive")
    with tempfile.TemporaryDirectory(prefix="brook-txn-bench-") as tmp, \
            LocalCluster(Path(tmp) / "cluster", nodes=3) as cluster:
        with Admin(cluster.bootstrap_servers, request_timeout_ms=20_000) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
        conf = cluster.kafka_client_config()
        latencies: list[float] = []
        committed: list[int] = []
        errors: list[str] = []
        print(f"== {args.producers} transactional producers, {args.records} records a transaction over two "
              f"partitions, {args.seconds:g} s, RF 3", flush=True)
        started = time.monotonic()
        until = started + args.seconds
        threads = [threading.Thread(target=_producer, args=(conf, i, args.records, until, latencies, committed,
                                                            errors)) for i in range(args.producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        for e in errors:
            print(f"   {e}", file=sys.stderr)
        if not latencies:
            print("no transaction committed", file=sys.stderr)
            return 1
        print(f"   {len(latencies) / elapsed:,.0f} transactions/s committed ({len(latencies)} in {elapsed:.1f} s); "
              f"commit_transaction() p50 {_quantile(latencies, 0.5) * 1000:.1f} ms, "
              f"p99 {_quantile(latencies, 0.99) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms", flush=True)
        expected = sum(committed)
        total, distinct = _read_committed(conf, expected)
        print(f"   read_committed: {total} records read, {distinct} distinct, of {expected} committed", flush=True)
        return 0 if not errors and total == distinct == expected else 1


if __name__ == "__main__":
    sys.exit(main())
