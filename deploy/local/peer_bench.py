"""``make bench-peer``: Brook next to a peer, NATS JetStream, in one run on this machine.

Both get the same job: 3 server processes on loopback, a log replicated on all three
(Brook: a topic with replication factor 3 and min.insync.replicas 2, one partition, acks=all;
NATS: an R3 file-storage stream, every publish acknowledged), the same number of records of
the same size, published as fast as the client can keep acknowledgements coming, then read
back in full. NATS runs ``nats-server`` from the distribution's packages (installed with
apt-get when missing and run as root) and the ``nats-py`` client; Brook runs its own perf
tools (``brook perf produce/consume``), and confluent-kafka (librdkafka) against the same Brook
cluster's Kafka listener. The figures and their ratios are printed; nothing
is asserted on them.

    python -m deploy.local.peer_bench [--records 200000] [--record-size 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from client.perf import consume_main, produce_main
from deploy.local.bench import run_perf
from deploy.local.cluster import LocalCluster, free_port
from deploy.local.tools import debian_tool

STARTUP_TIMEOUT_S = 60.0
PUBLISH_WINDOW = 4096  # acknowledgements NATS' client may wait for at once (its wait_stall bound)
FETCH_BATCH = 1000


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


async def _nats_run(urls: list[str], records: int, size: int) -> tuple[float, float]:
    """(acknowledged publishes per second, records read per second)."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

    nc = await nats.connect(urls)
    try:
        js = nc.jetstream(timeout=30)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:  # the JetStream meta leader needs a moment after the servers start
            try:
                await js.add_stream(StreamConfig(name="BENCH", subjects=["bench"], num_replicas=3,
                                                 storage=StorageType.FILE))
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
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


def _brook_rate(fn: Callable[[list[str]], int], argv: list[str]) -> float | None:
    rc, rate = run_perf(fn, argv)
    return float(rate) if rc == 0 and rate is not None else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.peer_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=100)
    args = parser.parse_args(argv)
    if args.records < 1 or args.record_size < 1:
        parser.error("--records and --record-size must be positive")
    n, size = args.records, args.record_size
    print(f"== Brook: {n} records of {size} B, 3 nodes, RF 3, acks=all, one partition", flush=True)
    with tempfile.TemporaryDirectory(prefix="brook-peer-") as tmp, \
            LocalCluster(Path(tmp) / "cluster", nodes=3, overrides={"default.replication.factor": "3", "min.insync.replicas": "2"}) as cluster:
        common = ["--bootstrap-servers", cluster.bootstrap_servers, "--topic", "peer"]
        brook_produce = _brook_rate(produce_main, [*common, "--partitions", "1", "--replication-factor", "3",
                                                   "--record-size", str(size), "--acks", "all",
                                                   "--num-records", str(n)])
        brook_consume = _brook_rate(consume_main, [*common, "--num-records", str(n)])
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
    print(f"== {n} records of {size} B, replicated on 3 nodes (records/sec; ratio = Brook / NATS)", flush=True)
    print(f"  {'':<22}{'Brook':>14}{'NATS JetStream':>18}{'ratio':>9}{'Brook via librdkafka':>22}")
    for label, b, p, k in (("produce, acknowledged", brook_produce, nats_produce, kafka_produce),
                           ("consume, every record", brook_consume, nats_consume, kafka_consume)):
        ratio = f"{b / p:.2f}x" if b and p else "-"
        print(f"  {label:<22}{_fmt(b):>14}{_fmt(p):>18}{ratio:>9}{_fmt(k):>22}", flush=True)
    return 0 if brook_produce and brook_consume else 1


def _fmt(rate: float | None) -> str:
    return f"{rate:,.0f}" if rate else "-"


if __name__ == "__main__":
    sys.exit(main())
