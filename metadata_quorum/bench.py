"""Metadata quorum benchmark: ``python -m metadata_quorum.bench``.

Starts a LocalQuorum (3 controller processes on 127.0.0.1, encrypted quorum traffic),
registers 3 brokers, then prints:
- committed metadata operations per second (CreateTopics, one topic per request;
  AlterPartition ISR changes with compare-and-set), sequential and concurrent, with
  p50/p99 latency;
- heartbeat throughput (no quorum round-trip unless a broker's state changes);
- controller failover time: kill -9 of the active controller until another one is
  active, and until the first write commits through it (several rounds).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from metadata_quorum.client import ControllerClient
from metadata_quorum.local_quorum import LocalQuorum
from proto import common_pb2
from proto import controller_pb2 as pb
from proto.errors import ErrorCode


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _run_ops(name: str, op: Callable[[int], None], count: int, threads: int) -> None:
    latencies: list[float] = []
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_index[0]
                if i >= count:
                    return
                next_index[0] += 1
            t0 = time.perf_counter()
            op(i)
            elapsed = time.perf_counter() - t0
            with lock:
                latencies.append(elapsed)

    started = time.perf_counter()
    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    total = time.perf_counter() - started
    print(f"{name:<46} {count / total:9.0f} ops/s   p50 {_percentile(latencies, 0.5) * 1000:6.1f} ms"
          f"   p99 {_percentile(latencies, 0.99) * 1000:6.1f} ms   ({count} ops, {threads} threads)")


def _register(client: ControllerClient, cluster_id: str) -> dict[int, int]:
    epochs = {}
    for b in (1, 2, 3):
        r = client.call("RegisterBroker", pb.RegisterBrokerRequest(
            node_id=b, incarnation_id=f"bench-{b}-{time.time_ns()}", cluster_id=cluster_id,
            endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=29000 + b)]))
        epochs[b] = r.broker_epoch
        client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(node_id=b, broker_epoch=r.broker_epoch,
                                                                 current_metadata_version=r.broker_epoch))
    return epochs


def _check(code: int, what: str) -> None:
    if code != ErrorCode.NONE:
        raise SystemExit(f"{what} failed with error code {code}")


def bench_ops(client: ControllerClient, epochs: dict[int, int], ops: int, threads: int) -> None:
    def create(prefix: str) -> Callable[[int], None]:
        def op(i: int) -> None:
            r = client.call("CreateTopics", pb.CreateTopicsRequest(
                topics=[pb.CreatableTopic(name=f"{prefix}-{i}", num_partitions=1, replication_factor=3)]))
            _check(r.results[0].error_code, f"create {prefix}-{i}")
        return op

    _run_ops("CreateTopics (1 topic/request), sequential", create("seq"), ops, 1)
    _run_ops("CreateTopics (1 topic/request), concurrent", create("par"), ops, threads)

    cluster = client.call("DescribeCluster", pb.DescribeClusterRequest())
    parts = {p.topic: p for p in cluster.partitions if p.topic.startswith("par-")}
    state = {name: (p.leader, p.leader_epoch, p.partition_epoch, list(p.isr)) for name, p in parts.items()}
    names = sorted(state)

    def alter(i: int) -> None:
        name = names[i % len(names)]
        leader, leader_epoch, partition_epoch, isr = state[name]
        new_isr = [leader] if len(isr) > 1 else [leader] + [b for b in (1, 2, 3) if b != leader]
        r = client.call("AlterPartition", pb.AlterPartitionRequest(
            broker_id=leader, broker_epoch=epochs[leader], items=[pb.AlterPartitionItem(
                topic=name, partition=0, leader_epoch=leader_epoch, partition_epoch=partition_epoch,
                new_isr=new_isr)]))
        result = r.results[0]
        _check(result.error_code, f"alter ISR of {name}")
        state[name] = (leader, leader_epoch, result.partition_state.partition_epoch, list(result.partition_state.isr))

    # One partition per thread at a time: the CAS chain of a partition is sequential by nature.
    per_thread = max(1, min(threads, len(names)))
    _run_ops("AlterPartition (ISR CAS), concurrent", alter, min(ops, len(names)) * 2, per_thread)

    def heartbeat(i: int) -> None:
        b = 1 + i % 3
        r = client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(node_id=b, broker_epoch=epochs[b],
                                                                     current_metadata_version=1 << 40))
        _check(r.error_code, "heartbeat")

    _run_ops("BrokerHeartbeat (no state change)", heartbeat, ops * 2, threads)


def bench_failover(quorum: LocalQuorum, client: ControllerClient, rounds: int) -> None:
    elected: list[float] = []
    first_write: list[float] = []
    for round_no in range(rounds):
        old = quorum.active_id()
        killed_at = time.monotonic()
        quorum.kill(old, signal.SIGKILL)
        quorum.active_id(timeout_s=30, exclude={old})
        elected.append(time.monotonic() - killed_at)
        r = client.call("CreateTopics", pb.CreateTopicsRequest(
            topics=[pb.CreatableTopic(name=f"failover-{round_no}", num_partitions=1, replication_factor=2)]))
        _check(r.results[0].error_code, "write after failover")
        first_write.append(time.monotonic() - killed_at)
        quorum.start_node(old)
        _wait_caught_up(client)
    print(f"controller failover (kill -9 of the active one, {rounds} rounds): new controller active in "
          f"median {statistics.median(elected):.2f}s (min {min(elected):.2f}, max {max(elected):.2f}); "
          f"first write committed in median {statistics.median(first_write):.2f}s (max {max(first_write):.2f})")


def _wait_caught_up(client: ControllerClient, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        q = client.call("DescribeQuorum", pb.DescribeQuorumRequest())
        if all(v.connected and v.lag == 0 for v in q.voters):
            return
        time.sleep(0.1)
    raise SystemExit("the restarted controller did not catch up")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Brook metadata quorum benchmark (3 local controller processes)")
    parser.add_argument("--ops", type=int, default=500, help="operations per measurement")
    parser.add_argument("--threads", type=int, default=8, help="client threads for the concurrent runs")
    parser.add_argument("--failovers", type=int, default=3, help="kill -9 rounds")
    parser.add_argument("--dir", type=Path, default=None, help="data directory (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="brook-quorum-bench-") as tmp:
        base = args.dir or Path(tmp)
        quorum = LocalQuorum(base, extra_args=["--session-timeout-ms", "600000"])
        quorum.start()
        try:
            with quorum.client(timeout_s=30) as client:
                epochs = _register(client, quorum.cluster_id)
                print(f"3 controller processes (encrypted quorum), data in {base}")
                bench_ops(client, epochs, args.ops, args.threads)
                if args.failovers > 0:
                    bench_failover(quorum, client, args.failovers)
        finally:
            quorum.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
