"""``make demo``: a local 3-node cluster, a topic, data produced, and a Spark streaming job over it.

    python -m deploy.local.demo [--dir .brook/demo] [--records 10000] [--keep]

Steps, each printed as it happens: start Spark's JVM (first, before this process uses gRPC:
see main), start the cluster (deploy.local LocalCluster), create a
replicated topic, produce keyed records with the Python producer, show `brook`-style
cluster health, then run the Spark Structured Streaming job (spark_source.demo_job) that
counts records per key with Trigger.AvailableNow, and check its total against what was
produced. The cluster is stopped at the end (controlled shutdown) unless --keep.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console

from deploy.local.cluster import DEMO_USER, ClusterError, LocalCluster

TOPIC = "demo-events"
KEYS = [f"sensor-{i}" for i in range(8)]
console = Console()


def produce(bootstrap: str, records: int, security: dict[str, str]) -> int:
    from client.producer import Producer

    started = time.monotonic()
    # lz4 + pipelined idempotent batches: the path that once failed with OUT_OF_ORDER_SEQUENCE_NUMBER
    # (brokers now refuse a batch that overtook an earlier one, and the producer retries it in order).
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=10, compression_type="lz4",
                  **{k.replace(".", "_"): v for k, v in security.items()}) as producer:
        futures = []
        for i in range(records):
            key = KEYS[i % len(KEYS)]
            value = json.dumps({"seq": i, "sensor": key, "reading": (i * 37) % 1000 / 10}).encode()
            futures.append(producer.send(TOPIC, value, key=key.encode()))
        producer.flush(120)
        for f in futures:
            f.result(120)
    elapsed = time.monotonic() - started
    console.print(f"  produced {records} records in {elapsed:.1f} s ({records / max(elapsed, 1e-6):,.0f} records/s)")
    return records


def spark_session():  # type: ignore[no-untyped-def]
    from spark_source import local_session

    return local_session("brook-demo", conf={"spark.ui.showConsoleProgress": "false"})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.local.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=Path(".brook/demo"), help="cluster directory (wiped first)")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    p.add_argument("--no-spark", action="store_true", help="skip the Spark job")
    p.add_argument("--plaintext", action="store_true", help="no TLS (default: mTLS everywhere, CA under DIR/tls)")
    args = p.parse_args(argv)

    spark = None
    if not args.no_spark:
        if shutil.which("java") is None:
            console.print("[red]java is not on PATH: Spark needs Java 17+[/red]")
            return 1
        # First, before this process opens any gRPC channel (see spark_source.local_session).
        console.rule("[bold]1. start Spark (local[2])")
        spark = spark_session()
    try:
        return _demo(args, spark)
    finally:
        if spark is not None:
            spark.stop()


def _demo(args: argparse.Namespace, spark) -> int:  # type: ignore[no-untyped-def]
    if args.dir.exists():
        shutil.rmtree(args.dir)  # a demo starts from nothing: stale ports or data would confuse it
    cluster = LocalCluster(args.dir, nodes=args.nodes, detach=args.keep, tls=not args.plaintext,
                           authorizer=not args.plaintext)
    console.rule("[bold]2. start a local cluster")
    try:
        cluster.start()
        cluster.wait_ready(120)
    except ClusterError as e:
        console.print(f"[red]cluster did not start:[/red] {e}", markup=True)
        cluster.teardown()
        return 1
    console.print(f"  {args.nodes} combined nodes up; bootstrap servers {cluster.bootstrap_servers}")
    console.print(f"  logs and data under {cluster.base_dir}")
    if cluster.tls:
        console.print(f"  mTLS between nodes and for clients; CA and certificates in {cluster.tls_dir}")
        console.print(f"  client settings: {cluster.base_dir / 'client.properties'}, or `. {cluster.base_dir}/env.sh`")
    try:
        return _run(cluster, args, spark)
    finally:
        if args.keep:
            console.print(f"\ncluster left running: python -m deploy.local stop --dir {args.dir}")
        else:
            console.rule("[bold]stop the cluster (controlled shutdown)")
            cluster.stop(timeout_s=30)
            cluster.teardown()


def _run(cluster: LocalCluster, args: argparse.Namespace, spark) -> int:  # type: ignore[no-untyped-def]
    from admin_cli.main import main as brook

    bootstrap = cluster.bootstrap_servers
    cli = ["-b", bootstrap, "--command-config", str(cluster.base_dir / "client.properties")]
    console.rule("[bold]3. create a topic")
    if brook([*cli, "topic", "create", TOPIC, "-p", "6", "-r", str(min(3, args.nodes)),
              "-c", "retention.ms=3600000", "-c", f"min.insync.replicas={min(2, args.nodes)}"]) != 0:
        return 1
    console.rule("[bold]4. produce")
    # The producer and the Spark job run as the least-privileged demo user (User:demo: demo-* only);
    # the topic was created by the operator (User:admin) through the CLI above.
    cluster.grant_demo_acls()
    demo_security = cluster.client_config_for(DEMO_USER)
    produced = produce(bootstrap, args.records, demo_security)
    console.rule("[bold]5. cluster health")
    brook([*cli, "cluster", "health"])
    if spark is None:
        return 0
    console.rule("[bold]6. Spark Structured Streaming over the topic")
    from spark_source.demo_job import run_demo

    result = run_demo(spark, bootstrap, TOPIC, security=demo_security)
    counted = sum(c for _, c, _ in result)
    if counted != produced:
        console.print(f"[red]Spark counted {counted} records, {produced} were produced[/red]")
        return 1
    console.print(f"[green]demo OK:[/green] Spark counted all {counted} records across {len(result)} keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
