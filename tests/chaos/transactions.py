"""``make chaos-txn``: Kafka transactions under faults, checked for atomicity and exactly-once visibility.

A 3-node cluster, a topic of 3 partitions (RF 3, ``min.insync.replicas`` 2). One librdkafka (confluent-kafka)
transactional producer writes transactions of ``--per-txn`` records over the three partitions, back to back,
aborting every fifth (after flushing it, so its records are in the logs). Meanwhile a seeded nemesis SIGKILLs
(then restarts) or SIGSTOPs (then SIGCONTs) a random broker every 5-9 s: the transaction coordinator, the
group and partition leaders all move. Each transaction's outcome is what the producer was told: committed,
aborted, or unknown (a commit that failed with an error that does not say how it ended; the producer is then
made anew, which fences the old one and aborts what it left open).

Afterwards a read_committed consumer reads every partition, and the run fails (exit 1) on any violation:
a committed transaction not read whole, or read twice; an aborted transaction with any record read; a
transaction of unknown outcome read in part. Liveness: the longest stretch without a commit is printed, and
must stay under ``--commit-gap-bound`` seconds.

    python -m tests.chaos.transactions --duration 120 --seed 7
"""

from __future__ import annotations

import argparse
import collections
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from client.admin import Admin, NewTopic
from deploy.local.cluster import LocalCluster

TOPIC, PARTITIONS = "txn-chaos", 3
PARTITION_EOF = -191  # librdkafka's _PARTITION_EOF


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.transactions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--per-txn", type=int, default=10, help="records a transaction")
    parser.add_argument("--commit-gap-bound", type=float, default=60.0,
                        help="longest stretch without a commit allowed (liveness), seconds")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="brook-txn-chaos-"))
    with LocalCluster(base, nodes=3) as cluster:
        conf = cluster.kafka_client_config()
        with Admin(cluster.bootstrap_servers, request_timeout_ms=20_000) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
        writer = Writer(conf, args.per_txn)
        writer.start()
        started = time.monotonic()  # the fault times printed count from here
        faults = nemesis(cluster, rng, args.duration)
        writer.stop()
        return check(conf, writer, faults, args, started)


class Writer(threading.Thread):
    """The transactional producer's loop; ``status`` maps each transaction to what the producer was told."""

    def __init__(self, conf: dict[str, str], per_txn: int) -> None:
        super().__init__(name="txn-writer", daemon=True)
        self.conf, self.per_txn = conf, per_txn
        self.status: dict[int, str] = {}
        self.commits: list[float] = []
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()
        self.join(300)

    def _producer(self) -> Any:
        from confluent_kafka import KafkaException, Producer

        while True:
            try:
                p = Producer({**self.conf, "transactional.id": "txn-chaos", "transaction.timeout.ms": "20000"})
                p.init_transactions(60)
                return p
            except KafkaException as exc:
                print(f"init_transactions failed, again: {exc}", flush=True)
                if self._stopping.wait(1):
                    raise

    def run(self) -> None:
        from confluent_kafka import KafkaException

        p = self._producer()
        i = 0
        while not self._stopping.is_set():
            i += 1
            try:
                p.begin_transaction()
                for j in range(self.per_txn):
                    p.produce(TOPIC, value=f"t{i}-{j}".encode(), partition=j % PARTITIONS)
                if i % 5 == 0:
                    p.flush(30)
                    p.abort_transaction(60)
                    self.status[i] = "aborted"
                else:
                    p.commit_transaction(60)
                    self.status[i] = "committed"
                    self.commits.append(time.monotonic())
            except KafkaException as exc:
                err = exc.args[0]
                self.status[i] = "unknown"
                print(f"transaction {i}: {err.str()[:160]} (fatal {err.fatal()}, abortable {err.txn_requires_abort()})",
                      flush=True)
                if err.txn_requires_abort():
                    try:
                        p.abort_transaction(60)
                        self.status[i] = "aborted"
                        continue
                    except KafkaException as again:
                        print(f"abort failed: {again}", flush=True)
                try:
                    p = self._producer()  # fences the old producer; what it left open is aborted
                except KafkaException:
                    return


def nemesis(cluster: LocalCluster, rng: random.Random, duration: float) -> int:
    started, faults = time.monotonic(), 0
    while time.monotonic() - started < duration:
        time.sleep(rng.uniform(5, 9))
        victim, kind = rng.choice(cluster.broker_ids), rng.choice(["kill", "stop"])
        print(f"{time.monotonic() - started:6.1f}s: {kind} node {victim}", flush=True)
        faults += 1
        if kind == "kill":
            cluster.kill_node(victim)
            time.sleep(4)
            cluster.start_node(victim)
        else:
            cluster.kill_node(victim, signal.SIGSTOP)
            time.sleep(4)
            cluster.resume_node(victim)
    return faults


def check(conf: dict[str, str], writer: Writer, faults: int, args: argparse.Namespace, started: float) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conf, "group.id": "txn-chaos-check", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    seen: collections.Counter[str] = collections.Counter()
    at_end: set[int] = set()
    deadline = time.monotonic() + 180
    try:
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == PARTITION_EOF:
                    at_end.add(m.partition())
                continue
            at_end.discard(m.partition())
            seen[m.value().decode()] += 1
    finally:
        consumer.close()
    by_txn = collections.Counter(int(v.split("-")[0][1:]) for v in seen)
    violations = []
    for i, outcome in writer.status.items():
        n = by_txn.get(i, 0)
        if (outcome == "committed" and n != args.per_txn) or (outcome == "aborted" and n) or \
                (outcome == "unknown" and n not in (0, args.per_txn)):
            violations.append(f"transaction {i} {outcome}: {n} of {args.per_txn} records read")
    violations += [f"{value} read {count} times" for value, count in seen.items() if count > 1]
    if len(at_end) < PARTITIONS:
        violations.append(f"the read-back did not reach the end of partitions {set(range(PARTITIONS)) - at_end}")
    gaps = [(b - a, a - started) for a, b in zip(writer.commits, writer.commits[1:], strict=False)]
    gap, gap_from = max(gaps, default=(float("inf"), 0.0))
    if gap > args.commit_gap_bound:
        violations.append(f"{gap:.1f} s without a commit (bound {args.commit_gap_bound:g} s)")
    outcomes = collections.Counter(writer.status.values())
    print(f"txn-chaos: seed={args.seed} duration={args.duration:g}s faults={faults} transactions={len(writer.status)} "
          f"committed={outcomes['committed']} aborted={outcomes['aborted']} unknown={outcomes['unknown']} "
          f"records_read={sum(seen.values())} max_commit_gap={gap:.1f}s (from {gap_from:.1f}s) "
          f"violations={len(violations)} "
          f"VERDICT={'PASS' if not violations else 'FAIL'}", flush=True)
    for v in violations[:20]:
        print(f"  {v}", flush=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
