"""The synchronous receive gate (broker/receiving.py SyncReceiveGate) in front of a real sync gRPC
server: clients cannot take the workers kept for the cluster's nodes.

The controller's server reads a call's message on the worker that took the call. One address may
have ``per_client`` messages being received, but enough addresses together held every worker: six
at the controller's 16 took all 96 for 5 s at a time, and brokers' heartbeats waited. Here three
addresses (127.0.0.2-4) at their bound would take all eight workers of the test's pool; the gate
keeps two for "nodes" (the test's classifier: calls from 127.0.0.1), and a control run without the
reservation shows the node's call starved.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from waiting import wait_for

from broker.admission import peer_host
from broker.receiving import SyncReceiveGate

pytest.importorskip("h2.connection")
from h2client import H2Sender  # noqa: E402  (after the skip: h2 is a test dependency)

WORKERS = 8
PER_CLIENT = 3
RESERVED = 2
ATTACKERS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]  # 9 calls at their bound: more than the 8 workers
LIVENESS_S = 30.0  # generous on a loaded machine: not a speed assert


def _identity(b: bytes) -> bytes:
    return b


class Served:
    def __init__(self) -> None:
        self.watching = threading.Event()

    def echo(self, request: bytes, context: Any) -> bytes:
        return b"echo " + request

    def watch(self, request: bytes, context: Any) -> Iterator[bytes]:
        self.watching.set()
        while context.is_active():
            yield b"update"
            threading.Event().wait(0.05)


def _is_node(context: Any) -> bool:
    return peer_host(context.peer()) == "127.0.0.1"


def serve(gate: SyncReceiveGate) -> tuple[grpc.Server, int, Served]:
    served = Served()
    handler = grpc.method_handlers_generic_handler("t.T", {
        "Echo": grpc.unary_unary_rpc_method_handler(served.echo, _identity, _identity),
        "Watch": grpc.unary_stream_rpc_method_handler(served.watch, _identity, _identity),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS), handlers=[handler], interceptors=[gate],
                         options=[("grpc.http2.bdp_probe", 0)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port, served


def hold_every_clients_worker(port: int, attackers: list[H2Sender]) -> None:
    """Each attacker address opens PER_CLIENT calls whose 1,000-byte messages never finish."""
    for source in ATTACKERS:
        attackers.append(H2Sender(port, "/t.T/Echo", PER_CLIENT, 1000, source=source))
    for a in attackers:
        a.push(0.2)


def test_clients_cannot_take_the_workers_kept_for_nodes(senders: list[H2Sender]) -> None:
    gate = SyncReceiveGate(PER_CLIENT, 300.0, "t", workers=WORKERS, reserved_for_nodes=RESERVED, is_node=_is_node)
    server, port, served = serve(gate)
    try:
        hold_every_clients_worker(port, senders)
        clients_share = WORKERS - RESERVED
        wait_for(lambda: [a.push(0.05) for a in senders] and gate.busy == clients_share and
                 sum(len(a.ended) for a in senders) == len(ATTACKERS) * PER_CLIENT - clients_share, LIVENESS_S,
                 lambda: f"{clients_share} calls held, the rest refused: busy {gate.busy}, "
                         f"ended {[a.ended for a in senders]}")
        ended = [status for a in senders for status in a.ended.values()]
        assert ended == ["8"] * len(ended), f"refused RESOURCE_EXHAUSTED: {ended}"
        assert gate.workers_refused_total == len(ended)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            # Both kept workers serve the node at once: a watch stream holds one, a call takes the other.
            watch = ch.unary_stream("/t.T/Watch")(b"", timeout=LIVENESS_S)
            assert next(watch) == b"update"
            assert gate.busy == clients_share + 1
            assert ch.unary_unary("/t.T/Echo")(b"heartbeat", timeout=LIVENESS_S) == b"echo heartbeat"
            watch.cancel()
        wait_for(lambda: gate.busy == clients_share, LIVENESS_S,
                 lambda: f"the cancelled watch to give its worker back: busy {gate.busy}")
    finally:
        for a in senders:
            a.close()
        wait_for(lambda: gate.busy == 0, LIVENESS_S, lambda: f"the attackers' workers back: busy {gate.busy}")
        server.stop(None)


def test_without_workers_kept_for_nodes_the_same_clients_starve_a_nodes_call(senders: list[H2Sender]) -> None:
    """The control: per-address bounds alone let three addresses hold every worker."""
    gate = SyncReceiveGate(PER_CLIENT, 300.0, "t")
    server, port, _ = serve(gate)
    try:
        hold_every_clients_worker(port, senders)
        wait_for(lambda: [a.push(0.05) for a in senders] and gate.busy == WORKERS, LIVENESS_S,
                 lambda: f"every worker held: busy {gate.busy}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError) as info:
                ch.unary_unary("/t.T/Echo")(b"heartbeat", timeout=1.0)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        for a in senders:
            a.close()
        server.stop(None)


def test_the_controller_keeps_its_workers_for_nodes_and_super_users_only() -> None:
    from metadata_quorum.node import nodes_and_super_users

    class Ctx:
        def __init__(self, cn: str | None, peer: str = "ipv4:10.1.2.3:5555") -> None:
            self.cn, self._peer = cn, peer

        def peer(self) -> str:
            return self._peer

        def auth_context(self) -> dict:
            return {"x509_subject": [f"CN={self.cn},O=Brook".encode()]} if self.cn else {}

        def invocation_metadata(self) -> tuple:
            return ()

    guarded = nodes_and_super_users({"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                                     "super.users": "User:admin;User:ops"})
    assert [guarded(Ctx(cn)) for cn in ("node-2", "admin", "ops", "demo", None)] == [True, True, True, False, False]
    # Without an authorizer every principal may do anything: none is told apart as a super user.
    open_cluster = nodes_and_super_users({"super.users": "User:admin"})
    assert [open_cluster(Ctx(cn)) for cn in ("node-2", "admin", "demo")] == [True, False, False]
