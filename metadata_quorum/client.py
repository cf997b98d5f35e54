"""ControllerClient: talk to whichever controller is active right now.

Brokers, the admin client and the operators' tools all reach the quorum through this
class. Every controller serves ``ControllerService``, but only the active one (the
Raft leader) answers; the others reply ``NOT_CONTROLLER`` with a redirect. The client
remembers the active controller, follows redirects, and retries retriable errors with
a bounded exponential backoff until the caller's timeout.

Finding the leader uses a cheap probe (``DescribeQuorum``, answered without a quorum
round-trip) with a short deadline, so a frozen controller (SIGSTOP, a hung host) costs
one probe timeout instead of the whole call budget.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from client.cluster import HUNG_PEER_OPTIONS
from client.security import SecurityConfig, make_channel
from proto import controller_pb2 as pb
from proto import controller_pb2_grpc as pb_grpc
from proto import errors
from proto import security_pb2_grpc as security_grpc
from proto.errors import ErrorCode

log = logging.getLogger(__name__)

Endpoint = tuple[str, int]

_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 1.0
_PROBE_TIMEOUT_S = 1.5
# A watch stream or call to a frozen controller fails within ~10 s instead of hanging: the clients'
# pings and connect timeout (client/cluster.py), also while no call is open (the controller's server
# permits pings this frequent).
_CHANNEL_OPTIONS = [
    *HUNG_PEER_OPTIONS,
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
]
# gRPC transport failures that mean "try another controller".
_TRANSPORT_RETRY = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
    }
)


def _too_large(exc: grpc.RpcError) -> bool:
    """gRPC's own refusal of a message by its size ("Received/Sent message larger than max (N vs. M)"),
    not the controller being busy (its receive gate and concurrency limit also answer RESOURCE_EXHAUSTED)."""
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return "larger than max" in str(details or "")


def _backoff_s(attempt: int) -> float:
    base = min(_BACKOFF_MAX_S, _BACKOFF_MIN_S * (2 ** min(attempt, 10)))
    return base * (0.5 + random.random() / 2)  # jitter: peers retrying together spread out


class ControllerClient:
    """Calls the active controller of a quorum; thread-safe."""

    def __init__(self, endpoints: list[tuple[str, int]], *, timeout_s: float = 10.0,
                 security: SecurityConfig | None = None, broker_id: int | None = None) -> None:
        if not endpoints:
            raise errors.InvalidRequestError("ControllerClient needs at least one controller endpoint")
        self._endpoints: list[Endpoint] = [(str(h), int(p)) for h, p in endpoints]
        self._timeout_s = timeout_s
        self._security = security or SecurityConfig()
        # A broker's own client names its broker when it looks for the active controller: the voters it asks
        # learn that brokers reach them (QuorumController.hears_brokers).
        self._probe = pb.DescribeQuorumRequest() if broker_id is None else pb.DescribeQuorumRequest(
            caller_broker_id=broker_id)
        self._lock = threading.Lock()
        self._channels: dict[Endpoint, grpc.Channel] = {}
        self._stubs: dict[Endpoint, pb_grpc.ControllerServiceStub] = {}
        self._leader: Endpoint | None = None
        self._active_calls: set[Any] = set()
        # Open watch streams -> the controller each follows; a stream in _superseded was cancelled because
        # another controller answered as the active one (see _answered_as_active).
        self._watch_targets: dict[Any, Endpoint] = {}
        self._superseded: set[Any] = set()
        self._closed = False

    # ---- public API ----
    @property
    def active_controller(self) -> Endpoint | None:
        """The endpoint last seen answering as the active controller (None if unknown)."""
        return self._leader

    def forget_active_controller(self) -> None:
        """Find the active controller again on the next call (a per-item NOT_CONTROLLER said it moved)."""
        self._leader = None

    def call(self, method: str, request: Any, *, timeout_s: float | None = None,
             metadata: tuple[tuple[str, str], ...] | None = None) -> Any:
        """Send ``request`` to the active controller's ``method``; return the response.

        Raises the ``BrookError`` subclass of the response's error code when it is not
        retriable, or ``RequestTimedOutError`` (with the last error seen) on timeout.
        """
        budget_s = self._timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget_s
        last_error = "no controller answered"
        attempt = 0
        while True:
            self._check_open()
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise errors.RequestTimedOutError(
                    f"{method}: no result from the active controller within {budget_s:.1f}s "
                    f"(last error: {last_error})"
                )
            target = self._leader or self._find_leader(min(remaining_s, _PROBE_TIMEOUT_S))
            if target is None:
                last_error = "no active controller found (election in progress or quorum unreachable)"
                self._sleep_before_retry(attempt, deadline)
                attempt += 1
                continue
            try:
                response = getattr(self._stub(target), method)(request, timeout=remaining_s, metadata=metadata)
            except grpc.RpcError as exc:
                status = exc.code() if hasattr(exc, "code") else None
                last_error = f"{target[0]}:{target[1]}: {status} {exc.details() if hasattr(exc, 'details') else exc}"
                if status == grpc.StatusCode.RESOURCE_EXHAUSTED and _too_large(exc):
                    # gRPC refused the message by its size (the controller's socket.request.max.bytes, or
                    # this client's receive limit): permanent, the same request would be refused again.
                    # Retried, it held a broker's Kafka admin worker for the whole request timeout (audit).
                    raise errors.MessageTooLargeError(
                        f"{method}: the request is larger than the controller accepts (its "
                        f"socket.request.max.bytes): {last_error}") from None
                if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    # The controller is busy (too many calls, or this address's messages being
                    # received): the same controller, after a backoff.
                    self._sleep_before_retry(attempt, deadline)
                    attempt += 1
                    continue
                if status == grpc.StatusCode.UNIMPLEMENTED:
                    # The active controller's release predates the call (a rolling upgrade in progress).
                    raise errors.UnsupportedVersionError(
                        f"{method}: the active controller ({target[0]}:{target[1]}) runs a release without this "
                        f"call; it needs a newer release on the controllers (finish the rolling upgrade)") from None
                if status not in _TRANSPORT_RETRY:
                    raise errors.UnknownServerError(f"{method}: {last_error}") from None
                self._forget_leader(target)
                self._sleep_before_retry(attempt, deadline)
                attempt += 1
                continue
            code = response.error_code
            if code == ErrorCode.NONE:
                self._answered_as_active(target)
                return response
            last_error = f"{errors.code_name(code)}: {response.error_message}"
            if code == ErrorCode.NOT_CONTROLLER:
                self._follow_redirect(target, response.redirect)
                if self._leader is None:
                    self._sleep_before_retry(attempt, deadline)
                attempt += 1
                continue
            if code in errors.RETRIABLE:
                self._sleep_before_retry(attempt, deadline)
                attempt += 1
                continue
            raise errors.error_for(code, response.error_message)

    def describe_quorum(self, *, timeout_s: float | None = None) -> pb.DescribeQuorumResponse:
        """The quorum as the active controller sees it, else as any reachable voter sees it.

        Every voter answers (``any_voter``), so this works exactly when no controller is
        active; ``responder_id`` / ``responder_is_active`` say whose view it is. Raises
        RequestTimedOutError only if no voter answers at all within the timeout.
        """
        budget_s = self._timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget_s
        request = pb.DescribeQuorumRequest(any_voter=True)
        attempt = 0
        last_error = "no controller answered"
        while True:
            self._check_open()
            candidates = list(self._endpoints)
            random.shuffle(candidates)
            if self._leader in candidates:  # the known active controller first
                candidates.remove(self._leader)
                candidates.insert(0, self._leader)
            fallback: pb.DescribeQuorumResponse | None = None
            for endpoint in candidates:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    break
                try:
                    response = self._stub(endpoint).DescribeQuorum(
                        request, timeout=min(remaining_s, _PROBE_TIMEOUT_S))
                except grpc.RpcError as exc:
                    last_error = f"{endpoint[0]}:{endpoint[1]}: {exc.code()}"
                    continue
                if response.error_code != ErrorCode.NONE:
                    last_error = f"{errors.code_name(response.error_code)}: {response.error_message}"
                    continue
                if response.responder_is_active:
                    self._answered_as_active(endpoint)
                    return response
                if fallback is None or (fallback.leader_id < 0 <= response.leader_id):
                    fallback = response
            if fallback is not None:
                return fallback
            if time.monotonic() >= deadline:
                raise errors.RequestTimedOutError(
                    f"DescribeQuorum: no controller answered within {budget_s:.1f}s (last error: {last_error})")
            self._sleep_before_retry(attempt, deadline)
            attempt += 1

    def call_endpoint(self, endpoint: tuple[str, int], method: str, request: Any, *, timeout_s: float) -> Any:
        """One attempt at one given controller, no redirects or retries (diagnostics, tests).

        Returns the response whatever its error code; gRPC failures raise ``grpc.RpcError``.
        """
        return getattr(self._stub((str(endpoint[0]), int(endpoint[1]))), method)(request, timeout=timeout_s)

    def watch(
        self, since_version: int = 0, broker_id: int = -1, *, give_up_after_s: float = 120.0
    ) -> Iterator[pb.MetadataUpdate]:
        """Follow metadata changes after ``since_version`` from the active controller.

        Yields ``MetadataUpdate`` messages (a snapshot first when the controller says so).
        Reconnects to the new active controller after a failover and resumes from the
        last version received. Ends when ``close()`` is called; raises
        ``RequestTimedOutError`` after ``give_up_after_s`` without any controller serving.
        """
        version = since_version
        last_served = time.monotonic()
        attempt = 0
        while not self._closed:
            if time.monotonic() - last_served > give_up_after_s:
                raise errors.RequestTimedOutError(
                    f"WatchMetadata: no active controller served the stream for {give_up_after_s:.0f}s"
                )
            target = self._leader or self._find_leader(_PROBE_TIMEOUT_S)
            if target is None:
                time.sleep(_backoff_s(attempt))
                attempt += 1
                continue
            stream = self._stub(target).WatchMetadata(
                pb.WatchMetadataRequest(broker_id=broker_id, since_version=version)
            )
            with self._lock:
                self._active_calls.add(stream)
                self._watch_targets[stream] = target
            try:
                for update in stream:
                    if update.error_code != ErrorCode.NONE:
                        log.info("watch on %s:%d ended: %s %s", target[0], target[1],
                                 errors.code_name(update.error_code), update.error_message)
                        if update.error_code == ErrorCode.NOT_CONTROLLER:
                            self._follow_redirect(target, update.redirect)
                        break
                    self._leader = target
                    version = update.version
                    last_served = time.monotonic()
                    attempt = 0
                    yield update
            except grpc.RpcError as exc:
                if self._closed:
                    return
                with self._lock:
                    superseded = stream in self._superseded
                if superseded:
                    log.warning("watch on %s:%d ended: another controller (%s) answered as the active one; "
                                "following it", target[0], target[1], self._leader)
                else:
                    log.info("watch on %s:%d broke: %s", target[0], target[1], exc.code())
                self._forget_leader(target)
            finally:
                with self._lock:
                    self._active_calls.discard(stream)
                    self._watch_targets.pop(stream, None)
                    self._superseded.discard(stream)
                stream.cancel()
            if not self._closed:
                time.sleep(_backoff_s(attempt))
                attempt += 1

    def close(self) -> None:
        """Cancel open watch streams and close every channel."""
        with self._lock:
            self._closed = True
            calls = list(self._active_calls)
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for stream in calls:
            stream.cancel()
        for channel in channels:
            channel.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----
    def _check_open(self) -> None:
        if self._closed:
            raise errors.InvalidRequestError("ControllerClient is closed")

    def _stub(self, endpoint: Endpoint) -> pb_grpc.ControllerServiceStub:
        with self._lock:
            if self._closed:
                raise errors.InvalidRequestError("ControllerClient is closed")
            stub = self._stubs.get(endpoint)
            if stub is None:
                channel = make_channel(f"{endpoint[0]}:{endpoint[1]}", self._security, options=_CHANNEL_OPTIONS)
                self._channels[endpoint] = channel
                stub = self._stubs[endpoint] = pb_grpc.ControllerServiceStub(channel)
            return stub

    def _answered_as_active(self, endpoint: Endpoint) -> None:
        """``endpoint`` has just answered as the active controller: remember it, and end every watch stream
        open on another controller. That one is no longer active (it would end the stream with NOT_CONTROLLER
        if it could), or it cannot say so: a controller whose Python threads are all stuck (pysyncobj writes
        its journal through mmap while holding the GIL, so a hung metadata disk stops the whole process) still
        answers HTTP/2 pings from gRPC's C core, so the stream neither fails nor delivers, and a broker
        following it learns no leader election, fence or ISR change for as long as that lasts. The heartbeats
        and other calls find the new controller; the watch follows them here, resuming from its last version."""
        self._leader = endpoint
        with self._lock:
            stale = [s for s, target in self._watch_targets.items() if target != endpoint and s not in self._superseded]
            self._superseded.update(stale)
        for stream in stale:
            stream.cancel()

    def _forget_leader(self, endpoint: Endpoint) -> None:
        if self._leader == endpoint:
            self._leader = None

    def _follow_redirect(self, source: Endpoint, redirect: pb.ControllerRedirect) -> None:
        if redirect.leader_id >= 0 and redirect.leader.port > 0:
            target = (redirect.leader.host, redirect.leader.port)
            self._leader = None if target == source else target
        else:
            self._forget_leader(source)

    def _find_leader(self, probe_timeout_s: float) -> Endpoint | None:
        """Ask the known controllers, in random order, which one is active."""
        candidates = list(self._endpoints)
        random.shuffle(candidates)
        for endpoint in candidates:
            try:
                response = self._stub(endpoint).DescribeQuorum(self._probe, timeout=probe_timeout_s)
            except grpc.RpcError:
                continue
            if response.error_code == ErrorCode.NONE:
                self._answered_as_active(endpoint)
                return endpoint
            redirect = response.redirect
            if response.error_code == ErrorCode.NOT_CONTROLLER and redirect.leader_id >= 0 \
                    and redirect.leader.port > 0:
                self._leader = (redirect.leader.host, redirect.leader.port)
                return self._leader
        return None

    def _sleep_before_retry(self, attempt: int, deadline: float) -> None:
        time.sleep(max(0.0, min(_backoff_s(attempt), deadline - time.monotonic())))


class _SecurityStub:
    """ControllerService and SecurityService on one channel: ControllerClient's leader-following for both."""

    def __init__(self, controller_stub: Any, security_stub: Any) -> None:
        self._controller_stub = controller_stub
        self._security_stub = security_stub

    def __getattr__(self, name: str) -> Any:
        if hasattr(self._security_stub, name):
            return getattr(self._security_stub, name)
        return getattr(self._controller_stub, name)


class SecurityControllerClient(ControllerClient):
    """A ControllerClient that can also call SecurityService (users, ACLs, quotas) on the active controller."""

    def _stub(self, endpoint: Endpoint) -> Any:
        controller_stub = super()._stub(endpoint)
        with self._lock:
            channel = self._channels[endpoint]
        return _SecurityStub(controller_stub, security_grpc.SecurityServiceStub(channel))
