"""A consumer whose broker stalls (SIGSTOP) gives up the FetchStream fetch that is overdue and reads
again once the broker is back: a stream that never answers must not hold the consumer. And a
stream it no longer uses is closed, not left holding one of the broker's max.fetch.streams.

Real node process, real sockets, a real stall longer than the fetch may take.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from waiting import wait_for

from client import Consumer, Producer
from client.admin import Admin
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT_MS = 2000
FETCH_MAX_WAIT_MS = 500
STALL_S = 2 * (REQUEST_TIMEOUT_MS + FETCH_MAX_WAIT_MS) / 1000  # past the time a fetch may take
LIVENESS_S = 30.0  # reading again after the stall: generous on a loaded machine, not a speed assert


def produce(cluster: LocalCluster, values: list[bytes]) -> None:
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all") as p:
        for v in values:
            p.send("t", v, partition=0)
        p.flush(LIVENESS_S)


def test_a_consumer_whose_broker_stalls_reads_again_once_it_is_back(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", nodes=1) as cluster:
        with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
            admin.create_topic("t", 1, 1)
        produce(cluster, [b"before-%d" % i for i in range(5)])
        seen: list[bytes] = []
        with Consumer(bootstrap_servers=cluster.bootstrap_servers, enable_auto_commit=False,
                      request_timeout_ms=REQUEST_TIMEOUT_MS, fetch_max_wait_ms=FETCH_MAX_WAIT_MS) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            consumer.seek_to_beginning()

            def read(n: int) -> bool:
                seen.extend(r.value for rs in consumer.poll(timeout_ms=200).values() for r in rs)
                return len(seen) >= n
            wait_for(lambda: read(5), LIVENESS_S, lambda: f"the first records; read {seen}")
            stream = consumer._fetcher._streams.get(1)  # noqa: SLF001 - the consumer's FetchStream to broker 1
            assert stream is not None, "the consumer does not fetch over a FetchStream"
            cluster.pause_node(1)
            try:
                stalled_until = time.monotonic() + STALL_S
                while time.monotonic() < stalled_until:  # the consumer keeps polling meanwhile
                    consumer.poll(timeout_ms=200)
            finally:
                cluster.resume_node(1)
            produce(cluster, [b"after-%d" % i for i in range(5)])
            wait_for(lambda: read(10), LIVENESS_S, lambda: f"the records sent after the stall; read {seen}")
            # The fetch parked when the broker stopped was given up with its stream (overdue), not
            # waited for: the records after the stall came over a new stream.
            assert consumer._fetcher._streams.get(1) is not stream, "the stalled stream was kept"  # noqa: SLF001
            assert not stream.answering(), "the stalled stream is still open"
        assert seen == [b"before-%d" % i for i in range(5)] + [b"after-%d" % i for i in range(5)], seen


def streams_open(cluster: LocalCluster) -> float:
    for line in cluster.read_metrics(1).splitlines():
        if line.startswith("brook_request_streams_open "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no brook_request_streams_open on the broker's /metrics")


def test_a_fetch_stream_the_consumer_no_longer_uses_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from client import streams

    monkeypatch.setattr(streams, "STREAM_MAX_AGE_S", 1.0)  # instead of a minute
    with LocalCluster(tmp_path / "c", nodes=1) as cluster:
        with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
            admin.create_topic("t", 1, 1)
        produce(cluster, [b"v-%d" % i for i in range(3)])
        tp = TopicPartition("t", 0)
        with Consumer(bootstrap_servers=cluster.bootstrap_servers, enable_auto_commit=False) as consumer:
            consumer.assign([tp])
            consumer.seek_to_beginning()
            seen: list[bytes] = []
            wait_for(lambda: seen.extend(r.value for rs in consumer.poll(timeout_ms=200).values() for r in rs)
                     or len(seen) >= 3, LIVENESS_S, lambda: f"the records; read {seen}")
            assert streams_open(cluster) == 1, "the consumer's FetchStream is not open"
            consumer.pause(tp)  # nothing to fetch from the broker any more (as after a leader moved away)
            wait_for(lambda: consumer.poll(timeout_ms=100) is not None and streams_open(cluster) == 0, LIVENESS_S,
                     lambda: f"the unused stream to close; {streams_open(cluster)} streams open on the broker")
