"""Benchmark: records/s a Spark streaming query reads from Brook into a no-op sink.

    python -m spark_source.bench                       # starts a local 3-node cluster
    python -m spark_source.bench --bootstrap 127.0.0.1:9092 --records 2000000

Fills a topic with ``--records`` records of ``--value-bytes`` bytes (prebuilt batches sent
straight to the partition leaders with acks=all, so filling is not what is measured), then
runs ``readStream.format("brook")`` with ``Trigger.AvailableNow`` into the ``noop`` sink and
prints records/s over the query's wall time and over its micro-batch execution time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import spark_source

logger = logging.getLogger(__name__)

_MAX_BATCH_BYTES = 900 * 1024  # below the broker's default max.message.bytes (1 MiB)


def _build_batch(records: int, value_bytes: int) -> bytes:
    from storage.record_batch import RecordBatchBuilder

    builder = RecordBatchBuilder()
    now_ms = int(time.time() * 1000)
    for _ in range(records):
        builder.append(now_ms, None, os.urandom(value_bytes))
    return builder.build()


def fill_topic(bootstrap: str, topic: str, partitions: int, records: int, value_bytes: int) -> int:
    """Write ``records`` records round-robin over the partitions; returns how many were acked."""
    from client.cluster import ClusterClient
    from client.types import TopicPartition
    from proto import broker_pb2, errors

    per_batch = max(1, min(records, _MAX_BATCH_BYTES // (value_bytes + 12)))
    batch = _build_batch(per_batch, value_bytes)
    written = 0
    with ClusterClient(bootstrap) as client:
        part = 0
        while written < records:
            n = min(per_batch, records - written)
            payload = batch if n == per_batch else _build_batch(n, value_bytes)
            tp = TopicPartition(topic, part)
            req = broker_pb2.ProduceRequest(
                acks=-1, timeout_ms=30_000,
                partitions=[broker_pb2.ProducePartitionData(topic=topic, partition=part, records=payload)],
            )
            resp = client.broker_stub(client.leader_for(tp)).Produce(req, timeout=60)
            for p in resp.partitions:
                errors.raise_for(p.error_code, p.error_message)
            written += n
            part = (part + 1) % partitions
    return written


def create_topic(controller_endpoints: list[tuple[str, int]], topic: str, partitions: int, rf: int) -> None:
    from metadata_quorum.client import ControllerClient
    from proto import controller_pb2, errors

    with ControllerClient(controller_endpoints, timeout_s=30) as ctl:
        resp = ctl.call("CreateTopics", controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=topic, num_partitions=partitions, replication_factor=rf)],
            timeout_ms=30_000))
        for r in resp.results:
            errors.raise_for(r.error_code, r.error_message)


def _wait_leaders(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30.0) -> None:
    from client.cluster import ClusterClient

    deadline = time.monotonic() + timeout_s
    with ClusterClient(bootstrap) as client:
        while time.monotonic() < deadline:
            info = client.metadata([topic], refresh=True).topics.get(topic)
            if info and len(info.partitions) == partitions and all(p.leader >= 0 for p in info.partitions.values()):
                return
            time.sleep(0.1)
    raise TimeoutError(f"topic {topic} has no leaders after {timeout_s} s")


def run_query(spark, bootstrap: str, topic: str, checkpoint: str, **options: str) -> tuple[int, float, float]:  # type: ignore[no-untyped-def]
    """(rows, wall seconds, summed micro-batch execution seconds) of one AvailableNow query."""
    reader = (spark.readStream.format("brook").option("bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    for k, v in options.items():
        reader = reader.option(k, v)
    start = time.monotonic()
    query = (reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    wall = time.monotonic() - start
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    exec_s = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    return rows, wall, exec_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="an existing cluster (else a local 3-node cluster is started)")
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--replication-factor", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--min-partitions", type=int, default=0, help="minPartitions option (0 = one task per partition)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    spark = spark_source.local_session("brook-spark-bench", args.master)  # before any gRPC channel here
    with tempfile.TemporaryDirectory(prefix="brook-spark-bench-") as tmp:
        cluster = None
        if args.bootstrap:
            bootstrap = args.bootstrap
            controllers = None
        else:
            from deploy.local.cluster import LocalCluster

            cluster = LocalCluster(Path(tmp) / "cluster", nodes=3)
            cluster.start()
            cluster.wait_ready(120)
            bootstrap = cluster.bootstrap_servers
            controllers = cluster.controller_endpoints
        try:
            return _bench(spark, args, bootstrap, controllers, Path(tmp))
        finally:
            if cluster is not None:
                cluster.stop(timeout_s=20)
                cluster.teardown()


def _bench(spark, args: argparse.Namespace, bootstrap: str,  # type: ignore[no-untyped-def]
           controllers: list[tuple[str, int]] | None, tmp: Path) -> int:
    topic = f"spark-bench-{uuid.uuid4().hex[:8]}"
    if controllers is None:
        from client.cluster import ClusterClient

        with ClusterClient(bootstrap) as client:
            controllers = client.metadata(refresh=True).controllers
    create_topic(controllers, topic, args.partitions, args.replication_factor)
    _wait_leaders(bootstrap, topic, args.partitions)
    t0 = time.monotonic()
    written = fill_topic(bootstrap, topic, args.partitions, args.records, args.value_bytes)
    fill_s = time.monotonic() - t0
    print(f"filled {topic}: {written} records of {args.value_bytes} B in {fill_s:.1f} s")
    spark_source.register(spark)
    try:
        opts = {"minPartitions": str(args.min_partitions)} if args.min_partitions else {}
        # Warm-up: starts the Python workers and warms the JVM paths with a small batch read.
        ends = json.dumps({topic: {str(p): min(10_000, args.records // args.partitions) for p in range(args.partitions)}})
        warm = (spark.read.format("brook").option("bootstrap.servers", bootstrap).option("subscribe", topic)
                .option("endingOffsets", ends).load().count())
        logger.info("warm-up read %d records", warm)
        rows, wall_s, exec_s = run_query(spark, bootstrap, topic, str(tmp / "measured"), **opts)
    finally:
        spark.stop()
    if rows != written:
        print(f"ERROR: the query read {rows} records, {written} were written", file=sys.stderr)
        return 1
    mb = rows * args.value_bytes / 1e6
    print(f"spark streaming read (AvailableNow -> noop, master {args.master}, {args.partitions} partitions): "
          f"{rows} records in {wall_s:.2f} s wall = {rows / wall_s:,.0f} records/s ({mb / wall_s:.1f} MB/s of values); "
          f"micro-batch execution {exec_s:.2f} s = {rows / max(exec_s, 1e-9):,.0f} records/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
