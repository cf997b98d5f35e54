"""A consumer-group member as its own process, for the multi-process group tests.

Consumes with commit-after-process and commit-before-revoke: every polled record is
appended to ``<out>/<name>.processed`` (one ``partition offset value`` line, flushed),
then the positions are committed; the rebalance listener commits again before a
partition is revoked. The current assignment is written atomically to
``<out>/<name>.status.json`` whenever it changes. SIGTERM = clean close (commit + leave).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
from pathlib import Path

from client.consumer import Consumer, ConsumerRebalanceListener
from client.group_membership import CommitFailedError
from client.types import TopicPartition

stop = threading.Event()


def write_status(out: Path, name: str, consumer: Consumer, event: str) -> None:
    parts = sorted([tp.topic, tp.partition] for tp in consumer.assignment())
    tmp = out / f"{name}.status.json.tmp"
    tmp.write_text(json.dumps({"assignment": parts, "event": event, "pid": os.getpid()}))
    os.replace(tmp, out / f"{name}.status.json")


class CommitBeforeRevoke(ConsumerRebalanceListener):
    def __init__(self, out: Path, name: str) -> None:
        self.out, self.name = out, name
        self.consumer: Consumer | None = None

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        assert self.consumer is not None
        self.consumer.commit()  # the positions of everything processed so far

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        pass  # fenced: someone else owns them already; committing would be refused


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--session-ms", type=int, default=3000)
    ap.add_argument("--assignor", default="range")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    listener = CommitBeforeRevoke(args.out, args.name)
    consumer = Consumer(bootstrap_servers=args.bootstrap, group_id=args.group, auto_offset_reset="earliest",
                        enable_auto_commit=False, session_timeout_ms=args.session_ms,
                        heartbeat_interval_ms=max(100, args.session_ms // 6), max_poll_interval_ms=20_000,
                        partition_assignment_strategy=args.assignor, metadata_max_age_ms=2000,
                        client_id=args.name)
    listener.consumer = consumer
    consumer.subscribe([args.topic], listener=listener)
    last: list = []
    with (args.out / f"{args.name}.processed").open("a") as sink:
        while not stop.is_set():
            batch = consumer.poll(200)
            for recs in batch.values():
                for r in recs:
                    sink.write(f"{r.partition} {r.offset} {r.value.decode()}\n")
            sink.flush()
            if batch:
                try:
                    consumer.commit()
                except CommitFailedError as exc:
                    # Fenced (e.g. a stall past the session timeout): the partitions went to
                    # another member, which re-reads from the last good commit.
                    logging.warning("commit failed: %s", exc)
            now = sorted(consumer.assignment())
            if now != last:
                last = now
                write_status(args.out, args.name, consumer, "assigned")
        consumer.close()
    write_status_closed(args.out, args.name)


def write_status_closed(out: Path, name: str) -> None:
    tmp = out / f"{name}.status.json.tmp"
    tmp.write_text(json.dumps({"assignment": [], "event": "closed", "pid": os.getpid()}))
    os.replace(tmp, out / f"{name}.status.json")


if __name__ == "__main__":
    main()
