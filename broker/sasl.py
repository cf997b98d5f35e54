"""Server side of SASL/SCRAM over gRPC: the exchange, session tokens, and who is calling.

A client proves its password once per channel with SCRAM (RFC 5802, SCRAM-SHA-256 and
SCRAM-SHA-512 as RFC 7677, via the ``scramp`` library) through the ``SaslAuthenticate``
RPC, in two round trips. The answering node then hands out a random session token with
a lifetime (``sasl.session.lifetime.ms``); the client sends it as ``x-brook-session``
metadata on every call. Tokens are per node: each broker and controller the client
talks to runs its own exchange (as a Kafka client authenticates each connection).

Bounds: half-finished exchanges and live sessions are capped (oldest dropped first),
and failed exchanges per user name and client address are rate limited, so a password-guessing client
gets SASL_AUTHENTICATION_FAILED quickly and cheaply and cannot grow memory.

No user enumeration: an unknown user name is answered exactly as a known one with a wrong
password. SCRAM offers it a fake salt (stable per name, as long as a real one) and the default
iteration count, and PLAIN runs the same PBKDF2 work against fake credentials. A user locked out
for too many failures is answered as a wrong password too (its SCRAM exchange shows its real salt
but can only fail, PLAIN does the same work and fails), so the lockout does not tell which names
exist either; only the log says so. Only existing users' failures are counted: a node retrying
before its bootstrap user exists cannot lock itself out, and made-up names take no memory.

A call that carries a token this node does not know (expired, or issued before a
restart) is refused with gRPC status UNAUTHENTICATED by ``SessionInterceptor``; the
client library re-authenticates once and retries.

A session ends as soon as the credential it was proved with does not hold any more: every call's
token is checked against the user's stored credential for that mechanism, so deleting a user, or
changing its password, refuses its live sessions within the metadata's propagation (and its next
login fails), not only when they expire. Kafka-listener connections keep their principal themselves
and are checked per request the same way (``holds``), and closed (Kafka leaves them open until
``connections.max.reauth.ms``, off by default). A call without a token is from the
ANONYMOUS principal (or from its mTLS certificate's principal, once TLS is in place).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import scramp
from scramp.core import Nonce as ScramNonce

from broker.log_limits import ThrottledWarning
from broker.principal import ANONYMOUS, SESSION_METADATA_KEY, Principal, principal_of, set_session_resolver
from metadata_quorum.security import MAX_ITERATIONS, MECHANISMS, MIN_ITERATIONS, ScramCredential
from proto import errors
from proto import security_pb2 as spb
from proto.errors import ErrorCode

log = logging.getLogger(__name__)

DEFAULT_SESSION_LIFETIME_MS = 3_600_000
EXCHANGE_TIMEOUT_S = 30.0
MAX_EXCHANGES = 1024
# Exchanges one client address may have begun and not finished: past it its own oldest goes. When all of them
# are over MAX_EXCHANGES, the oldest exchange of the address holding the most goes, not the oldest of all: a
# flood of half-finished logins from 100 addresses pushed out six of ten real logins waiting 2 s (audit).
MAX_EXCHANGES_PER_ADDRESS = 64
MAX_SESSIONS = 100_000
# One user's share of them: past it the user's own oldest session goes, so a user who logs in again and again
# (a login costs the client one PBKDF2 it can reuse) cannot push every other user's sessions out.
MAX_SESSIONS_PER_USER = 10_000
MAX_FAILURES_PER_USER = 10  # per FAILURE_WINDOW_S; more get refused without running SCRAM
FAILURE_WINDOW_S = 60.0
# (user, address) pairs whose failures are remembered (existing users only; keys are fixed-size digests,
# whatever the name's length). Large, so that evicting a pair under attack takes thousands of failures.
MAX_FAILURE_RECORDS = 10_000
# The user names one client address may fail PLAIN logins for within FAILURE_WINDOW_S: past it, its next PLAIN
# logins are refused at once, without their PBKDF2 (two a PLAIN attempt, the server's own cost). The per-user
# limit above never counts made-up users, so wrong passwords for made-up names from 100 addresses, 200 a second,
# made a real login take 0.8-2.5 s (audit). Refused at once whoever the user is: the refusal tells nothing of the
# name. Names, not attempts: librdkafka retrying one deleted user's login fails 150 times a minute, and the other
# clients of its address must not be refused for it (nor a node retrying before its bootstrap user exists).
MAX_PLAIN_FAILED_NAMES_PER_ADDRESS = 20
# PBKDF2 iterations of the fake credentials unknown users are answered with: what users get when created
# without an explicit count (salted_credential, ``brook user create``, Admin.create_user: RFC 7677's minimum).
DEFAULT_ITERATIONS = MIN_ITERATIONS
# Credentials over MAX_ITERATIONS remembered as already warned about (the cluster stores at most 10,000).
MAX_COSTLY_WARNINGS = 10_000
FAKE_SALT_BYTES = 32  # what scramp's make_auth_info draws for real credentials; SCRAM shows its length
MAX_AUTH_BYTES = 4096

__all__ = ["ANONYMOUS", "Principal", "principal_of", "ScramAuthenticator", "SessionInterceptor",
           "SESSION_METADATA_KEY"]


@dataclass(slots=True)
class _Session:
    principal: Principal
    expires_at: float
    credential: ScramCredential  # the one proved: the session lasts while the user's stored one is still it


class ScramAuthenticator:
    """Runs SCRAM exchanges and keeps this node's sessions. Thread-safe.

    ``lookup(user, mechanism)`` returns the stored credential or None; it is read at each
    exchange, and again each time a session's token is used: a deleted user cannot start a new
    session, and its sessions (as those proved with a password since changed) end at their next use.
    """

    def __init__(self, lookup: Callable[[str, str], ScramCredential | None], *,
                 session_lifetime_ms: int = DEFAULT_SESSION_LIFETIME_MS,
                 clock: Callable[[], float] = time.monotonic, ready: Callable[[], bool] | None = None) -> None:
        self._lookup = lookup
        # False while the node has not loaded its users (a broker before its first metadata): an exchange then
        # gets the retriable BROKER_NOT_AVAILABLE, never "invalid credentials" for a user it will know in a moment.
        self._ready = ready
        self.session_lifetime_ms = session_lifetime_ms
        self._clock = clock
        self._lock = threading.Lock()
        # id -> (server, failure-limit key, deadline, user as sent, whether the user exists, the credential
        # the proof is checked against: None for an unknown or locked-out user, whose proof cannot match)
        self._exchanges: OrderedDict[str, tuple[Any, str, float, str, bool, ScramCredential | None]] = OrderedDict()
        self._exchanges_of: dict[str, OrderedDict[str, None]] = {}  # client address -> its exchanges, oldest first
        self._exchange_peer: dict[str, str] = {}  # exchange id -> the address that began it
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        # user -> that user's session tokens, oldest first (some may have gone already: skipped)
        self._user_sessions: dict[str, collections.deque[str]] = {}
        # digest of the limit key -> recent failure times; ordered by last failure, so the front expires first
        self._failures: OrderedDict[bytes, list[float]] = OrderedDict()
        # client address -> the user names its PLAIN logins failed for (digests) -> last failure; ordered by last failure
        self._plain_failures: OrderedDict[str, OrderedDict[bytes, float]] = OrderedDict()
        self._plain_refusals = ThrottledWarning(log)
        self._fake_secret = secrets.token_bytes(32)  # salts for unknown users: no user enumeration
        # Stored credentials above MAX_ITERATIONS (created before the cap) already warned about: bounded by
        # the credentials the cluster may store.
        self._costly_warned: set[tuple[str, str, int]] = set()
        self.failed_total = 0
        self.succeeded_total = 0
        self.revoked_total = 0  # sessions (and Kafka connections) ended because their credential changed

    # ---- the exchange ----
    def authenticate(self, request: spb.SaslAuthenticateRequest, peer: str = "") -> spb.SaslAuthenticateResponse:
        """One step of an exchange. ``peer`` (the client's address) scopes the failed-login limit: failures
        from one address lock a user out from that address only, so nobody can lock a user out for all."""
        try:
            if len(request.auth_bytes) > MAX_AUTH_BYTES:
                raise errors.InvalidRequestError(f"SASL message larger than {MAX_AUTH_BYTES} bytes")
            if not request.exchange_id:
                return self._first(request.mechanism, request.auth_bytes, peer)
            return self._final(request.exchange_id, request.auth_bytes)
        except errors.BrookError as exc:
            return spb.SaslAuthenticateResponse(error_code=exc.code, error_message=exc.message)

    def _check_ready(self) -> None:
        if self._ready is not None and not self._ready():
            raise errors.error_class(ErrorCode.BROKER_NOT_AVAILABLE)(
                "this node is starting and has not loaded its users yet; authenticate again in a moment")

    def _first(self, mechanism: str, client_first: bytes, peer: str = "") -> spb.SaslAuthenticateResponse:
        self._check_ready()
        if mechanism not in MECHANISMS:
            raise errors.error_class(ErrorCode.UNSUPPORTED_SASL_MECHANISM)(
                f"SASL mechanism {mechanism!r} is not enabled; use one of {sorted(MECHANISMS)}")
        user_holder: list[str] = []
        known: list[bool] = []
        locked: list[bool] = []
        proved: list[ScramCredential] = []  # the stored credential the client's proof is checked against

        def auth_fn(user: str) -> tuple[bytes, bytes, bytes, int]:
            user_holder.append(user)
            cred = self._lookup(user, mechanism)
            known.append(cred is not None)
            if cred is None:
                return self._fake_credential(user, mechanism)
            if self._too_many_failures(_limit_key(user, peer)):
                # Locked out: the real salt and iterations (a fake one would give the lockout, and so the
                # user, away), keys no proof can match; answered at the end as a wrong password.
                locked.append(True)
                _, fake_key, _, _ = self._fake_credential(user, mechanism)
                return cred.salt, fake_key, fake_key, cred.iterations
            proved.append(cred)
            return cred.salt, cred.stored_key, cred.server_key, cred.iterations

        server = scramp.ScramMechanism(mechanism).make_server(auth_fn)
        try:
            server.set_client_first(client_first.decode("utf-8"))
            server_first = server.get_server_first()
        except (scramp.ScramException, UnicodeDecodeError, ValueError) as exc:
            raise errors.error_class(ErrorCode.SASL_AUTHENTICATION_FAILED)(f"bad client-first message: {exc}") from None
        user = user_holder[0] if user_holder else ""
        limit_key = _limit_key(user, peer)
        if locked:
            log.warning("SCRAM authentication of user %r from %s refused: %d failures within %.0f s (the client "
                        "is told invalid credentials)", user, peer, MAX_FAILURES_PER_USER, FAILURE_WINDOW_S)
        exchange_id = secrets.token_urlsafe(16)
        with self._lock:
            # Only an existing user's failures are counted (and not those while it is locked out).
            counted = bool(known and known[0] and not locked)
            self._exchanges[exchange_id] = (server, limit_key, self._clock() + EXCHANGE_TIMEOUT_S, user, counted,
                                            proved[0] if proved else None)
            mine = self._exchanges_of.setdefault(peer, OrderedDict())
            mine[exchange_id] = None
            self._exchange_peer[exchange_id] = peer
            self._expire_locked()
            if len(mine) > MAX_EXCHANGES_PER_ADDRESS:
                self._drop_exchange_locked(next(iter(mine)))
            while len(self._exchanges) > MAX_EXCHANGES:
                most = max(self._exchanges_of.values(), key=len)  # at most MAX_EXCHANGES addresses
                self._drop_exchange_locked(next(iter(most)))
        return spb.SaslAuthenticateResponse(auth_bytes=server_first.encode("utf-8"), exchange_id=exchange_id)

    def _final(self, exchange_id: str, client_final: bytes) -> spb.SaslAuthenticateResponse:
        with self._lock:
            entry = self._exchanges.get(exchange_id)
            if entry is not None:
                self._drop_exchange_locked(exchange_id)
        if entry is None or entry[2] < self._clock():
            raise errors.error_class(ErrorCode.ILLEGAL_SASL_STATE)("unknown or expired SASL exchange; start again")
        server, limit_key, _, user, counted, credential = entry
        try:
            final = client_final.decode("utf-8")
            _accept_librdkafka_nonce(server, final)
            server.set_client_final(final)
            server_final = server.get_server_final()
            if credential is None:  # a fake credential's keys match no proof: never reached
                raise ValueError("no stored credential")
        except (scramp.ScramException, UnicodeDecodeError, ValueError):
            self._record_failure(limit_key, user, counted)
            raise errors.error_class(ErrorCode.SASL_AUTHENTICATION_FAILED)(
                f"authentication failed for user {user!r}: invalid credentials") from None
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[token] = _Session(Principal("User", user),
                                             self._clock() + self.session_lifetime_ms / 1000, credential)
            mine = self._user_sessions.setdefault(user, collections.deque())
            mine.append(token)
            while mine and (mine[0] not in self._sessions or len(mine) > MAX_SESSIONS_PER_USER):
                self._sessions.pop(mine.popleft(), None)
            while len(self._sessions) > MAX_SESSIONS:
                old_token, old = self._sessions.popitem(last=False)
                self._forget_user_session_locked(old.principal.name, old_token)
            self.succeeded_total += 1
        log.info("user %s authenticated", user)
        return spb.SaslAuthenticateResponse(auth_bytes=server_final.encode("utf-8"), session_token=token,
                                            session_lifetime_ms=self.session_lifetime_ms)

    def authenticate_plain(self, auth_bytes: bytes, peer: str = "") -> str:
        """SASL PLAIN (RFC 4616, ``authzid NUL user NUL password``) checked against the user's stored SCRAM
        credential: the password is salted and hashed as SCRAM would and compared with the stored key, so
        no plain password is kept anywhere. Returns the user; SASL_AUTHENTICATION_FAILED otherwise."""
        return self.plain_credential(auth_bytes, peer).user

    def plain_credential(self, auth_bytes: bytes, peer: str = "") -> ScramCredential:
        """``authenticate_plain``, returning the stored credential the password matched (for ``holds``)."""
        self._check_ready()
        failed = errors.error_class(ErrorCode.SASL_AUTHENTICATION_FAILED)
        if len(auth_bytes) > MAX_AUTH_BYTES:
            raise failed(f"SASL message larger than {MAX_AUTH_BYTES} bytes")
        parts = auth_bytes.split(b"\0")
        if len(parts) != 3:
            raise failed("a PLAIN message is authzid NUL user NUL password")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise failed("PLAIN user and password must be UTF-8") from None
        if authzid and authzid != user:
            raise failed("PLAIN: acting as another user (authzid) is not allowed")
        if self._plain_failures_over(peer):
            self._plain_refusals.warn("PLAIN authentication from %s refused without checking: failed logins of %d "
                                      "users within %.0f s (the client is told invalid credentials)", peer,
                                      MAX_PLAIN_FAILED_NAMES_PER_ADDRESS, FAILURE_WINDOW_S)
            with self._lock:
                self.failed_total += 1
            raise failed(f"authentication failed for user {user!r}: invalid credentials")
        creds = [c for m in MECHANISMS if (c := self._lookup(user, m)) is not None]
        limit_key = _limit_key(user, peer)
        locked = bool(creds) and self._too_many_failures(limit_key)
        pw = password.encode("utf-8")
        for cred in creds:
            if cred.iterations > MAX_ITERATIONS:
                self._warn_costly(cred)
        if not locked:
            for cred in creds:
                if _plain_matches(pw, cred.mechanism, cred.salt, cred.stored_key, cred.iterations):
                    with self._lock:
                        self.succeeded_total += 1
                    return cred
        # A failure costs one PBKDF2 per mechanism whoever the user is: a mechanism the user has no
        # credential for (all of them for an unknown user; every one while it is locked out) is checked
        # against a fake one, so the time to answer does not tell whether the name exists (or is locked
        # out). A fake never lets anyone in.
        have = set() if locked else {cred.mechanism for cred in creds}
        for mechanism in MECHANISMS:
            if mechanism not in have:
                salt, stored_key, _, iterations = self._fake_credential(user, mechanism)
                _plain_matches(pw, mechanism, salt, stored_key, iterations)
        if locked:
            log.warning("PLAIN authentication of user %r from %s refused: %d failures within %.0f s (the client "
                        "is told invalid credentials)", user, peer, MAX_FAILURES_PER_USER, FAILURE_WINDOW_S)
        self._record_failure(limit_key, user, bool(creds) and not locked)
        self._plain_failed(peer, user)
        raise failed(f"authentication failed for user {user!r}: invalid credentials")

    def _plain_failures_over(self, peer: str) -> bool:
        """Has ``peer`` failed PLAIN logins for MAX_PLAIN_FAILED_NAMES_PER_ADDRESS names within FAILURE_WINDOW_S?"""
        if not peer:
            return False
        now = self._clock()
        with self._lock:
            names = self._plain_failures.get(peer)
            return names is not None and sum(1 for at in names.values() if now - at < FAILURE_WINDOW_S) \
                >= MAX_PLAIN_FAILED_NAMES_PER_ADDRESS

    def _plain_failed(self, peer: str, user: str) -> None:
        if not peer:
            return
        now = self._clock()
        name = hashlib.sha256(user.encode("utf-8", "surrogatepass")).digest()[:16]  # fixed size, whatever was sent
        with self._lock:
            names = self._plain_failures.pop(peer, None) or OrderedDict()
            names.pop(name, None)
            names[name] = now
            while len(names) > MAX_PLAIN_FAILED_NAMES_PER_ADDRESS:
                names.popitem(last=False)
            self._plain_failures[peer] = names  # at the back: ordered by last failure
            _trim_failure_table(self._plain_failures, now, lambda names: next(reversed(names.values())))

    def _warn_costly(self, cred: ScramCredential) -> None:
        """A credential stored before new ones were capped at MAX_ITERATIONS (Kafka's maximum) still
        authenticates, PLAIN included (refusing it would lock its user out after an upgrade); but each PLAIN
        attempt for it, a wrong password from anyone included, runs PBKDF2 at its count on this node: say so,
        once per credential."""
        key = (cred.user, cred.mechanism, cred.iterations)
        with self._lock:
            if key in self._costly_warned:
                return
            if len(self._costly_warned) >= MAX_COSTLY_WARNINGS:
                self._costly_warned.clear()
            self._costly_warned.add(key)
        log.warning("the %s credential of user %r has %d PBKDF2 iterations, more than the %d new credentials may have "
                    "(Kafka's maximum): every SASL PLAIN attempt for this user, a wrong password from anyone "
                    "included, costs this node that many. It still authenticates; create the user's credential "
                    "again (brook user create, or Admin.create_user) with at most %d iterations",
                    cred.mechanism, cred.user, cred.iterations, MAX_ITERATIONS, MAX_ITERATIONS)

    def _fake_credential(self, user: str, mechanism: str) -> tuple[bytes, bytes, bytes, int]:
        """RFC 5802 section 5.1: answer an unknown user like a known one; the proof fails later. Stable per
        name (from a per-process secret), so asking twice does not give the fake away, and shaped as real
        credentials are (salt length, iterations), as SCRAM's server-first message shows both."""
        digest = hashlib.sha256 if mechanism == "SCRAM-SHA-256" else hashlib.sha512
        salt = hmac.new(self._fake_secret, user.encode(), hashlib.sha256).digest()[:FAKE_SALT_BYTES]
        key = hmac.new(self._fake_secret, b"key" + user.encode(), digest).digest()
        return salt, key, key, DEFAULT_ITERATIONS

    def _failure_slot(self, limit_key: str) -> bytes:
        """Fixed-size key of the failure table: a user name may be kilobytes long."""
        return hashlib.blake2b(limit_key.encode("utf-8", "surrogatepass"), digest_size=16,
                               key=self._fake_secret).digest()

    def _too_many_failures(self, limit_key: str) -> bool:
        now = self._clock()
        slot = self._failure_slot(limit_key)
        with self._lock:
            recent = [t for t in self._failures.get(slot, []) if now - t < FAILURE_WINDOW_S]
            if recent:
                self._failures[slot] = recent  # keeps its place: only a new failure moves it back
            else:
                self._failures.pop(slot, None)
            return len(recent) >= MAX_FAILURES_PER_USER

    def _record_failure(self, limit_key: str, user: str, counted: bool) -> None:
        """Count a failed authentication; towards the lockout only when ``counted`` (an existing user, not
        locked out already)."""
        if not counted:
            with self._lock:
                self.failed_total += 1
            log.warning("SCRAM authentication failed for user %r", user)
            return
        now = self._clock()
        slot = self._failure_slot(limit_key)
        with self._lock:
            self.failed_total += 1
            times = self._failures.pop(slot, [])
            times.append(now)
            del times[:-MAX_FAILURES_PER_USER]
            self._failures[slot] = times  # at the back: the table is ordered by last failure
            _trim_failure_table(self._failures, now, lambda times: times[-1])
        log.warning("SCRAM authentication failed for user %r", user)

    def _expire_locked(self) -> None:
        now = self._clock()
        while self._exchanges:
            first_id, (_, _, deadline, *_) = next(iter(self._exchanges.items()))
            if deadline >= now:
                break
            self._drop_exchange_locked(first_id)

    def _drop_exchange_locked(self, exchange_id: str) -> None:
        """Forget an exchange (finished, expired or pushed out) here and in its address's list."""
        self._exchanges.pop(exchange_id, None)
        peer = self._exchange_peer.pop(exchange_id, None)
        mine = self._exchanges_of.get(peer) if peer is not None else None
        if mine is not None:
            mine.pop(exchange_id, None)
            if not mine:
                del self._exchanges_of[peer]  # type: ignore[arg-type]

    # ---- sessions ----
    def _forget_user_session_locked(self, user: str, token: str) -> None:
        mine = self._user_sessions.get(user)
        if mine is None:
            return
        while mine and mine[0] not in self._sessions:  # the token just dropped, and any gone before it
            mine.popleft()
        if not mine:
            del self._user_sessions[user]

    def end_session(self, token: str) -> None:
        """Forget a session whose principal the caller keeps itself (a Kafka-listener connection): it
        must not hold a place among the sessions gRPC clients need."""
        with self._lock:
            s = self._sessions.pop(token, None)
            if s is not None:
                self._forget_user_session_locked(s.principal.name, token)

    def holds(self, credential: ScramCredential) -> bool:
        """Is ``credential`` still its user's stored one for its mechanism (not deleted, password not changed)?"""
        stored = self._lookup(credential.user, credential.mechanism)
        return stored is not None and hmac.compare_digest(stored.stored_key, credential.stored_key)

    def revoked(self, user: str, why: str) -> None:
        """Count and log a session (or connection) ended because its user's credential no longer holds."""
        with self._lock:
            self.revoked_total += 1
        log.info("ending a session of user %s: %s", user, why)

    def session(self, token: str) -> Principal | None:
        """The principal of a live session; None when the token is unknown or expired, or the credential it
        was proved with is no longer the user's (deleted, or the password changed): then it ends here."""
        s = self.session_record(token)
        return None if s is None else s.principal

    def session_record(self, token: str) -> _Session | None:
        with self._lock:
            s = self._sessions.get(token)
            if s is None:
                return None
            if s.expires_at < self._clock():
                del self._sessions[token]
                self._forget_user_session_locked(s.principal.name, token)
                return None
        if self.holds(s.credential):
            return s
        with self._lock:
            if self._sessions.get(token) is s:
                del self._sessions[token]
                self._forget_user_session_locked(s.principal.name, token)
        self.revoked(s.principal.name, f"its {s.credential.mechanism} credential was deleted or changed")
        return None

    def resolve(self, metadata: Sequence[tuple[str, Any]] | None) -> Principal | None:
        """The session resolver installed in broker.principal: metadata -> principal."""
        token = _token_of(metadata)
        return self.session(token) if token else None

    def install(self) -> None:
        """Make this node's sessions resolve principals (a combined node has two authenticators)."""
        with _installed_lock:
            _installed.append(self)
        set_session_resolver(_resolve_any)

    def uninstall(self) -> None:
        with _installed_lock:
            if self in _installed:
                _installed.remove(self)


def _accept_librdkafka_nonce(server: Any, client_final: str) -> None:
    """librdkafka's built-in SCRAM (2.0.2 as in Debian 12's kcat, and later 2.x releases) sends
    ``r=<its nonce><the server's whole nonce>`` in its client-final message, not the server's nonce
    alone as RFC 5802 asks, and signs that message as sent. Kafka let it in (its server checked
    only that the nonce *ends with* the server's). Brook accepts exactly that doubled form and
    nothing looser: the exchange then expects it, so scramp checks the proof over the message as
    the client signed it, and the server's random part is still in what was signed (no replay).
    Any other nonce is left to scramp, which refuses it."""
    full = str(server.nonce)
    client_nonce = full[:len(full) - len(str(server.s_nonce))]
    doubled = client_nonce + full
    if any(part == "r=" + doubled for part in client_final.split(",")):
        server.nonce = ScramNonce(doubled)


def _plain_matches(password: bytes, mechanism: str, salt: bytes, stored_key: bytes, iterations: int) -> bool:
    """Whether a PLAIN password is the one a SCRAM credential was salted from (RFC 5802's StoredKey)."""
    digest = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    salted = hashlib.pbkdf2_hmac(digest, password, salt, iterations)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    return hmac.compare_digest(hashlib.new(digest, client_key).digest(), stored_key)


def _trim_failure_table(table: OrderedDict[Any, Any], now: float, last_failure: Callable[[Any], float]) -> None:
    """Bound a table of failures ordered by last failure: drop the records whose window has passed (they are at
    the front), then, if many users or addresses still overflow it, the records that failed least recently."""
    while table:
        oldest_key, oldest = next(iter(table.items()))
        if now - last_failure(oldest) < FAILURE_WINDOW_S and len(table) <= MAX_FAILURE_RECORDS:
            return
        del table[oldest_key]


def _limit_key(user: str, peer: str) -> str:
    """What the failed-login limit counts by: the user at one client address."""
    return f"{user}\0{peer}"


_installed: list[ScramAuthenticator] = []
_installed_lock = threading.Lock()


def _resolve_any(metadata: Sequence[tuple[str, Any]] | None) -> Principal | None:
    token = _token_of(metadata)
    if not token:
        return None
    with _installed_lock:
        authenticators = list(_installed)
    for auth in authenticators:
        found = auth.session(token)
        if found is not None:
            return found
    return None


def _token_of(metadata: Sequence[tuple[str, Any]] | None) -> str:
    for key, value in metadata or ():
        if key == SESSION_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return ""


class SessionInterceptor(grpc.ServerInterceptor):
    """Refuses calls whose session token this node does not know (UNAUTHENTICATED)."""

    def __init__(self, authenticator: ScramAuthenticator) -> None:
        self._auth = authenticator

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        token = _token_of(handler_call_details.invocation_metadata)
        if handler is None or not token or self._auth.session(token) is not None:
            return handler
        if handler_call_details.method.endswith("/SaslAuthenticate"):
            return handler  # re-authenticating with a stale token still attached

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)

        def refuse_stream(request: Any, context: grpc.ServicerContext) -> Any:
            refuse(request, context)
            yield  # pragma: no cover - abort raised

        if handler.request_streaming:
            return handler  # no client-streaming RPCs exist; leave them to the servicer
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse_stream, handler.request_deserializer,
                                                        handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(refuse, handler.request_deserializer,
                                                   handler.response_serializer)


_REFUSAL = "SASL session expired or unknown; authenticate again"


class AioSessionInterceptor(grpc.aio.ServerInterceptor):
    """SessionInterceptor for grpc.aio servers (the broker's client-facing server is one)."""

    def __init__(self, authenticator: ScramAuthenticator) -> None:
        self._auth = authenticator

    async def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        token = _token_of(handler_call_details.invocation_metadata)
        if handler is None or not token or handler_call_details.method.endswith("/SaslAuthenticate"):
            return handler
        if handler.request_streaming:
            return self._checked_per_message(handler, token)
        if self._auth.session(token) is not None:
            return handler

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)

        async def refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)
            yield  # pragma: no cover - abort raised

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse_stream, handler.request_deserializer,
                                                        handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(refuse, handler.request_deserializer,
                                                   handler.response_serializer)

    def _checked_per_message(self, handler: Any, token: str) -> Any:
        """A request stream (ReplicaFetch, ProduceStream, FetchStream) whose session is checked as each message
        arrives: it may expire while the stream lasts, or be one this node (restarted) never issued.
        The stream then ends UNAUTHENTICATED (the client drops the token and authenticates again)
        before the message is handled, rather than the message being taken as ANONYMOUS's."""
        if not handler.response_streaming:
            return handler  # no client-streaming RPC with a single answer exists
        inner, auth = handler.stream_stream, self._auth

        async def checked(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            async def requests() -> Any:
                async for request in request_iterator:
                    if auth.session(token) is None:
                        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)
                    yield request
            async for response in inner(requests(), context):
                yield response
        return grpc.stream_stream_rpc_method_handler(checked, handler.request_deserializer,
                                                     handler.response_serializer)
