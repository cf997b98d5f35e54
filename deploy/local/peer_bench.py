"""``make bench-peer``: Brook next to a peer, NATS JetStream, in one run on this machine.

Both get the same job: 3 server processes on loopback, a log replicated on all three
(Brook: a topic with replication factor 3 and min.insync.replicas 2, one partition, acks=all;
NATS: an R3 file-storage stream, every publish acknowledged), the same number of records of
the same size, published as fast as the client can keep acknowledgements coming, then read
back in full. NATS runs ``nats-server`` from the distribution's packages (installed with
apt-get when missing and run as root) and the ``nats-py`` client; Brook runs its own perf
tools (``brook perf produce/consume``), and confluent-kafka (librdkafka) against the same Brook
cluster's Kafka listener. Then each of the three writes at a fixed rate (10,000 records/s) with
its client's default batching, and the time from send to acknowledgement is printed side by
side, with the rate each client held and its CPU a record. The figures and their ratios are
printed; nothing is asserted on them.

    python -m deploy.local.peer_bench [--records 200000] [--record-size 100] [--latency-records 50000] [--rate 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from client.perf import PerfResult, consume_main, produce_main, seconds_ahead
from deploy.local.bench import run_perf
from deploy.local.cluster import LocalCluster, free_port
from deploy.local.tools import debian_tool

STARTUP_TIMEOUT_S = 60.0
PUBLISH_WINDOW = 4096  # acknowledgements NATS' client may wait for at once (its wait_stall bound)
FETCH_BATCH = 1000
HELD_RATE = 0.95  # a latency run whose client sent below this share of the rate measured its client


@contextlib.contextmanager
def nats_cluster(binary: str, base: Path, servers: int = 3) -> Iterator[list[str]]:
    """``servers`` clustered nats-server processes with JetStream on files under ``base``."""
    ports = [(free_port(), free_port()) for _ in range(servers)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, (client, route) in enumerate(ports):
            d = base / f"n{i}"
            d.mkdir(parents=True)
            routes = ", ".join(f"nats-route://127.0.0.1:{r}" for j, (_, r) in enumerate(ports) if j != i)
            (d / "server.conf").write_text(
                f'server_name: "n{i}"\nlisten: "127.0.0.1:{client}"\n'
                f'jetstream {{ store_dir: "{d / "js"}" }}\n'
                f'cluster {{ name: "brook-bench-peer", listen: "127.0.0.1:{route}", routes: [{routes}] }}\n')
            log = (d / "server.log").open("wb")
            procs.append(subprocess.Popen([binary, "-c", str(d / "server.conf")], stdout=log, stderr=log))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for client, _ in ports:
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", client), timeout=1):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server on port {client} did not start; see {base}")
                time.sleep(0.1)
        yield [f"nats://127.0.0.1:{client}" for client, _ in ports]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)


async def _add_stream(js: Any, name: str, subject: str) -> None:
    """An R3 file stream; retried while the JetStream meta leader is still being elected."""
    from nats.js.api import StorageType, StreamConfig

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            await js.add_stream(StreamConfig(name=name, subjects=[subject], num_replicas=3, storage=StorageType.FILE))
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _nats_run(urls: list[str], records: int, size: int) -> tuple[float, float]:
    """(acknowledged publishes per second, records read per second)."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(urls)
    try:
        js = nc.jetstream(timeout=30)
        await _add_stream(js, "BENCH", "bench")
        payload = b"x" * size
        start = time.perf_counter()
        for _ in range(records):
            await js.publish_async("bench", payload, wait_stall=30)
        await js.publish_async_completed()
        produce_s = time.perf_counter() - start
        info = await js.stream_info("BENCH")
        if info.state.messages != records:
            raise RuntimeError(f"the stream holds {info.state.messages} messages, {records} were published")
        sub = await js.pull_subscribe("bench", durable="bench-reader",
                                      config=ConsumerConfig(ack_policy=AckPolicy.NONE))
        start = time.perf_counter()
        read = 0
        while read < records:
            read += len(await sub.fetch(FETCH_BATCH, timeout=10))
        consume_s = time.perf_counter() - start
        return records / produce_s, records / consume_s
    finally:
        await nc.close()


async def _nats_latency(urls: list[str], records: int, size: int, rate: float, warmup: int) -> PerfResult:
    """Publishes at ``rate`` records/s to an R3 file stream, each one's time until its acknowledgement."""
    import nats

    nc = await nats.connect(urls)
    try:
        js = nc.jetstream(timeout=30)
        await _add_stream(js, "LATENCY", "latency")
        payload = b"x" * size
        latencies_ms: list[float] = []
        failed = [0]

        def acknowledged(ack: asyncio.Future[Any], sent: float) -> None:
            if ack.cancelled() or ack.exception() is not None:
                failed[0] += 1
            else:
                latencies_ms.append((time.monotonic() - sent) * 1000)

        interval = 1.0 / rate
        for measured, count in ((False, warmup), (True, records)):
            cpu_start = time.process_time()
            start = time.monotonic()
            for i in range(count):
                if i % 16 == 0 and (ahead := seconds_ahead(start, i, interval)):  # paced as brook perf
                    await asyncio.sleep(ahead)
                sent = time.monotonic()
                ack = await js.publish_async("latency", payload, wait_stall=30)
                if measured:
                    ack.add_done_callback(lambda f, sent=sent: acknowledged(f, sent))
            await js.publish_async_completed()
            elapsed = time.monotonic() - start
        return PerfResult(records, records * size, elapsed, latencies_ms, failed[0], time.process_time() - cpu_start)
    finally:
        await nc.close()


def _brook_rate(fn: Callable[[list[str]], int], argv: list[str]) -> float | None:
    rc, rate = run_perf(fn, argv)
    return float(rate) if rc == 0 and rate is not None else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.peer_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--latency-records", type=int, default=50_000, help="records for the fixed-rate latency run")
    parser.add_argument("--rate", type=float, default=10_000, help="records/s of the latency run")
    args = parser.parse_args(argv)
    if args.records < 1 or args.record_size < 1 or args.latency_records < 1 or args.rate <= 0:
        parser.error("--records, --record-size, --latency-records and --rate must be positive")
    n, size, lat_n, rate = args.records, args.record_size, args.latency_records, args.rate
    latency: dict[str, dict[str, float] | None] = {}
    latency_job = (f"{lat_n} records of {size} B at {rate:,.0f} records/s, one partition, RF 3, acks=all "
                   f"(each client's default batching)")
    print(f"== Brook: {n} records of {size} B, 3 nodes, RF 3, acks=all, one partition", flush=True)
    with tempfile.TemporaryDirectory(prefix="brook-peer-") as tmp, \
            LocalCluster(Path(tmp) / "cluster", nodes=3, overrides={"default.replication.factor": "3", "min.insync.replicas": "2"}) as cluster:
        common = ["--bootstrap-servers", cluster.bootstrap_servers, "--topic", "peer"]
        brook_produce = _brook_rate(produce_main, [*common, "--partitions", "1", "--replication-factor", "3",
                                                   "--record-size", str(size), "--acks", "all",
                                                   "--num-records", str(n)])
        brook_consume = _brook_rate(consume_main, [*common, "--num-records", str(n)])
        print(f"== Brook, latency: {latency_job}", flush=True)
        latency["Brook"] = _latency(produce_main, [
            "--bootstrap-servers", cluster.bootstrap_servers, "--topic", "peer-latency", "--partitions", "1",
            "--replication-factor", "3", "--record-size", str(size), "--acks", "all", "--throughput", str(rate),
            "--num-records", str(lat_n), "--warmup-records", "5000"])
        kafka_produce = kafka_consume = None
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            print("== confluent-kafka: skipped: not installed", flush=True)
        else:
            from client.admin import Admin
            from deploy.local import kafka_perf

            print(f"== confluent-kafka against Brook's Kafka listener: {n} records of {size} B, one partition, "
                  "RF 3, acks=all, idempotent", flush=True)
            with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
                admin.create_topic("peer-kafka", 1, 3)
            config = cluster.kafka_client_config()
            kafka_produce = _brook_rate(lambda _: kafka_perf.produce(config, "peer-kafka", n, size), [])
            kafka_consume = _brook_rate(lambda _: kafka_perf.consume(config, "peer-kafka", n, size), [])
            print(f"== confluent-kafka against Brook's Kafka listener, latency: {latency_job}", flush=True)
            with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
                admin.create_topic("peer-kafka-latency", 1, 3)
            latency["Brook via librdkafka"] = _latency(
                lambda _: 0 if kafka_perf.produce_at_rate(config, "peer-kafka-latency", lat_n, rate, size) else 1, [])
    binary, why = debian_tool("nats-server", "nats-server")
    nats_produce = nats_consume = None
    if binary is None:
        print(f"== NATS JetStream: skipped: {why}", flush=True)
    else:
        print(f"== NATS JetStream: {n} records of {size} B, 3 servers, R3 file stream, acknowledged publishes",
              flush=True)
        with tempfile.TemporaryDirectory(prefix="brook-peer-nats-") as tmp, \
                nats_cluster(binary, Path(tmp)) as urls:
            nats_produce, nats_consume = asyncio.run(_nats_run(urls, n, size))
            print(f"== NATS JetStream, latency: {lat_n} records of {size} B at {rate:,.0f} records/s, R3 file "
                  "stream, every publish acknowledged", flush=True)

            def nats_latency(_: list[str]) -> int:
                result = asyncio.run(_nats_latency(urls, lat_n, size, rate, warmup=5000))
                print(f"{result.summary('sent')} [nats-py, publish_async]", flush=True)
                return 0 if result.errors == 0 else 1

            latency["NATS JetStream"] = _latency(nats_latency, [])
    print(f"== {n} records of {size} B, replicated on 3 nodes (records/sec; ratio = Brook / NATS)", flush=True)
    print(f"  {'':<22}{'Brook':>14}{'NATS JetStream':>18}{'ratio':>9}{'Brook via librdkafka':>22}")
    for label, b, p, k in (("produce, acknowledged", brook_produce, nats_produce, kafka_produce),
                           ("consume, every record", brook_consume, nats_consume, kafka_consume)):
        ratio = f"{b / p:.2f}x" if b and p else "-"
        print(f"  {label:<22}{_fmt(b):>14}{_fmt(p):>18}{ratio:>9}{_fmt(k):>22}", flush=True)
    print(f"== latency from send to acknowledgement at {rate:,.0f} records/s, replicated on 3 nodes "
          "(ms; ratio = Brook / NATS)", flush=True)
    print(f"  {'':<22}{'50th':>8}{'99th':>8}{'99.9th':>8}{'records/sec':>13}{'client us/record':>18}")
    for name in ("Brook", "NATS JetStream", "Brook via librdkafka"):
        figures = latency.get(name)
        if figures is None:
            print(f"  {name:<22}{'-':>8}{'-':>8}{'-':>8}{'-':>13}{'-':>18}", flush=True)
            continue
        print(f"  {name:<22}{figures['50th']:>8.2f}{figures['99th']:>8.2f}{figures['99.9th']:>8.2f}"
              f"{figures['rate']:>13,.0f}{figures['cpu_us']:>18.1f}", flush=True)
    held = {name: f for name, f in latency.items() if f is not None and f["rate"] >= HELD_RATE * rate}
    for name, figures in latency.items():
        if figures is not None and name not in held:
            print(f"  {name}: its client held only {figures['rate']:,.0f} of {rate:,.0f} records/s "
                  f"({figures['cpu_us']:.0f} us of client CPU a record), so these figures are its client's, "
                  "not its servers'", flush=True)
    ours, theirs = held.get("Brook"), held.get("NATS JetStream")
    if ours and theirs:
        print("  ratio Brook / NATS: " + ", ".join(f"{q} {ours[q] / theirs[q]:.2f}x" for q in ("50th", "99th", "99.9th")),
              flush=True)
    return 0 if brook_produce and brook_consume and latency.get("Brook") else 1


_LATENCY = re.compile(r"([\d.]+) records/sec .*?([\d.]+) ms 50th, ([\d.]+) ms 99th, ([\d.]+) ms 99\.9th, "
                      r"0 errors .*?\(([\d.]+) us/record\)")


def latency_figures(text: str) -> dict[str, float] | None:
    """The figures of a perf summary line (``PerfResult.summary``) of a run without errors, else None."""
    match = _LATENCY.search(text)
    if match is None:
        return None
    return dict(zip(("rate", "50th", "99th", "99.9th", "cpu_us"), map(float, match.groups()), strict=True))


def _latency(fn: Callable[[list[str]], int], argv: list[str]) -> dict[str, float] | None:
    output: list[str] = []
    rc, _ = run_perf(fn, argv, output)
    return latency_figures("".join(output)) if rc == 0 else None


def _fmt(rate: float | None) -> str:
    return f"{rate:,.0f}" if rate else "-"


if __name__ == "__main__":
    sys.exit(main())
