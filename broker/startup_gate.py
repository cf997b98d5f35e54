"""Client calls wait for the broker's first cluster metadata: until then they are answered UNAVAILABLE.

A broker's gRPC server starts before the broker registers (its followers' fetches and the replication
it leads need the port as soon as the controller names it), but what it knows of the cluster arrives
later, with the first update of its metadata watch. Until then its cache is empty, and a Metadata call
answered from it says every topic is UNKNOWN_TOPIC_OR_PARTITION and the cluster has no brokers: a
consumer or an admin tool that asked a just-restarted broker concluded that an existing topic was gone,
and SCRAM users were unknown (a non-retriable authentication failure). Kafka does not open its listeners
before the broker has caught up with the metadata log (KIP-631); a gRPC port must be open sooner, so
each client call is refused instead, ``UNAVAILABLE``, which clients retry and take to another broker,
with nothing of the call read. Followers' calls (``ReplicaFetch``, ``OffsetsForLeaderEpoch``) pass:
they answer from the partitions' state, which a broker without metadata does not lead
(NOT_LEADER_OR_FOLLOWER, retried by the follower).

Once the first metadata is there the gate stays open for the life of the process (a later loss of the
controllers leaves a broker serving the metadata it has, as Kafka's does), and costs one attribute read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

log = logging.getLogger(__name__)

# The follower side of replication: answered from partition state, never from the metadata cache.
REPLICATION_METHODS = frozenset({"/brook.BrokerService/ReplicaFetch", "/brook.BrokerService/OffsetsForLeaderEpoch"})


class MetadataGate(grpc.aio.ServerInterceptor):
    """Refuses the broker's client calls ``UNAVAILABLE`` until ``loaded()`` first holds.

    Put it first among the server's interceptors: the handler it replaces is never run, so a refused
    call's message is not read (the receive gate's slots are not taken). ``outermost``: the metrics
    interceptor goes after it (broker/node.py), and a refusal is counted in ``refused_total``."""

    outermost = True

    def __init__(self, node_id: int, loaded: Callable[[], bool]) -> None:
        self.node_id = node_id
        self._loaded = loaded
        self.open = False
        self.refused_total = 0
        self._message = (f"broker {node_id} is starting: it has not received the cluster metadata from the "
                         "controller yet; retry, or ask another broker")

    async def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if self.open or handler is None:
            return handler
        if self._loaded():
            self.open = True
            log.info("broker %d: cluster metadata received; serving clients (%d calls were refused before)",
                     self.node_id, self.refused_total)
            return handler
        method = handler_call_details.method
        if method in REPLICATION_METHODS or not method.startswith("/brook."):
            return handler
        self.refused_total += 1
        if self.refused_total == 1:
            log.info("broker %d: refusing client calls (UNAVAILABLE) until the first cluster metadata arrives",
                     self.node_id)
        return _refusing(handler, self._message)


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape that ends the call UNAVAILABLE without reading its request."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, des, ser)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, des, ser)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, des, ser)
    return grpc.unary_unary_rpc_method_handler(refuse, des, ser)
