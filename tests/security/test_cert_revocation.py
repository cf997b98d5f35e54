"""Open connections end once the listener's CA bundle no longer trusts their client certificate.

Replacing ``ssl.ca.location`` used to revoke a client certificate for new connections only: a client
already connected went on calling for as long as it kept its connection. Real gRPC servers (the
controller's synchronous one, the broker's grpc.aio one) on real sockets, with the interceptors of
broker/cert_revocation.py, and the bundle replaced on disk.
"""

from __future__ import annotations

import asyncio
import datetime
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from waiting import wait_for

from broker.cert_revocation import (
    AioCertificateInterceptor,
    CertificateInterceptor,
    ConnectionTrust,
    GrpcCertificateCheck,
    TrustAnchors,
    peer_key,
)
from broker.tls import ServerTls, bind_port
from client.security import SecurityConfig, make_channel
from deploy.local.certs import CertificateAuthority

FRESH = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel
TIMEOUT_S = 20.0


@pytest.fixture()
def pki(tmp_path: Path) -> dict[str, object]:
    ca1 = CertificateAuthority.create(tmp_path / "ca1", "CA one")
    ca2 = CertificateAuthority.create(tmp_path / "ca2", "CA two")
    server_dir = tmp_path / "server"
    both = tmp_path / "both.pem"
    both.write_bytes(ca1.path.read_bytes() + ca2.path.read_bytes())
    out: dict[str, object] = {"ca1": ca1, "ca2": ca2, "both": both, "server": ca1.issue(server_dir, "node-1"),
                              "clients_ca": server_dir / "clients-ca.pem",
                              "alice": ca1.issue(tmp_path / "alice", "alice", hosts=(), server=False),
                              "bob": ca2.issue(tmp_path / "bob", "bob", hosts=(), server=False)}
    shutil.copy(ca1.path, server_dir / "clients-ca.pem")
    return out


def replace(path: Path, data: bytes) -> None:
    """Atomically, as an operator (or cert-manager) would."""
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    tmp.replace(path)


def _whoami(request: bytes, context: grpc.ServicerContext) -> bytes:
    return b"ok"


def _echo(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    yield from requests


async def _aio_whoami(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"ok"


async def _aio_echo(requests, context):  # type: ignore[no-untyped-def]
    async for r in requests:
        yield r


class Server:
    """A sync or grpc.aio server with the certificate check, on 127.0.0.1 with mTLS."""

    def __init__(self, kind: str, tls: ServerTls) -> None:
        self.check = GrpcCertificateCheck(f"test {kind} server")
        self.kind = kind
        self._loop: asyncio.AbstractEventLoop | None = None
        if kind == "sync":
            self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                                      interceptors=[CertificateInterceptor(self.check)])
            self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.T", {
                "Who": grpc.unary_unary_rpc_method_handler(_whoami),
                "Echo": grpc.stream_stream_rpc_method_handler(_echo)}),))
            self.port = bind_port(self.server, "127.0.0.1", 0, tls)
            self.server.start()
        else:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
            self._thread.start()
            self.port = asyncio.run_coroutine_threadsafe(self._start_aio(tls), self._loop).result(10)
        self.check.watch(self.port, tls)

    async def _start_aio(self, tls: ServerTls) -> int:
        self.server = grpc.aio.server(interceptors=[AioCertificateInterceptor(self.check)])
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.T", {
            "Who": grpc.unary_unary_rpc_method_handler(_aio_whoami),
            "Echo": grpc.stream_stream_rpc_method_handler(_aio_echo)}),))
        port = bind_port(self.server, "127.0.0.1", 0, tls)
        await self.server.start()
        return port

    def stop(self) -> None:
        if self._loop is None:
            self.server.stop(0)
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture(params=["sync", "aio"])
def server(request: pytest.FixtureRequest, pki: dict) -> Iterator[Server]:
    files = pki["server"]
    srv = Server(request.param, ServerTls(files.cert, files.key, pki["clients_ca"]))
    try:
        yield srv
    finally:
        srv.stop()


def channel(port: int, client, ca1: CertificateAuthority) -> grpc.Channel:  # type: ignore[no-untyped-def]
    sec = SecurityConfig(protocol="SSL", ssl_ca_location=str(ca1.path), ssl_certificate_location=str(client.cert),
                         ssl_key_location=str(client.key))
    return make_channel(f"127.0.0.1:{port}", sec, options=FRESH)


def call(ch: grpc.Channel) -> str | grpc.StatusCode:
    try:
        return ch.unary_unary("/test.T/Who")(b"x", timeout=5).decode()
    except grpc.RpcError as e:
        return e.code()


def until(what: str, fn: Callable[[], object], timeout_s: float = TIMEOUT_S) -> object:
    return wait_for(fn, timeout_s=timeout_s, what=what)


class Stream:
    """A bidi stream kept open: ``send(x)`` and read its echo."""

    def __init__(self, ch: grpc.Channel) -> None:
        self._out: list[bytes | None] = []
        self._cv = threading.Condition()
        self.call = ch.stream_stream("/test.T/Echo")(self._requests(), timeout=60)

    def _requests(self) -> Iterator[bytes]:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._out)
                item = self._out.pop(0)
            if item is None:
                return
            yield item

    def send(self, data: bytes) -> bytes | grpc.StatusCode:
        with self._cv:
            self._out.append(data)
            self._cv.notify()
        try:
            return next(self.call)
        except grpc.RpcError as e:
            return e.code()

    def close(self) -> None:
        with self._cv:
            self._out.append(None)
            self._cv.notify()


def test_an_open_connection_of_a_removed_ca_is_refused_and_closed(server: Server, pki: dict) -> None:
    alice_ch = channel(server.port, pki["alice"], pki["ca1"])
    stream_ch = channel(server.port, pki["alice"], pki["ca1"])
    assert call(alice_ch) == "ok"
    stream = Stream(stream_ch)
    assert stream.send(b"before") == b"before"

    replace(pki["clients_ca"], pki["ca2"].path.read_bytes())  # CA one is out: alice is revoked

    # Her open connection is checked at its next call (the bundle is looked at once a second): refused.
    first = until("alice's open connection to be refused", lambda: (r := call(alice_ch)) != "ok" and r)
    assert first == grpc.StatusCode.UNAUTHENTICATED, first
    # The stream opened before the change ends at its next message, with the same refusal.
    assert stream.send(b"after") == grpc.StatusCode.UNAUTHENTICATED
    # Her connection is closed (once the refusal had time to arrive): what she sends next needs a new
    # handshake, which CA two refuses. Until then every call is refused.
    seen: list[object] = []
    until("alice's connection to be closed", lambda: seen.append(call(alice_ch)) or seen[-1] == grpc.StatusCode.UNAVAILABLE)
    assert set(seen) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE}, seen
    assert server.check.revoked_total == 2, server.check.revoked_total
    # Bob's CA two is trusted now.
    assert call(channel(server.port, pki["bob"], pki["ca1"])) == "ok"
    stream.close()


def test_adding_a_ca_leaves_open_connections_alone(server: Server, pki: dict) -> None:
    alice_ch = channel(server.port, pki["alice"], pki["ca1"])
    assert call(alice_ch) == "ok"
    stream = Stream(channel(server.port, pki["alice"], pki["ca1"]))
    assert stream.send(b"1") == b"1"
    anchors = server.check._listeners[0][1]

    replace(pki["clients_ca"], pki["both"].read_bytes())  # the first step of a CA rotation

    until("the check to see the new bundle", lambda: call(alice_ch) == "ok" and anchors.generation == 1)
    # Judged once against the new bundle, still trusted: no longer a suspect, and nothing was closed.
    assert call(alice_ch) == "ok"
    assert stream.send(b"2") == b"2"
    assert server.check.suspects() == 0
    assert server.check.revoked_total == 0
    assert call(channel(server.port, pki["bob"], pki["ca1"])) == "ok"
    stream.close()


def test_a_connection_made_after_the_change_is_not_looked_at(server: Server, pki: dict) -> None:
    replace(pki["clients_ca"], pki["both"].read_bytes())
    bob = channel(server.port, pki["bob"], pki["ca1"])
    until("bob to be served", lambda: call(bob) == "ok")
    until("the check to see the new bundle", lambda: server.check.checking() or
          server.check._listeners[0][1].generation == 1)
    assert call(bob) == "ok"
    assert server.check.revoked_total == 0


# ---------------------------------------------------------------- TrustAnchors without a server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cert(pki: dict, name: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pki[name].cert.read_bytes())


def test_anchors_follow_the_file_at_most_once_an_interval(pki: dict, tmp_path: Path) -> None:
    clock = Clock()
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki["ca1"].path.read_bytes())
    anchors = TrustAnchors(bundle, "test", interval_s=1.0, clock=clock)
    alice, bob = _cert(pki, "alice"), _cert(pki, "bob")
    assert anchors.trusts(alice) and not anchors.trusts(bob)

    replace(bundle, pki["ca2"].path.read_bytes())
    assert not anchors.refresh(), "looked again before the interval"
    assert anchors.trusts(alice)
    clock.now += 1.0
    assert anchors.refresh()
    assert anchors.generation == 1
    assert not anchors.trusts(alice) and anchors.trusts(bob)

    # The same certificates in a new file are a change too: in between (within one interval, unseen here) the
    # file may have held others, which a handshake then was checked against.
    replace(bundle, pki["ca2"].path.read_bytes())
    clock.now += 1.0
    assert anchors.refresh() and anchors.generation == 2
    # A garbage file: the previous certificates are kept.
    replace(bundle, b"-----BEGIN CERTIFICATE-----\nnot base64\n")
    clock.now += 1.0
    assert not anchors.refresh() and anchors.generation == 2
    assert anchors.trusts(bob)
    bundle.unlink()
    clock.now += 1.0
    assert not anchors.refresh() and anchors.trusts(bob)


def test_a_bundle_unusable_when_the_listener_starts_trusts_nothing_until_it_is_fixed(pki: dict, tmp_path: Path) -> None:
    """The bundle may be replaced between the listener's own load and this one (a Kafka listener opens once the
    first metadata arrives): a garbage file then trusts no certificate, and the start goes on."""
    clock = Clock()
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
    anchors = TrustAnchors(bundle, "test", interval_s=1.0, clock=clock)
    assert not anchors.trusts(_cert(pki, "alice"))
    replace(bundle, pki["ca1"].path.read_bytes())
    clock.now += 1.0
    assert anchors.refresh() and anchors.trusts(_cert(pki, "alice"))


def test_a_certificate_with_the_issuers_name_but_another_key_is_not_trusted(pki: dict, tmp_path: Path) -> None:
    """Trust is the signature under the bundle certificate's key, not a matching issuer name."""
    ca1: CertificateAuthority = pki["ca1"]
    impostor_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    forged = (x509.CertificateBuilder().subject_name(x509.Name.from_rfc4514_string("CN=alice"))
              .issuer_name(x509.load_pem_x509_certificate(ca1.path.read_bytes()).subject)
              .public_key(impostor_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
              .sign(impostor_key, hashes.SHA256()))
    anchors = TrustAnchors(ca1.path, "test")
    assert not anchors.trusts(forged)
    assert anchors.trusts(_cert(pki, "alice"))
    assert not anchors.trusts_pem(b"") and not anchors.trusts_pem(b"garbage") and not anchors.trusts_der(b"\x30\x00")


@pytest.mark.parametrize(("peer", "key"), [
    ("ipv4:10.0.0.5:5000", ("10.0.0.5", 5000)),
    ("ipv6:[::1]:6000", ("::1", 6000)),
    ("ipv6:[::ffff:127.0.0.1]:7000", ("127.0.0.1", 7000)),  # a dual-stack port: as the kernel's table names it
    ("unix:/tmp/x", None),
    ("ipv4:nonsense", None),
])
def test_peer_key(peer: str, key: tuple[str, int] | None) -> None:
    assert peer_key(peer) == key


def test_checking_costs_nothing_until_a_bundle_changes(pki: dict) -> None:
    clock = Clock()
    check = GrpcCertificateCheck("test", clock=clock)
    files = pki["server"]
    check.watch(1, ServerTls(files.cert, files.key, pki["clients_ca"]))
    check.watch(2, ServerTls(files.cert, files.key, None, "none"))  # no client certificates: not followed
    assert len(check._listeners) == 1
    for _ in range(5):  # looks at the unchanged file: nothing to check
        clock.now += 1.0
        assert not check.checking()
    replace(pki["clients_ca"], pki["ca2"].path.read_bytes())
    clock.now += 1.0
    assert not check.checking()  # nothing is connected to port 1
    assert check._listeners[0][1].generation == 1


class FakeSsl:
    """What a connection's ssl object gives after the handshake: the client's certificate, DER."""

    def __init__(self, der: bytes | None) -> None:
        self.der = der

    def getpeercert(self, binary_form: bool = False) -> bytes | None:
        return self.der


def test_an_asyncio_listener_connection_is_judged_once_after_each_change(pki: dict, tmp_path: Path) -> None:
    """The Kafka and replication listeners' side: a connection is checked only when the bundle's generation
    moved since it was last found trusted."""
    from cryptography.hazmat.primitives.serialization import Encoding

    clock = Clock()
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki["ca1"].path.read_bytes())
    revoked: list[int] = []
    trust = ConnectionTrust(TrustAnchors(bundle, "test", clock=clock), lambda: revoked.append(1))
    alice = FakeSsl(_cert(pki, "alice").public_bytes(Encoding.DER))
    bob = FakeSsl(_cert(pki, "bob").public_bytes(Encoding.DER))
    start = trust.generation()
    assert trust.holds(alice, start) == start
    assert trust.holds(bob, start) == start  # not looked at: nothing changed since its handshake

    replace(bundle, pki["both"].read_bytes())
    clock.now += 1.0
    assert trust.holds(alice, start) == start + 1  # checked against the new bundle, still trusted
    replace(bundle, pki["ca2"].path.read_bytes())
    clock.now += 1.0
    assert trust.holds(alice, start + 1) is None and revoked == [1]
    assert trust.holds(bob, start + 1) == start + 2
    assert trust.holds(FakeSsl(None), start) is None  # no certificate at all: not trusted
