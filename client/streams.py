"""Request streams: a client's requests to one broker as messages of one long-lived gRPC call.

A producer's Produce requests go over a ProduceStream, a consumer's Fetch requests over a
FetchStream: a message costs both ends about a third of a unary call (no call set-up, headers or
per-call objects), as Kafka's requests share one connection. A broker that does not serve the
method (an older version) or has none of its streams free answers the stream before reading any of
its messages; its requests then go as unary calls for a while (``UNARY_RETRY_*``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc

from client import errors
from client.cluster import rpc_error
from proto.errors import STREAM_REFUSED_METADATA_KEY

log = logging.getLogger(__name__)

# A stream keeps the SCRAM session token it opened with (tokens age): a client's stream to a
# broker is retired (half-closed, its answers still read) and a new one opened after this long.
STREAM_MAX_AGE_S = 60.0
# A broker without the stream method gets unary calls; the stream is tried again after this long.
UNARY_RETRY_STREAM_S = 300.0
# A broker with all its streams of the kind taken (max.produce.streams, max.fetch.streams,
# max.request.streams.per.ip) gets unary calls; a stream is tried again after this long.
UNARY_RETRY_FULL_STREAMS_S = 30.0

# What the client does with each answer: (node, the request's payload, response, error); exactly
# one of response and error is None.
OnDone = Callable[[int, Any, Any, "errors.BrookError | None"], None]
# Requests of a stream the broker refused unread: (node, stub, [(payload, request)], full).
OnUnsupported = Callable[[int, Any, list[tuple[Any, Any]], bool], None]


def refused_unread(exc: grpc.RpcError) -> bool:
    """The broker refused the stream before reading any of its messages: none of them was handled."""
    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return False
    try:
        trailing = exc.trailing_metadata() or ()  # type: ignore[attr-defined]
    except Exception:
        return False
    return any(key == STREAM_REFUSED_METADATA_KEY for key, _ in trailing)


class UnaryFallback:
    """The brokers whose requests go as unary calls for now (no ``method`` stream, or none free), and
    the ``on_unsupported`` of a RequestStream: its unhandled requests are sent unary on ``pool`` with
    ``call(node, payload, stub, request)``; ``fail(node, payload, exc)`` once the pool is shut down."""

    def __init__(self, method: str, pool: Any, call: Callable[[int, Any, Any, Any], None],
                 fail: Callable[[int, Any, Exception], None]) -> None:
        self.method = method
        self._pool = pool
        self._call = call
        self._fail = fail
        self._until: dict[Any, float] = {}  # stub -> until when its requests go as unary calls

    def active(self, stub: Any) -> bool:
        return self._until.get(stub, 0.0) > time.monotonic()

    def __call__(self, node: int, stub: Any, unsent: list[tuple[Any, Any]], full: bool = False) -> None:
        if not self.active(stub):  # said once per period
            if full:
                log.info("broker %d has no %s free (its stream bounds): unary calls for %.0f s",
                         node, self.method, UNARY_RETRY_FULL_STREAMS_S)
            else:
                log.info("broker %d does not serve %s (an older version): unary calls for %.0f s",
                         node, self.method, UNARY_RETRY_STREAM_S)
        self._until[stub] = time.monotonic() + (UNARY_RETRY_FULL_STREAMS_S if full else UNARY_RETRY_STREAM_S)
        for payload, request in unsent:
            try:
                self._pool.submit(self._call, node, payload, stub, request)
            except RuntimeError as exc:  # the client is closing: the pool takes nothing more
                self._fail(node, payload, exc)


class RequestStream:
    """One request stream to a broker: requests go out in the order sent, answers come back in that
    order, so each answer belongs to the oldest unanswered request.

    ``send`` never blocks: the stream's own thread opens the call (on a SASL channel that may first
    run the SCRAM exchange), then takes the answers and hands each to ``on_done`` with its payload.
    When the stream ends, every unanswered request gets the error that ended it (whether the broker
    handled it is unknown, as after a lost connection). A broker without the method (UNIMPLEMENTED)
    or with none free handled none of them: those go to ``on_unsupported``, to be sent as unary calls.
    """

    def __init__(self, node: int, stub: Any, method: str, what: str, timeout_s: float,
                 on_done: OnDone, on_unsupported: OnUnsupported, *, name: str) -> None:
        self.node = node
        self.stub = stub
        self.method = method
        self.what = what  # "Produce to broker 3": how errors name the requests
        self.timeout_s = timeout_s  # an answer later than this cancels the stream
        self.opened_at = time.monotonic()
        self._on_done = on_done
        self._on_unsupported = on_unsupported
        self._lock = threading.Lock()
        # (payload, request, sent at) of the unanswered requests, oldest first.
        self._pending: deque[tuple[Any, Any, float]] = deque()
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.ended = False  # no request can be sent on it any more
        self._call: Any = None
        self._cancelled = False
        self._overdue = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, payload: Any, request: Any) -> bool:
        """Queue a request on the stream; False when the stream has ended (nothing was sent)."""
        with self._lock:
            if self.ended:
                return False
            self._pending.append((payload, request, time.monotonic()))
            self._requests.put(request)
        return True

    def old(self) -> bool:
        return time.monotonic() - self.opened_at > STREAM_MAX_AGE_S

    def idle(self) -> bool:
        """Is no request of it unanswered?"""
        with self._lock:
            return not self._pending

    def retire(self) -> None:
        """Send nothing more on it; the broker answers what it has and ends the stream."""
        with self._lock:
            if not self.ended:
                self.ended = True
                self._requests.put(None)

    def cancel(self) -> None:
        self.retire()
        with self._lock:
            self._cancelled = True
            call = self._call
        if call is not None:
            call.cancel()

    def answering(self) -> bool:
        """Are answers still to come (or being handed over)?"""
        return self._thread.is_alive()

    def cancel_if_overdue(self, now: float) -> bool:
        with self._lock:
            overdue = bool(self._pending) and now - self._pending[0][2] > self.timeout_s
        if overdue:
            self._overdue = True
            self.cancel()
        return overdue

    def _run(self) -> None:
        what = self.what
        error: errors.BrookError | None = None
        unsupported = full = False
        try:
            call = getattr(self.stub, self.method)(iter(self._requests.get, None))
            with self._lock:
                self._call = call
                cancelled = self._cancelled
            if cancelled:
                call.cancel()
            for response in call:
                with self._lock:
                    entry = self._pending.popleft() if self._pending else None
                if entry is None:
                    error = errors.error_for(errors.ErrorCode.NETWORK_EXCEPTION,
                                             f"{what}: an answer to no request on the stream")
                    call.cancel()
                    break
                self._hand_over(entry[0], response, None)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                unsupported = True
            elif refused_unread(exc):
                unsupported = full = True
            elif exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                # The broker does not know the stream's SASL session (it restarted, or the session
                # expired): the channel has dropped the token, and the next stream authenticates anew.
                # Or it no longer trusts the client's certificate (its CA left the bundle): the broker's
                # reason says which, and the next stream's handshake fails.
                error = errors.error_for(errors.ErrorCode.NETWORK_EXCEPTION,
                                         f"{what}: refused as unauthenticated ({exc.details()}); the next stream "
                                         "authenticates again")
            elif self._overdue:
                error = errors.RequestTimedOutError(f"{what}: no answer within {self.timeout_s:.1f} s")
            else:
                error = rpc_error(exc, what)
        except errors.BrookError as exc:  # the channel's SCRAM exchange failed before the stream opened
            error = exc
        except Exception as exc:  # e.g. the channel was closed under us
            error = errors.error_for(errors.ErrorCode.NETWORK_EXCEPTION, f"{what}: {exc!r}")
        with self._lock:
            if not self.ended:
                self.ended = True
                self._requests.put(None)  # lets gRPC's request-iterator thread finish
            left = list(self._pending)
            self._pending.clear()
        if unsupported:
            self._on_unsupported(self.node, self.stub, [(payload, request) for payload, request, _ in left], full)
            return
        if not left:
            return
        if error is None:
            error = errors.error_for(errors.ErrorCode.NETWORK_EXCEPTION, f"{what}: the stream ended unanswered")
        for payload, _, _ in left:
            self._hand_over(payload, None, error)

    def _hand_over(self, payload: Any, response: Any, error: errors.BrookError | None) -> None:
        try:
            self._on_done(self.node, payload, response, error)
        except Exception:  # a bug there must not cost the other requests their answers
            log.exception("handling the answer of a %s failed", self.what)
