"""brook-server signals on a real cluster: SIGTERM is a controlled shutdown (leaderships move away,
exit 0); a second signal exits at once (exit 3) and the node restarts with its acknowledged data.

The double-signal half must not depend on timing: a node that leads nothing can finish its
controlled shutdown before the second signal lands (and then rightly exits 0). So the victim
first leads partitions again, and its two peers are paused (SIGSTOP) while it stops: without
a quorum its controlled shutdown cannot finish (it waits up to controlled.shutdown.timeout.ms),
so the second signal, sent once the node logs that its controlled shutdown began, always
arrives while that shutdown is still in progress."""

from __future__ import annotations

import signal
import time

import pytest
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.cluster import ClusterClient
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

TOPIC = "signals"
LED = "signals-led"  # pinned so that the restarted victim leads it


def leaders(bootstrap: str, topic: str = TOPIC) -> dict[int, int]:
    with ClusterClient(bootstrap) as cc:
        return {p: m.leader for p, m in cc.metadata([topic], refresh=True).topics[topic].partitions.items()}


def wait_exit(cluster: LocalCluster, node_id: int, timeout_s: float) -> int:
    # (code,): a truthy box, so that exit code 0 ends the wait too
    return wait_for(lambda: (code,) if (code := cluster.returncode(node_id)) is not None else None,
                    timeout_s, f"node {node_id} to exit")[0]


def count_records(bootstrap: str, partitions: int, topic: str = TOPIC) -> int:
    consumer = Consumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
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
    peers = [n for n in ops_cluster.broker_ids if n != victim]
    with Admin(ops_cluster.bootstrap_servers) as admin:  # the victim is every partition's preferred leader
        admin.create_topics([NewTopic(LED, replica_assignments=[[victim, *peers], [victim, *reversed(peers)]])])
    wait_for(lambda: set(leaders(ops_cluster.bootstrap_servers, LED).values()) == {victim}, 30,
             f"broker {victim} leading every partition of {LED}")
    with Producer(bootstrap_servers=ops_cluster.bootstrap_servers, acks="all") as producer:
        for i in range(20):
            producer.send(LED, b"w%d" % i, partition=i % 2)
        producer.flush(30)
    node_log = ops_cluster.node_log(victim)
    log_start = node_log.stat().st_size
    begun = f"broker {victim}: controlled shutdown"

    def new_log() -> str:
        with node_log.open("rb") as f:
            f.seek(log_start)
            return f.read().decode(errors="replace")

    for peer in peers:  # no quorum: the victim's controlled shutdown cannot complete
        ops_cluster.pause_node(peer)
    try:
        ops_cluster.kill_node(victim, signal.SIGTERM)
        wait_for(lambda: begun in new_log(), 15, f"{begun!r} in the victim's log")
        ops_cluster.kill_node(victim, signal.SIGINT)
        code = wait_exit(ops_cluster, victim, 30)
    finally:
        for peer in peers:
            ops_cluster.resume_node(peer)
    text = new_log()
    assert code == 3, f"exit code {code} after a second signal; log:\n{text[-3000:]}"
    assert "exiting now" in text and "controlled shutdown complete" not in text, text[-3000:]

    # Storage is crash-safe: the node comes back and every acknowledged record is still there.
    ops_cluster.start_node(victim)
    ops_cluster.wait_ready(90)
    assert count_records(ops_cluster.bootstrap_servers, 6) == 60
    assert count_records(ops_cluster.bootstrap_servers, 2, LED) == 20
    with Admin(ops_cluster.bootstrap_servers) as admin:
        admin.delete_topics([LED])


def test_a_node_whose_quorum_is_gone_stops_without_waiting_out_the_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The other two nodes of a combined cluster are gone (stopped first, or crashed): the last one's
    controlled shutdown can reach no controller. Its own controller sees no majority, so it gives the
    shutdown up (and exits 0) instead of waiting out a minute of controlled.shutdown.timeout.ms."""
    cluster = LocalCluster(tmp_path / "cluster", nodes=3, mode="combined",
                           overrides={"controlled.shutdown.timeout.ms": "60000"})
    try:
        cluster.start()
        cluster.wait_ready(90)
        for gone in (2, 3):
            cluster.kill_node(gone)
        cluster.kill_node(1, signal.SIGTERM)
        code = wait_exit(cluster, 1, 90)
        text = cluster.node_log(1).read_text()
        assert code == 0, f"exit code {code}; log:\n{text[-3000:]}"
        assert "controlled shutdown given up" in text and "did not finish" not in text, text[-3000:]
    finally:
        cluster.teardown()


def test_a_broker_only_node_whose_controllers_lost_their_majority_stops_without_waiting_out_the_timeout(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Split roles: two of the three controllers are gone (the third is up but leads nothing) when the
    broker is told to stop. The broker has no controller of its own to ask; its DescribeQuorum probes
    find no controller that knows a leader, so it gives its controlled shutdown up (exit 0) instead of
    waiting out a minute of controlled.shutdown.timeout.ms."""
    cluster = LocalCluster(tmp_path / "cluster", nodes=1, mode="split", controllers=3,
                           overrides={"controlled.shutdown.timeout.ms": "60000"})
    try:
        cluster.start()
        cluster.wait_ready(90)
        with Admin(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("led", 2, 1)])  # leaderships for the shutdown to move
        for gone in cluster.controller_ids[:2]:
            cluster.kill_node(gone)
        cluster.kill_node(1, signal.SIGTERM)
        code = wait_exit(cluster, 1, 90)
        text = cluster.node_log(1).read_text()
        assert code == 0, f"exit code {code}; log:\n{text[-3000:]}"
        assert "controlled shutdown given up: no controller has answered with a leader known" in text, text[-3000:]
        assert "did not finish" not in text, text[-3000:]
    finally:
        cluster.teardown()
