"""ClusterClient behaviour that needs no cluster: config parsing and bounded failure."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from broker.tls import ServerTls, bind_port
from client import errors
from client.admin import Admin
from client.cluster import Backoff, ClusterClient, parse_bootstrap, rpc_error
from client.security import SecurityConfig
from client.types import TopicPartition
from deploy.local.certs import CertFiles, CertificateAuthority
from proto import broker_pb2, broker_pb2_grpc
from proto.errors import ErrorCode


def test_parse_bootstrap_forms() -> None:
    assert parse_bootstrap("127.0.0.1:9092, localhost:9093") == ["127.0.0.1:9092", "localhost:9093"]
    assert parse_bootstrap(["a:1", ("b", 2)]) == ["a:1", "b:2"]
    with pytest.raises(errors.InvalidConfigError):
        parse_bootstrap("no-port")
    with pytest.raises(errors.InvalidConfigError):
        parse_bootstrap("")
    # Unicode digits ('²' made int() raise ValueError, a traceback in the CLI) and absurd lengths: one error.
    for bad in ("h:²", "h:١٢", "h:" + "9" * 5000, "h:70000"):
        with pytest.raises(errors.InvalidConfigError):
            parse_bootstrap(bad)
    # IPv6 in brackets only: '[::1' was dialled as the host ':' (audit), '::1:9092' is ambiguous.
    assert parse_bootstrap("[::1]:9092,h:1") == ["[::1]:9092", "h:1"]
    for bad in ("[::1", "::1:9092", "[zz]:1", "h]:1"):
        with pytest.raises(errors.InvalidConfigError, match="IPv6 address is written"):
            parse_bootstrap(bad)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_cluster_fails_typed_within_deadline() -> None:
    client = ClusterClient(f"127.0.0.1:{_closed_port()}", request_timeout_ms=600, retry_backoff_ms=20)
    start = time.monotonic()
    with pytest.raises(errors.BrookError) as info:
        client.metadata()
    elapsed = time.monotonic() - start
    client.close()
    assert info.value.retriable, f"transport failure should be retriable, got {info.value!r}"
    assert elapsed < 5, f"metadata() took {elapsed:.1f}s with a 0.6s timeout"


def test_backoff_is_bounded_by_deadline() -> None:
    backoff = Backoff(10, 40, time.monotonic() + 0.2)
    sleeps = 0
    while backoff.sleep():
        sleeps += 1
        assert sleeps < 100, "backoff never hit its deadline"
    assert backoff.remaining_s() <= 0.05


def test_fetch_error_is_returned_not_raised_when_unreachable() -> None:
    client = ClusterClient(f"127.0.0.1:{_closed_port()}", request_timeout_ms=300, retry_backoff_ms=20)
    result = client.fetch(TopicPartition("t", 0), 0, 1024)
    client.close()
    assert isinstance(result.error, errors.BrookError), f"expected a typed error, got {result!r}"
    assert result.records == b""


class _Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_a_message_over_the_brokers_size_limit_is_a_typed_error_not_retried() -> None:
    e = rpc_error(_Status(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          "Received message larger than max (9437200 vs. 8388608)"), "Produce to broker 1")
    assert isinstance(e, errors.MessageTooLargeError) and not e.retriable
    assert "socket.request.max.bytes" in str(e) and "9437200" in str(e)
    throttled = rpc_error(_Status(grpc.StatusCode.RESOURCE_EXHAUSTED, "broker overloaded: client 1.2.3.4 has 4 "
                                  "requests waiting to be received"), "Fetch")
    assert throttled.code == errors.ErrorCode.THROTTLING_QUOTA_EXCEEDED and throttled.retriable


@pytest.mark.parametrize("details", [
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:40199: Tls handshake failed "
    "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: "
    "unable to get local issuer certificate: OK",
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:40175: Custom verification check "
    "failed with error: UNAUTHENTICATED: Hostname Verification Check failed.",
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:43903: Tls handshake failed "
    "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER: "
    "Invalid certificate verification context: OK",
], ids=["untrusted-ca", "host-not-in-certificate", "port-without-tls"])
def test_a_tls_handshake_the_client_refuses_is_an_authentication_failure_not_retried(details: str) -> None:
    """As Kafka's SslAuthenticationException (KIP-152): the same handshake would fail again. gRPC's own
    words, as it reported each case against a real server."""
    e = rpc_error(_Status(grpc.StatusCode.UNAVAILABLE, details), "Metadata from 127.0.0.1:9092")
    assert isinstance(e, errors.SslAuthenticationError) and not e.retriable
    assert e.code == errors.ErrorCode.SASL_AUTHENTICATION_FAILED and "ssl.ca.location" in str(e)


def test_a_connection_closed_is_retried_whatever_closed_it() -> None:
    """A broker that went down and one that refused the client's certificate (TLS 1.3 tells the client only
    after its handshake) look the same: retried."""
    e = rpc_error(_Status(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: "
                          "UNAVAILABLE: ipv4:127.0.0.1:40199: Socket closed"), "Metadata")
    assert e.code == errors.ErrorCode.NETWORK_EXCEPTION and e.retriable


class _MetadataBroker(broker_pb2_grpc.BrokerServiceServicer):
    """A broker that answers Metadata at ``version``, with topic "t" once it has applied ``topic_at``."""

    def __init__(self, version: int, topic_at: int = 10, tls: ServerTls | None = None) -> None:
        self.version = version
        self.topic_at = topic_at
        self.fenced: set[int] = set()  # the brokers this one's metadata shows fenced
        self.asked = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        broker_pb2_grpc.add_BrokerServiceServicer_to_server(self, self.server)
        self.port = bind_port(self.server, "127.0.0.1", 0, tls) if tls else self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Metadata(self, request: broker_pb2.MetadataRequest, context: object) -> broker_pb2.MetadataResponse:
        self.asked += 1
        version = self.version
        topic = broker_pb2.TopicMetadata(name="t", topic_id="T", partitions=[
            broker_pb2.PartitionMetadata(partition=0, leader=1, leader_epoch=0, replicas=[1], isr=[1])])
        if version < self.topic_at:
            topic = broker_pb2.TopicMetadata(name="t", error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return broker_pb2.MetadataResponse(cluster_id="c", controller_id=1, metadata_version=version, topics=[topic],
                                           brokers=[broker_pb2.BrokerInfo(node_id=n, host="127.0.0.1", port=p,
                                                                          fenced=n in self.fenced)
                                                    for n, p in self.brokers])


def test_metadata_never_goes_back_to_a_broker_that_has_not_applied_what_another_showed() -> None:
    """CI saw it: a topic created (and seen with a leader on one broker) was unknown to the next
    describe, answered by a broker a few milliseconds behind. An answer older than the version the
    client has seen is passed over until a broker has caught up, and taken only at the deadline."""
    ahead, behind = _MetadataBroker(10), _MetadataBroker(9)
    for b in (ahead, behind):
        b.brokers = [(1, ahead.port), (2, behind.port)]  # type: ignore[attr-defined]
    client = ClusterClient(f"127.0.0.1:{ahead.port}", request_timeout_ms=10_000, retry_backoff_ms=20)
    try:
        assert client.metadata(["t"], refresh=True).topics["t"].error_code == ErrorCode.NONE
        ahead.server.stop(0)  # only the broker that lags is left; it catches up a moment later
        threading.Timer(0.5, setattr, (behind, "version", 11)).start()
        meta = client.metadata(["t"], refresh=True)
        assert meta.version == 11 and meta.topics["t"].error_code == ErrorCode.NONE, meta
        assert behind.asked >= 2, f"the answer at version 9 was taken: asked {behind.asked} time(s)"

        behind.version = 5  # lags for good (say, cut off from the controllers): taken at the deadline
        start = time.monotonic()
        meta = client.metadata(["t"], refresh=True, timeout_ms=600)
        assert meta.version == 5 and time.monotonic() - start >= 0.5, meta
    finally:
        client.close()
        ahead.server.stop(0)
        behind.server.stop(0)


def test_a_broker_whose_certificate_the_client_refuses_is_passed_over_and_only_then_fatal(tmp_path: Path) -> None:
    """A handshake the client refuses is not retried (SslAuthenticationError), but one broker with a certificate
    the client does not trust (say, mid-rotation) costs nothing while another broker answers."""
    ca, rogue = CertificateAuthority.create(tmp_path / "ca", "CA"), CertificateAuthority.create(tmp_path / "rogue", "rogue")
    good = _MetadataBroker(10, tls=ServerTls(*_pair(ca.issue(tmp_path / "good", "node-1")), ca.path))
    bad = _MetadataBroker(10, tls=ServerTls(*_pair(rogue.issue(tmp_path / "bad", "node-2")), ca.path))
    for b in (good, bad):
        b.brokers = [(1, good.port), (2, bad.port)]  # type: ignore[attr-defined]
    mine = ca.issue(tmp_path / "client", "client", hosts=(), server=False)
    sec = SecurityConfig(protocol="SSL", ssl_ca_location=str(ca.path), ssl_certificate_location=str(mine.cert),
                         ssl_key_location=str(mine.key))
    both = ClusterClient(f"127.0.0.1:{bad.port},127.0.0.1:{good.port}", security=sec, request_timeout_ms=10_000)
    only_bad = ClusterClient(f"127.0.0.1:{bad.port}", security=sec, request_timeout_ms=10_000)
    try:
        assert both.metadata(["t"], refresh=True).topics["t"].error_code == ErrorCode.NONE
        with pytest.raises(errors.SslAuthenticationError, match="CERTIFICATE_VERIFY_FAILED"):
            only_bad.metadata(["t"], refresh=True, timeout_ms=10_000)
        assert bad.asked == 0
    finally:
        both.close()
        only_bad.close()
        good.server.stop(0)
        bad.server.stop(0)


def _pair(files: CertFiles) -> tuple[Path, Path]:
    return files.cert, files.key


def test_wait_for_brokers_waits_for_each_live_broker_and_skips_one_that_is_down(
        caplog: pytest.LogCaptureFixture) -> None:
    """What create_topics, create_partitions and the CLI's deletes and moves end with: every live broker
    at the version that holds the change, so the next client finds it whichever broker it asks."""
    ahead, lagging, down = _MetadataBroker(10), _MetadataBroker(8), _MetadataBroker(10)
    for b in (ahead, lagging, down):
        b.brokers = [(1, ahead.port), (2, lagging.port), (3, down.port)]  # type: ignore[attr-defined]
    down.server.stop(0)
    admin = Admin(f"127.0.0.1:{ahead.port}", request_timeout_ms=10_000)
    try:
        threading.Timer(0.3, setattr, (lagging, "version", 10)).start()
        start = time.monotonic()
        assert admin.wait_for_brokers(10) == [3], "the broker that is down is not waited for, and named"
        assert time.monotonic() - start >= 0.25 and lagging.asked >= 2, \
            f"returned before broker 2 reached version 10 (asked {lagging.asked} time(s))"

        lagging.version = 9  # behind for good: the wait ends at its deadline, and says so
        with caplog.at_level(logging.WARNING, logger="client.admin"):
            assert admin.wait_for_brokers(10, timeout_ms=300) == [3]
        assert "brokers [2] are still behind metadata version 10" in caplog.text, caplog.text

        # The controller fences it (cut off from the quorum) while we wait: no longer waited for.
        threading.Timer(0.3, setattr, (ahead, "fenced", {2})).start()
        start = time.monotonic()
        assert admin.wait_for_brokers(10, timeout_ms=5_000) == [3]
        assert time.monotonic() - start < 4, "waited out the deadline for a broker the others show fenced"
    finally:
        admin.close()
        for b in (ahead, lagging):
            b.server.stop(0)


def _connections_to(port: int) -> int:
    """ESTABLISHED TCP connections this process holds to ``port`` on this host (their client side)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # gRPC's sockets are IPv6, v4-mapped
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            rows += [line.split() for line in f.read().splitlines()[1:]]
    return sum(1 for r in rows if r[3] == "01" and r[9] in inodes and int(r[2].split(":")[1], 16) == port)


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="counts connections through /proc")
def test_each_client_has_its_own_connection_to_a_broker() -> None:
    """As a Kafka client does. gRPC shares one connection to an address among all channels of a process
    with the same options; a broker lets a connection have 100 streams open, so two clients of one
    process would compete for them (one's long polls holding the other's calls)."""
    broker = _MetadataBroker(10)
    broker.brokers = [(1, broker.port)]  # type: ignore[attr-defined]
    clients = [ClusterClient(f"127.0.0.1:{broker.port}", request_timeout_ms=10_000) for _ in range(2)]
    try:
        for c in clients:
            assert c.metadata(["t"], refresh=True).topics["t"].error_code == ErrorCode.NONE
        assert _connections_to(broker.port) == 2
    finally:
        for c in clients:
            c.close()
        broker.server.stop(0)
