"""poll(timeout) and close(timeout) keep to their timeouts when no broker answers.

Kafka's poll(Duration) returns when its timeout says whatever the cluster does (KIP-266), and
close(Duration) gives up on what is unsent when its timeout runs out: an application's poll
loop must stay able to notice a shutdown flag, and its shutdown must not hang on a dead
cluster. Brook's consumer used to retry the coordinator lookup for the whole rebalance timeout
(a poll(500 ms) was still blocked after 200 s) and the position lookup for request.timeout.ms
(30 s, then an exception); a producer's close(timeout=1) waited out its InitProducerId retries
(6 s). Real sockets: a port nothing listens on (refused at once) and a socket that accepts
connections and never answers (what a SIGSTOPped broker looks like to a client).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from waiting import wait_for

from client import errors
from client.accumulator import estimate_record_bytes
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition

POLL_MS = 300
# Each poll may overrun its timeout by one short attempt (a 50 ms RPC floor per address); this
# bound is generous for a loaded CI machine and far below what the old code took (30-300 s).
POLL_BOUND_S = 3.0


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """host:port of a socket that completes TCP handshakes (the kernel's backlog) and never reads."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    try:
        yield f"127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


@pytest.fixture
def refused_address() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # bound, never listened: connections to it are refused
    return f"127.0.0.1:{port}"


def _polls_return_in_time(consumer: Consumer) -> None:
    for i in range(3):
        started = time.monotonic()
        records = consumer.poll(timeout_ms=POLL_MS)
        took = time.monotonic() - started
        assert records == {}, records
        assert took < POLL_BOUND_S, f"poll #{i + 1} of {POLL_MS} ms took {took:.1f} s"


@pytest.mark.parametrize("where", ["refused", "silent"])
def test_a_group_consumers_poll_returns_when_no_broker_answers(where: str, request: pytest.FixtureRequest) -> None:
    address = request.getfixturevalue("refused_address" if where == "refused" else "silent_broker")
    consumer = Consumer(bootstrap_servers=address, group_id="g", request_timeout_ms=30_000)
    try:
        consumer.subscribe(["t"])
        _polls_return_in_time(consumer)
    finally:
        consumer.close(autocommit=False, timeout_ms=1000)


@pytest.mark.parametrize("where", ["refused", "silent"])
def test_an_assigned_consumers_poll_returns_when_no_broker_answers(where: str,
                                                                    request: pytest.FixtureRequest) -> None:
    # No group: the position comes from auto.offset.reset, a ListOffsets no broker answers.
    address = request.getfixturevalue("refused_address" if where == "refused" else "silent_broker")
    consumer = Consumer(bootstrap_servers=address, auto_offset_reset="earliest", request_timeout_ms=30_000)
    try:
        consumer.assign([TopicPartition("t", 0)])
        _polls_return_in_time(consumer)
        # position() is not a poll: it still waits request.timeout.ms for an answer and raises.
    finally:
        consumer.close(autocommit=False, timeout_ms=1000)


def test_a_producers_close_keeps_to_its_timeout_while_no_broker_answers(silent_broker: str) -> None:
    producer = Producer(bootstrap_servers=silent_broker, max_block_ms=100, request_timeout_ms=30_000)
    # A record queued as send() queues it once it has the partition's metadata: the sender then
    # needs a producer id, from brokers that take connections and never answer.
    future = producer._accumulator.append(TopicPartition("t", 0), 1000, None, b"x", [],
                                          estimate_record_bytes(None, b"x", []))
    # The sender is in its InitProducerId retries once it has opened a channel for them.
    wait_for(lambda: producer.cluster._channels, 10, "the sender's InitProducerId to the silent broker")
    started = time.monotonic()
    producer.close(timeout=0.5)
    took = time.monotonic() - started
    assert took < POLL_BOUND_S, f"close(timeout=0.5) took {took:.1f} s"
    with pytest.raises(errors.ProducerClosedError):
        future.result(timeout=1)
