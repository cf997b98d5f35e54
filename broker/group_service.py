"""GroupCoordinatorService (proto/group.proto) on the broker's gRPC (aio) server.

Thin: turns requests into ``GroupCoordinator`` calls and results or ``BrookError``s into
responses with error codes. The coordinator's calls block (JoinGroup and SyncGroup until
the group answers, bounded by the rebalance timeout and the caller's deadline; commits
until acks=all), so each handler runs its body on the servicer's own bounded executor,
never on the broker's event loop and never on the client or replication executors: a
rebalance storm cannot take the capacity fetches and produces need. JoinGroup and SyncGroup
wait for the group as futures on the loop (the group machine's callback completes them),
so a parked join holds no thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from broker import authorizer as authz
from broker import bytes_apart, consumer_groups, principal
from broker.admission import peer_host, refuse_over, refuse_oversized, release_when_done
from broker.authorizer import ALLOW_ALL, Authorizer
from broker.bytes_apart import BytesApart
from broker.cpu_shares import CpuShares
from broker.fair_pool import FairExecutor
from broker.group_coordinator import (
    DESCRIBE_ANSWER_MAX_BYTES,
    GroupCoordinator,
    join_timed_out,
    sync_timed_out,
)
from broker.group_state import JoinResult, SyncResult
from client.types import TopicPartition
from proto import errors, group_pb2, group_pb2_grpc
from proto.common_pb2 import ErrorCode

# Threads for group RPC bodies; excess requests queue (each client's in-flight requests are
# bounded by the broker's admission control, and groups rebalance one join per member).
GROUP_WORKERS = 32
# Of which one client address has at most this many running at a time (waits for replicated writes not
# counted: broker/fair_pool.py). Threads share one GIL: a ListGroups flood of 500 groups from one address,
# on up to 31 threads, made another address's commits 12x and its rebalances 5x slower.
GROUP_RUNNING_PER_CLIENT = 2
# A JoinGroup answer carrying more member metadata than this keeps the metadata apart from the message (JoinAnswer)
# and is held against DESCRIBE_INFLIGHT_MAX_BYTES until written (GroupCoordinatorServicer.JoinGroup).
JOIN_ANSWER_ON_LOOP_MAX_BYTES = 256 * 1024
# What a listed group costs its answer besides its id and protocol type (its state, the coordinator's id, framing,
# and the copies the answer's encodings make), for the bytes a ListGroups holds until it is written out.
LISTED_GROUP_BYTES = 64


class _CallDeadline:
    """The caller's deadline and identity (peer, TLS auth context, metadata), read on the loop and
    carried to the worker thread; it answers the ServicerContext calls broker.principal makes."""

    def __init__(self, context: grpc.aio.ServicerContext | None) -> None:
        remaining = context.time_remaining() if context is not None else None
        self._deadline = time.monotonic() + remaining if remaining is not None else None
        self._peer = context.peer() if context is not None else ""
        self._auth = context.auth_context() if context is not None else {}
        self._metadata = tuple(context.invocation_metadata() or ()) if context is not None else ()
        # A Kafka-protocol call's principal and listener (broker/kafka_wire/context.py) travel along.
        self.brook_authentication = getattr(context, "brook_authentication", None)
        self.brook_listener = getattr(context, "brook_listener", None)

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> Any:
        return self._auth

    def invocation_metadata(self) -> Any:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()


def _loop_callback() -> tuple[asyncio.Future[Any], Callable[[Any], None]]:
    """A future on the running loop and a thread-safe callback that completes it (once)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any) -> None:
        if not fut.done():
            fut.set_result(result)

    def callback(result: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, result)
        except RuntimeError:
            pass  # the loop is closed: the broker is stopping and nobody waits any more
    return fut, callback


async def _wait_or(fut: asyncio.Future[Any], timeout_s: float, on_timeout: Callable[[], Any]) -> Any:
    try:
        return await asyncio.wait_for(fut, max(0.0, timeout_s))
    except TimeoutError:
        return on_timeout()


class JoinAnswer(BytesApart):
    """A JoinGroupResponse with its members' metadata held apart (broker/bytes_apart.py): a leader's answer of 64
    members of 1 MiB took 190-220 ms of the event loop for protobuf to serialize, and ~300 ms to build."""

    MESSAGE = group_pb2.JoinGroupResponse
    REPEATED = "members"
    VALUE = "metadata"
    __slots__ = ()


def join_answer_of(answer: group_pb2.JoinGroupResponse | JoinAnswer) -> JoinAnswer:
    return answer if isinstance(answer, JoinAnswer) else JoinAnswer(answer)


def _join_answer(r: JoinResult) -> JoinAnswer:
    """The answer, its members' metadata the bytes the coordinator holds (not copied)."""
    answer = JoinAnswer(_join_response(r, metadata=False))
    answer.values.update((i, md) for i, (_m, md, _cid, _gi) in enumerate(r.members) if md)
    return answer


def _join_response(r: JoinResult, metadata: bool = True) -> group_pb2.JoinGroupResponse:
    """The answer; without its members' metadata when not ``metadata`` (``_join_answer`` holds it apart)."""
    return group_pb2.JoinGroupResponse(
        error_code=r.error_code, error_message=r.error_message, generation_id=r.generation_id,
        protocol_name=r.protocol_name, leader=r.leader, member_id=r.member_id,
        members=[group_pb2.JoinGroupMember(member_id=m, metadata=md if metadata else b"", client_id=cid,
                                           group_instance_id=gi)
                 for m, md, cid, gi in r.members])


def _sync_response(r: SyncResult) -> group_pb2.SyncGroupResponse:
    return group_pb2.SyncGroupResponse(error_code=r.error_code, error_message=r.error_message,
                                       protocol_name=r.protocol_name, assignment=r.assignment)


class _DescribeBytes:
    """One DescribeGroups call's share of the coordinator's DESCRIBE_INFLIGHT_MAX_BYTES: taken group by
    group on the executor, given back once the call has ended (its answer written out, or never to
    be). A call that ended while the executor still describes takes no more, so nothing is left held."""

    def __init__(self, coordinator: Any) -> None:
        self._c = coordinator
        self._lock = threading.Lock()
        self._held = 0
        self._released = False

    def reserve(self, size: int) -> bool:
        with self._lock:
            if self._released or not self._c.reserve_describe(size):
                return False
            self._held += size
            return True

    def release(self) -> None:
        with self._lock:
            self._released = True
            held, self._held = self._held, 0
        self._c.release_describe(held)


class GroupCoordinatorServicer(group_pb2_grpc.GroupCoordinatorServiceServicer):
    def __init__(self, coordinator: GroupCoordinator,
                 executor: concurrent.futures.Executor | None = None, authorizer: Authorizer = ALLOW_ALL,
                 cpu: CpuShares | None = None) -> None:
        self.c = coordinator
        self.authz = authorizer  # Kafka's group ACLs: READ to join/commit, DESCRIBE to find/describe, DELETE
        # Turns between client addresses (broker/fair_pool.py): one client's commits, each waiting for acks=all,
        # cannot queue every other client's heartbeats behind them.
        self._executor = executor or FairExecutor(GROUP_WORKERS, thread_name_prefix=f"groups-{coordinator.node_id}",
                                                  running_per_client=GROUP_RUNNING_PER_CLIENT, cpu=cpu)
        # As BrokerService.listener_by_tls: the coordinator's address on the caller's kind of listener.
        self.listener_by_tls: dict[bool, str] = {}

    def _refused(self, context: Any, operation: str, group_id: str, response_cls: type) -> Any:
        """The response refusing the call (GROUP_AUTHORIZATION_FAILED), or None when allowed."""
        caller = principal.principal_of(context)
        if self.authz.authorize(caller, operation, authz.GROUP, group_id):
            return None
        exc = authz.denied_error(caller, operation, authz.GROUP, group_id)
        return response_cls(error_code=exc.code, error_message=exc.message)

    def _topic_denied(self, context: Any, operation: str, partitions: Any) -> tuple[set[str], Any]:
        caller = principal.principal_of(context)
        return self.authz.denied_topics(caller, operation, {p.topic for p in partitions}), caller

    async def refuse_too_many_groups(self, count: int, context: Any) -> None:
        """A request may name at most max(1000, twice the groups this coordinator holds) group ids
        (see ``refuse_oversized``): a DeleteGroups of 100,000 made-up ids took 4.8 s of work."""
        groups = self.c.group_count()
        await refuse_over(context, count, "groups", groups, f"this coordinator holds {groups} groups")

    async def _run(self, body: Callable[[Any, Any], Any], request: Any, context: Any) -> Any:
        deadline = _CallDeadline(context)
        return await asyncio.get_running_loop().run_in_executor(self._executor, body, request, deadline)

    async def FindCoordinator(self, request, context):  # noqa: N802
        return await self._run(self._find_coordinator, request, context)

    async def JoinGroup(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.READ, request.group_id, group_pb2.JoinGroupResponse)) is not None:
            refused.member_id, refused.generation_id = request.member_id, -1
            return refused
        # Registering takes the coordinator's lock (executor); the wait for the join phase to
        # end is a future on the loop, completed by the group machine's callback: no thread.
        wait_s = self._wait_s(_CallDeadline(context), max(request.rebalance_timeout_ms, request.session_timeout_ms,
                                                          self.c.config.group_initial_rebalance_delay_ms))
        # The member's host is the connection's address, as Kafka shows it, not what the client says.
        request.client_host = peer_host(context.peer())
        fut, callback = _loop_callback()
        try:
            await self.run_on_pool(self.c.start_join, request, callback)
            r = await _wait_or(fut, wait_s, lambda: join_timed_out(request))
        except errors.BrookError as exc:
            return group_pb2.JoinGroupResponse(error_code=exc.code, error_message=exc.message,
                                               member_id=request.member_id, generation_id=-1)
        size = sum(len(m) + len(md) + len(cid) + len(gi) for m, md, cid, gi in r.members)
        if size <= JOIN_ANSWER_ON_LOOP_MAX_BYTES:
            return _join_response(r)
        # A leader's answer carries every member's metadata (up to group.member.metadata.max.bytes each), and a
        # leader may rejoin while the group waits for its SyncGroup, to be answered again at once: 64 members of
        # 1 MiB made each 10 KB JoinGroup build 64 MiB on the event loop, held until written, from as many
        # connections as did not read them (audit). Such an answer keeps the metadata apart from the message, the
        # bytes the coordinator holds (JoinAnswer: nothing copied until written), and is held against the answers
        # being built (DESCRIBE_INFLIGHT_MAX_BYTES) until written, as its copy on the way out is; past it, the
        # retriable COORDINATOR_LOAD_IN_PROGRESS, and the leader joins again.
        held = _DescribeBytes(self.c)
        if not held.reserve(size):
            self.c.answer_bytes_refusal("a JoinGroup answer", request.group_id, size)
            return group_pb2.JoinGroupResponse(
                error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, member_id=r.member_id, generation_id=-1,
                error_message=f"the answers being built hold too many bytes for this one's {size}: join again")
        release_when_done(context, held.release, at_once=True)
        return _join_answer(r)

    async def join_group_over_grpc(self, request: group_pb2.JoinGroupRequest, context: Any) -> Any:
        """JoinGroup as the gRPC port serves it (``add_to_server``): a long answer handed over as its bytes, joined
        on the group pool (the Kafka listener calls ``JoinGroup`` itself, and sends the metadata as it is)."""
        return await bytes_apart.for_grpc(await self.JoinGroup(request, context), self.run_on_pool)

    async def SyncGroup(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.READ, request.group_id, group_pb2.SyncGroupResponse)) is not None:
            return refused
        wait_s = self._wait_s(_CallDeadline(context), 300_000)
        fut, callback = _loop_callback()
        try:
            r = await self.run_on_pool(self.c.start_sync, request, callback)
            if r is None:
                r = await _wait_or(fut, wait_s, sync_timed_out)
                # Handing out the assignment waits for the generation's write (acks=all): executor.
                r = await self.run_on_pool(self.c.finish_sync, request, r)
        except errors.BrookError as exc:
            return group_pb2.SyncGroupResponse(error_code=exc.code, error_message=exc.message)
        return _sync_response(r)

    async def run_on_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the group pool, in the calling client address's turn (the Kafka listener's answers too)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def Heartbeat(self, request, context):  # noqa: N802
        return await self._run(self._heartbeat, request, context)

    async def consumer_group_heartbeat(self, hb: consumer_groups.Heartbeat, context: Any) -> Any:
        """KIP-848's ConsumerGroupHeartbeat (the Kafka listener's; gRPC has no such call): the answer, or the
        error (BrookError or HeartbeatError) it is refused with."""
        return await self._run(self._consumer_group_heartbeat, hb, context)

    def _consumer_group_heartbeat(self, hb: consumer_groups.Heartbeat, context: Any) -> Any:
        caller = principal.principal_of(context)
        if not self.authz.authorize(caller, authz.READ, authz.GROUP, hb.group_id):
            return authz.denied_error(caller, authz.READ, authz.GROUP, hb.group_id)
        if hb.subscribed_topic_names:
            # A member is given the partitions of the topics it subscribes to, and told their ids: only of
            # topics it may describe (as Kafka 4's coordinator checks).
            denied = self.authz.denied_topics(caller, authz.DESCRIBE, set(hb.subscribed_topic_names))
            if denied:
                return authz.denied_error(caller, authz.DESCRIBE, authz.TOPIC, min(denied))
        def describable(names: set[str]) -> set[str]:  # what a regular expression may give it, as Kafka 4 checks
            return names - self.authz.denied_topics(caller, authz.DESCRIBE, names)
        try:
            return self.c.consumer_group_heartbeat(hb, describable)
        except (errors.BrookError, consumer_groups.HeartbeatError) as exc:
            return exc

    async def consumer_group_describe(self, group_ids: list[str], include_operations: bool, context: Any) -> list[dict]:
        """KIP-848's ConsumerGroupDescribe (the Kafka listener's): each group id's entry, in order, a repeated one
        described again; DESCRIBE on each group."""
        await self.refuse_too_many_groups(len(group_ids), context)
        return await self._run(functools.partial(self._consumer_group_describe, include_operations), group_ids,
                               context)

    def _consumer_group_describe(self, include_operations: bool, group_ids: list[str], context: Any) -> list[dict]:
        caller = principal.principal_of(context)
        described: dict[str, dict] = {}
        for gid in dict.fromkeys(group_ids):
            if not self.authz.authorize(caller, authz.DESCRIBE, authz.GROUP, gid):
                exc = authz.denied_error(caller, authz.DESCRIBE, authz.GROUP, gid)
                described[gid] = {"group_id": gid, "error_code": exc.code, "error_message": exc.message}
                continue
            entry = self.c.describe_consumer_group(gid)
            if include_operations and entry["error_code"] == 0:
                entry["authorized_operations"] = self.authz.authorized_operations(caller, authz.GROUP, gid)
            described[gid] = entry
        return [described[gid] for gid in group_ids]

    async def LeaveGroup(self, request, context):  # noqa: N802
        return await self._run(self._leave_group, request, context)

    async def OffsetCommit(self, request, context):  # noqa: N802
        await refuse_oversized(context, self.c.metadata_cache, len(request.partitions), "partitions")
        return await self._run(self._offset_commit, request, context)

    async def OffsetFetch(self, request, context):  # noqa: N802
        await refuse_oversized(context, self.c.metadata_cache, len(request.partitions), "partitions")
        return await self._run(self._offset_fetch, request, context)

    async def ListGroups(self, request, context):  # noqa: N802
        # Its answer's bytes are held as a description's are: 100 ListGroups of 38,000 groups from clients that
        # did not read their answers took a node from 215 MB to 2 GB, and got it fenced (audit).
        return await self._run_holding_answer_bytes(self._list_groups, request, context)

    async def DescribeGroups(self, request, context):  # noqa: N802
        await self.refuse_too_many_groups(len(request.group_ids), context)
        return await self._run_holding_answer_bytes(self._describe_groups, request, context)

    async def _run_holding_answer_bytes(self, body, request, context):
        """``body(request, context, held=...)`` on the executor, the bytes it builds held against the coordinator's
        DESCRIBE_INFLIGHT_MAX_BYTES until the answer is written out (or the call ends unwritten), so answers a
        client does not read stay within the budget; the Kafka listener ends it once it wrote its encoding."""
        held = _DescribeBytes(self.c)
        try:
            out = await self._run(functools.partial(body, held=held), request, context)
        except BaseException:
            held.release()
            raise
        release_when_done(context, held.release, at_once=True)
        return out

    async def DeleteGroups(self, request, context):  # noqa: N802
        await self.refuse_too_many_groups(len(request.group_ids), context)
        return await self._run(self._delete_groups, request, context)

    async def OffsetDelete(self, request, context):  # noqa: N802
        await refuse_oversized(context, self.c.metadata_cache, len(request.partitions), "partitions")
        return await self._run(self._offset_delete, request, context)

    async def AlterGroupOffsets(self, request, context):  # noqa: N802
        # Each spec is resolved and answered, made-up partitions too (400,000 specs took 3.3 s).
        await refuse_oversized(context, self.c.metadata_cache, len(request.specs), "partitions")
        return await self._run(self._alter_group_offsets, request, context)

    # ---- bodies (on the executor) ----
    @staticmethod
    def _wait_s(context: _CallDeadline | None, wanted_ms: int) -> float:
        remaining = context.time_remaining() if context is not None else None
        wait = wanted_ms / 1000 + 5
        return min(wait, max(0.0, remaining - 0.5)) if remaining is not None else wait

    def _find_coordinator(self, request, context):
        if (refused := self._refused(context, authz.DESCRIBE, request.group_id,
                                     group_pb2.FindCoordinatorResponse)) is not None:
            refused.node_id = -1
            return refused
        try:
            listener = (getattr(context, "brook_listener", None)
                        or self.listener_by_tls.get(principal.is_tls(context), "BROKER"))
            node_id, host, port = self.c.find_coordinator(request.group_id, listener)
        except errors.BrookError as exc:
            return group_pb2.FindCoordinatorResponse(error_code=exc.code, error_message=exc.message, node_id=-1)
        return group_pb2.FindCoordinatorResponse(node_id=node_id, host=host, port=port)

    def _heartbeat(self, request, context):
        if (refused := self._refused(context, authz.READ, request.group_id, group_pb2.HeartbeatResponse)) is not None:
            return refused
        try:
            code = self.c.heartbeat(request.group_id, request.member_id, request.generation_id,
                                    request.group_instance_id)
        except errors.BrookError as exc:
            return group_pb2.HeartbeatResponse(error_code=exc.code, error_message=exc.message)
        return group_pb2.HeartbeatResponse(error_code=code)

    def _leave_group(self, request, context):
        if (refused := self._refused(context, authz.READ, request.group_id, group_pb2.LeaveGroupResponse)) is not None:
            return refused
        try:
            leaving = [(m, "") for m in request.member_ids] + [(m.member_id, m.group_instance_id)
                                                               for m in request.members]
            results = self.c.leave_group(request.group_id, leaving, request.reason)
        except errors.BrookError as exc:
            return group_pb2.LeaveGroupResponse(error_code=exc.code, error_message=exc.message)
        return group_pb2.LeaveGroupResponse(members=[
            group_pb2.LeaveGroupMemberResponse(member_id=m, group_instance_id=gi, error_code=c)
            for (m, gi), c in zip(leaving, results, strict=True)])

    def _offset_commit(self, request, context):
        if (refused := self._refused(context, authz.READ, request.group_id,
                                     group_pb2.OffsetCommitResponse)) is not None:
            return refused
        denied, caller = self._topic_denied(context, authz.READ, request.partitions)
        refusals = []
        if denied:  # commit the partitions the member may read; refuse the others one by one
            refusals = [(p.topic, p.partition, authz.denied_error(caller, authz.READ, authz.TOPIC, p.topic))
                        for p in request.partitions if p.topic in denied]
            allowed = group_pb2.OffsetCommitRequest()
            allowed.CopyFrom(request)
            del allowed.partitions[:]
            allowed.partitions.extend(p for p in request.partitions if p.topic not in denied)
            request = allowed
        try:
            results = (self.c.commit_offsets(request, peer_host(context.peer()))
                       if request.partitions or not refusals else [])
        except errors.BrookError as exc:
            if not refusals:
                return group_pb2.OffsetCommitResponse(error_code=exc.code, error_message=exc.message)
            # As Kafka: the topics refused keep TOPIC_AUTHORIZATION_FAILED, the others get the group's error
            # (the answer gave every partition the group's error, UNKNOWN_MEMBER_ID on a refused topic).
            results = [(p.topic, p.partition, exc.code, exc.message) for p in request.partitions]
            return group_pb2.OffsetCommitResponse(error_code=exc.code, error_message=exc.message, partitions=[
                group_pb2.PartitionError(topic=t, partition=p, error_code=c, error_message=m)
                for t, p, c, m in results + [(t, p, e.code, e.message) for t, p, e in refusals]])
        results = list(results) + [(t, p, e.code, e.message) for t, p, e in refusals]
        return group_pb2.OffsetCommitResponse(partitions=[
            group_pb2.PartitionError(topic=t, partition=p, error_code=c, error_message=m) for t, p, c, m in results])

    def _offset_fetch(self, request, context):
        if (refused := self._refused(context, authz.DESCRIBE, request.group_id,
                                     group_pb2.OffsetFetchResponse)) is not None:
            return refused
        caller = principal.principal_of(context)
        # Each partition once, as Kafka keys them by a map: every copy was answered with its committed offset and
        # metadata (4 KiB), so 2,034 copies of one partition (22 KB) made an 8.4 MB answer (audit).
        tps = list(dict.fromkeys(TopicPartition(p.topic, p.partition) for p in request.partitions))
        try:
            found = self.c.fetch_offsets(request.group_id, tps)
        except errors.BrookError as exc:
            return group_pb2.OffsetFetchResponse(error_code=exc.code, error_message=exc.message)
        resp = group_pb2.OffsetFetchResponse()
        # Kafka leaves out (all partitions) or refuses (named ones) topics the caller may not DESCRIBE.
        denied = self.authz.denied_topics(caller, authz.DESCRIBE, {tp.topic for tp, _ in found})
        for tp, e in found:
            if tp.topic in denied:
                if request.partitions:
                    resp.partitions.append(group_pb2.CommittedOffset(
                        topic=tp.topic, partition=tp.partition, offset=-1, leader_epoch=-1,
                        error_code=authz.denied_code(authz.TOPIC)))
                continue
            if e is None:
                resp.partitions.append(group_pb2.CommittedOffset(topic=tp.topic, partition=tp.partition,
                                                                 offset=-1, leader_epoch=-1))
            else:
                resp.partitions.append(group_pb2.CommittedOffset(
                    topic=tp.topic, partition=tp.partition, offset=e.offset, leader_epoch=e.leader_epoch,
                    metadata=e.metadata, commit_timestamp_ms=e.commit_timestamp_ms))
        return resp

    def _list_groups(self, request, context, held: _DescribeBytes):
        # (group id, protocol type, state, group type): the classic groups and those of the consumer protocol
        classic, consumer = consumer_groups.CLASSIC_GROUP_TYPE, consumer_groups.CONSUMER_GROUP_TYPE
        groups = [(g.group_id, g.protocol_type, g.state.value, classic) for g in self.c.list_groups(set(request.states))]
        groups += [(gid, consumer, state, consumer) for gid, state in self.c.consumer_group_listing(set(request.states))]
        caller = principal.principal_of(context)
        if not self.authz.authorize(caller, authz.DESCRIBE, authz.CLUSTER):  # else: only describable groups
            groups = [g for g in groups if self.authz.authorize(caller, authz.DESCRIBE, authz.GROUP, g[0])]
        size = sum(len(g[0]) + len(g[1]) + LISTED_GROUP_BYTES for g in groups)
        if not held.reserve(size):
            return self.c.listing_refusal(len(groups), size)
        return group_pb2.ListGroupsResponse(groups=[
            group_pb2.ListedGroup(group_id=gid, protocol_type=protocol_type, state=state, group_type=kind,
                                  coordinator_id=self.c.node_id)
            for gid, protocol_type, state, kind in sorted(groups)])

    def _describe_groups(self, request, context, held: _DescribeBytes):
        """Each group id the request lists is answered, in order, a repeated one again (as Kafka does); but
        each distinct id is authorized and described once, and a repeat answered with a copy of its
        description, counted against the answer's bounds as the first was (each copy of an id was described
        anew: 1,000 copies of one group with 2,000 committed partitions took 30 s and built 20 MB; an
        audit). A partition's end offset is resolved once a request, whichever groups show it."""
        out = group_pb2.DescribeGroupsResponse()
        left = DESCRIBE_ANSWER_MAX_BYTES
        described: dict[str, tuple[int, int]] = {}  # group id -> (where its answer is in out.groups, its bytes)
        end_offsets: dict[TopicPartition, tuple[int, str]] = {}
        for gid in request.group_ids:
            first = described.get(gid)
            if first is not None:
                at, size = first
                if size:
                    refused = self.c.describe_refusal(gid, size, left, held.reserve)
                    if refused is not None:
                        out.groups.append(refused)
                        continue
                    left -= size
                out.groups.add().CopyFrom(out.groups[at])
                continue
            refused = self._refused(context, authz.DESCRIBE, gid, group_pb2.DescribedGroup)
            if refused is not None:
                refused.group_id = gid
                described[gid] = (len(out.groups), 0)
                out.groups.append(refused)
                continue
            answer, size = self.c.describe_group(gid, request.include_offsets, max_bytes=left,
                                                 reserve=held.reserve, end_offsets=end_offsets)
            left -= size
            if answer.offsets:
                # As OffsetFetch: committed offsets (and lag) only of topics the caller may DESCRIBE;
                # a viewer of the group alone saw every topic it had committed (found by an audit).
                denied = self.authz.denied_topics(principal.principal_of(context), authz.DESCRIBE,
                                                  {o.topic for o in answer.offsets})
                if denied:
                    kept = [o for o in answer.offsets if o.topic not in denied]
                    del answer.offsets[:]
                    answer.offsets.extend(kept)
            described[gid] = (len(out.groups), size)
            out.groups.append(answer)
        return out

    def _delete_groups(self, request, context):
        out = group_pb2.DeleteGroupsResponse()
        for gid in request.group_ids:
            if (refused := self._refused(context, authz.DELETE, gid, group_pb2.GroupResult)) is not None:
                refused.group_id = gid
                out.results.append(refused)
                continue
            try:
                self.c.delete_group(gid)
                out.results.append(group_pb2.GroupResult(group_id=gid))
            except errors.BrookError as exc:
                out.results.append(group_pb2.GroupResult(group_id=gid, error_code=exc.code,
                                                         error_message=exc.message))
        return out

    def _offset_delete(self, request, context):
        if (refused := self._refused(context, authz.DELETE, request.group_id,
                                     group_pb2.OffsetDeleteResponse)) is not None:
            return refused
        # As Kafka (handleOffsetDeleteRequest): the partitions of topics the caller may not READ are refused one by
        # one, TOPIC_AUTHORIZATION_FAILED, and the others deleted (the whole request used to be refused).
        denied, caller = self._topic_denied(context, authz.READ, request.partitions)
        refused = [(p.topic, p.partition, authz.denied_code(authz.TOPIC)) for p in request.partitions
                   if p.topic in denied]
        tps = [TopicPartition(p.topic, p.partition) for p in request.partitions if p.topic not in denied]
        try:
            results = self.c.delete_offsets(request.group_id, tps)
        except errors.BrookError as exc:
            return group_pb2.OffsetDeleteResponse(error_code=exc.code, error_message=exc.message)
        return group_pb2.OffsetDeleteResponse(partitions=[
            group_pb2.PartitionError(topic=t, partition=p, error_code=c)
            for t, p, c in [(tp.topic, tp.partition, c) for tp, c in results] + refused])

    def _alter_group_offsets(self, request, context):
        # Kafka: resetting offsets is an offset commit (READ on the group and on each topic).
        if (refused := self._refused(context, authz.READ, request.group_id,
                                     group_pb2.AlterGroupOffsetsResponse)) is not None:
            return refused
        denied, caller = self._topic_denied(context, authz.READ, request.specs)
        if denied:
            exc = authz.denied_error(caller, authz.READ, authz.TOPIC, sorted(denied)[0])
            return group_pb2.AlterGroupOffsetsResponse(error_code=exc.code, error_message=exc.message)
        try:
            resolved = self.c.alter_offsets(request, peer_host(context.peer()))
        except errors.BrookError as exc:
            return group_pb2.AlterGroupOffsetsResponse(error_code=exc.code, error_message=exc.message)
        return group_pb2.AlterGroupOffsetsResponse(partitions=resolved)


def add_to_server(servicer: GroupCoordinatorServicer, server: grpc.aio.Server) -> None:
    """The generated ``add_GroupCoordinatorServiceServicer_to_server``, except that JoinGroup is served by
    ``join_group_over_grpc``: its answer may be a JoinAnswer, or its bytes joined off the loop."""
    bytes_apart.add_service(server, group_pb2.DESCRIPTOR.services_by_name["GroupCoordinatorService"], servicer,
                            {"JoinGroup": servicer.join_group_over_grpc})
