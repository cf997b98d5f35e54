"""max.connections: the broker port refuses connections past the bound, and takes new ones once
connections close (a connection flood cannot exhaust the broker's file descriptors);
connections.max.idle.ms: a connection with no call open that long is closed; max.connections.per.ip:
one address's connections past it are closed, on the broker's and the controller's gRPC ports."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import grpc
import h2.events
import pytest
from h2client import ATTACKER, h2_connect
from sockets import still_open
from waiting import wait_for

from deploy.local.cluster import LocalCluster
from proto import broker_pb2, broker_pb2_grpc

pytestmark = pytest.mark.slow

LIMIT = 3


def metadata_ok(channel: grpc.Channel) -> bool:
    try:
        broker_pb2_grpc.BrokerServiceStub(channel).Metadata(broker_pb2.MetadataRequest(), timeout=3)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e  # refused at accept, nothing else
        return False
    return True


def test_connections_past_max_connections_are_refused_then_accepted_again(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", nodes=1, overrides={"max.connections": str(LIMIT)}) as cluster:
        address = cluster.broker_address(1)
        # A separate subchannel pool per channel: each channel is its own TCP connection.
        channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(LIMIT + 3)]
        try:
            served = [metadata_ok(ch) for ch in channels]
            assert 0 < sum(served) <= LIMIT, served
            assert not all(served), f"all {len(channels)} connections were served with max.connections={LIMIT}"
            # The port is full: a gRPC health probe there is refused too, but the health listener (its own
            # port and thread) still says the broker is alive and ready: no restart for being busy.
            with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as probe:
                assert not metadata_ok(probe), "a new connection was served on a full port"
            assert cluster.probe(1, "/livez")[0] == 200
            assert cluster.probe(1, "/readyz")[0] == 200
        finally:
            for ch in channels:
                ch.close()

        def fresh_client_served() -> bool:
            with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                return metadata_ok(ch)
        wait_for(fresh_client_served, 30, "a new connection to be served once the others closed")


IDLE_MS = 1500


def goaway_then_closed(port: int, timeout_s: float) -> tuple[bool, bool]:
    """Open an HTTP/2 connection from another address, send no call, and read until the server closes it:
    (GOAWAY received, connection closed) within ``timeout_s``."""
    sock, conn = h2_connect(port, ATTACKER)
    goaway = closed = False
    deadline = time.monotonic() + timeout_s
    try:
        sock.sendall(conn.data_to_send())
        while not closed and time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                data = b""
            if not data:
                closed = True
                break
            for ev in conn.receive_data(data):
                goaway |= isinstance(ev, h2.events.ConnectionTerminated)
            pending = conn.data_to_send()
            if pending:
                with contextlib.suppress(OSError):
                    sock.sendall(pending)
    finally:
        sock.close()
    return goaway, closed


def test_connections_without_a_call_for_connections_max_idle_ms_are_closed(tmp_path: Path) -> None:
    """Kafka closes a connection idle for connections.max.idle.ms; the gRPC port does too (GOAWAY), and a
    client whose connection was closed for idleness is served on its next call."""
    with LocalCluster(tmp_path / "c", nodes=1, overrides={"connections.max.idle.ms": str(IDLE_MS)}) as cluster:
        address = cluster.broker_address(1)
        port = int(address.rsplit(":", 1)[1])
        started = time.monotonic()
        goaway, closed = goaway_then_closed(port, 20)
        took = time.monotonic() - started
        assert goaway and closed, f"after {took:.1f} s: GOAWAY {goaway}, closed {closed} (idle bound {IDLE_MS} ms)"
        assert took >= IDLE_MS / 1000 * 0.9, f"closed after {took:.2f} s, before the idle bound of {IDLE_MS} ms"

        with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            assert metadata_ok(channel)
            states: list[grpc.ChannelConnectivity] = []
            channel.subscribe(states.append, try_to_connect=False)
            wait_for(lambda: grpc.ChannelConnectivity.IDLE in states[states.index(grpc.ChannelConnectivity.READY):]
                     if grpc.ChannelConnectivity.READY in states else False,
                     20, lambda: f"the idle connection to be closed (channel states {states})")
            assert metadata_ok(channel), "no answer on a new connection after the idle one was closed"


PER_IP = 4
FLOOD = 12


def held_open(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server has not closed."""
    return sum(map(still_open, socks))


def test_one_address_holds_at_most_max_connections_per_ip_on_the_broker_and_controller_ports(tmp_path: Path) -> None:
    """Before, the gRPC ports had no per-address bound: one address's HTTP/2 connections, a preface and
    nothing else, were each held for connections.max.idle.ms, up to max.connections of them."""
    # The override keeps this process's and the node's own connections (127.0.0.1) out of the bound.
    with LocalCluster(tmp_path / "c", nodes=1, overrides={"max.connections.per.ip": str(PER_IP),
                                                          "max.connections.per.ip.overrides": "127.0.0.1:1000"}
                      ) as cluster:
        address = cluster.broker_address(1)
        ports = {"broker": int(address.rsplit(":", 1)[1]), "controller": cluster.spec(1).controller_port}
        for role, port in ports.items():
            flood = []
            try:
                for _ in range(FLOOD):
                    sock, conn = h2_connect(port, ATTACKER)
                    sock.sendall(conn.data_to_send())
                    flood.append(sock)
                wait_for(lambda f=flood: held_open(f) <= PER_IP, 15,  # type: ignore[misc]
                         lambda r=role, f=flood: f"the {r} port to close all but {PER_IP} of one address's "
                                                 f"connections ({held_open(f)} of {FLOOD} open)")
                assert held_open(flood) == PER_IP, f"the {role} port kept fewer than the address's {PER_IP}"
                # 127.0.0.1 is another address.
                with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
                    assert metadata_ok(channel)
            finally:
                for s in flood:
                    s.close()
        metrics = cluster.read_metrics(1)
        for role in ports:
            line = f'brook_grpc_connections_closed_per_ip_total{{role="{role}"}} {float(FLOOD - PER_IP)}'
            assert line in metrics, f"no {line!r} in /metrics"
