"""Connections whose client certificate the listener's CA bundle no longer trusts are ended.

The README's way to revoke client certificates is to take their CA out of the listener's bundle
(``ssl.ca.location``). The listeners re-read the bundle for each new TLS handshake (broker/tls.py,
broker/kafka_wire/server.py), so a connection already open kept its handshake's verdict for as long as
the client held it: a revoked client went on producing and fetching until it chose to reconnect. A SASL
session no longer outlives its user (broker/sasl.py); this is the same rule for certificates.

Each listener with ``ssl.client.auth=required`` follows its bundle with a ``TrustAnchors``: the file is
looked at (a stat) at most once a ``CHECK_INTERVAL_S``, by the requests themselves, with no thread of its
own. When the bundle's certificates change:

- on a gRPC port (``GrpcCertificateCheck``, a server interceptor), the connections open on that port at
  that moment (the kernel's table, as broker/grpc_connections.py reads it; read twice, since a read may skip
  a connection) become suspects. The next call or stream message on a suspect connection has its client
  certificate (gRPC's auth context carries it) checked against the new bundle. Still trusted, the
  connection is no longer a suspect; not, the call ends UNAUTHENTICATED and the connection is shut down. A
  connection opened after the change had its handshake checked against the new bundle already and is not
  looked at;
- on the Kafka and replication listeners (``ConnectionTrust``), each connection remembers the bundle's
  generation at its handshake and is checked at its next request once the generation moved. One no longer
  trusted is closed, as Kafka closes a connection whose re-authentication fails (KIP-368).

"Trusted" means a certificate of the bundle issued the client's certificate (the issuer's name matches and
the signature checks out under that certificate's key). After the handshake only the client's own
certificate can be seen (neither gRPC nor Python's ssl keeps the chain it sent), so a client whose
certificate was issued by an intermediate CA that only the client sends is not recognised: its connection
is ended once at each change of the bundle, and its reconnection, which the TLS handshake checks against the
new bundle in full, goes on as before.
"""

from __future__ import annotations

import inspect
import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm

from broker.grpc_connections import read_connections, shut_down
from broker.log_limits import ThrottledWarning
from client.security import read_pem
from proto import errors

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0  # how often a listener's CA bundle file is looked at (a stat), at most
# How often the suspects of a gRPC port are matched against the connections still open: a connection that
# closed without a call since the change is forgotten (its client port may be reused by a new connection).
PRUNE_INTERVAL_S = 30.0
CLOSE_AFTER_S = 0.5  # a refused gRPC connection is shut down this long after its refusal
REFUSAL = "the client certificate is no longer trusted by this listener's CA bundle (ssl.ca.location)"


class TrustAnchors:
    """The CA certificates a listener's ``ssl.ca.location`` holds now. ``generation`` moves each time the file
    changes (its mtime, size or inode: what the listener's own reload looks at); a file that cannot be read or
    holds no certificate keeps the previous ones (as that reload does)."""

    def __init__(self, path: Path, what: str, interval_s: float = CHECK_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.what = what
        self.generation = 0
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next = clock() + interval_s
        self._warning = ThrottledWarning(log, every_s=60.0)  # before the first read, which may need it
        self._stamp = self._stat()
        self._certs: list[x509.Certificate] = self._read() or []

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _read(self) -> list[x509.Certificate] | None:
        try:
            return x509.load_pem_x509_certificates(read_pem(self.path, "ssl.ca.location"))
        except (errors.BrookError, ValueError) as e:
            self._warning.warn("%s: CA bundle %s unusable (%s); open connections are still checked against "
                               "the previous one", self.what, self.path, getattr(e, "message", e))
            return None

    def refresh(self, now: float | None = None) -> bool:
        """Re-read the bundle if its file changed (looked at no more than once an interval); whether it did."""
        now = self._clock() if now is None else now
        if now < self._next:
            return False
        with self._lock:
            if now < self._next:
                return False
            self._next = now + self._interval_s
            stamp = self._stat()
            if stamp is None or stamp == self._stamp:
                return False
            certs = self._read()
            if certs is None:
                return False  # retried when the file changes again
            # A new file is a change even with the same certificates as at the last look: the file may have held
            # others in between (a CA added, then taken out again within one interval), and a handshake of then
            # was checked against those.
            self._stamp = stamp
            self._certs = certs
            self.generation += 1
        log.info("%s: CA bundle %s changed (%d certificates); open connections are checked against it",
                 self.what, self.path, len(certs))
        return True

    def trusts(self, cert: x509.Certificate) -> bool:
        """Whether a certificate of the bundle issued ``cert``."""
        for ca in self._certs:
            try:
                cert.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
                continue
            return True
        return False

    def trusts_der(self, der: bytes | None) -> bool:
        """``trusts`` of a DER certificate (Python's ssl gives it); False for none or a broken one."""
        return self._trusts_encoded(der, x509.load_der_x509_certificate)

    def trusts_pem(self, pem: bytes | None) -> bool:
        """``trusts`` of a PEM certificate (gRPC's auth context gives it); False for none or a broken one."""
        return self._trusts_encoded(pem, x509.load_pem_x509_certificate)

    def _trusts_encoded(self, data: bytes | None, load: Callable[[bytes], x509.Certificate]) -> bool:
        if not data:
            return False
        try:
            return self.trusts(load(data))
        except ValueError:
            return False


class ConnectionTrust:
    """One asyncio TLS listener's side (Kafka, replication): ``generation()`` when a connection's handshake
    is done, then ``holds(sslobj, generation)`` before each of its requests."""

    def __init__(self, anchors: TrustAnchors, on_revoked: Callable[[], None] | None = None) -> None:
        self.anchors = anchors
        self._on_revoked = on_revoked

    def generation(self) -> int:
        self.anchors.refresh()
        return self.anchors.generation

    def holds(self, sslobj: Any, generation: int) -> int | None:
        """The bundle generation the connection now holds under, or None when its certificate is no longer
        trusted (counted; the caller closes the connection)."""
        current = self.generation()
        if current == generation:
            return generation
        der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
        if self.anchors.trusts_der(der):
            return current
        if self._on_revoked is not None:
            self._on_revoked()
        return None


@dataclass
class _Suspect:
    anchors: TrustAnchors
    inode: int
    refused: bool = False


def peer_key(peer: str) -> tuple[str, int] | None:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` -> (the IP as the kernel's table names it, the port)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
        mapped = getattr(ip, "ipv4_mapped", None)
        return str(mapped or ip), int(port)
    except ValueError:
        return None


class GrpcCertificateCheck:
    """The gRPC side: ``allows(context)`` for each call and each stream message of a server; ``watch`` adds
    each of its mTLS listeners once its port is bound. ``what`` names the server in log lines."""

    def __init__(self, what: str, on_revoked: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._listeners: list[tuple[int, TrustAnchors]] = []
        self._ports: list[int] = []
        self.what = what
        self.revoked_total = 0
        self._on_revoked = on_revoked
        self._clock = clock
        self._lock = threading.Lock()
        self._suspects: dict[tuple[str, int], _Suspect] = {}
        self._next_look = clock() + CHECK_INTERVAL_S
        self._next_prune = 0.0
        self._closing: set[int] = set()  # connections refused, to shut down once their refusal is sent
        self._closer: threading.Timer | None = None

    def watch(self, port: int, tls: Any) -> None:
        """Follow the CA bundle of the listener bound at ``port`` (a ``broker.tls.ServerTls``), if it requires
        client certificates."""
        if tls is None or tls.ca is None or tls.client_auth != "required":
            return
        self._listeners.append((port, TrustAnchors(tls.ca, f"{self.what} port {port}", clock=self._clock)))
        self._ports.append(port)

    def suspects(self) -> int:
        return len(self._suspects)

    def checking(self) -> bool:
        """Whether calls are checked now (some connection predates a change of its listener's bundle)."""
        now = self._clock()
        if now >= self._next_look:
            self._look(now)
        return bool(self._suspects)

    def _look(self, now: float) -> None:
        with self._lock:
            if now < self._next_look:
                return
            self._next_look = now + CHECK_INTERVAL_S
        changed = {port: anchors for port, anchors in self._listeners if anchors.refresh(now)}
        if changed:
            found = read_connections(changed, reads=2)  # a connection left out is never checked
            with self._lock:
                for c in found:
                    self._suspects[(c.address, c.port)] = _Suspect(changed[c.local_port], c.inode)
            self._next_prune = now + PRUNE_INTERVAL_S
            log.info("%s: %d open connection(s) on port(s) %s will have their client certificate checked against "
                     "the new CA bundle at their next request", self.what, len(found),
                     ", ".join(map(str, sorted(changed))))
        elif self._suspects and now >= self._next_prune:
            self._next_prune = now + PRUNE_INTERVAL_S
            still_open = {c.inode for c in read_connections(self._ports, reads=2)}  # one left out: unchecked
            with self._lock:
                for key in [k for k, s in self._suspects.items() if s.inode not in still_open]:
                    del self._suspects[key]

    def _close_soon(self, inode: int) -> None:
        """Shut the connection down once the refusal had time to reach the client (shut down at once, the
        client saw its connection fail, UNAVAILABLE, and retried on a new one, without the reason). One timer
        for all the connections refused meanwhile."""
        with self._lock:
            self._closing.add(inode)
            if self._closer is not None:
                return
            self._closer = threading.Timer(CLOSE_AFTER_S, self._close_now)
            self._closer.daemon = True
            self._closer.start()

    def _close_now(self) -> None:
        with self._lock:
            inodes, self._closing, self._closer = self._closing, set(), None
        shut_down(inodes)

    def allows(self, context: Any) -> bool:
        """Whether this call (or stream message) may go on; False ends it, and its connection is shut down."""
        if not self.checking():
            return True
        try:
            key = peer_key(context.peer())
        except Exception:  # a call that ended has no peer
            return True
        suspect = self._suspects.get(key) if key is not None else None
        if suspect is None:
            return True
        if suspect.refused:
            return False
        try:
            pem = (context.auth_context() or {}).get("x509_pem_cert") or [b""]
        except Exception:
            pem = [b""]
        if suspect.anchors.trusts_pem(pem[0]):
            with self._lock:
                self._suspects.pop(key, None)  # type: ignore[arg-type]
            return True
        with self._lock:
            if suspect.refused:
                return False
            suspect.refused = True
        self._close_soon(suspect.inode)
        self.revoked_total += 1
        if self._on_revoked is not None:
            self._on_revoked()
        log.info("%s: closing the connection of %s: its client certificate is no longer trusted by CA bundle %s",
                 self.what, context.peer(), suspect.anchors.path)
        return False


def _checked_requests_sync(requests: Any, context: grpc.ServicerContext, check: GrpcCertificateCheck) -> Any:
    for request in requests:
        if not check.allows(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
        yield request


class CertificateInterceptor(grpc.ServerInterceptor):
    """``GrpcCertificateCheck`` on a synchronous gRPC server (the controller's): each call is checked at its
    start and each message of a request stream as it arrives. It goes before the receive gate, and so before
    the metrics interceptor (``outermost``, broker/node.py)."""

    outermost = True

    def __init__(self, check: GrpcCertificateCheck) -> None:
        self.check = check

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or (not handler.request_streaming and not self.check.checking()):
            return handler
        check = self.check
        if handler.request_streaming:
            inner = handler.stream_stream or handler.stream_unary

            def streamed(requests: Any, context: grpc.ServicerContext) -> Any:
                if not check.allows(context):
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
                return inner(_checked_requests_sync(requests, context, check), context)
            make = (grpc.stream_stream_rpc_method_handler if handler.response_streaming
                    else grpc.stream_unary_rpc_method_handler)
            return make(streamed, handler.request_deserializer, handler.response_serializer)
        inner = handler.unary_stream or handler.unary_unary

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            if not check.allows(context):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
            return inner(request, context)
        make = grpc.unary_stream_rpc_method_handler if handler.response_streaming else grpc.unary_unary_rpc_method_handler
        return make(unary, handler.request_deserializer, handler.response_serializer)


class AioCertificateInterceptor(grpc.aio.ServerInterceptor):
    """``GrpcCertificateCheck`` on the broker's grpc.aio server. It goes outside the receive gate
    (broker/receiving.py), whose handlers are all request-streaming coroutines or async generators: a call is
    checked before it takes a receive slot, and each message of a request stream as it arrives. ``outermost``:
    the metrics interceptor goes after the gates (broker/node.py)."""

    outermost = True

    def __init__(self, check: GrpcCertificateCheck) -> None:
        self.check = check
        self._streams: dict[str, Any] = {}  # method -> its wrapped handler (a stream is always checked)

    async def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.request_streaming and handler.response_streaming:
            wrapped = self._streams.get(handler_call_details.method)
            if wrapped is None or wrapped[0] is not handler:
                wrapped = self._streams[handler_call_details.method] = (handler, self._stream(handler))
            return wrapped[1]
        if not self.check.checking():
            return handler
        return self._started(handler)

    def _started(self, handler: Any) -> Any:
        """``handler`` checked as its call starts (a call with one request message, or the receive gate's
        unary calls, which read theirs themselves)."""
        check = self.check
        inner = handler.stream_unary or handler.unary_unary or handler.unary_stream
        if inspect.iscoroutinefunction(inner):
            async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if not check.allows(context):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
                return await inner(request, context)
            behaviour: Any = call
        elif inspect.isasyncgenfunction(inner):
            async def answers(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if not check.allows(context):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
                async for response in inner(request, context):
                    yield response
            behaviour = answers
        else:
            return handler  # a synchronous handler: the receive gate serves none (it runs them as coroutines)
        make = (grpc.stream_unary_rpc_method_handler if handler.request_streaming else
                grpc.unary_stream_rpc_method_handler if handler.response_streaming else
                grpc.unary_unary_rpc_method_handler)
        return make(behaviour, handler.request_deserializer, handler.response_serializer)

    def _stream(self, handler: Any) -> Any:
        inner, check = handler.stream_stream, self.check

        async def checked(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async for request in requests:
                if not check.allows(context):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
                yield request

        if inspect.isasyncgenfunction(inner):
            async def stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                if not check.allows(context):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
                async for response in inner(checked(requests, context), context):
                    yield response
            behaviour: Any = stream
        else:
            async def writes(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                if not check.allows(context):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)
                return await inner(checked(requests, context), context)
            behaviour = writes
        return grpc.stream_stream_rpc_method_handler(behaviour, handler.request_deserializer,
                                                     handler.response_serializer)
