"""A follower whose leader registered a replication listener it cannot reach falls back to the gRPC stream.

A real ReplicaFetcher follows a real Partition from a stand-in leader: a gRPC server (the ReplicaFetch stream)
and the real ReplicationListener (broker/replication_listener.py) in front of a stand-in service, each on a
real socket. A port bound and not listening refuses connections, as a closed or blocked port does. Shown
here: with the listener's port refusing, the follower replicates over gRPC within seconds, says so in one
WARNING, and goes back to the listener (one INFO) once it answers, not before the retry period; a leader
down on both ports (restarting) is not taken for an unreachable listener; a listener session that answered
and then broke is opened again, never a reason to leave the listener; a listener whose TLS handshake fails
(a certificate the follower does not trust) is left for the gRPC stream as a refusing one is.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from test_fetch_session import BATCH  # one leader batch at offset 0, epoch 0
from waiting import wait_for

from broker.kafka_wire.server import server_ssl_context
from broker.replication_listener import Refused, ReplicationListener
from client.security import SecurityConfig
from deploy.local.certs import CertificateAuthority
from proto import broker_pb2, broker_pb2_grpc
from replication import fetcher as fetcher_module
from replication.fetcher import FetcherConfig, ReplicaFetcherManager
from replication.partition import Partition

RETRY_S = 1.5  # LISTENER_RETRY_S for these tests


def answer(req: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
    return broker_pb2.FetchResponse(partitions=[broker_pb2.FetchPartitionResponse(
        topic=fp.topic, partition=fp.partition, high_watermark=1, log_start_offset=0, log_end_offset=1,
        records=BATCH if fp.fetch_offset == 0 else b"") for fp in req.partitions])


class GrpcLeader(broker_pb2_grpc.BrokerServiceServicer):
    """The leader's ReplicaFetch stream: BATCH at offset 0, a short long poll after it."""

    def __init__(self) -> None:
        self.streams = 0
        self.messages = 0
        self.lock = threading.Lock()

    def ReplicaFetch(self, request_iterator: Iterator[broker_pb2.FetchRequest],
                     context: Any) -> Iterator[broker_pb2.FetchResponse]:
        with self.lock:
            self.streams += 1
        for request in request_iterator:
            with self.lock:
                self.messages += 1
            if all(fp.fetch_offset > 0 for fp in request.partitions):
                time.sleep(0.05)  # the leader's long poll with nothing new
            yield answer(request)


class ListenerService:
    """What ReplicationListener asks of the broker: fetch sessions, and answers (BATCH at offset 0). With
    ``break_after``, a connection is closed on its request after that many answers (a leader restarting)."""

    def __init__(self, break_after: int | None = None) -> None:
        self.break_after = break_after
        self.sessions = 0
        self.first_request_at: float | None = None  # time.time(), as log records have it
        self.rm = SimpleNamespace(new_fetch_session=self._new_session)

    def _new_session(self) -> Any:
        self.sessions += 1
        return SimpleNamespace(answers=0, close=lambda: None)

    async def replica_fetch_message(self, request: broker_pb2.FetchRequest, context: Any,
                                    session: Any) -> broker_pb2.FetchResponse:
        if self.first_request_at is None:
            self.first_request_at = time.time()
        if self.break_after is not None and session.answers >= self.break_after:
            raise Refused("the leader went away")  # the listener closes the connection
        session.answers += 1
        if all(fp.fetch_offset > 0 for fp in request.partitions):
            await asyncio.sleep(0.05)
        return answer(request)


class Listener:
    """The real replication listener, plaintext on loopback (trusted as a node), on a loop of its own."""

    def __init__(self, service: ListenerService, port: int) -> None:
        self.loop = fetcher_module._FetchLoop("test-replication-listener")
        self.listener = ReplicationListener(service, 1, "127.0.0.1", port, None, {})
        self.loop.submit(self.listener.start()).result(10)

    def stop(self) -> None:
        self.loop.submit(self.listener.stop()).result(10)
        self.loop.stop()


class Refusing:
    """A port bound and not listening: every connection to it is refused, and no one else takes it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])

    def release(self) -> int:
        self.sock.close()
        return self.port


def grpc_leader(leader: GrpcLeader, port: int = 0) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(leader, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port


@pytest.fixture
def fetcher_log(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> pytest.LogCaptureFixture:
    monkeypatch.setattr(fetcher_module, "LISTENER_RETRY_S", RETRY_S)
    caplog.set_level(logging.DEBUG, logger=fetcher_module.__name__)
    return caplog


def records(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == fetcher_module.__name__ and r.levelno == level
            and text in r.getMessage()]


def follow(p: Partition, grpc_port: int, replication_port: int) -> ReplicaFetcherManager:
    manager = ReplicaFetcherManager(2, lambda: 1, FetcherConfig(max_wait_ms=100, backoff_ms=50))
    manager.add_partition(p, 1, f"127.0.0.1:{grpc_port}", 0, replication_address=f"127.0.0.1:{replication_port}")
    return manager


def test_an_unreachable_listener_falls_back_to_grpc_and_is_tried_again(
        follower: Partition, fetcher_log: pytest.LogCaptureFixture) -> None:
    leader, refusing = GrpcLeader(), Refusing()
    server, grpc_port = grpc_leader(leader)
    manager = follow(follower, grpc_port, refusing.port)
    listener: Listener | None = None
    try:
        wait_for(lambda: follower.log.log_end_offset == 1 and follower.log.high_watermark == 1, 5,
                 "the batch replicated over the gRPC stream though the listener refuses connections")
        [warning] = wait_for(lambda: records(fetcher_log, logging.WARNING, "replication listener"), 5,
                             "the fallback's WARNING")
        text = warning.getMessage()
        for part in ("leader 1", f"127.0.0.1:{refusing.port}", f"127.0.0.1:{grpc_port}", "ConnectionRefused",
                     f"every {RETRY_S:g} s"):
            assert part in text, f"{part!r} not in {text!r}"
        assert manager.stats.listener_fallbacks_total == 1
        service = ListenerService()
        listener = Listener(service, refusing.release())  # the port opened (the NetworkPolicy fixed)
        wait_for(lambda: listener.listener.stats.requests_total >= 3, RETRY_S + 10,
                 "fetches on the listener once the retry period ran out")
        [back] = wait_for(lambda: records(fetcher_log, logging.INFO, "answers again"), 5,
                          "the INFO saying the listener is used again")
        assert service.first_request_at is not None
        assert service.first_request_at - warning.created >= RETRY_S * 0.95, \
            "the listener was tried again before the retry period ran out"
        streams = leader.streams
        wait_for(lambda: listener.listener.stats.requests_total >= 10, 10, "more fetches on the listener")
        assert leader.streams == streams, "a gRPC stream opened again while the listener answers"
    finally:
        manager.shutdown()
        server.stop(0)
        if listener is not None:
            listener.stop()
        refusing.release()
    assert len(records(fetcher_log, logging.WARNING, "")) == 1, "one WARNING, not one per retry"
    assert manager.stats.listener_fallbacks_total == 1


def test_a_leader_down_on_both_ports_is_not_taken_for_an_unreachable_listener(
        follower: Partition, fetcher_log: pytest.LogCaptureFixture) -> None:
    """A restarting leader refuses the listener and the gRPC port alike: the follower goes back and forth
    between them (each try a failed fetch, with its backoff) and, once the leader is up, fetches from the
    listener without a WARNING."""
    grpc_refusing, listener_refusing = Refusing(), Refusing()
    manager = follow(follower, grpc_refusing.port, listener_refusing.port)
    server: grpc.Server | None = None
    listener: Listener | None = None
    try:
        wait_for(lambda: len(records(fetcher_log, logging.DEBUG, "trying the gRPC stream")) >= 2, 10,
                 "the gRPC stream tried, failed, and the listener tried again")
        server, _ = grpc_leader(GrpcLeader(), grpc_refusing.release())
        service = ListenerService()
        listener = Listener(service, listener_refusing.release())
        wait_for(lambda: follower.log.log_end_offset == 1, 10, "the batch replicated once the leader is up")
        wait_for(lambda: listener.listener.stats.requests_total >= 3, 10, "the follower on the listener")
    finally:
        manager.shutdown()
        if server is not None:
            server.stop(0)
        if listener is not None:
            listener.stop()
        grpc_refusing.release()
        listener_refusing.release()
    assert records(fetcher_log, logging.WARNING, "") == [], "a leader that was down is not a blocked listener"
    assert manager.stats.listener_fallbacks_total == 0


def test_a_listener_session_that_answered_and_broke_is_opened_again(
        follower: Partition, fetcher_log: pytest.LogCaptureFixture) -> None:
    """Each connection answers once and is then closed (a leader restarting, again and again): no fallback."""
    leader, refusing = GrpcLeader(), Refusing()
    server, grpc_port = grpc_leader(leader)
    service = ListenerService(break_after=1)
    listener = Listener(service, refusing.release())
    manager = follow(follower, grpc_port, listener.listener.port)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 5, "the batch replicated through the listener")
        wait_for(lambda: service.sessions >= 2 * fetcher_module.LISTENER_FAILURES_TO_FALL_BACK + 2, 10,
                 "sessions broken after their answer and opened again")
    finally:
        manager.shutdown()
        server.stop(0)
        listener.stop()
    assert leader.streams == 0, "a session that answered made the follower try the gRPC stream"
    assert records(fetcher_log, logging.WARNING, "") == [] and manager.stats.listener_fallbacks_total == 0


def test_a_listener_port_that_drops_packets_costs_one_connection_timeout(
        follower: Partition, fetcher_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A port that drops packets (a firewall's DROP, not a refusal) times the connection out after
    CONNECT_TIMEOUT_S (10 s). Two such waits before the gRPC stream was tried kept the follower from fetching for
    20 s, past the local launcher's replica.lag.time.max.ms; one is now enough. (The timeout is raised at once
    here: a port that drops packets cannot be made on loopback without root firewall rules.)"""
    events: list[str] = []

    async def timed_out(self: Any) -> None:
        events.append("listener")
        raise TimeoutError

    monkeypatch.setattr(fetcher_module._FramedFetchSession, "_open", timed_out)
    leader, refusing = GrpcLeader(), Refusing()
    original = leader.ReplicaFetch

    def counted(request_iterator: Iterator[broker_pb2.FetchRequest], context: Any) -> Iterator[broker_pb2.FetchResponse]:
        events.append("grpc")
        yield from original(request_iterator, context)

    leader.ReplicaFetch = counted  # type: ignore[method-assign]
    server, grpc_port = grpc_leader(leader)
    manager = follow(follower, grpc_port, refusing.port)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 5, "the batch replicated over the gRPC stream")
        wait_for(lambda: records(fetcher_log, logging.WARNING, "replication listener"), 5, "the fallback's WARNING")
    finally:
        manager.shutdown()
        server.stop(0)
        refusing.release()
    assert events[:2] == ["listener", "grpc"], f"connections tried, in order: {events}"


def test_a_listener_whose_tls_handshake_fails_falls_back_to_grpc(
        follower: Partition, fetcher_log: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """The listener answers TCP but its TLS handshake fails: here it shows a certificate from a CA the follower
    does not trust (a listener given another cluster's certificate), while the leader's gRPC port shows one the
    follower trusts. Each handshake fails as a refused connection does, and after
    LISTENER_FAILURES_TO_FALL_BACK of them the follower replicates over the gRPC stream, with one WARNING that
    names the certificate failure."""
    ours = CertificateAuthority.create(tmp_path / "ours")
    theirs = CertificateAuthority.create(tmp_path / "theirs")
    follower_cert = ours.issue(tmp_path / "ours", "node-2")
    grpc_cert = ours.issue(tmp_path / "ours", "node-1")
    listener_cert = theirs.issue(tmp_path / "theirs", "node-1")
    leader = GrpcLeader()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(leader, server)
    grpc_port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [(grpc_cert.key.read_bytes(), grpc_cert.cert.read_bytes())]))
    server.start()
    loop = fetcher_module._FetchLoop("test-tls-listener")
    listener = ReplicationListener(ListenerService(), 1, "127.0.0.1", 0, server_ssl_context(
        str(listener_cert.cert), str(listener_cert.key), None, client_auth_required=False), {})
    loop.submit(listener.start()).result(10)
    security = SecurityConfig(protocol="SSL", ssl_ca_location=str(ours.path),
                              ssl_certificate_location=str(follower_cert.cert),
                              ssl_key_location=str(follower_cert.key))
    manager = ReplicaFetcherManager(2, lambda: 1, FetcherConfig(max_wait_ms=100, backoff_ms=50, security=security))
    manager.add_partition(follower, 1, f"127.0.0.1:{grpc_port}", 0,
                          replication_address=f"127.0.0.1:{listener.port}")
    try:
        wait_for(lambda: follower.log.log_end_offset == 1 and follower.log.high_watermark == 1, 10,
                 "the batch replicated over the gRPC stream though the listener's handshake fails")
        [warning] = wait_for(lambda: records(fetcher_log, logging.WARNING, "replication listener"), 5,
                             "the fallback's WARNING")
        assert "CERTIFICATE_VERIFY_FAILED" in warning.getMessage() or \
            "certificate verify failed" in warning.getMessage(), warning.getMessage()
        assert manager.stats.listener_fallbacks_total == 1
        assert leader.streams >= 1 and listener.stats.requests_total == 0, "no fetch went over the failed handshake"
    finally:
        manager.shutdown()
        server.stop(0)
        loop.submit(listener.stop()).result(10)
        loop.stop()
