"""No client can stall a broker (real broker processes, real sockets).

1. One client sends 1,100 long-poll fetches to one broker: 1,000 (its
   ``max.waiting.fetches.per.ip``) park, holding no thread; the rest are refused at once
   with RESOURCE_EXHAUSTED, which the client library reads as a retriable throttle. Meanwhile
   a second client's Metadata, zero-wait Fetch, ListGroups and the gRPC health check answer
   within a liveness bound, acks=all produces still commit (replication runs on its own
   capacity) and every ISR stays full. One append then wakes all 1,000 parked polls.
2. Fetches asking for max_bytes=2^31-1 over a ~96 MB partition get at most the broker's
   ``fetch.max.bytes`` (lowered to 4 MiB), sixteen of them at once keep the broker's
   resident memory bounded (``queued.max.request.bytes``, lowered to 8 MiB): a memory bound
   read from /proc, not a speed assert; and a consumer still reads the whole partition.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from brokerkit import FAST_FAILURE_DETECTION, Kit, make_batch, running_kit
from waiting import wait_for

from client.cluster import rpc_error
from deploy.local.cluster import check_health
from deploy.local.cluster import rss_bytes as process_rss_bytes
from proto import broker_pb2, broker_pb2_grpc, controller_pb2, group_pb2, group_pb2_grpc
from proto.errors import ErrorCode
from storage.record_batch import RecordBatchBuilder, iter_batches

pytestmark = pytest.mark.slow

LIVENESS_BOUND_S = 10.0  # generous: a liveness bound on a loaded machine, not a speed assert (main stalled ~150 s)
WAITING_MAX = 1000
FLOOD = 1100
FLOOD_HOLD_S = 3 * int(FAST_FAILURE_DETECTION["replica.lag.time.max.ms"]) / 1000
POLL_WAIT_MS = 60_000  # the broker's longest long poll (MAX_FETCH_WAIT_MS)
# A parked poll answers empty once POLL_WAIT_MS pass; "all still parked" is only checked
# well within that, so a very slow machine cannot make the test fail spuriously.
PARKED_CHECK_WITHIN_S = POLL_WAIT_MS / 1000 * 0.75
# What a client reads when gRPC core cancels a call the server never picked up in time.
UNREQUESTED_CANCEL_DETAILS = "CANCELLED"


def fetch_req(topic: str, partition: int, offset: int, *, max_wait_ms: int, min_bytes: int,
              max_bytes: int = 1 << 20, partition_max_bytes: int = 1 << 20) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(
        replica_id=-1, replica_epoch=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
        partitions=[broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset,
                                              partition_max_bytes=partition_max_bytes, current_leader_epoch=-1,
                                              last_fetched_epoch=-1, log_start_offset=-1)])


# ---------------------------------------------------------------------------- 1. long-poll flood


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    base: Path = tmp_path_factory.mktemp("isolation-cluster")
    # The flood's polls share one connection: let it open them all at once (the default, 100 streams
    # a connection, would hold the rest in the client), so the per-address bound is what meets them.
    overrides = {**FAST_FAILURE_DETECTION, "max.waiting.fetches.per.ip": str(WAITING_MAX),
                 "max.streams.per.connection": str(FLOOD)}
    with running_kit(base, nodes=3, overrides=overrides) as k:
        yield k


def full_isr_everywhere(kit: Kit) -> list[str]:
    """Partitions whose ISR is not all their replicas (empty when every ISR is full)."""
    resp = kit.cc.call("DescribeCluster", controller_pb2.DescribeClusterRequest())
    return [f"{p.topic}-{p.partition} isr={list(p.isr)} replicas={list(p.replicas)}"
            for p in resp.partitions if len(p.isr) != len(p.replicas)]


def refused_in_metrics(kit: Kit, node: int) -> float:
    """brook_rpc_requests_total{method="Fetch",code="RESOURCE_EXHAUSTED"} from the node's /metrics."""
    with urllib.request.urlopen(kit.cluster.metrics_url(node), timeout=LIVENESS_BOUND_S) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("brook_rpc_requests_total{") and 'method="Fetch"' in line \
                and 'code="RESOURCE_EXHAUSTED"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def second_client_round(address: str, kit: Kit, topic: str, node: int) -> None:
    """What another client needs from the flooded broker, each bounded by LIVENESS_BOUND_S."""
    with grpc.insecure_channel(address) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        md = stub.Metadata(broker_pb2.MetadataRequest(topics=[topic]), timeout=LIVENESS_BOUND_S)
        assert md.topics[0].error_code == ErrorCode.NONE, md
        f = stub.Fetch(fetch_req(topic, 1, 0, max_wait_ms=0, min_bytes=0), timeout=LIVENESS_BOUND_S)
        assert f.partitions[0].error_code == ErrorCode.NONE, f
        groups = group_pb2_grpc.GroupCoordinatorServiceStub(ch).ListGroups(
            group_pb2.ListGroupsRequest(), timeout=LIVENESS_BOUND_S)
        assert groups is not None
    assert check_health(address, timeout_s=LIVENESS_BOUND_S) == "SERVING"
    # acks=all needs both followers' fetches served by the flooded leader's replication capacity.
    r = kit.produce(topic, 1, make_batch(b"during-flood"), acks=-1, timeout_ms=int(LIVENESS_BOUND_S * 1000),
                    node_id=node)
    assert r.error_code == ErrorCode.NONE, r


def test_long_poll_flood_does_not_stall_the_broker(kit: Kit) -> None:
    topic = "flood"
    # Both partitions led by the same broker, so the flood and the second client meet there.
    kit.create_topic(topic, partitions=2, rf=3, assignments=[[1, 2, 3], [1, 2, 3]])
    node = kit.leader(topic, 0)
    address = kit.cluster.broker_address(node)
    flood_channel = grpc.insecure_channel(address)
    try:
        stub = broker_pb2_grpc.BrokerServiceStub(flood_channel)
        req = fetch_req(topic, 0, 0, max_wait_ms=POLL_WAIT_MS, min_bytes=1)
        started = time.monotonic()
        polls = [stub.Fetch.future(req, timeout=120) for _ in range(FLOOD)]

        def refused() -> list[grpc.RpcError]:
            return [p.exception() for p in polls if p.done() and p.exception() is not None]
        wait_for(lambda: len(refused()) >= FLOOD - WAITING_MAX, 60,
                 lambda: f"{FLOOD - WAITING_MAX} polls refused (refused {len(refused())})")
        shed = 0
        for exc in refused():
            err = rpc_error(exc, "Fetch")
            if exc.code() == grpc.StatusCode.CANCELLED and exc.details() == UNREQUESTED_CANCEL_DETAILS:
                # gRPC itself cancels a call the broker's loop has not picked up within 30 s
                # (server_max_unrequested_time_in_server): only on a machine so loaded that the
                # loop took that long over the flood. Brook's client retries it as a network error.
                shed += 1
                assert err.code == ErrorCode.NETWORK_EXCEPTION and err.retriable, err
                continue
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            assert err.code == ErrorCode.THROTTLING_QUOTA_EXCEEDED and err.retriable, err
        assert len(refused()) == FLOOD - WAITING_MAX, "only the polls past the bound may be refused"
        assert refused_in_metrics(kit, node) + shed >= FLOOD - WAITING_MAX, \
            f"refusals must show in brook_rpc_requests_total ({shed} shed by gRPC before the broker saw them)"

        # The flood holds for several replica.lag.time.max.ms: a stalled broker would shrink its ISRs.
        until = time.monotonic() + FLOOD_HOLD_S
        while time.monotonic() < until:
            second_client_round(address, kit, topic, node)
        assert full_isr_everywhere(kit) == [], "a follower fell out of the ISR during the flood"

        # One append to the watched partition wakes every parked poll, each with the record.
        parked = [p for p in polls if not p.done()]
        if time.monotonic() - started < PARKED_CHECK_WITHIN_S:
            assert len(parked) == WAITING_MAX, "parked polls answered with nothing to read"
        assert kit.produce(topic, 0, make_batch(b"wake"), acks=-1, node_id=node).error_code == ErrorCode.NONE
        wait_for(lambda: all(p.done() for p in polls), 120, "every parked poll answered after the append")
        woken = [p.result() for p in parked]
        assert woken and all(r.partitions[0].error_code == ErrorCode.NONE and r.partitions[0].records
                             for r in woken), "a parked poll answered without the appended record"
    finally:
        flood_channel.close()


# ---------------------------------------------------------------------------- 2. byte caps


FETCH_CAP = 4 << 20
BUDGET = 8 << 20
BATCH_VALUE = 64 << 10
BATCH_RECORDS = 15  # 960 KiB batches: under the default max.message.bytes (1 MiB + 12)
PARTITION_MB = 96
CONCURRENT_FETCHES = 16
# Without the caps each fetch would read the whole partition (~96 MB, copied ~3 times on its
# way out): sixteen at once would add gigabytes. With them, the budget (8 MiB) bounds what
# all sixteen hold; allow generously for copies, gRPC buffers and allocator slack.
RSS_GROWTH_MAX_BYTES = 250 << 20


def rss_bytes(pid: int) -> int:
    rss = process_rss_bytes(pid)
    assert rss is not None, f"no VmRSS for pid {pid}"
    return rss


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    base: Path = tmp_path_factory.mktemp("capped-cluster")
    overrides = {"fetch.max.bytes": str(FETCH_CAP), "fetch.partition.max.bytes": str(FETCH_CAP),
                 "queued.max.request.bytes": str(BUDGET)}
    with running_kit(base, nodes=1, overrides=overrides) as k:
        yield k


def big_batch() -> bytes:
    b = RecordBatchBuilder()
    ts = int(time.time() * 1000)
    for _ in range(BATCH_RECORDS):
        b.append(ts, None, os.urandom(BATCH_VALUE))
    return b.build()


def test_huge_max_bytes_fetches_are_capped_and_memory_stays_bounded(capped: Kit) -> None:
    topic = "big"
    capped.create_topic(topic, partitions=1, rf=1)
    node = capped.leader(topic, 0)
    batch_bytes = 0
    while batch_bytes < PARTITION_MB << 20:
        r = capped.produce(topic, 0, big_batch(), acks=1, timeout_ms=30_000, node_id=node)
        assert r.error_code == ErrorCode.NONE, r
        batch_bytes += BATCH_VALUE * BATCH_RECORDS
    pid = capped.cluster.pid(node)
    assert pid is not None
    baseline = rss_bytes(pid)
    peak = [baseline]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.02):
            peak[0] = max(peak[0], rss_bytes(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    huge = (1 << 31) - 1
    with grpc.insecure_channel(capped.cluster.broker_address(node),
                               options=[("grpc.max_receive_message_length", -1)]) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        try:
            for _round in range(3):
                calls = [stub.Fetch.future(fetch_req(topic, 0, 0, max_wait_ms=0, min_bytes=0, max_bytes=huge,
                                                     partition_max_bytes=huge), timeout=120)
                         for _ in range(CONCURRENT_FETCHES)]
                for c in calls:
                    p = c.result().partitions[0]
                    assert p.error_code == ErrorCode.NONE, p
                    assert 0 < len(p.records) <= FETCH_CAP, len(p.records)
                    assert next(iter_batches(p.records))[1].base_offset == 0
        finally:
            sampling.set()
            sampler.join(5)
        growth = peak[0] - baseline
        assert growth < RSS_GROWTH_MAX_BYTES, f"RSS grew {growth >> 20} MiB (baseline {baseline >> 20} MiB)"

        # Capped responses still let a consumer read the whole partition, cap by cap.
        offset, hw = 0, -1
        for _ in range(10_000):
            p = stub.Fetch(fetch_req(topic, 0, offset, max_wait_ms=0, min_bytes=0, max_bytes=huge,
                                     partition_max_bytes=huge), timeout=60).partitions[0]
            assert p.error_code == ErrorCode.NONE and len(p.records) <= FETCH_CAP, p.error_code
            hw = p.high_watermark
            if not p.records:
                break
            *_, (_, last) = iter_batches(p.records)
            offset = last.next_offset
        assert offset == hw and hw == (batch_bytes // (BATCH_VALUE * BATCH_RECORDS)) * BATCH_RECORDS
