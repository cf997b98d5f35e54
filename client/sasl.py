"""Client side of SASL/SCRAM over gRPC: authenticate each channel once, send its session token.

``scram_channel(address, credentials)`` returns a channel whose every call carries the
``x-brook-session`` token of a SCRAM exchange (RFC 5802/7677, via ``scramp``) run
against that server on first use, through ``SecurityService.SaslAuthenticate``. The
client also checks the server's signature (server-final-message), so a server that
does not know the password's keys cannot pose as the cluster.

The session is renewed before its lifetime runs out, and once more when the server
answers UNAUTHENTICATED (it restarted, or expired the session early); a second refusal
is the caller's ``SaslAuthenticationFailedError``. A wrong password fails the first
call with ``SaslAuthenticationFailedError`` (non-retriable). A node that has just started
answers BROKER_NOT_AVAILABLE until it has loaded its users; the exchange is tried again
within the call's timeout, and only then is that (retriable) error the caller's.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import scramp

from client.cluster import Backoff
from proto import errors
from proto import security_pb2 as spb
from proto import security_pb2_grpc as spb_grpc
from proto.errors import ErrorCode

log = logging.getLogger(__name__)

SESSION_METADATA_KEY = "x-brook-session"
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
AUTH_TIMEOUT_S = 15.0
RENEW_AT_FRACTION = 0.8  # renew a session once 80% of its lifetime has passed
# A node that has just started answers BROKER_NOT_AVAILABLE until it has loaded its users: the
# exchange is tried again with client.cluster.Backoff from the first pause to the largest, within the call's timeout.
NOT_READY_BACKOFF_MS = 50
NOT_READY_BACKOFF_MAX_MS = 1000


@dataclass(frozen=True)
class ScramCredentials:
    username: str
    password: str
    mechanism: str = "SCRAM-SHA-256"

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise errors.InvalidConfigError(f"sasl.mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if not self.username or not self.password:
            raise errors.InvalidConfigError("sasl.username and sasl.password are required for SCRAM")

    def __repr__(self) -> str:  # never print the password
        return f"ScramCredentials(username={self.username!r}, mechanism={self.mechanism!r})"


def credentials_from_config(security_protocol: str | None, mechanism: str | None, username: str | None,
                            password: str | None) -> ScramCredentials | None:
    """Kafka's client configs -> credentials (None for PLAINTEXT)."""
    protocol = (security_protocol or "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    if protocol not in ("SASL_PLAINTEXT", "SASL_SSL"):
        raise errors.InvalidConfigError(f"security.protocol {security_protocol!r} is not supported here")
    return ScramCredentials(username or "", password or "", mechanism or "SCRAM-SHA-256")


class ScramSession:
    """One channel's SCRAM session with one server. Thread-safe; authenticates lazily."""

    def __init__(self, channel: grpc.Channel, credentials: ScramCredentials,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._channel = channel
        self._stub = spb_grpc.SecurityServiceStub(channel)
        self._creds = credentials
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._renew_at = 0.0

    def token(self, timeout_s: float | None = None) -> str:
        """The session token, authenticating first if there is none or it is due for renewal; a
        server still loading its users is waited for up to ``timeout_s`` (at most AUTH_TIMEOUT_S)."""
        with self._lock:
            if not self._token or self._clock() >= self._renew_at:
                self._authenticate_when_ready(AUTH_TIMEOUT_S if timeout_s is None else min(timeout_s, AUTH_TIMEOUT_S))
            return self._token

    def _authenticate_when_ready(self, within_s: float) -> None:
        """``_authenticate``, run again after a pause while the server answers BROKER_NOT_AVAILABLE (it
        has just started and not loaded its users) and ``within_s`` allows; then its error is raised."""
        backoff = Backoff(NOT_READY_BACKOFF_MS, NOT_READY_BACKOFF_MAX_MS, time.monotonic() + within_s)
        while True:
            try:
                self._authenticate()
                return
            except errors.BrookError as exc:
                if exc.code != ErrorCode.BROKER_NOT_AVAILABLE:
                    raise
                log.debug("SCRAM: the server is not ready (%s); authenticating again", exc.message)
                if not backoff.sleep():
                    raise

    def close(self) -> None:
        """Close the channel the exchange runs over (the session's owner is done with it)."""
        self._channel.close()

    def invalidate(self, token: str) -> None:
        with self._lock:
            if self._token == token:
                self._token = ""

    def _authenticate(self) -> None:
        c = self._creds
        client = scramp.ScramClient([c.mechanism], c.username, c.password)
        first = self._call(spb.SaslAuthenticateRequest(mechanism=c.mechanism,
                                                        auth_bytes=client.get_client_first().encode()))
        try:
            client.set_server_first(first.auth_bytes.decode())
            final_msg = client.get_client_final()
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise _auth_failed(f"bad server-first message: {exc}") from None
        final = self._call(spb.SaslAuthenticateRequest(mechanism=c.mechanism, exchange_id=first.exchange_id,
                                                        auth_bytes=final_msg.encode()))
        try:
            client.set_server_final(final.auth_bytes.decode())  # checks the server's signature
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise _auth_failed(f"the server could not prove it knows the credential: {exc}") from None
        if not final.session_token:
            raise _auth_failed("the server completed SCRAM without a session token")
        self._token = final.session_token
        self._renew_at = self._clock() + RENEW_AT_FRACTION * max(1, final.session_lifetime_ms) / 1000
        log.debug("SCRAM session established for %s", c.username)

    def _call(self, request: spb.SaslAuthenticateRequest) -> spb.SaslAuthenticateResponse:
        try:
            response = self._stub.SaslAuthenticate(request, timeout=AUTH_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise _auth_failed("the server does not offer SASL authentication") from None
            raise  # transport trouble: the caller's own retry logic sees the RpcError
        if response.error_code != ErrorCode.NONE:
            raise errors.error_for(response.error_code, response.error_message)
        return response


def _auth_failed(message: str) -> errors.BrookError:
    return errors.error_class(ErrorCode.SASL_AUTHENTICATION_FAILED)(message)


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")),
               grpc.ClientCallDetails):
    pass


class ScramInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                       grpc.StreamStreamClientInterceptor):
    """Adds the session token to every call on one channel; re-authenticates once on UNAUTHENTICATED."""

    def __init__(self, session: ScramSession) -> None:
        self._session = session

    def _with_token(self, details: grpc.ClientCallDetails) -> tuple[_Details, str]:
        token = self._session.token(details.timeout)
        metadata: list[tuple[str, Any]] = [m for m in (details.metadata or ()) if m[0] != SESSION_METADATA_KEY]
        metadata.append((SESSION_METADATA_KEY, token))
        return _Details(details.method, details.timeout, metadata, details.credentials,
                        getattr(details, "wait_for_ready", None), getattr(details, "compression", None)), token

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        new_details, token = self._with_token(details)
        outcome = continuation(new_details, request)
        if _is_unauthenticated(outcome):
            self._session.invalidate(token)
            new_details, _ = self._with_token(details)
            outcome = continuation(new_details, request)
        return outcome

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails,
                               request: Any) -> Any:
        # A stream's first message may be far away (WatchMetadata): no retry here; the
        # stream's owner reconnects, and the next token() call renews the session.
        new_details, token = self._with_token(details)
        return continuation(new_details, request)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails,
                                request_iterator: Any) -> Any:
        # A follower's fetch stream, a producer's: its token is the one of the moment it opened. The
        # owner opens a new stream when the server refuses it (a stale session) and after some time;
        # a stream ended UNAUTHENTICATED drops the token, so the next one authenticates afresh.
        new_details, token = self._with_token(details)
        return _ForgetsRefusedToken(continuation(new_details, request_iterator), self._session, token)


class _ForgetsRefusedToken:
    """A stream call (iterated for its responses) that invalidates its session token when the
    server ends it UNAUTHENTICATED; everything else is the call's own."""

    def __init__(self, call: Any, session: ScramSession, token: str) -> None:
        self._call = call
        self._session = session
        self._token = token

    def __iter__(self) -> _ForgetsRefusedToken:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as exc:
            if _is_unauthenticated(exc):
                self._session.invalidate(self._token)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


def _is_unauthenticated(outcome: Any) -> bool:
    try:
        return outcome.code() == grpc.StatusCode.UNAUTHENTICATED
    except Exception:  # not a finished call object: nothing to retry
        return False


def scram_channel(address: str, credentials: ScramCredentials,
                  options: Sequence[tuple[str, Any]] | None = None,
                  raw: grpc.Channel | None = None) -> grpc.Channel:
    """An (insecure transport) channel whose calls are authenticated with SCRAM."""
    base = raw if raw is not None else grpc.insecure_channel(address, options=list(options or ()))
    return grpc.intercept_channel(base, ScramInterceptor(ScramSession(base, credentials)))


def _credentials_of(security: Any) -> ScramCredentials:
    return ScramCredentials(security.sasl_username or "", security.sasl_password or "",
                            str(security.sasl_mechanism).upper())


def sasl_channel_wrapper(channel: grpc.Channel, security: Any, address: str) -> grpc.Channel:
    """What client.security.make_channel uses for SASL_* protocols: ``security`` carries Kafka's sasl.* configs."""
    return scram_channel(address, _credentials_of(security), raw=channel)


def session_for(address: str, security: Any) -> ScramSession:
    """A SCRAM session with the server at ``address`` for a caller that attaches the token to its calls
    itself (a grpc.aio channel has no sync interceptors): ``SESSION_METADATA_KEY`` with ``token()``,
    and ``invalidate(token)`` when a call is refused UNAUTHENTICATED. The exchange runs over a channel
    of its own with ``security``'s transport."""
    from client.security import make_transport_channel
    return ScramSession(make_transport_channel(address, security), _credentials_of(security))
