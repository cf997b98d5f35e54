"""The per-request context a Kafka-protocol call hands to Brook's gRPC servicers.

The Kafka listener does not re-implement any rule: it translates each request into the
protobuf request of the same RPC and calls the servicer (BrokerService, the group
coordinator's servicer, the controller through the broker). Those read who is calling
and from where through a ``grpc.aio.ServicerContext``; this object answers the same
calls from the connection's state (the replication listener, broker/replication_listener.py, uses it too
for its followers' connections, with a gRPC-style peer so that the loopback trust applies):

- ``brook_authentication``: the connection's principal (mTLS certificate or SASL login),
  taken as is by ``broker.principal.authenticate``. Its peer is written ``kafka:<host>``,
  which is never a loopback gRPC peer: a Kafka connection is never trusted as a broker.
- ``peer()``: ``ipv4:<host>:<port>``, so per-address admission bounds apply as on gRPC.
- ``abort()``: raises ``Aborted``; the dispatcher turns RESOURCE_EXHAUSTED into waiting
  (the connection is muted, as Kafka's network layer does) and anything else into an error.
- ``add_done_callback()``: called with the context once the answer is written out to the client
  or will never be (the connection closed), as gRPC calls it when a call ends: a fetch holds its
  bytes of the broker's budget until then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from broker.principal import Authentication

if TYPE_CHECKING:
    from broker.kafka_wire.codec import Request

log = logging.getLogger(__name__)


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class KafkaCallContext:
    def __init__(self, auth: Authentication, peer: str, listener: str, timeout_s: float | None = None) -> None:
        self.brook_authentication = auth
        self.brook_listener = listener
        self._peer = peer
        self.client_id: str | None = None  # the request header's client.id
        self.client_host = ""
        self.brook_file_slices: dict[tuple[str, int], Any] | None = None  # Fetch: records left in their files
        self.brook_on_appended: Any = None  # Produce: a future set once the batches are appended
        self.brook_produce_records: list[bytes] | None = None  # Produce: the records, apart from the request
        self._deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        self._done_callbacks: list[Callable[[KafkaCallContext], None]] = []
        self._finished = False

    def add_done_callback(self, callback: Callable[[KafkaCallContext], None]) -> None:
        """``callback(self)`` once the answer is written or dropped (at once if that happened already)."""
        if self._finished:
            callback(self)
        else:
            self._done_callbacks.append(callback)

    def finish(self) -> None:
        """The connection wrote the answer, or never will: run the done callbacks, once."""
        self._finished = True
        callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a Kafka call's done callback failed")

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, Any]:
        return {}

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def clear_deadline(self) -> None:
        """For a call Kafka holds as long as its own bound says (a group's join and sync phases, bounded by the
        group's rebalance timeout): ``kafka.request.timeout.ms`` is not the deadline of its answer."""
        self._deadline = None

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise Aborted(code, details)

    def set_code(self, code: Any) -> None:
        pass

    def set_details(self, details: str) -> None:
        pass


# An API handler: the parsed request and the call's context -> the response entity (None: no response).
Handler = Callable[["Request", KafkaCallContext], Awaitable[Any]]
