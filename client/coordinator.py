"""Talking to a consumer group's coordinator (proto/group.proto): discovery, offsets, admin calls.

The coordinator of a group is the leader of its ``__consumer_offsets`` partition; any
broker answers FindCoordinator. Calls that come back NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS or fail to connect forget the
cached coordinator, look it up again and retry with backoff until the deadline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import grpc

from client import errors
from client.cluster import ClusterClient, as_timeout_ms, rpc_error
from client.types import OffsetAndMetadata, TopicPartition
from proto import group_pb2, group_pb2_grpc

log = logging.getLogger(__name__)

_COORDINATOR_MOVED = frozenset(
    {
        errors.ErrorCode.NOT_COORDINATOR,
        errors.ErrorCode.COORDINATOR_NOT_AVAILABLE,
        errors.ErrorCode.NETWORK_EXCEPTION,
        errors.ErrorCode.REQUEST_TIMED_OUT,
    }
)


def group_stub(cluster: ClusterClient, address: str) -> group_pb2_grpc.GroupCoordinatorServiceStub:
    return group_pb2_grpc.GroupCoordinatorServiceStub(cluster.channel_for_address(address))


def offset_commit_request(
    group_id: str,
    offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
    *,
    generation_id: int = -1,
    member_id: str = "",
) -> group_pb2.OffsetCommitRequest | None:
    """The OffsetCommit request for ``offsets`` (None when there is nothing to commit).

    Negative offsets are refused here, before anything is sent. An ``OffsetAndMetadata``'s leader
    epoch is committed with it (KIP-320; -1 when it has none, as for a plain int)."""
    parts = []
    for tp, om in offsets.items():
        om = om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(int(om))
        if om.offset < 0:
            raise errors.InvalidCommitOffsetSizeError(f"cannot commit negative offset {om.offset} for {tp}")
        epoch = om.leader_epoch if om.leader_epoch is not None else -1
        parts.append(group_pb2.OffsetCommitPartition(topic=tp[0], partition=tp[1], offset=om.offset,
                                                     leader_epoch=epoch, metadata=om.metadata))
    if not parts:
        return None
    return group_pb2.OffsetCommitRequest(group_id=group_id, generation_id=generation_id,
                                         member_id=member_id, partitions=parts)


class GroupCoordinatorClient:
    def __init__(self, cluster: ClusterClient, group_id: str, *, request_timeout_ms: int | None = None) -> None:
        if not group_id:
            raise errors.InvalidGroupIdError("group.id must be a non-empty string")
        self.cluster = cluster
        self.group_id = group_id
        self.request_timeout_ms = request_timeout_ms or cluster.request_timeout_ms
        self._lock = threading.Lock()
        self._address: str | None = None
        self.node_id = -1

    def find_coordinator(self, timeout_s: float) -> str:
        with self._lock:
            if self._address is not None:
                return self._address
        request = group_pb2.FindCoordinatorRequest(group_id=self.group_id)
        channel = self.cluster.any_broker_channel(timeout_ms=as_timeout_ms(timeout_s))
        response = group_pb2_grpc.GroupCoordinatorServiceStub(channel).FindCoordinator(request, timeout=timeout_s)
        errors.raise_for(response.error_code, response.error_message)
        address = f"{response.host}:{response.port}"
        with self._lock:
            self._address = address
            self.node_id = response.node_id
        return address

    def ready(self, timeout_s: float) -> bool:
        """Is the coordinator known, looked up for at most ``timeout_s`` (what is left of a poll)?
        False when no broker named it in that time (unreachable, no coordinator yet): the next
        poll looks again. A failure that retrying cannot mend raises."""
        try:
            self.cluster.with_retries(self.find_coordinator, timeout_ms=as_timeout_ms(timeout_s))
        except errors.BrookError as exc:
            if not exc.retriable:
                raise
            log.debug("group %s: no coordinator within %.2f s: %s", self.group_id, timeout_s, exc)
            return False
        return True

    def forget(self) -> None:
        with self._lock:
            self._address = None
            self.node_id = -1

    def send(self, method: str, request: Any, *, timeout_ms: int) -> grpc.Future:
        """Start ``method`` on the coordinator ``ready`` found, without waiting: its future, for ``receive``.
        No retries: a caller that keeps a call across polls (a JoinGroup waiting for the join phase)
        starts it again itself when ``receive`` raises."""
        with self._lock:
            address = self._address
        if address is None:
            raise errors.error_for(errors.ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                   f"{method} for group {self.group_id!r}: no coordinator known")
        return getattr(group_stub(self.cluster, address), method).future(request, timeout=timeout_ms / 1000)

    def receive(self, method: str, call: grpc.Future) -> Any | None:
        """The answer to a call ``send`` started, or None while it has not come (never waits). A
        failed call forgets the coordinator and raises the client error it stands for."""
        if not call.done():
            return None
        try:
            return call.result(timeout=0)
        except grpc.FutureCancelledError as exc:
            raise errors.error_for(errors.ErrorCode.NETWORK_EXCEPTION,
                                   f"{method} for group {self.group_id!r} was cancelled") from exc
        except grpc.RpcError as exc:
            self.forget()
            raise rpc_error(exc, f"{method} for group {self.group_id!r}") from exc

    def call(self, method: str, request: Any, *, timeout_ms: int | None = None, check: bool = True) -> Any:
        """Send ``method`` to the coordinator; retries while the coordinator moves or loads."""

        def attempt(timeout_s: float) -> Any:
            try:
                address = self.find_coordinator(timeout_s)
                response = getattr(group_stub(self.cluster, address), method)(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                self.forget()
                raise rpc_error(exc, f"{method} for group {self.group_id!r}") from exc
            code = getattr(response, "error_code", errors.ErrorCode.NONE)
            if check and code != errors.ErrorCode.NONE:
                err = errors.error_for(code, response.error_message)
                if code in _COORDINATOR_MOVED:
                    self.forget()
                raise err
            return response

        return self.cluster.with_retries(attempt, timeout_ms=timeout_ms or self.request_timeout_ms)

    # ---- offsets ----
    def commit(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        *,
        generation_id: int = -1,
        member_id: str = "",
        timeout_ms: int | None = None,
    ) -> None:
        request = offset_commit_request(self.group_id, offsets, generation_id=generation_id, member_id=member_id)
        if request is None:
            return

        def attempt(remaining_s: float) -> None:
            response = self.call("OffsetCommit", request, timeout_ms=max(1, int(remaining_s * 1000)))
            for p in response.partitions:
                # A retriable one (UNKNOWN_TOPIC_OR_PARTITION: a topic the coordinator has not heard
                # of yet) commits again, as Kafka's consumer does; committing twice is harmless.
                errors.raise_for(p.error_code, p.error_message or f"commit {p.topic}-{p.partition}")
        self.cluster.with_retries(attempt, timeout_ms=timeout_ms or self.request_timeout_ms)

    def committed(self, tps: Iterable[TopicPartition] | None = None, *, timeout_ms: int | None = None
                  ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """Committed offsets (None where nothing is committed); ``tps=None`` = every committed partition.
        Each carries the leader epoch it was committed with (``OffsetAndMetadata.leader_epoch``, None
        when the commit had none)."""
        wanted = None if tps is None else [TopicPartition(*tp) for tp in tps]
        request = group_pb2.OffsetFetchRequest(
            group_id=self.group_id,
            partitions=[group_pb2.TopicPartitionRef(topic=t, partition=p) for t, p in wanted or []],
        )
        response = self.call("OffsetFetch", request, timeout_ms=timeout_ms)
        result: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(wanted or [])
        for p in response.partitions:
            errors.raise_for(p.error_code, f"offset fetch {p.topic}-{p.partition}")
            tp = TopicPartition(p.topic, p.partition)
            result[tp] = OffsetAndMetadata(p.offset, p.metadata, p.leader_epoch) if p.offset >= 0 else None
        return result
