"""brook-server signals on a real cluster: SIGTERM is a controlled shutdown (leaderships move away,
exit 0); a second signal exits at once (exit 3) and the node restarts with its acknowledged data."""

from __future__ import annotations

import signal
import time

import pytest

from client.cluster import ClusterClient
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

TOPIC = "signals"


def leaders(bootstrap: str) -> dict[int, int]:
    with ClusterClient(bootstrap) as cc:
        return {p: m.leader for p, m in cc.metadata([TOPIC], refresh=True).topics[TOPIC].partitions.items()}


def wait_exit(cluster: LocalCluster, node_id: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = cluster.returncode(node_id)
        if code is not None:
            return code
        time.sleep(0.05)
    raise AssertionError(f"node {node_id} still running after {timeout_s} s")


def count_records(bootstrap: str, partitions: int) -> int:
    consumer = Consumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        got = 0
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            got += sum(len(rs) for rs in consumer.poll(timeout_ms=300).values())
        return got
    finally:
        consumer.close()


def test_sigterm_moves_leaderships_then_second_signal_exits_at_once(ops_cluster: LocalCluster, brook) -> None:
    assert brook("topic", "create", TOPIC, "-p", "6", "-r", "3").code == 0
    with Producer(bootstrap_servers=ops_cluster.bootstrap_servers, acks="all") as producer:
        for i in range(60):
            producer.send(TOPIC, b"v%d" % i, key=b"k%d" % i)
        producer.flush(30)
    victim = 2
    assert victim in leaders(ops_cluster.bootstrap_servers).values()

    # One SIGTERM: controlled shutdown; the victim's partitions get other leaders, none goes offline.
    ops_cluster.kill_node(victim, signal.SIGTERM)
    assert wait_exit(ops_cluster, victim, 60) == 0
    after = leaders(ops_cluster.bootstrap_servers)
    assert victim not in after.values() and all(leader >= 0 for leader in after.values()), after
    log = ops_cluster.node_log(victim).read_text()
    assert "controlled shutdown complete" in log and f"node {victim} stopped" in log, log[-3000:]

    # Two signals in a row: the second one exits at once, without waiting for the controlled stop.
    ops_cluster.start_node(victim)
    ops_cluster.wait_ready(90)
    ops_cluster.kill_node(victim, signal.SIGTERM)
    ops_cluster.kill_node(victim, signal.SIGINT)
    assert wait_exit(ops_cluster, victim, 30) == 3
    assert "exiting now" in ops_cluster.node_log(victim).read_text()

    # Storage is crash-safe: the node comes back and every acknowledged record is still there.
    ops_cluster.start_node(victim)
    ops_cluster.wait_ready(90)
    assert count_records(ops_cluster.bootstrap_servers, 6) == 60
