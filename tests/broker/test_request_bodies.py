"""A client sending request bodies it never finishes holds a bounded part of a real broker, and no more.

Before, gRPC read every request whole before the broker could refuse it: one HTTP/2 connection
sending 100 Produce messages of 50 MiB took a broker from 76 MB to 1.3 GB. Now (broker/receiving.py)
a message is read only under one of its address's receive slots; the other calls are held by HTTP/2
flow control to 64 KiB each, and ProduceStreams and FetchStreams are bounded in number, their
producers and consumers falling back to unary calls.

Real broker process, real sockets; the attacker is a raw HTTP/2 client from 127.0.0.2 sending all
but the last byte of each message, the producers are Brook's own from 127.0.0.1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerkit import Kit, running_kit
from waiting import wait_for

from client import Consumer, Producer
from deploy.local.cluster import rss_bytes

pytest.importorskip("h2.connection")
from h2client import H2Sender  # noqa: E402  (after the skip: h2 is a test dependency)

pytestmark = pytest.mark.slow

MiB = 1 << 20
WINDOW = 65535
PER_IP = 2  # max.receiving.requests.per.ip
CALLS = 40
SIZE = 4 * MiB  # each call's message, under socket.request.max.bytes (8 MiB)
RECORDS = 2000
LIVENESS_S = 60.0  # generous on a loaded machine: not a speed assert


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    base: Path = tmp_path_factory.mktemp("request-bodies")
    # request.receive.timeout.ms far above what a test takes: the attacker's calls are held, not timed out.
    overrides = {"max.receiving.requests": "4", "max.receiving.requests.per.ip": str(PER_IP),
                 "max.produce.streams": "1", "max.fetch.streams": "1", "request.receive.timeout.ms": "300000"}
    with running_kit(base, nodes=1, overrides=overrides) as k:
        k.create_topic("t", partitions=1, rf=1)
        yield k


def gauges(kit: Kit) -> dict[str, float]:
    out = {}
    for line in kit.cluster.read_metrics(1).splitlines():
        name, _, value = line.partition(" ")
        if name.startswith(("brook_receiv", "brook_request_streams")):
            out[name] = float(value)
    return out


def produce_all(kit: Kit, what: str) -> None:
    """RECORDS records with acks=all from 127.0.0.1, every one acknowledged within LIVENESS_S."""
    with Producer(bootstrap_servers=kit.cluster.bootstrap_servers, acks="all", linger_ms=2,
                  request_timeout_ms=int(LIVENESS_S * 1000)) as p:
        futures = [p.send("t", b"%06d" % i) for i in range(RECORDS)]
        p.flush(LIVENESS_S)
        offsets = [f.get(timeout=LIVENESS_S).offset for f in futures]
    assert len(set(offsets)) == RECORDS, f"{what}: {len(set(offsets))} distinct offsets for {RECORDS} records"


def test_unary_calls_past_the_addresss_slots_are_held_to_their_window(kit: Kit) -> None:
    pid = kit.cluster.pid(1)
    assert pid is not None
    before = rss_bytes(pid) or 0
    port = int(kit.cluster.broker_address(1).rsplit(":", 1)[1])
    attacker = H2Sender(port, "/brook.BrokerService/Produce", CALLS, SIZE)
    try:
        sent = attacker.push_until_held(LIVENESS_S)
        bound = PER_IP * (SIZE + 5) + (CALLS - PER_IP) * WINDOW
        assert PER_IP * SIZE <= sent <= bound, f"the broker let the attacker send {sent} bytes; bound {bound}"
        g = wait_for(lambda: (g := gauges(kit))["brook_receiving_requests"] == PER_IP and g, 10,
                     lambda: f"the attacker's {PER_IP} calls to be receiving: {gauges(kit)}")
        assert g["brook_receive_waiting_requests"] == CALLS - PER_IP, g
        # Another address's producer is served meanwhile (its calls take the other slots).
        produce_all(kit, "while the attacker holds its slots")
        more = attacker.push(1.0)
        assert more == sent, f"the attacker's held calls were let send {more - sent} more bytes meanwhile"
        growth = (rss_bytes(pid) or 0) - before
        # The two messages being received and the allocator's slack; 160 MiB were declared.
        assert growth < 64 * MiB, f"broker RSS grew {growth / MiB:.0f} MiB"
    finally:
        attacker.close()
    wait_for(lambda: (g := gauges(kit))["brook_receiving_requests"] == 0 and
             g["brook_receive_waiting_requests"] == 0, 10,
             lambda: f"the closed connection's calls to give back their slots: {gauges(kit)}")


@contextlib.contextmanager
def the_only_stream_taken(kit: Kit, method: str) -> Iterator[None]:
    """An attacker holds the broker's one ``method`` stream (its first message never finishes) while the
    block runs; the client in it must have had its own stream refused."""
    port = int(kit.cluster.broker_address(1).rsplit(":", 1)[1])
    refused_before = gauges(kit)["brook_request_streams_refused_total"]
    holder = H2Sender(port, f"/brook.BrokerService/{method}", 1, SIZE)
    try:
        holder.push(0.5)
        wait_for(lambda: gauges(kit)["brook_request_streams_open"] == 1, 10,
                 lambda: f"the attacker's stream to be open: {gauges(kit)}")
        yield
        assert gauges(kit)["brook_request_streams_refused_total"] > refused_before, \
            f"the client's {method} was never refused: it did not test the fallback"
        assert not holder.ended, f"the attacker's stream ended: {holder.ended}"
    finally:
        holder.close()
    wait_for(lambda: gauges(kit)["brook_request_streams_open"] == 0, 10,
             lambda: f"the closed stream to be counted out: {gauges(kit)}")


def test_a_producer_finding_no_produce_stream_free_sends_unary_calls(kit: Kit) -> None:
    with the_only_stream_taken(kit, "ProduceStream"):
        produce_all(kit, "with every ProduceStream taken")


def test_a_consumer_finding_no_fetch_stream_free_sends_unary_calls(kit: Kit) -> None:
    produce_all(kit, "before the consumer reads")
    seen: list[bytes] = []
    with the_only_stream_taken(kit, "FetchStream"), \
            Consumer(bootstrap_servers=kit.cluster.bootstrap_servers, enable_auto_commit=False) as c:
        c.assign([("t", 0)])
        c.seek_to_beginning()
        wait_for(lambda: seen.extend(r.value for rs in c.poll(timeout_ms=200).values() for r in rs)
                 or len(seen) >= RECORDS, LIVENESS_S,
                 lambda: f"{len(seen)} of the {RECORDS} records read with every FetchStream taken")


def test_controller_calls_no_worker_has_taken_are_held_to_their_window(kit: Kit) -> None:
    """The controller's server (synchronous gRPC) reads a call's message when a worker takes the call;
    until then, with BDP probing off, the call is let send 64 KiB. Before, 300 calls of 1 MiB were
    let send all 300 MiB."""
    from metadata_quorum.node import GRPC_MAX_WORKERS

    _, port = kit.cluster.controller_endpoints[0]
    calls, size = 300, 1 * MiB
    attacker = H2Sender(port, "/brook.ControllerService/CreateTopics", calls, size)
    try:
        sent = attacker.push_until_held(LIVENESS_S)
        bound = GRPC_MAX_WORKERS * (size + 5) + (calls - GRPC_MAX_WORKERS) * WINDOW
        assert sent <= bound, f"the controller let the attacker send {sent / MiB:.0f} MiB; bound {bound / MiB:.0f}"
    finally:
        attacker.close()
    # The controller serves once the attacker is gone.
    kit.create_topic("after-controller-attack", partitions=1, rf=1)


def test_controller_calls_whose_messages_never_finish_cannot_take_its_workers(kit: Kit) -> None:
    """Before, 120 such calls from one client took every worker of the controller's server: no broker
    could heartbeat, no topic be created, for as long as the client liked."""
    from metadata_quorum.node import RECEIVE_TIMEOUT_S, RECEIVING_PER_CLIENT

    _, port = kit.cluster.controller_endpoints[0]
    calls = 120
    # Over two connections: one may have MAX_STREAMS_PER_CONNECTION (100) streams open.
    attackers = [H2Sender(port, "/brook.ControllerService/CreateTopics", calls // 2, 1000) for _ in range(2)]

    def ended() -> list[str]:
        return [status for a in attackers for status in a.ended.values()]

    def push(seconds: float) -> None:
        for a in attackers:
            a.push(seconds / len(attackers))
    try:
        push(1.0)
        refused = [status for status in ended() if status == "8"]  # RESOURCE_EXHAUSTED
        assert len(refused) >= calls - RECEIVING_PER_CLIENT, f"refused {len(refused)}: {ended()}"
        kit.create_topic("while-the-controller-is-attacked", partitions=1, rf=1)  # from 127.0.0.1
        wait_for(lambda: push(0.2) is None and len(ended()) == calls, RECEIVE_TIMEOUT_S + LIVENESS_S,
                 lambda: f"the held calls to be cancelled after {RECEIVE_TIMEOUT_S} s: {len(ended())} ended")
        cancelled = [status for status in ended() if status != "8"]
        assert len(cancelled) <= RECEIVING_PER_CLIENT, ended()
        metrics = dict(line.split(" ", 1) for line in kit.cluster.read_metrics(1).splitlines()
                       if line.startswith("brook_controller_receive_"))
        assert float(metrics["brook_controller_receive_refused_total"]) >= len(refused), metrics
        assert float(metrics["brook_controller_receive_timeouts_total"]) >= len(cancelled), metrics
    finally:
        for a in attackers:
            a.close()
