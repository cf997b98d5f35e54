"""Who is calling: the authenticated principal of a gRPC request.

One answer for every service (broker, controller, group coordinator) and for both
sync ``grpc`` and ``grpc.aio`` servicer contexts, in this order:

1. a client certificate verified on an mTLS listener: its subject DN (RFC 2253,
   ``CN=alice,O=Example``), rewritten by ``ssl.principal.mapping.rules`` (Kafka's
   syntax; Brook's default keeps the CN, then falls back to the whole DN), becomes
   ``User:<name>``;
2. otherwise a SASL session: the resolver installed with ``set_session_resolver``
   (the SCRAM code of the ``acl`` package) maps the request metadata to a principal;
3. otherwise ``ANONYMOUS``.

Broker identity: a broker's own certificate maps to ``node_principal(node_id)``
(``User:node-<id>`` by default, from ``CN=node-<id>``). Broker-only RPCs
(RegisterBroker, BrokerHeartbeat, ControlledShutdown, AlterPartition, replica fetches)
call ``require_node(context, node_id)``, which accepts only that node's certificate
principal. A SASL user can never act as a broker, whatever its name: broker identity
comes from certificates only. The one exception is a plaintext caller on the loopback
interface, trusted as any broker while ``configure(trust_loopback_plaintext=True)``
(the default; the node config turns it off when any plaintext listener is reachable
beyond loopback), so single-host dev clusters and the test suite run without TLS; a
caller reaching a node over the network must present a node certificate. On a
single-host cluster with an authorizer, ``inter.broker.sasl.username`` narrows that
trust to loopback callers authenticated as that SCRAM user (the nodes themselves).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.admission import peer_host
from metadata_quorum.security import acl_host
from proto import errors

log = logging.getLogger(__name__)

USER = "User"
SESSION_METADATA_KEY = "x-brook-session"  # where a SASL session token travels (the acl package's SCRAM)
DEFAULT_NODE_PRINCIPAL_FORMAT = "User:node-{id}"
# Brook's default takes the CN (Kafka's DEFAULT alone would keep the whole DN), so
# "CN=alice,O=Example" is User:alice and a node certificate "CN=node-1,..." is User:node-1.
DEFAULT_MAPPING_RULES = "RULE:^CN=([^,]*)(,.*)?$/$1/,DEFAULT"
RULES_MAX = 64  # bound on configured mapping rules

AUTH_CERTIFICATE = "certificate"
AUTH_SASL = "sasl"
AUTH_NONE = "none"
AUTH_FORWARDED = "forwarded"  # a broker forwarding a Kafka-protocol client's admin request (KIP-590's envelope)
FORWARDED_PRINCIPAL_KEY = "x-brook-forwarded-principal"
FORWARDED_HOST_KEY = "x-brook-forwarded-host"  # that client's address, for ACLs with a host


@dataclass(frozen=True)
class Principal:
    kind: str
    name: str
    # The caller's address (canonical IP: metadata_quorum.security.acl_host) when this is a request's
    # caller, for ACLs with a host; "" when unknown. Not part of the identity: equality, hashing and
    # str() ignore it.
    host: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Principal:
        """``"User:alice"`` -> Principal("User", "alice")."""
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise errors.InvalidConfigError(f"principal {text!r} must look like Kind:name, e.g. User:alice")
        return cls(kind, name)


ANONYMOUS = Principal(USER, "ANONYMOUS")


@dataclass(frozen=True)
class Authentication:
    """A principal plus how it was established (certificate, sasl or none) and the peer address."""

    principal: Principal
    method: str
    peer: str = ""


# ----------------------------------------------------------------------------- mapping rules


@dataclass(frozen=True)
class MappingRule:
    """One ``RULE:pattern/replacement/[LU]`` (or DEFAULT) of ``ssl.principal.mapping.rules``."""

    pattern: re.Pattern[str] | None  # None: DEFAULT (the whole DN)
    replacement: str = ""
    case: str = ""  # "", "L" or "U"

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        match = self.pattern.fullmatch(dn)
        if match is None:
            return None
        # Kafka writes back-references as $1; Python's are \1.
        result = match.expand(re.sub(r"\$(\d+)", r"\\g<\1>", self.replacement.replace("\\", "\\\\")))
        if self.case == "L":
            result = result.lower()
        elif self.case == "U":
            result = result.upper()
        return result


_RULE_RE = re.compile(r"RULE:((?:\\.|[^/\\])*)/((?:\\.|[^/\\])*)/([LU]?)")


def parse_mapping_rules(text: str | Sequence[str]) -> tuple[MappingRule, ...]:
    """Parse Kafka's ``ssl.principal.mapping.rules``; a bad rule raises InvalidConfigError."""
    source = text if isinstance(text, str) else ",".join(text)
    source = source.strip()
    if not source:
        return (MappingRule(None),)
    rules: list[MappingRule] = []
    pos = 0
    while pos < len(source):
        rest = source[pos:].lstrip(" ,\n\t")
        pos = len(source) - len(rest)
        if not rest:
            break
        if rest.startswith("DEFAULT"):
            rules.append(MappingRule(None))
            pos += len("DEFAULT")
        else:
            match = _RULE_RE.match(rest)
            if match is None:
                raise errors.InvalidConfigError(
                    f"ssl.principal.mapping.rules: cannot parse {rest[:60]!r}; expected RULE:pattern/replacement/"
                    "[LU] or DEFAULT")
            try:
                pattern = re.compile(match.group(1).replace("\\/", "/"))
            except re.error as e:
                raise errors.InvalidConfigError(
                    f"ssl.principal.mapping.rules: bad pattern {match.group(1)!r}: {e}") from None
            rules.append(MappingRule(pattern, match.group(2).replace("\\/", "/"), match.group(3)))
            pos += match.end()
        if len(rules) > RULES_MAX:
            raise errors.InvalidConfigError(f"ssl.principal.mapping.rules: more than {RULES_MAX} rules")
    return tuple(rules)


def map_subject(dn: str, rules: Sequence[MappingRule]) -> str | None:
    """The first rule that matches the DN decides; no match -> None (the caller refuses the cert)."""
    for rule in rules:
        name = rule.apply(dn)
        if name is not None:
            return name
    return None


@functools.lru_cache(maxsize=1024)
def _mapped_subject(dn: str, rules: tuple[MappingRule, ...]) -> str | None:
    """``map_subject``, cached: every request on an mTLS listener maps its certificate's subject, and
    the same few subjects come back (a changed rule set is another key)."""
    return map_subject(dn, rules)


def principal_from_subject(dn: str) -> Principal:
    """The principal of a verified certificate subject (RFC 2253), as for a gRPC call; a subject no
    ``ssl.principal.mapping.rules`` accepts is refused (SASL_AUTHENTICATION_FAILED)."""
    name = _mapped_subject(dn, _settings.rules)
    if name is None:
        raise errors.error_for(errors.ErrorCode.SASL_AUTHENTICATION_FAILED,
                               f"certificate subject {dn!r} matches no ssl.principal.mapping.rules")
    return Principal(USER, name)


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class _Settings:
    rules: tuple[MappingRule, ...] = parse_mapping_rules(DEFAULT_MAPPING_RULES)
    node_principal_format: str = DEFAULT_NODE_PRINCIPAL_FORMAT
    trust_loopback_plaintext: bool = True
    # When set (from inter.broker.sasl.username), a loopback plaintext caller is trusted as a
    # node only when its SASL session is this principal: anonymous local clients are not.
    loopback_node_principal: Principal | None = None


_settings = _Settings()
_settings_lock = threading.Lock()
# fn(invocation metadata: the raw ((key, value), ...) of the call, or None) -> Principal | None
SessionResolver = Callable[[Sequence[tuple[str, Any]] | None], "Principal | None"]
_session_resolver: SessionResolver | None = None


_UNSET: Any = object()


def configure(*, mapping_rules: str | Sequence[str] | None = None, node_principal_format: str | None = None,
              trust_loopback_plaintext: bool | None = None,
              loopback_node_principal: Principal | None = _UNSET) -> None:
    """Set this process's principal rules (from the node config at start). Unset arguments keep their value."""
    global _settings
    with _settings_lock:
        s = _settings
        rules = s.rules if mapping_rules is None else parse_mapping_rules(mapping_rules)
        fmt = s.node_principal_format if node_principal_format is None else node_principal_format
        if "{id}" not in fmt:
            raise errors.InvalidConfigError(f"broker principal format {fmt!r} must contain {{id}}")
        Principal.parse(fmt.replace("{id}", "0"))
        trust = s.trust_loopback_plaintext if trust_loopback_plaintext is None else trust_loopback_plaintext
        loopback = s.loopback_node_principal if loopback_node_principal is _UNSET else loopback_node_principal
        _settings = _Settings(rules, fmt, trust, loopback)


def set_session_resolver(fn: SessionResolver | None) -> None:
    """Install (or with None remove) the SASL session resolver: invocation metadata -> Principal | None.

    Called for requests without a verified client certificate. It must be cheap and
    must not raise for bad input: an unknown or expired session returns None (the
    caller is then ANONYMOUS) or raises ``BrookError(SASL_AUTHENTICATION_FAILED)``,
    which ``authenticate`` lets through so the RPC fails with that code.
    """
    global _session_resolver
    _session_resolver = fn


def node_principal(node_id: int) -> Principal:
    """What broker/controller ``node_id``'s own certificate maps to (e.g. User:node-3)."""
    return _node_principal(_settings.node_principal_format, int(node_id))


@functools.lru_cache(maxsize=1024)  # asked at every follower fetch; bounded, as the ids come from requests
def _node_principal(fmt: str, node_id: int) -> Principal:
    return Principal.parse(fmt.replace("{id}", str(node_id)))


def node_id_of(principal: Principal) -> int | None:
    """The node id whose principal this is, or None (inverse of ``node_principal``)."""
    fmt = _settings.node_principal_format
    head, _, tail = fmt.partition("{id}")
    text = str(principal)
    if text.startswith(head) and text.endswith(tail):
        middle = text[len(head):len(text) - len(tail)]
        if middle.isdigit():
            return int(middle)
    return None


# ----------------------------------------------------------------------------- per request


def _auth_value(auth: Mapping[str, Sequence[bytes]], key: str) -> str | None:
    values = auth.get(key) or ()
    return values[0].decode("utf-8", "replace") if values else None


class CallIdentity:
    """A streaming call's context whose identity is read once, for every message of the stream.

    A call's peer, TLS auth context and invocation metadata are fixed when it starts; reading them
    from grpc.aio's context costs a broker more than a follower fetch's own work when done for each
    message of a ReplicaFetch or ProduceStream. ``authenticate`` keeps a certificate's answer here
    too, and an anonymous one where no SASL is served; a SASL session is resolved again for each
    message (it may expire while the stream is open), and so is a forwarded principal. Everything else (``abort``,
    ``time_remaining``, the Kafka listener's attributes) is the wrapped context's.
    """

    __slots__ = ("_context", "_peer", "_auth", "_metadata", "known")

    # A stream's request ends with its answer on the stream, not with a call of its own: the stream's
    # done callback is not the request's (broker.admission.release_when_done releases at once).
    add_done_callback = None

    def __init__(self, context: Any) -> None:
        self._context = context
        try:
            self._peer = str(context.peer())
        except Exception:  # a closed call has no peer; not an identity anyway
            self._peer = ""
        try:
            self._auth = context.auth_context() or {}
        except Exception:
            self._auth = {}
        try:
            self._metadata = tuple(context.invocation_metadata() or ())
        except Exception:
            self._metadata = ()
        self.known: Authentication | None = None

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> Mapping[str, Sequence[bytes]]:
        return self._auth

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def authenticate(context: Any) -> Authentication:
    """The caller of this request, for sync grpc and grpc.aio ServicerContexts alike.

    A broker may forward a request for a client of its Kafka listener with the client's principal in
    ``x-brook-forwarded-principal`` metadata (as Kafka's brokers wrap forwarded requests in an envelope,
    KIP-590); that principal is the caller only when the sender is itself a node. The forwarded caller
    is never a node: its method is ``forwarded``.
    """
    fixed = getattr(context, "brook_authentication", None)
    if isinstance(fixed, Authentication):  # a Kafka-protocol connection (broker/kafka_wire/context.py)
        return fixed
    if isinstance(context, CallIdentity):
        if context.known is not None:
            return context.known
        auth = _authenticate_call(context)
        if auth.method == AUTH_CERTIFICATE or (auth.method == AUTH_NONE and _session_resolver is None):
            context.known = auth
        return auth
    return _authenticate_call(context)


def _authenticate_call(context: Any) -> Authentication:
    direct = _authenticate_direct(context)
    forwarded = _metadata_value(context, FORWARDED_PRINCIPAL_KEY)
    if forwarded is None:
        return direct
    if not is_node_auth(direct):
        log.warning("ignored a forwarded principal from %s (%s): only nodes may forward", direct.principal, direct.peer)
        return direct
    try:
        caller = Principal.parse(forwarded)
    except errors.BrookError:
        caller = ANONYMOUS
    try:  # the forwarding node's word for its client's address; unknown ("") if it sent none
        host = acl_host(_metadata_value(context, FORWARDED_HOST_KEY) or "")
    except ValueError:
        host = ""
    return Authentication(Principal(caller.kind, caller.name, host), AUTH_FORWARDED, direct.peer)


def _metadata_value(context: Any, key: str) -> str | None:
    try:
        metadata = tuple(context.invocation_metadata() or ())
    except Exception:
        return None
    for k, v in metadata:
        if k == key:
            return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
    return None


def _authenticate_direct(context: Any) -> Authentication:
    peer = ""
    try:
        peer = str(context.peer())
    except Exception:  # a test double or a closed call has no peer; not an identity anyway
        peer = ""
    auth = _authenticate_peer(context, peer)
    hosted = with_host(auth.principal, peer)
    return auth if hosted is auth.principal else Authentication(hosted, auth.method, peer)


def _authenticate_peer(context: Any, peer: str) -> Authentication:
    auth: Mapping[str, Sequence[bytes]] = {}
    try:
        auth = context.auth_context() or {}
    except Exception:
        auth = {}
    # gRPC sets x509_subject only for a client certificate it verified against the
    # listener's CA (ssl_server_credentials with require_client_auth).
    subject = _auth_value(auth, "x509_subject")
    if subject:
        return Authentication(principal_from_subject(subject), AUTH_CERTIFICATE, peer)
    resolver = _session_resolver
    if resolver is not None:
        try:
            metadata = tuple(context.invocation_metadata() or ())
        except Exception:
            metadata = ()
        principal = resolver(metadata)
        if principal is not None:
            return Authentication(principal, AUTH_SASL, peer)
    return Authentication(ANONYMOUS, AUTH_NONE, peer)


def is_tls(context: Any) -> bool:
    """Whether this request came over a TLS connection."""
    try:
        auth = context.auth_context() or {}
    except Exception:
        return False
    return _auth_value(auth, "transport_security_type") == "ssl"


def principal_of(context: Any) -> Principal:
    """The principal of this request (see the module doc for the order)."""
    return authenticate(context).principal


@functools.lru_cache(maxsize=4096)
def acl_host_of(peer: str) -> str:
    """``ipv4:10.0.0.5:5000`` / ``ipv6:[::1]:5000`` (gRPC) / ``kafka:10.0.0.5`` (the Kafka listener) ->
    the caller's address as ACLs name it (``acl_host``); "" when the peer has none (``unix:``, a test
    double)."""
    text = peer[len("kafka:"):] if peer.startswith("kafka:") else peer_host(peer)
    try:
        return acl_host(text)
    except ValueError:
        return ""


def with_host(principal: Principal, peer: str) -> Principal:
    """``principal`` as the caller at ``peer`` (its ``host`` set), for the authorizer's host match."""
    return _at(principal, acl_host_of(peer))


def at_address(principal: Principal, address: str) -> Principal:
    """``principal`` as the caller at the IP ``address`` (a socket's peer address); unknown if not one."""
    try:
        host = acl_host(address)
    except ValueError:
        host = ""
    return _at(principal, host)


def connection_authentication(sslobj: Any, host: str, peer: str) -> Authentication:
    """Who is at the other end of an asyncio connection (the Kafka and replication listeners): the principal
    of the client certificate its TLS handshake verified, else anonymous, at ``host``, with ``peer`` as the
    peer text (a Kafka connection writes ``kafka:<host>``, never a loopback gRPC peer)."""
    der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
    if der:
        from cryptography import x509

        subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
        return Authentication(at_address(principal_from_subject(subject), host), AUTH_CERTIFICATE, peer)
    return Authentication(at_address(ANONYMOUS, host), AUTH_NONE, peer)


def _at(principal: Principal, host: str) -> Principal:
    return principal if host == principal.host else Principal(principal.kind, principal.name, host)


def is_loopback_host(host: str) -> bool:
    """A bind host that only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=4096)
def is_loopback_peer(peer: str) -> bool:
    """``ipv4:127.0.0.1:5000`` / ``ipv6:[::1]:5000`` / ``unix:...`` -> whether it is this host.

    Cached: a node asks it for every follower fetch of a plaintext loopback cluster, and a peer's
    address (with its port) stays the same for the connection's life."""
    if peer.startswith("unix:"):
        return True
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        host = rest.rpartition(":")[0]
    elif kind == "ipv6":
        host = rest.rpartition(":")[0].strip("[]")
        host = host.split("%", 1)[0]
    else:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _trusted_loopback(auth: Authentication) -> bool:
    """A plaintext caller on loopback, trusted as a node of a single-host cluster: anyone there, or,
    with ``inter.broker.sasl.username`` set (an authorizer guards the cluster), only that SCRAM user."""
    s = _settings
    if auth.method == AUTH_CERTIFICATE or not s.trust_loopback_plaintext or not is_loopback_peer(auth.peer):
        return False
    if s.loopback_node_principal is None:
        return auth.method == AUTH_NONE
    return auth.method == AUTH_SASL and auth.principal == s.loopback_node_principal


def require_node(context: Any, node_id: int) -> Principal:
    """Refuse (CLUSTER_AUTHORIZATION_FAILED) unless the caller is broker/controller ``node_id`` itself."""
    if is_node(context, node_id):
        return node_principal(node_id)
    auth = authenticate(context)
    log.warning("refused a broker-only request for node %d from %s (%s, peer %s)", node_id, auth.principal,
                auth.method, auth.peer)
    raise errors.error_for(errors.ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                           f"{auth.principal} may not act as node {node_id}: broker-only requests need that "
                           f"node's certificate ({node_principal(node_id)})")


def is_node(context: Any, node_id: int) -> bool:
    """Is the caller node ``node_id`` itself: its certificate, or the documented loopback trust of a single-host
    plaintext cluster? Logs nothing (``require_node`` refuses and logs)."""
    auth = authenticate(context)
    if auth.method == AUTH_CERTIFICATE:
        return auth.principal == node_principal(node_id)
    return _trusted_loopback(auth)


def is_node_caller(context: Any) -> bool:
    """Whether this call comes from a node itself (its certificate, or the documented loopback trust),
    not from a client, nor a client's request that a node forwards (its method is ``forwarded``)."""
    return is_node_auth(authenticate(context))


def is_node_auth(auth: Authentication) -> bool:
    """``is_node_caller`` for a call already authenticated."""
    if auth.method == AUTH_CERTIFICATE:
        return node_id_of(auth.principal) is not None
    return _trusted_loopback(auth)


def require_any_node(context: Any) -> int | None:
    """Refuse unless the caller is some node; its id (None for a trusted loopback plaintext caller)."""
    auth = authenticate(context)
    if is_node_auth(auth):
        return node_id_of(auth.principal) if auth.method == AUTH_CERTIFICATE else None
    raise errors.error_for(errors.ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                           f"{auth.principal} is not a cluster node")
