"""Producers, a consumer and a liveness probe that record everything they do in a history file.

History: JSON lines, one event each, written under a lock as they happen (so a crashed
run still leaves what it saw):

    {"e": "send", "id": "w0.1:17", "p": 2}                  a send attempt
    {"e": "ack",  "id": "w0.1:17", "p": 2, "o": 133}        acknowledged (acks=all) at offset 133
    {"e": "fail", "id": "w0.1:17", "p": 2, "err": "..."}    failed: it may or may not be in the log
    {"e": "consume", "p": 2, "recs": [[133, "w0.1:17"], ...]}
    {"e": "schedule", ...} / {"e": "fault", ...} / {"e": "heal", ...} / {"e": "recovered", "s": 1.2}
    {"e": "final", "recovery_s": 0.1}                        from the run and the nemesis

A record's value is its id, ``<writer>.<incarnation>:<seq>``; a writer that has to replace
its producer (fatal error) starts a new incarnation, i.e. a new producer id.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from client import errors
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition

log = logging.getLogger(__name__)

OUTSTANDING_MAX = 2000  # unacknowledged sends per writer before it waits
CONSUME_POLL_MS = 500
PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable_idempotence": True,
    "linger_ms": 5,
    "request_timeout_ms": 5000,
    "delivery_timeout_ms": 30000,
    "retry_backoff_ms": 100,
    "max_block_ms": 10000,
}


class History:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", buffering=1 << 16)
        self._lock = threading.Lock()
        self.acked = 0

    def record(self, **event: Any) -> None:
        event.setdefault("ts", round(time.time(), 3))
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            if event["e"] == "ack":
                self.acked += 1
            self._file.write(line)

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def load_history(path: Path) -> list[dict[str, Any]]:
    events = []
    with path.open() as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a torn last line from a crash
    return events


class _Worker(threading.Thread):
    """A workload thread whose unexpected death is reported, not silently shrinking the load."""

    crashed: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except Exception as exc:  # a harness bug: the run must not pass on a smaller workload
            log.exception("%s crashed", self.name)
            self.crashed = exc

    def work(self) -> None:
        raise NotImplementedError


class Writer(_Worker):
    """One idempotent acks=all producer writing ``rate`` records/s round-robin over the partitions."""

    def __init__(self, name: str, bootstrap: str, topic: str, partitions: int, rate: float, history: History,
                 stop: threading.Event, delivery_timeout_ms: int = PRODUCER_CONFIG["delivery_timeout_ms"],
                 security: Mapping[str, str] | None = None) -> None:
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.security = dict(security or {})
        self.writer = name
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.interval_s = 1.0 / rate
        self.history = history
        self.stop_event = stop
        self.delivery_timeout_ms = delivery_timeout_ms
        self.incarnation = 0
        self.outstanding = 0
        self._cond = threading.Condition()
        self.producer: Producer | None = None

    def _done(self, record_id: str, partition: int) -> Any:
        def callback(md: Any, err: BaseException | None) -> None:
            if err is None:
                self.history.record(e="ack", id=record_id, p=partition, o=md.offset)
            else:
                self.history.record(e="fail", id=record_id, p=partition, err=repr(err)[:200])
            with self._cond:
                self.outstanding -= 1
                self._cond.notify_all()
        return callback

    def work(self) -> None:
        seq = 0
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            if self.producer is None:
                self.incarnation += 1
                self.producer = Producer(bootstrap_servers=self.bootstrap, client_id=self.writer,
                                         **{**PRODUCER_CONFIG, "delivery_timeout_ms": self.delivery_timeout_ms},
                                         **self.security)
                seq = 0
            with self._cond:
                while self.outstanding >= OUTSTANDING_MAX and not self.stop_event.is_set():
                    self._cond.wait(0.5)
            partition = seq % self.partitions
            record_id = f"{self.writer}.{self.incarnation}:{seq}"
            self.history.record(e="send", id=record_id, p=partition)
            with self._cond:
                self.outstanding += 1
            try:
                self.producer.send(self.topic, record_id.encode(), partition=partition,
                                   on_delivery=self._done(record_id, partition))
            except errors.BrookError as exc:
                # Not queued (metadata wait timed out, producer fenced/closed): it is not in the log.
                self.history.record(e="fail", id=record_id, p=partition, err=f"not queued: {exc!r}"[:200])
                with self._cond:
                    self.outstanding -= 1
                if isinstance(exc, errors.ProducerClosedError):
                    self._replace_producer()
            seq += 1
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stop_event.wait(delay)
            else:
                next_at = time.monotonic()  # fell behind (blocked send): do not burst to catch up
        self._close_producer(timeout_s=60.0)

    def _replace_producer(self) -> None:
        log.warning("%s: producer failed, starting incarnation %d", self.writer, self.incarnation + 1)
        self._close_producer(timeout_s=5.0)

    def _close_producer(self, timeout_s: float) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout=timeout_s)
            except errors.BrookError as exc:
                log.warning("%s: close failed: %r", self.writer, exc)
            self.producer = None


class Reader(_Worker):
    """A consumer on every partition from the beginning; records every record it is handed."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, history: History,
                 stop: threading.Event, security: Mapping[str, str] | None = None) -> None:
        super().__init__(name="chaos-reader", daemon=True)
        self.security = dict(security or {})
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.stop_event = stop
        self.errors = 0

    def work(self) -> None:
        consumer = Consumer(bootstrap_servers=self.bootstrap, auto_offset_reset="earliest",
                            request_timeout_ms=5000, fetch_max_wait_ms=200, **self.security)
        consumer.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
        try:
            while not self.stop_event.is_set():
                try:
                    polled = consumer.poll(timeout_ms=CONSUME_POLL_MS)
                except errors.BrookError as exc:
                    self.errors += 1
                    log.info("reader: poll failed (%r), retrying", exc)
                    self.stop_event.wait(0.5)
                    continue
                for tp, records in polled.items():
                    self.history.record(e="consume", p=tp.partition,
                                        recs=[[r.offset, (r.value or b"").decode(errors="replace")] for r in records])
        finally:
            consumer.close(autocommit=False, timeout_ms=5000)


class Probe:
    """Measures liveness: the time until an acks=all write is acknowledged on every partition."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, history: History,
                 security: Mapping[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.security = dict(security or {})
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.incarnation = 0
        self.seq = 0
        self.producer: Producer | None = None

    def _producer(self) -> Producer:
        if self.producer is None:
            self.incarnation += 1
            self.seq = 0
            self.producer = Producer(bootstrap_servers=self.bootstrap, client_id="probe", acks="all",
                                     enable_idempotence=True, linger_ms=0, request_timeout_ms=3000,
                                     delivery_timeout_ms=5000, retry_backoff_ms=100, max_block_ms=5000,
                                     **self.security)
        return self.producer

    def writable_within(self, bound_s: float) -> float | None:
        """Seconds until every partition acknowledged a probe write; None if not within ``bound_s``."""
        start = time.monotonic()
        pending = set(range(self.partitions))
        while pending and time.monotonic() - start < bound_s:
            futures = {}
            for p in sorted(pending):
                record_id = f"probe.{self.incarnation}:{self.seq}"
                try:
                    producer = self._producer()
                    record_id = f"probe.{self.incarnation}:{self.seq}"
                    self.seq += 1
                    self.history.record(e="send", id=record_id, p=p)
                    futures[p] = (record_id, producer.send(self.topic, record_id.encode(), partition=p))
                except errors.BrookError as exc:
                    self.history.record(e="fail", id=record_id, p=p, err=f"not queued: {exc!r}"[:200])
                    self._reset()
            for p, (record_id, future) in futures.items():
                try:
                    exc = future.exception(timeout=10.0)
                except errors.RequestTimedOutError as timed_out:  # still pending: outcome unknown
                    exc = timed_out
                if exc is None:
                    self.history.record(e="ack", id=record_id, p=p, o=future.result(timeout=0).offset)
                    pending.discard(p)
                else:
                    self.history.record(e="fail", id=record_id, p=p, err=repr(exc)[:200])
            if pending:
                time.sleep(0.2)
        return None if pending else time.monotonic() - start

    def _reset(self) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout=2.0)
            except errors.BrookError:
                pass
            self.producer = None

    def close(self) -> None:
        self._reset()
