"""``make bench-client``: the client perf goals of issue 5 on a fresh local cluster.

Starts a local 3-node cluster (real ``brook-server`` processes, combined roles) in a
temporary directory and runs, with 100-byte records on a topic with replication
factor 3:

1. ``brook perf produce`` at full speed with acks=all (goal: 300,000 records/s);
2. ``brook perf consume`` of what was produced, decoding every record, then again
   counting from batch headers only (goal: 1,000,000 records/s);
3. ``brook perf produce`` capped at 10,000 records/s with acks=all (goal: p99 < 10 ms).

Each step prints the perf tool's own summary line. Figures depend on the machine and
on what else runs on it; nothing here asserts on them.

    python -m deploy.local.bench [--records 1000000] [--latency-records 100000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from client.perf import consume_main, produce_main
from deploy.local.cluster import LocalCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records for the throughput runs")
    parser.add_argument("--latency-records", type=int, default=100_000, help="records for the 10k/s latency run")
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args(argv)
    if args.records < 1 or args.latency_records < 1:
        parser.error("record counts must be positive")

    with tempfile.TemporaryDirectory(prefix="brook-bench-") as tmp, \
            LocalCluster(Path(tmp) / "cluster", nodes=3) as cluster:
        bootstrap = cluster.bootstrap_servers
        common = ["--bootstrap-servers", bootstrap, "--partitions", str(args.partitions),
                  "--replication-factor", "3", "--record-size", "100"]
        steps: list[tuple[str, int]] = []
        print(f"== 1. produce {args.records} records, acks=all, RF=3, unthrottled", flush=True)
        steps.append(("produce", produce_main([*common, "--topic", "bench-throughput", "--acks", "all",
                                               "--num-records", str(args.records),
                                               "--warmup-records", str(min(50_000, args.records))])))
        consume = ["--bootstrap-servers", bootstrap, "--topic", "bench-throughput",
                   "--num-records", str(args.records)]
        print("== 2a. consume them, decoding every record", flush=True)
        steps.append(("consume", consume_main(consume)))
        print("== 2b. consume them, counting from batch headers (poll_batches)", flush=True)
        steps.append(("consume --batches", consume_main([*consume, "--batches"])))
        print(f"== 3. produce {args.latency_records} records at 10,000 records/s, acks=all (latency)", flush=True)
        steps.append(("produce 10k/s", produce_main([*common, "--topic", "bench-latency", "--acks", "all",
                                                     "--throughput", "10000", "--batch-size", "16384",
                                                     "--linger-ms", "1",
                                                     "--num-records", str(args.latency_records),
                                                     "--warmup-records", "5000"])))
    failed = [name for name, rc in steps if rc != 0]
    if failed:
        print(f"steps that did not complete: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
