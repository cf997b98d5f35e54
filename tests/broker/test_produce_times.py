"""A leader splits each produce request's time as Kafka's RequestMetrics do: local and remote.

*local* is the leader's own work (the appends), recorded for every produce; *remote* is an
acks=all request's wait for its in-sync followers, from the appends until the HW passes them.
The histograms are exported as ``brook_produce_local_time_seconds`` and
``brook_produce_remote_time_seconds`` (tests/ops/test_metrics_e2e.py scrapes them from a real
cluster). Real BrokerService, ReplicaManager, Log and purgatories; the follower's fetches are
made through the ReplicaManager as the ReplicaFetch handler makes them.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import InProcessBroker
from waiting import await_for

from broker.metrics import _produce_time_families
from broker.request_times import LatencyHistogram, ProduceTimes
from proto import broker_pb2
from storage.record_batch import RecordBatchBuilder

FOLLOWER_DELAY_S = 0.2  # the follower acknowledges no sooner than this after the produce's append


class Leader(InProcessBroker):
    """Broker 1 leading t-0 with broker 2 as an in-sync follower (which fetches only when told)."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path, {"t": {}}, replicas=(1, 2))

    async def follower_fetch(self, offset: int) -> broker_pb2.FetchResponse:
        req = broker_pb2.FetchRequest(replica_id=2, replica_epoch=1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                                      partitions=[broker_pb2.FetchPartition(
                                          topic="t", partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
                                          current_leader_epoch=0, last_fetched_epoch=0, log_start_offset=0)])
        return (await self.service._fetch(req, None)).to_message()


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    with Leader(tmp_path) as b:
        yield b


def produce_request(acks: int, timeout_ms: int = 30_000) -> broker_pb2.ProduceRequest:
    b = RecordBatchBuilder()
    b.append(0, None, b"v")
    return broker_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms, partitions=[
        broker_pb2.ProducePartitionData(topic="t", partition=0, records=b.build())])


def counts(times: ProduceTimes) -> tuple[int, int]:
    return times.local.snapshot()[2], times.remote.snapshot()[2]


def test_remote_time_is_the_wait_for_the_followers_acknowledgement(leader: Leader) -> None:
    times = leader.rm.produce_times

    async def scenario() -> broker_pb2.ProduceResponse:
        produced = asyncio.ensure_future(leader.service._produce(produce_request(acks=-1)))
        # The delay counts from the append (where the remote time starts), not from the request: the
        # append itself may take longer than the follower's two fetches.
        await await_for(lambda: counts(times) != (0, 0), 10, "the produce's append")
        await asyncio.sleep(FOLLOWER_DELAY_S)
        assert not produced.done(), "acks=all must wait for follower 2"
        assert counts(times) == (1, 0), f"appended, not yet acknowledged: (local, remote) = {counts(times)}"
        fetched = await leader.follower_fetch(0)  # the follower copies the batch...
        assert fetched.partitions[0].records
        await leader.follower_fetch(1)  # ...and its next fetch acknowledges it: the HW passes the batch
        return await asyncio.wait_for(produced, 10)

    resp = asyncio.run(scenario())
    assert resp.partitions[0].error_code == 0 and resp.partitions[0].base_offset == 0, resp
    assert counts(times) == (1, 1)
    _, local_s, _ = times.local.snapshot()
    _, remote_s, _ = times.remote.snapshot()
    assert remote_s >= FOLLOWER_DELAY_S, f"remote time {remote_s} s is shorter than the follower's delay"
    assert local_s < remote_s, f"local {local_s} s: the follower's wait must not count as local work"


def test_acks_1_records_local_time_only_and_a_refused_request_nothing(leader: Leader) -> None:
    times = leader.rm.produce_times
    resp = asyncio.run(leader.service._produce(produce_request(acks=1)))
    assert resp.partitions[0].error_code == 0, resp
    assert counts(times) == (1, 0)
    resp = asyncio.run(leader.service._produce(produce_request(acks=2)))  # no such acks: refused before any append
    assert resp.partitions[0].error_code != 0, resp
    assert counts(times) == (1, 0)


def test_an_acks_all_request_that_times_out_records_its_whole_wait(leader: Leader) -> None:
    times = leader.rm.produce_times
    resp = asyncio.run(leader.service._produce(produce_request(acks=-1, timeout_ms=100)))  # the follower never fetches
    assert resp.partitions[0].error_code != 0, resp
    _, local_s, _ = times.local.snapshot()
    _, remote_s, count = times.remote.snapshot()
    # The timeout runs from the append, inside the local time: local and remote together cover it.
    assert count == 1 and local_s + remote_s >= 0.1, (count, local_s, remote_s)


def test_an_acks_all_timeout_leaves_asyncio_no_unretrieved_failure_to_log(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The leader reads each acks=all outcome from the append's own future; the loop-side copy it waited
    on must not be reported by asyncio ("Future exception was never retrieved", at ERROR) for each
    request the ISR did not acknowledge in time."""
    with Leader(tmp_path) as leader:
        resp = asyncio.run(leader.service._produce(produce_request(acks=-1, timeout_ms=100)))
    assert resp.partitions[0].error_code != 0, resp
    gc.collect()  # asyncio reports such a future when it is collected
    assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]


def test_histogram_buckets_are_upper_bounds_and_cumulative() -> None:
    h = LatencyHistogram((0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.002, 0.01, 5.0, -1.0):  # a bound belongs to its own bucket; negatives are 0
        h.observe(seconds)
    cumulative, total, count = h.snapshot()
    assert cumulative == [(0.001, 3), (0.01, 5), (0.1, 5), (float("inf"), 6)]
    assert count == 6 and total == pytest.approx(0.0005 + 0.001 + 0.002 + 0.01 + 5.0)


@pytest.mark.parametrize("bounds", [(), (0.1, 0.01), (0.1, 0.1)])
def test_histogram_refuses_bounds_that_are_not_increasing(bounds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        LatencyHistogram(bounds)


def test_histogram_counts_every_observation_from_many_threads() -> None:
    h = LatencyHistogram()
    per_thread, threads = 5_000, 4

    def observe() -> None:
        for i in range(per_thread):
            h.observe(i * 1e-6)
    workers = [threading.Thread(target=observe) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    cumulative, _, count = h.snapshot()
    assert count == per_thread * threads == cumulative[-1][1]


def test_exported_as_prometheus_histograms() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    times = ProduceTimes()
    times.local.observe(0.0003)
    times.remote.observe(0.004)
    times.remote.observe(0.02)

    class Collector:
        def collect(self) -> Iterator[Any]:
            yield from _produce_time_families(times)
    registry = CollectorRegistry()
    registry.register(Collector())
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    remote = {(s.name, s.labels.get("le")): s.value for s in families["brook_produce_remote_time_seconds"].samples}
    assert families["brook_produce_local_time_seconds"].type == "histogram"
    assert remote[("brook_produce_remote_time_seconds_bucket", "0.005")] == 1
    assert remote[("brook_produce_remote_time_seconds_bucket", "+Inf")] == 2
    assert remote[("brook_produce_remote_time_seconds_count", None)] == 2
    assert remote[("brook_produce_remote_time_seconds_sum", None)] == pytest.approx(0.024)
