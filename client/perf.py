"""Perf tools in the spirit of Kafka's producer/consumer perf tests (wired as `brook perf produce|consume`).

    python -m client.perf produce --bootstrap-servers 127.0.0.1:9092 --topic perf \
        --num-records 1000000 --record-size 100 --acks all --throughput -1
    python -m client.perf consume --bootstrap-servers 127.0.0.1:9092 --topic perf --num-records 1000000
    python -m client.perf end-to-end --bootstrap-servers 127.0.0.1:9092 --throughput 10000

A progress line goes to stderr every second; the summary goes to stdout. Produce
latency is send() -> acknowledgement, measured on a sample of records (at most
``LATENCY_SAMPLES_MAX``) so measuring does not cost per-record work.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import queue
import random
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from client import errors
from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.security import SecurityConfig, read_properties
from client.types import TopicPartition
from storage.perf import PerfArgumentParser
from storage.record_batch import iter_batches

_RECORD_VALUE = attrgetter("value")

LATENCY_SAMPLES_MAX = 50_000
DEFAULT_BOOTSTRAP = os.environ.get("BROOK_BOOTSTRAP_SERVERS", "127.0.0.1:9092")


def _percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, as Kafka's perf tools take it); NaN when empty."""
    if not values:
        return float("nan")
    data = sorted(values)
    return data[min(len(data) - 1, int(q * len(data)))]


@dataclass
class PerfResult:
    records: int
    bytes: int
    elapsed_s: float
    latencies_ms: list[float]
    errors: int = 0
    cpu_s: float = 0.0  # this process's CPU time (all threads): the client's own cost per record
    # Per acknowledged batch (produce): opened to last sent (linger.ms, then any wait for a request slot or
    # a retry), and last sent to acknowledged (the request's round trip), as Kafka's producer metrics
    # record-queue-time and request-latency split a record's latency.
    batch_wait_ms: list[float] = field(default_factory=list)
    round_trip_ms: list[float] = field(default_factory=list)

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / (1024 * 1024) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile(self, q: float) -> float:
        return _percentile(self.latencies_ms, q)

    def batch_line(self) -> str | None:
        """Where the producer's latency went, per batch; None without batch timings (consume)."""
        if not self.round_trip_ms:
            return None
        p = _percentile
        wait, trip = self.batch_wait_ms, self.round_trip_ms
        return (f"{len(trip)} batches: opened to sent (linger.ms and waits in the producer) p50 {p(wait, 0.5):.2f} "
                f"ms, p99 {p(wait, 0.99):.2f} ms; sent to acknowledged (the request's round trip) p50 "
                f"{p(trip, 0.5):.2f} ms, p99 {p(trip, 0.99):.2f} ms")

    def summary(self, what: str) -> str:
        lat = self.latencies_ms
        avg = sum(lat) / len(lat) if lat else float("nan")
        return (f"{self.records} records {what}, {self.records_per_s:.1f} records/sec "
                f"({self.mb_per_s:.2f} MB/sec), {avg:.2f} ms avg latency, "
                f"{max(lat) if lat else float('nan'):.2f} ms max latency, "
                f"{self.percentile(0.5):.2f} ms 50th, {self.percentile(0.99):.2f} ms 99th, "
                f"{self.percentile(0.999):.2f} ms 99.9th, {self.errors} errors (sampled), {self.elapsed_s:.2f} s, "
                f"client CPU {self.cpu_s:.2f} s ({self.cpu_s / max(1, self.records) * 1e6:.2f} us/record)")


def _config_pairs(items: Sequence[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"config {item!r} is not key=value")
        out[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    return out


class Progress:
    """One stderr line per interval: rate since the last line and the running total."""

    def __init__(self, what: str, interval_s: float = 1.0, stream: Any = sys.stderr) -> None:
        self.what = what
        self.interval_s = interval_s
        self.stream = stream
        self.start = self.last = time.monotonic()
        self.last_count = 0

    def maybe_print(self, count: int, extra: str = "") -> None:
        now = time.monotonic()
        if now - self.last < self.interval_s:
            return
        rate = (count - self.last_count) / (now - self.last)
        self.stream.write(f"{count} records {self.what}, {rate:.1f} records/sec{extra}\n")
        self.stream.flush()
        self.last, self.last_count = now, count


def _security_pairs(command_config: str | None) -> dict[str, Any]:
    """Client security (BROOK_SECURITY_PROTOCOL, BROOK_SSL_*, then the --command-config file) as config kwargs."""
    sec = SecurityConfig.from_env()
    if command_config:
        sec = sec.merged(read_properties(command_config))
    return {k.replace(".", "_"): v for k, v in sec.to_config().items()}


def ensure_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int,
                 security: SecurityConfig | None = None) -> None:
    with Admin(bootstrap, security=security) as admin:
        try:
            admin.create_topics([NewTopic(topic, partitions, replication_factor)])
        except errors.TopicAlreadyExistsError:
            admin.wait_for_topics([topic])


def pace(start: float, sent: int, interval: float) -> None:
    """Hold a fixed send rate: sleep while ``sent`` records are ahead of ``start`` + sent x interval
    (checked every 16 records by the callers, so the rate costs no per-record work)."""
    if ahead := seconds_ahead(start, sent, interval):
        time.sleep(ahead)


def seconds_ahead(start: float, sent: int, interval: float) -> float:
    """How long a sender of ``sent`` records since ``start`` at one per ``interval`` should wait
    (0 below a millisecond: not worth a sleep). ``pace``, and asyncio callers with their own sleep."""
    ahead = start + sent * interval - time.monotonic()
    return ahead if ahead > 0.001 else 0.0


def freeze_startup_objects() -> None:
    """Take what this process made so far (modules, gRPC and protobuf tables, the client) out of
    the garbage collector's sight before measuring, as a latency-sensitive application would
    (README, Client performance): a full collection then scans only what came after, instead of
    stalling the process for 25-70 ms in the middle of the figures."""
    gc.collect()
    gc.freeze()


def _settle(futures: list[Any]) -> int:
    """Drop the completed futures from ``futures`` (in place); how many of them failed."""
    pending, failed = [], 0
    for f in futures:
        if not f.done():
            pending.append(f)
        elif f.exception(timeout=0) is not None:
            failed += 1
    futures[:] = pending
    return failed


KEYS_HELP = ("records take N keys in turn, spread over the partitions by murmur2 (default 0: keyless, one "
             "partition at a time by the sticky partitioner, as Kafka's producer-perf-test)")


def perf_keys(text: str) -> tuple[bytes, ...]:
    """``--keys N`` (an argparse type): the keys records take in turn (none: keyless records, the
    sticky partitioner, as Kafka's producer-perf-test sends); murmur2 spreads them over the partitions."""
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (keyless) or more, got {text!r}")
    return tuple(b"key-%d" % i for i in range(count))


def key_at(keys: Sequence[bytes], i: int) -> bytes | None:
    """The key of the ``i``-th record (None: keyless)."""
    return keys[i % len(keys)] if keys else None


def run_produce(producer: Producer, topic: str, num_records: int, record_size: int, throughput: float,
                progress: Progress | None = None, *, warmup_records: int = 0,
                on_measuring: Callable[[], None] | None = None, keys: Sequence[bytes] = ()) -> PerfResult:
    """``on_measuring`` is called once the warm-up is acknowledged, just before the measured sends."""
    payload = bytes(random.Random(0).choices(range(65, 91), k=record_size))  # Kafka's A-Z payload
    if warmup_records > 0:
        # Connections, producer id, leaders and followers settle before the clock starts.
        for i in range(warmup_records):
            producer.send(topic, payload, key_at(keys, i))
        producer.flush()
    if on_measuring is not None:
        on_measuring()
    freeze_startup_objects()
    sample_every = max(1, num_records // LATENCY_SAMPLES_MAX)
    # Kept as numbers and one outcome per batch, not a (time, future) pair per record: 50,000 live futures
    # made each full collection of the measuring process scan them (7 ms pauses every few seconds, a tail
    # the tool itself caused), as Kafka's perf test keeps its latencies in an int array.
    sent_at = array("d")
    outcome_of = array("l")
    outcomes: list[Any] = []
    send = producer.send
    now = time.monotonic
    cpu_start = time.process_time()
    start = now()
    interval = 1.0 / throughput if throughput > 0 else 0.0
    for i in range(num_records):
        if interval and i % 16 == 0:
            pace(start, i, interval)
        key = key_at(keys, i)
        if i % sample_every == 0:
            t = now()
            outcome = send(topic, payload, key).batch_outcome
            if not outcomes or outcomes[-1] is not outcome:
                outcomes.append(outcome)
            sent_at.append(t)
            outcome_of.append(len(outcomes) - 1)
            if progress is not None:
                progress.maybe_print(i)
        else:
            send(topic, payload, key)
    producer.flush()
    elapsed = now() - start
    latencies = []
    failures = 0
    for sent, index in zip(sent_at, outcome_of, strict=True):
        outcome = outcomes[index]
        if outcome.error is not None:
            if failures == 0:
                sys.stderr.write(f"first failed send: {outcome.error!r}\n")
            failures += 1
            continue
        latencies.append((outcome.completed_at - sent) * 1000)
    done = [o for o in outcomes if o.error is None and o.sent_at]
    return PerfResult(num_records, num_records * record_size, elapsed, latencies, failures,
                      time.process_time() - cpu_start,
                      batch_wait_ms=[(o.sent_at - o.opened_at) * 1000 for o in done],
                      round_trip_ms=[(o.completed_at - o.sent_at) * 1000 for o in done])


def produce_main(argv: Sequence[str] | None = None, *, on_measuring: Callable[[], None] | None = None) -> int:
    parser = PerfArgumentParser(prog="brook perf produce", description="Producer throughput and latency", examples=(
        "brook perf produce -t perf -n 1000000 --record-size 100 -p 6 -r 3",
        "brook perf produce -t perf -n 100000 --throughput 10000 --acks all --linger-ms 2",
        "brook perf produce -t perf -n 100000 --compression zstd --producer-config batch_size=65536"))
    # The short and long names of the other `brook` commands (-b, -t, -n, -p, -r) work here too.
    parser.add_argument("--bootstrap", "-b", "--bootstrap-servers", dest="bootstrap_servers", default=DEFAULT_BOOTSTRAP)
    parser.add_argument("--topic", "-t", default="brook-perf")
    parser.add_argument("--num-records", "-n", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--throughput", type=float, default=-1, help="records/s cap; -1 = unlimited")
    parser.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
    parser.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    parser.add_argument("--partitions", "-p", type=int, default=6, help="partitions when the topic is created")
    parser.add_argument("--replication-factor", "-r", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=512 * 1024)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--warmup-records", type=int, default=0,
                        help="records sent (and acknowledged) before measuring starts")
    parser.add_argument("--keys", type=perf_keys, default=(), metavar="N", help=KEYS_HELP)
    parser.add_argument("--producer-config", nargs="*", metavar="KEY=VALUE", help="any other producer config")
    parser.add_argument("--command-config", default=None, help="client properties file (security.protocol, ssl.*)")
    args = parser.parse_args(argv)
    if args.num_records <= 0 or args.record_size <= 0:
        parser.error("--num-records and --record-size must be positive")
    security = _security_pairs(args.command_config)
    ensure_topic(args.bootstrap_servers, args.topic, args.partitions, args.replication_factor,
                 SecurityConfig.from_config(security))
    config: dict[str, Any] = {
        "bootstrap_servers": args.bootstrap_servers, "acks": args.acks, "compression_type": args.compression,
        "batch_size": args.batch_size, "linger_ms": args.linger_ms,
        "buffer_memory": max(64 * 1024 * 1024, 8 * args.batch_size),
        "max_request_size": max(4 * 1024 * 1024, 2 * args.batch_size),
        **security,
    }
    config.update(_config_pairs(args.producer_config))
    with Producer(config) as producer:
        result = run_produce(producer, args.topic, args.num_records, args.record_size, args.throughput,
                             Progress("sent"), warmup_records=args.warmup_records, on_measuring=on_measuring,
                             keys=args.keys)
    print(result.summary("sent"))
    if (line := result.batch_line()) is not None:
        print(line)
    return 0 if result.errors == 0 else 1


def run_consume(consumer: Consumer, num_records: int, timeout_ms: int, progress: Progress | None = None,
                *, batches: bool = False) -> PerfResult:
    """Consume until ``num_records``; ``batches`` counts records from batch headers without decoding."""
    count = 0
    size = 0
    poll_ms: list[float] = []
    cpu_start = time.process_time()
    start = last_data = time.monotonic()
    while count < num_records:
        t = time.monotonic()
        if batches:
            got: dict[Any, Any] = consumer.poll_batches(timeout_ms=100)
        else:
            got = consumer.poll(timeout_ms=100, max_records=max(500, min(20_000, num_records - count)))
        now = time.monotonic()
        if not got:
            if (now - last_data) * 1000 > timeout_ms:
                break
            continue
        if len(poll_ms) < LATENCY_SAMPLES_MAX:
            poll_ms.append((now - t) * 1000)
        last_data = now
        for data in got.values():
            if batches:
                for _pos, header in iter_batches(data):
                    count += header.record_count
                    size += header.size
            else:
                count += len(data)
                # The values' bytes, summed at C speed: a generator over the records cost the tool about 5%
                # of the consumer's CPU (0.06 µs of 1.0 µs a record), which the figure charged to the client.
                size += sum(map(len, filter(None, map(_RECORD_VALUE, data))))
        if progress is not None:
            progress.maybe_print(count)
    return PerfResult(count, size, last_data - start, poll_ms, 0, time.process_time() - cpu_start)


def consume_main(argv: Sequence[str] | None = None) -> int:
    parser = PerfArgumentParser(prog="brook perf consume", description="Consumer throughput", examples=(
        "brook perf consume -t perf -n 1000000", "brook perf consume -t perf -n 1000000 -g perf --batches"))
    parser.add_argument("--bootstrap", "-b", "--bootstrap-servers", dest="bootstrap_servers", default=DEFAULT_BOOTSTRAP)
    parser.add_argument("--topic", "-t", default="brook-perf")
    parser.add_argument("--num-records", "-n", type=int, default=1_000_000)
    parser.add_argument("--group", "-g", default=None, help="consume as this group (subscribe); default: assign all")
    parser.add_argument("--timeout-ms", type=int, default=10_000, help="stop after this long without records")
    parser.add_argument("--fetch-max-bytes", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--max-partition-fetch-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--consumer-config", nargs="*", metavar="KEY=VALUE", help="any other consumer config")
    parser.add_argument("--batches", action="store_true",
                        help="poll_batches(): count records from batch headers, no per-record decode (MB/s = batch bytes)")
    parser.add_argument("--command-config", default=None, help="client properties file (security.protocol, ssl.*)")
    args = parser.parse_args(argv)
    config: dict[str, Any] = {
        "bootstrap_servers": args.bootstrap_servers, "auto_offset_reset": "earliest",
        "fetch_max_bytes": args.fetch_max_bytes, "max_partition_fetch_bytes": args.max_partition_fetch_bytes,
        "group_id": args.group, "enable_auto_commit": False, "max_poll_records": 100_000,
        **_security_pairs(args.command_config),
    }
    config.update(_config_pairs(args.consumer_config))
    with Consumer(config=config) as consumer:
        if args.group:
            consumer.subscribe([args.topic])
        else:
            parts = consumer.partitions_for_topic(args.topic)
            consumer.assign([TopicPartition(args.topic, p) for p in sorted(parts)])
            consumer.seek_to_beginning()
        freeze_startup_objects()  # as the produce and end-to-end tools: no full collection scans start-up's objects
        result = run_consume(consumer, args.num_records, args.timeout_ms, Progress("consumed"),
                             batches=args.batches)
    print(result.summary("consumed").replace("latency", "poll latency"))
    return 0 if result.records >= args.num_records else 1


def _e2e_consumer(config: dict[str, Any], topic: str, num_records: int, timeout_ms: int,
                  ready: Any, results: Any) -> None:
    """The end-to-end tool's consumer (its own process, so it does not share the producer's GIL).

    Positions at the log end before ``ready`` is set, then reads until ``num_records`` stamped
    records arrived (or ``timeout_ms`` without any); sends back each record's latency in ms:
    the wall clock when poll() handed it over minus the send() time stamped in its value.
    """
    latencies: list[float] = []
    with Consumer(config=config) as consumer:
        parts = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_end()
        for tp in tps:
            consumer.position(tp)  # resolve the end offsets now, not after the first records were sent
        freeze_startup_objects()
        ready.set()
        last_data = time.monotonic()
        while len(latencies) < num_records:
            got = consumer.poll(timeout_ms=100)
            now_ns = time.time_ns()
            if not got:
                if (time.monotonic() - last_data) * 1000 > timeout_ms:
                    break
                continue
            last_data = time.monotonic()
            for records in got.values():
                for r in records:
                    if r.value is not None and len(r.value) >= 8:
                        latencies.append((now_ns - int.from_bytes(r.value[:8], "big")) / 1e6)
    results.put(latencies)


def e2e_main(argv: Sequence[str] | None = None) -> int:
    parser = PerfArgumentParser(
        prog="brook perf end-to-end",
        description="End-to-end latency: send() to a consumer's poll() returning the record, at a fixed rate",
        examples=("brook perf end-to-end -t e2e -n 100000 --throughput 10000",))
    parser.add_argument("--bootstrap", "-b", "--bootstrap-servers", dest="bootstrap_servers", default=DEFAULT_BOOTSTRAP)
    parser.add_argument("--topic", "-t", default="brook-perf-e2e")
    parser.add_argument("--num-records", "-n", type=int, default=100_000)
    parser.add_argument("--record-size", type=int, default=100, help="bytes per value (at least 8: the send time)")
    parser.add_argument("--throughput", type=float, default=10_000, help="records/s")
    parser.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
    parser.add_argument("--partitions", "-p", type=int, default=6, help="partitions when the topic is created")
    parser.add_argument("--replication-factor", "-r", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16384)
    # The producer's own default: at 10,000 records/s a 1 ms linger sends about twice the requests
    # and, on a small machine, doubles the latency it was meant to save (README, Client performance).
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--warmup-records", type=int, default=5000,
                        help="records sent (and acknowledged) before the consumer starts")
    parser.add_argument("--timeout-ms", type=int, default=30_000, help="consumer gives up after this long without records")
    parser.add_argument("--keys", type=perf_keys, default=(), metavar="N", help=KEYS_HELP)
    parser.add_argument("--producer-config", nargs="*", metavar="KEY=VALUE", help="any other producer config")
    parser.add_argument("--consumer-config", nargs="*", metavar="KEY=VALUE", help="any other consumer config")
    parser.add_argument("--command-config", default=None, help="client properties file (security.protocol, ssl.*)")
    args = parser.parse_args(argv)
    if args.num_records <= 0 or args.record_size < 8 or args.throughput <= 0:
        parser.error("--num-records and --throughput must be positive and --record-size at least 8")
    keys = args.keys
    security = _security_pairs(args.command_config)
    ensure_topic(args.bootstrap_servers, args.topic, args.partitions, args.replication_factor,
                 SecurityConfig.from_config(security))
    producer_config: dict[str, Any] = {
        "bootstrap_servers": args.bootstrap_servers, "acks": args.acks, "batch_size": args.batch_size,
        "linger_ms": args.linger_ms, **security, **_config_pairs(args.producer_config)}
    consumer_config: dict[str, Any] = {
        "bootstrap_servers": args.bootstrap_servers, "group_id": None, "enable_auto_commit": False,
        "fetch_min_bytes": 1, **security, **_config_pairs(args.consumer_config)}
    padding = bytes(random.Random(0).choices(range(65, 91), k=args.record_size - 8))
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    with Producer(producer_config) as producer:
        for i in range(args.warmup_records):
            producer.send(args.topic, bytes(8) + padding, key_at(keys, i))
        producer.flush()
        consumer = ctx.Process(target=_e2e_consumer, name="e2e-consumer", daemon=True, args=(
            consumer_config, args.topic, args.num_records, args.timeout_ms, ready, results))
        consumer.start()
        if not ready.wait(60):
            consumer.kill()
            print("the consumer did not get its positions within 60 s", file=sys.stderr)
            return 1
        progress = Progress("sent")
        interval = 1.0 / args.throughput
        # Only the futures still in flight are kept: 100,000 kept to the end would be promoted
        # to the oldest generation and set off full collections during the measurement.
        futures: list[Any] = []
        failed = 0
        freeze_startup_objects()
        start = time.monotonic()
        for i in range(args.num_records):
            if i % 16 == 0:
                pace(start, i, interval)
                progress.maybe_print(i)
                if len(futures) >= 4096:
                    failed += _settle(futures)
            futures.append(producer.send(args.topic, time.time_ns().to_bytes(8, "big") + padding,
                                         key_at(keys, i)))
        producer.flush()
        sent_s = time.monotonic() - start
    failed += _settle(futures)
    try:
        latencies = results.get(timeout=args.timeout_ms / 1000 + 30)
    except queue.Empty:
        latencies = []
    consumer.join(10)
    result = PerfResult(len(latencies), len(latencies) * args.record_size, sent_s, latencies, failed)
    print(f"{args.num_records} records sent at {args.num_records / sent_s:.1f} records/sec, "
          f"{len(latencies)} seen by the consumer; end-to-end (send() to poll()) latency: "
          f"{result.percentile(0.5):.2f} ms 50th, {result.percentile(0.99):.2f} ms 99th, "
          f"{result.percentile(0.999):.2f} ms 99.9th, {max(latencies, default=float('nan')):.2f} ms max, "
          f"{failed} send errors")
    return 0 if failed == 0 and len(latencies) >= args.num_records else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"produce": produce_main, "consume": consume_main, "end-to-end": e2e_main}
    if not argv or argv[0] not in commands:
        print("usage: python -m client.perf produce|consume|end-to-end [options]", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
