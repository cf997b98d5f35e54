"""The receive gate (broker/receiving.py): a gRPC request's bytes are let in only when there is room.

Unit tests of the slots, then a real grpc.aio server on a real socket with the gate in front of it
and a raw HTTP/2 client (h2) from 127.0.0.2 that declares large messages and sends as much of each
as flow control lets it, never the last byte: what it managed to send is what the server buffers
for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from waiting import await_for

from broker.admission import Overloaded
from broker.fair_pool import CLIENT
from broker.receiving import OTHER_STREAMS, ReceiveGate, ReceiveSlots, StreamCounts
from proto.errors import STREAM_REFUSED_METADATA_KEY

h2_connection = pytest.importorskip("h2.connection")
import h2.config  # noqa: E402  (after the skip: h2 is a test dependency)
from h2client import ATTACKER, H2Sender, grpc_request_headers, grpc_status  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
WINDOW = 65535  # HTTP/2's initial stream window, which a call waiting for its slot is held to


# ---- the slots ----

async def settle() -> None:
    """Let woken waiters run (a grant resumes its caller a few loop turns later)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_slots_are_bounded_in_all_and_per_client_and_served_round_robin() -> None:
    slots = ReceiveSlots(total=3, per_client=2)
    await slots.acquire("a", 1)
    await slots.acquire("a", 1)
    order: list[str] = []

    async def take(client: str) -> None:
        await slots.acquire(client, 5)
        order.append(client)

    waiting = [asyncio.create_task(take(c)) for c in ("a", "a", "b", "b", "c")]
    await settle()
    # One slot is free, but "a" is at its own bound: "b" takes it; the rest wait.
    assert order == ["b"] and slots.receiving == 3 and slots.waiting == 4
    slots.release("a")
    await settle()
    # Round robin among the waiting addresses under their bound, oldest address first.
    assert order == ["b", "a"], order
    for client in ("a", "b", "a"):
        slots.release(client)
        await settle()
    # "b" waited before "c" did (its first call was served at once, its second waited).
    assert order == ["b", "a", "b", "c", "a"], order
    await asyncio.gather(*waiting)
    assert slots.receiving == 3 and slots.waiting == 0
    assert {c: slots.held_by(c) for c in "abc"} == {"a": 1, "b": 1, "c": 1}


async def test_a_waiter_that_times_out_or_is_cancelled_takes_no_slot_with_it() -> None:
    slots = ReceiveSlots(total=1, per_client=1)
    await slots.acquire("a", 1)
    with pytest.raises(Overloaded, match="no receive slot"):
        await slots.acquire("b", 0.05)
    cancelled = asyncio.create_task(slots.acquire("c", 5))
    await settle()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert slots.waiting == 0 and slots.timed_out_total == 1
    slots.release("a")
    assert slots.receiving == 0
    # Granted in the same turn it is cancelled: the slot goes back, not lost.
    await slots.acquire("a", 1)
    granted_then_cancelled = asyncio.create_task(slots.acquire("d", 5))
    await settle()
    slots.release("a")  # grants "d"
    granted_then_cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await granted_then_cancelled
    assert slots.receiving == 0 and slots.held_by("d") == 0
    await slots.acquire("e", 0.05)  # free


async def test_a_client_with_its_queue_full_is_refused_at_once() -> None:
    slots = ReceiveSlots(total=1, per_client=1, queue_per_client=2)
    await slots.acquire("a", 1)
    waiters = [asyncio.create_task(slots.acquire("a", 5)) for _ in range(2)]
    await settle()
    with pytest.raises(Overloaded, match="2 requests waiting"):
        await slots.acquire("a", 5)
    assert slots.refused_total == 1
    for _ in range(3):
        slots.release("a")
        await settle()
    assert all(w.done() and w.exception() is None for w in waiters)


async def test_with_every_waiting_place_taken_a_smaller_address_takes_the_place_of_the_biggests_newest() -> None:
    """Waiting calls are bounded in all, not only per address, and one address filling the queue
    cannot keep the others out."""
    slots = ReceiveSlots(total=1, per_client=1, queue_per_client=10, queue_total=4)
    await slots.acquire("holder", 1)
    served: list[str] = []

    async def take(client: str, i: int) -> None:
        await slots.acquire(client, 30)
        served.append(f"{client}{i}")
        slots.release(client)

    a = [asyncio.create_task(take("a", i)) for i in range(4)]
    await settle()
    assert slots.waiting == 4
    b = asyncio.create_task(take("b", 0))  # share 4 // 2: "a" is over it, "b" under
    await settle()
    with pytest.raises(Overloaded, match="its newest gave its place"):
        await a[3]
    with pytest.raises(Overloaded, match="3 of them client a's"):
        await slots.acquire("a", 30)  # "a" at its share (2) or over: refused, no one loses a place
    c = asyncio.create_task(take("c", 0))  # share 4 // 3 = 1: "a" gives another place
    await settle()
    with pytest.raises(Overloaded, match="its newest gave its place"):
        await a[2]
    with pytest.raises(Overloaded, match="1 of them client b's"):
        await slots.acquire("b", 30)  # at its share of 1
    assert slots.waiting == 4 and slots.refused_total == 4
    slots.release("holder")
    await asyncio.gather(a[0], a[1], b, c)
    assert served == ["a0", "b0", "c0", "a1"], "the waiting addresses took turns"
    assert slots.waiting == 0 and slots.receiving == 0


async def test_a_waiter_cancelled_but_not_yet_resumed_gives_its_place_without_a_refusal() -> None:
    slots = ReceiveSlots(total=1, per_client=1, queue_per_client=10, queue_total=2)
    await slots.acquire("holder", 1)
    a = [asyncio.create_task(slots.acquire("a", 30)) for _ in range(2)]
    await settle()
    b = asyncio.create_task(slots.acquire("b", 30))  # runs before the cancelled call resumes
    a[1].cancel()  # its future is cancelled now; its task resumes only after b's first step
    await settle()
    with pytest.raises(asyncio.CancelledError):
        await a[1]
    assert slots.refused_total == 0 and slots.waiting == 2, "the cancelled call's place went to b"
    slots.release("holder")
    await a[0]
    slots.release("a")
    await b
    assert slots.waiting == 0


def test_stream_counts_per_client_and_in_all() -> None:
    counts = StreamCounts("ProduceStream", per_client=2, total=3)
    counts.enter("a")
    counts.enter("a")
    with pytest.raises(Overloaded, match="max.request.streams.per.ip=2"):
        counts.enter("a")
    counts.enter("b")
    with pytest.raises(Overloaded, match="max.produce.streams=3"):
        counts.enter("c")
    counts.leave("a")
    counts.enter("c")
    assert counts.open == 3 and counts.refused_total == 2


# ---- a grpc.aio server behind the gate ----

def _identity(b: bytes) -> bytes:
    return b


class Served:
    """The handlers behind the gate and what they saw."""

    def __init__(self) -> None:
        self.sync_peers: list[str] = []
        self.replicated: list[bytes] = []

    async def echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"%d" % len(request)

    async def client(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return CLIENT.get().encode()  # whose turns the call's work takes on the broker's pools

    def sync_echo(self, request: bytes, context: Any) -> bytes:  # runs on the pool, as SecurityService does
        self.sync_peers.append(context.peer())
        return b"sync %d" % len(request)

    async def watch_gen(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for i in range(3):
            yield b"%s %d" % (request, i)

    async def watch_writes(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        for i in range(2):
            await context.write(b"w %s %d" % (request, i))

    async def chat(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for r in requests:
            yield r

    async def replicate(self, requests: AsyncIterator[bytes],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for r in requests:
            self.replicated.append(r)
            yield r


class GatedServer:
    def __init__(self, gate: ReceiveGate, served: Served, port: int, server: grpc.aio.Server) -> None:
        self.gate, self.served, self.port, self.server = gate, served, port, server


@pytest.fixture
async def gated(request: pytest.FixtureRequest) -> AsyncIterator[GatedServer]:
    params = getattr(request, "param", {})
    pool = concurrent.futures.ThreadPoolExecutor(2)
    gate = ReceiveGate(ReceiveSlots(params.get("total", 4), params.get("per_client", 2),
                                    params.get("queue", 256)),
                       {"/t.T/Chat": StreamCounts("Chat", 2, 3), OTHER_STREAMS: StreamCounts("other", 2),
                        "/t.T/Replicate": StreamCounts("Replicate", 2, nodes_only=True)},
                       params.get("timeout_s", 300.0), pool)  # by default, far above what a test takes
    served = Served()
    u, ss = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler
    handlers = {"Echo": u(served.echo, _identity, _identity), "Client": u(served.client, _identity, _identity),
                "SyncEcho": u(served.sync_echo, _identity, _identity),
                "WatchGen": ss(served.watch_gen, _identity, _identity),
                "WatchWrites": ss(served.watch_writes, _identity, _identity),
                "Chat": grpc.stream_stream_rpc_method_handler(served.chat, _identity, _identity),
                "Replicate": grpc.stream_stream_rpc_method_handler(served.replicate, _identity, _identity)}
    server = grpc.aio.server(migration_thread_pool=pool, interceptors=[gate],
                             options=[("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", 8 * MiB)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield GatedServer(gate, served, port, server)
    finally:
        await server.stop(None)
        pool.shutdown(wait=False)


async def test_every_kind_of_call_is_served_through_the_gate(gated: GatedServer) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gated.port}") as ch:
        assert await ch.unary_unary("/t.T/Echo")(b"x" * 100_000) == b"100000"
        assert await ch.unary_unary("/t.T/SyncEcho")(b"abc") == b"sync 3"
        assert [r async for r in ch.unary_stream("/t.T/WatchGen")(b"g")] == [b"g 0", b"g 1", b"g 2"]
        assert [r async for r in ch.unary_stream("/t.T/WatchWrites")(b"q")] == [b"w q 0", b"w q 1"]
        chat = ch.stream_stream("/t.T/Chat")

        async def two() -> AsyncIterator[bytes]:
            yield b"1"
            yield b"2"
        assert [r async for r in chat(two())] == [b"1", b"2"]
    assert gated.served.sync_peers and gated.served.sync_peers[0].startswith("ipv4:127.0.0.1:")
    assert gated.gate.slots.receiving == 0 and gated.gate.streams["/t.T/Chat"].open == 0


async def test_a_calls_work_takes_its_client_addresss_turns(gated: GatedServer) -> None:
    """Every unary call through the gate (the group coordinator's too) hands its work to the broker's fair pools
    (broker/fair_pool.py) as its client address's, never as no one's."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gated.port}") as ch:
        assert await ch.unary_unary("/t.T/Client")(b"") == b"127.0.0.1"


async def test_calls_past_their_receive_slots_are_held_to_the_initial_window(gated: GatedServer,
                                                                           senders: list[H2Sender]) -> None:
    """20 calls declaring 1 MiB each: two (the address's slots) are read, the others are let send only
    HTTP/2's initial window. Without the gate the server takes all 20 MiB (checked below)."""
    calls, size = 20, 1 * MiB
    s = H2Sender(gated.port, "/t.T/Echo", calls, size)
    senders.append(s)
    sent = await asyncio.to_thread(s.push_until_held, 30.0)
    bound = 2 * (size + 5) + (calls - 2) * WINDOW
    assert sent <= bound, f"the server let the client send {sent} bytes; bound {bound}"
    assert sent >= 2 * size, f"the two calls holding slots should have been let send their messages: {sent}"
    assert gated.gate.slots.held_by(ATTACKER) == 2 and gated.gate.slots.waiting == calls - 2
    # Another address is served meanwhile.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gated.port}") as ch:
        assert await ch.unary_unary("/t.T/Echo")(b"x" * 1000, timeout=10) == b"1000"
    s.close()
    await await_for(lambda: gated.gate.slots.receiving == 0 and gated.gate.slots.waiting == 0, 10,
                    lambda: f"the calls of a closed connection to give their slots back: {gated.gate.slots.__dict__}")


async def test_without_the_gate_every_call_is_read_whole() -> None:
    """The control of the test above: what a grpc.aio server does without the gate."""
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await asyncio.Event().wait()  # never answers: the calls stay open until the server stops
        return b""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 8 * MiB)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "t.T", {"Echo": grpc.unary_unary_rpc_method_handler(echo, _identity, _identity)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    s = H2Sender(port, "/t.T/Echo", 20, 1 * MiB)
    try:
        sent = await asyncio.to_thread(s.push, 3.0)
    finally:
        s.close()
        await server.stop(None)
    assert sent >= 15 * MiB, f"an ungated server took only {sent} bytes: the gate test above proves nothing"


@pytest.mark.parametrize("gated", [{"timeout_s": 0.5}], indirect=True)
async def test_a_message_not_received_in_time_ends_its_call_and_gives_the_slot_back(
        gated: GatedServer, senders: list[H2Sender]) -> None:
    s = H2Sender(gated.port, "/t.T/Echo", 2, 256 * KiB)
    senders.append(s)
    started = time.monotonic()

    def until_ended() -> None:
        while len(s.ended) < 2 and time.monotonic() - started < 20:
            s.push(0.1)
    await asyncio.to_thread(until_ended)
    codes = {grpc.StatusCode.DEADLINE_EXCEEDED.value[0]}
    assert {int(v) for v in s.ended.values() if v.isdigit()} <= codes and len(s.ended) == 2, s.ended
    assert gated.gate.slots.timed_out_total == 2
    # The call's status goes out before the handler's slot is given back (context.abort raises after it is
    # sent), so the client can see the call end first: wait for the release, do not race it.
    await await_for(lambda: gated.gate.slots.receiving == 0, 5,
                    lambda: f"the timed-out calls to give their slots back: {gated.gate.slots.__dict__}")


@pytest.mark.parametrize("gated", [{"per_client": 1, "queue": 3}], indirect=True)
async def test_calls_past_an_addresss_queue_are_refused_unread(gated: GatedServer, senders: list[H2Sender]) -> None:
    s = H2Sender(gated.port, "/t.T/Echo", 6, 256 * KiB)
    senders.append(s)

    def until_refused() -> None:
        until = time.monotonic() + 20
        while len(s.ended) < 2 and time.monotonic() < until:
            s.push(0.1)
    await asyncio.to_thread(until_refused)
    assert sorted(s.ended.values()) == [str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])] * 2, s.ended
    assert gated.gate.slots.held_by(ATTACKER) == 1 and gated.gate.slots.waiting == 3


async def test_request_streams_past_the_bound_are_refused_before_a_message_is_read(gated: GatedServer) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gated.port}") as ch:
        chat = ch.stream_stream("/t.T/Chat")
        gates = [asyncio.Event() for _ in range(3)]

        async def held(i: int) -> AsyncIterator[bytes]:
            yield b"%d" % i
            await gates[i].wait()

        open_calls = [chat(held(i)) for i in range(2)]
        for call in open_calls:
            assert await call.read() is not None
        refused = chat(held(2))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await refused.read()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max.request.streams.per.ip=2" in (info.value.details() or "")
        assert (STREAM_REFUSED_METADATA_KEY, "1") in tuple(info.value.trailing_metadata() or ())
        gates[0].set()
        assert await open_calls[0].code() == grpc.StatusCode.OK
        await await_for(lambda: gated.gate.streams["/t.T/Chat"].open == 1, 10, "the ended stream to be counted out")
        again = chat(held(1))
        assert await again.read() == b"1"
        gates[1].set()
        assert [await c.code() for c in (open_calls[1], again)] == [grpc.StatusCode.OK] * 2
    assert gated.gate.streams["/t.T/Chat"].open == 0


async def test_a_nodes_only_stream_from_anyone_else_is_refused_before_a_message_is_read(gated: GatedServer) -> None:
    from broker import principal

    async def one() -> AsyncIterator[bytes]:
        yield b"fetch"
    counts = gated.gate.streams["/t.T/Replicate"]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gated.port}") as ch:
        # A plaintext caller on loopback is a node while that trust is on (a single-host cluster).
        assert [r async for r in ch.stream_stream("/t.T/Replicate")(one())] == [b"fetch"]
        principal.configure(trust_loopback_plaintext=False)
        try:
            # No message is sent: the refusal must not wait for one. (A message written while the refusal
            # is on its way makes grpc's client report its failed write, INTERNAL, instead of the status.)
            call = ch.stream_stream("/t.T/Replicate")()
            code = await asyncio.wait_for(call.code(), 10)
            details = await call.details()
        finally:
            principal.configure(trust_loopback_plaintext=True)
    assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
    assert "Replicate streams are for the cluster's nodes" in (details or "")
    assert gated.served.replicated == [b"fetch"], "the refused stream reached the handler"
    assert counts.refused_total == 1 and counts.open == 0


async def test_a_call_without_a_message_is_refused(gated: GatedServer) -> None:
    s = socket.create_connection(("127.0.0.1", gated.port))
    try:
        conn = h2_connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.send_headers(1, grpc_request_headers("/t.T/Echo", "x"), end_stream=True)
        s.sendall(conn.data_to_send())
        status = None
        s.settimeout(10)
        while status is None:
            data = await asyncio.to_thread(s.recv, 65536)
            assert data, "the server closed the connection without an answer"
            for ev in conn.receive_data(data):
                status = status or grpc_status(ev)
            s.sendall(conn.data_to_send())
        assert status == str(grpc.StatusCode.INVALID_ARGUMENT.value[0])
    finally:
        s.close()
