"""A scrape after real traffic shows every metric family, with values that match what was done."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pytest
from opskit import describe, sample_values
from waiting import wait_for

from client.cluster import ClusterClient
from client.consumer import Consumer
from client.producer import Producer
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

TOPIC = "metered"
RECORDS = 40
GROUP = "metered-group"


def scrape_all(cluster: LocalCluster) -> dict[int, str]:
    pages = {}
    for node_id in cluster.node_ids:
        if cluster.is_running(node_id) and not cluster.is_paused(node_id):
            with urllib.request.urlopen(cluster.metrics_url(node_id), timeout=5) as resp:
                pages[node_id] = resp.read().decode()
    return pages


def _samples(text: str, name: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def total(pages: dict[int, str], name: str, **labels: str) -> float:
    return sum(sum(sample_values(text, name, **labels)) for text in pages.values())


def eventually(cluster: LocalCluster, check: Callable[[dict[int, str]], bool], what: str,
               timeout_s: float = 30.0) -> dict[int, str]:
    """Scrape until ``check(pages)`` holds: stats are read at scrape time and some lag the traffic."""
    def scraped() -> dict[int, str] | None:
        pages = scrape_all(cluster)
        return pages if check(pages) else None
    return wait_for(scraped, timeout_s, f"metrics showing {what}", poll_s=0.3)


@pytest.fixture(scope="module")
def traffic(ops_cluster: LocalCluster, brook_module) -> dict[str, int]:
    brook_module("topic", "create", TOPIC, "-p", "3", "-r", "3", "--if-not-exists")
    value_bytes = 0
    with Producer(bootstrap_servers=ops_cluster.bootstrap_servers, acks="all") as producer:
        futures = []
        for i in range(RECORDS):
            value = f"value-{i:04d}".encode()
            value_bytes += len(value)
            futures.append(producer.send(TOPIC, value, key=f"k{i % 7}".encode()))
        producer.flush(30)
        for f in futures:
            f.result(30)
    consumer = Consumer(bootstrap_servers=ops_cluster.bootstrap_servers, group_id=GROUP,
                        auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        consumer.subscribe([TOPIC])
        got = 0
        deadline = time.monotonic() + 60
        while got < RECORDS and time.monotonic() < deadline:
            got += sum(len(rs) for rs in consumer.poll(timeout_ms=500).values())
        assert got == RECORDS, f"consumed {got} of {RECORDS}"
        consumer.commit()
    finally:
        consumer.close()
    return {"records": RECORDS, "value_bytes": value_bytes}


@pytest.fixture(scope="module")
def brook_module(ops_cluster: LocalCluster):
    from admin_cli.main import main as brook_main

    def run(*args: str) -> int:
        code = brook_main(["-b", ops_cluster.bootstrap_servers, "-o", "json", *args])
        assert code == 0, args
        return code

    return run


def test_traffic_families_match_what_was_done(ops_cluster: LocalCluster, traffic: dict[str, int]) -> None:
    n = traffic["records"]
    pages = eventually(ops_cluster, lambda p: total(p, "brook_topic_messages_in_total", topic=TOPIC) == n,
                       f"brook_topic_messages_in_total{{topic={TOPIC}}} == {n}")
    bytes_in = total(pages, "brook_topic_bytes_in_total", topic=TOPIC)
    bytes_out = total(pages, "brook_topic_bytes_out_total", topic=TOPIC)
    assert bytes_in > traffic["value_bytes"], f"bytes in {bytes_in} <= payload {traffic['value_bytes']}"
    assert bytes_out >= bytes_in, f"every record was consumed once: bytes out {bytes_out} < bytes in {bytes_in}"
    # Each partition's replicas all reach the same end offset; the offsets add up to the records produced.
    ends = []
    for p in range(3):
        per_replica = [v for text in pages.values() for v in sample_values(text, "brook_log_end_offset",
                                                                          topic=TOPIC, partition=str(p))]
        assert len(per_replica) == 3, f"partition {p}: replicas reporting {describe(per_replica)}"
        ends.append(max(per_replica))
    assert sum(ends) == n, f"log end offsets {ends} do not add up to {n}"
    for p in range(3):
        sizes = [v for text in pages.values() for v in sample_values(text, "brook_log_size_bytes", topic=TOPIC,
                                                                    partition=str(p))]
        assert sizes and all(s > 0 for s in sizes) == (ends[p] > 0), f"partition {p} sizes {sizes}"
    # Leader and partition counts agree with the controller's view of the cluster.
    cluster_partitions = max(v for text in pages.values() for v in sample_values(text, "brook_cluster_partitions"))
    assert total(pages, "brook_leader_partitions") == cluster_partitions
    assert total(pages, "brook_partitions") >= 3 * 3
    assert total(pages, "brook_under_replicated_partitions") == 0
    assert total(pages, "brook_under_min_isr_partitions") == 0
    assert max(v for text in pages.values() for v in sample_values(text, "brook_offline_partitions")) == 0
    # Followers long-poll their leaders, so some of their fetches are parked at any moment; no
    # acks=all produce is left waiting once the traffic is acknowledged.
    delayed = "brook_purgatory_delayed_operations"
    pages = eventually(ops_cluster, lambda p: total(p, delayed, operation="follower_fetch") > 0
                       and total(p, delayed, operation="produce") == 0,
                       "parked follower fetches and no waiting produce")
    for node_id, text in pages.items():
        kinds = {k: sample_values(text, delayed, operation=k) for k in ("produce", "follower_fetch", "consumer_fetch")}
        assert all(len(v) == 1 for v in kinds.values()), f"node {node_id}: {kinds}"


def test_produce_local_and_remote_times(ops_cluster: LocalCluster, traffic: dict[str, int]) -> None:
    # Every produce request handled (a unary Produce or a ProduceStream message) records its local
    # time once; the traffic's acks=all requests their remote time.
    local, remote = "brook_produce_local_time_seconds", "brook_produce_remote_time_seconds"
    pages = eventually(ops_cluster, lambda p: total(p, f"{local}_count") == sum(
        total(p, "brook_rpc_requests_total", method=m) for m in ("Produce", "ProduceStream")),
        "a local time for every produce request handled")
    assert total(pages, f"{remote}_count") >= 1, "the traffic's acks=all produces recorded no remote time"
    assert total(pages, f"{remote}_count") <= total(pages, f"{local}_count")
    for node_id, text in pages.items():
        for name in (local, remote):
            count = sample_values(text, f"{name}_count")
            assert len(count) == 1 and sample_values(text, f"{name}_bucket", le="+Inf") == count, \
                f"node {node_id}: {name} count {count}"
            assert sample_values(text, f"{name}_sum")[0] >= 0


def test_event_loop_lag_raft_ticks_and_gc_pauses(ops_cluster: LocalCluster, traffic: dict[str, int]) -> None:
    # Each broker's loop is probed every 50 ms, so its lag histogram grows between two scrapes.
    lag = "brook_event_loop_lag_seconds"
    first = {n: sample_values(text, f"{lag}_count") for n, text in scrape_all(ops_cluster).items()}
    assert first and all(len(c) == 1 for c in first.values()), f"lag counts per node: {first}"
    pages = eventually(ops_cluster, lambda p: all(sample_values(p[n], f"{lag}_count")[0] > c[0]
                                                  for n, c in first.items() if n in p), "every broker loop probed again")
    for node_id, text in pages.items():
        count = sample_values(text, f"{lag}_count")
        assert sample_values(text, f"{lag}_bucket", le="+Inf") == count, f"node {node_id}: lag count {count}"
        stalls = sample_values(text, "brook_event_loop_stalls_total")
        assert len(stalls) == 1 and stalls[0] <= count[0], f"node {node_id}: stalls {stalls} of {count} probes"
        # A running Python process collects its youngest generation often; every generation is a series.
        gc_counts = {g: sample_values(text, "brook_gc_pause_seconds_count", generation=g) for g in "012"}
        assert all(len(v) == 1 for v in gc_counts.values()) and gc_counts["0"][0] > 0, \
            f"node {node_id}: GC pause counts {gc_counts}"
        # Every node is a controller here: its Raft tick thread ticks at least every ~50 ms.
        ticks = sample_values(text, "brook_raft_tick_gap_seconds_count")
        tick_stalls = sample_values(text, "brook_raft_tick_stalls_total")
        assert len(ticks) == 1 and ticks[0] > 0 and len(tick_stalls) == 1 and tick_stalls[0] <= ticks[0], \
            f"node {node_id}: {ticks} Raft ticks, {tick_stalls} stalls"
        # Each voter flushed its journal before it acknowledged the entries the traffic made.
        flushes = sample_values(text, "brook_raft_journal_flush_seconds_count")
        assert len(flushes) == 1 and flushes[0] > 0, f"node {node_id}: {flushes} Raft journal flushes"


def test_rpc_and_quorum_families(ops_cluster: LocalCluster, traffic: dict[str, int]) -> None:
    pages = scrape_all(ops_cluster)
    # Producers send on ProduceStream streams: each message is counted and timed, as a Produce was.
    assert total(pages, "brook_rpc_requests_total", method="ProduceStream", code="OK") >= 1
    assert total(pages, "brook_rpc_request_duration_seconds_count", method="ProduceStream") == \
        total(pages, "brook_rpc_requests_total", method="ProduceStream")
    # Consumers fetch on FetchStream streams: each message is counted and timed, as a Fetch was.
    assert total(pages, "brook_rpc_requests_total", method="FetchStream", code="OK") >= 1
    assert total(pages, "brook_rpc_request_duration_seconds_count", method="FetchStream") == \
        total(pages, "brook_rpc_requests_total", method="FetchStream")
    # Follower fetches travel on the brokers' replication listeners (the launcher opens one on each), not on
    # ReplicaFetch streams: each is counted there.
    assert total(pages, "brook_replication_fetches_total") >= 1
    assert total(pages, "brook_replication_connections") >= 1
    assert total(pages, "brook_rpc_requests_total", method="ReplicaFetch") == 0
    assert total(pages, "brook_rpc_requests_total", method="JoinGroup") >= 1
    assert total(pages, "brook_controller_active") == 1
    leaders = {v for text in pages.values() for v in sample_values(text, "brook_raft_leader_id")}
    active = [node for node, text in pages.items() if sample_values(text, "brook_controller_active") == [1.0]]
    assert leaders == {float(active[0])}, f"leader ids {leaders}, active {active}"
    voters = {int(v) for v in ops_cluster.controller_ids}
    connected = [(s.labels["voter"], s.value) for s in _samples(pages[active[0]], "brook_raft_voter_connected")]
    assert {int(v) for v, _ in connected} == voters and all(c == 1 for _, c in connected), connected
    assert all(sample_values(t, "brook_raft_voter_lag") == [] for n, t in pages.items() if n != active[0])
    assert all(sample_values(t, "brook_raft_term")[0] >= 1 for t in pages.values())
    assert all(sample_values(t, "brook_raft_commit_index")[0] > 0 for t in pages.values())
    assert max(v for t in pages.values() for v in sample_values(t, "brook_fenced_brokers")) == 0
    assert max(v for t in pages.values() for v in sample_values(t, "brook_cluster_brokers")) == 3
    for node_id, text in pages.items():
        free = sample_values(text, "brook_log_dir_free_bytes")
        cap = sample_values(text, "brook_log_dir_capacity_bytes")
        assert len(free) == 1 and 0 < free[0] <= cap[0], f"node {node_id}: free {free} capacity {cap}"


def test_every_page_is_valid_openmetrics_with_each_family_once(ops_cluster: LocalCluster,
                                                                traffic: dict[str, int]) -> None:
    """Prometheus asks for OpenMetrics, which allows a family once a page. A combined node has two roles whose
    collectors each gave the security families (and the gRPC connection bound's): its page was refused by a
    strict parser ("Clashing name")."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    for node_id in ops_cluster.node_ids:
        req = urllib.request.Request(ops_cluster.metrics_url(node_id),
                                     headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text"), resp.headers
            page = resp.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(page)}
        roles = {s.labels["role"] for s in families["brook_sasl_authentications"].samples}
        assert roles == {"controller", "broker"}, f"node {node_id}: roles {roles}"
        assert {s.labels["role"] for s in families["brook_grpc_connections_closed_per_ip"].samples} == roles


def test_group_families_and_lag(ops_cluster: LocalCluster, traffic: dict[str, int], brook_module) -> None:
    n = traffic["records"]
    pages = eventually(ops_cluster, lambda p: total(p, "brook_consumer_group_committed_offset", group=GROUP) == n,
                       f"committed offsets of {GROUP} adding up to {n}")
    assert total(pages, "brook_consumer_group_lag", group=GROUP) == 0
    assert total(pages, "brook_consumer_groups", state="Empty") >= 1
    brook_module("group", "seek", GROUP, "-t", TOPIC, "--to-earliest")
    # The coordinator refreshes end offsets periodically; lag follows the new commit.
    eventually(ops_cluster, lambda p: total(p, "brook_consumer_group_lag", group=GROUP, topic=TOPIC) == n,
               f"lag of {GROUP} == {n} after seeking to the beginning", timeout_s=40)


def test_isr_shrink_and_expand_are_counted(ops_cluster: LocalCluster, traffic: dict[str, int]) -> None:
    """Pause a follower past replica.lag.time.max.ms: leaders shrink the ISR; resume: it expands back."""
    pages = scrape_all(ops_cluster)
    shrinks0 = total(pages, "brook_isr_shrinks_total")
    expands0 = total(pages, "brook_isr_expands_total")
    active = [node for node, text in pages.items() if sample_values(text, "brook_controller_active") == [1.0]][0]
    victim = next(i for i in ops_cluster.broker_ids if i != active)
    with ClusterClient(ops_cluster.bootstrap_servers) as cc:
        parts = cc.metadata([TOPIC], refresh=True).topics[TOPIC].partitions
    followed = [p for p, m in parts.items() if m.leader != victim and victim in m.replicas]
    assert followed, f"node {victim} follows no partition of {TOPIC}: {parts}"
    # A write while the victim is paused makes its lag real (an idle follower is never out of sync).
    ops_cluster.pause_node(victim)
    try:
        with Producer(bootstrap_servers=ops_cluster.bootstrap_servers, acks="1") as producer:
            for p in followed:
                producer.send(TOPIC, b"while-paused", partition=p)
            producer.flush(20)
        eventually(ops_cluster, lambda p: total(p, "brook_isr_shrinks_total") > shrinks0
                   and total(p, "brook_under_replicated_partitions") > 0,
                   "an ISR shrink while a follower is paused", timeout_s=30)
    finally:
        ops_cluster.resume_node(victim)
    eventually(ops_cluster, lambda p: total(p, "brook_isr_expands_total") > expands0
               and total(p, "brook_under_replicated_partitions") == 0,
               "the ISR expanding back after resume", timeout_s=45)
    ops_cluster.wait_ready(60)
