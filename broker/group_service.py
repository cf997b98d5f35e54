"""GroupCoordinatorService (proto/group.proto) on the broker's gRPC server.

Thin: turns requests into ``GroupCoordinator`` calls and results or ``BrookError``s into
responses with error codes. JoinGroup and SyncGroup block their handler thread until
the group answers, bounded by the rebalance timeout and the caller's deadline.
"""

from __future__ import annotations

from typing import Any

import grpc

from broker import authorizer as authz
from broker.authorizer import ALLOW_ALL, Authorizer
from broker.group_coordinator import GroupCoordinator
from broker.sasl import principal_of
from client.types import TopicPartition
from proto import errors, group_pb2, group_pb2_grpc


class GroupCoordinatorServicer(group_pb2_grpc.GroupCoordinatorServiceServicer):
    def __init__(self, coordinator: GroupCoordinator, authorizer: Authorizer = ALLOW_ALL) -> None:
        self.c = coordinator
        self.authz = authorizer  # Kafka's group ACLs: READ to join/commit, DESCRIBE to find/describe, DELETE

    def _refused(self, context: Any, operation: str, group_id: str, response_cls: type) -> Any:
        """The response refusing the call (GROUP_AUTHORIZATION_FAILED), or None when allowed."""
        principal = principal_of(context)
        if self.authz.authorize(principal, operation, authz.GROUP, group_id):
            return None
        exc = authz.denied_error(principal, operation, authz.GROUP, group_id)
        return response_cls(error_code=exc.code, error_message=exc.message)

    def _topic_denied(self, context: Any, operation: str, partitions: Any) -> tuple[set[str], Any]:
        principal = principal_of(context)
        return self.authz.denied_topics(principal, operation, {p.topic for p in partitions}), principal

    @staticmethod
    def _wait_s(context: grpc.ServicerContext, wanted_ms: int) -> float:
        remaining = context.time_remaining() if context is not None else None
        wait = wanted_ms / 1000 + 5
        return min(wait, max(0.0, remaining - 0.5)) if remaining is not None else wait

    def FindCoordinator(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.DESCRIBE, request.group_id,
                                     group_pb2.FindCoordinatorResponse)) is not None:
            refused.node_id = -1
            return refused
        try:
            node_id, host, port = self.c.find_coordinator(request.group_id)
        except errors.BrookError as exc:
            return group_pb2.FindCoordinatorResponse(error_code=exc.code, error_message=exc.message, node_id=-1)
        return group_pb2.FindCoordinatorResponse(node_id=node_id, host=host, port=port)

    def JoinGroup(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.READ, request.group_id, group_pb2.JoinGroupResponse)) is not None:
            refused.member_id, refused.generation_id = request.member_id, -1
            return refused
        try:
            wanted = max(request.rebalance_timeout_ms, request.session_timeout_ms,
                         self.c.config.group_initial_rebalance_delay_ms)
            r = self.c.join_group(request, self._wait_s(context, wanted))
        except errors.BrookError as exc:
            return group_pb2.JoinGroupResponse(error_code=exc.code, error_message=exc.message,
                                               member_id=request.member_id, generation_id=-1)
        return group_pb2.JoinGroupResponse(
            error_code=r.error_code, error_message=r.error_message, generation_id=r.generation_id,
            protocol_name=r.protocol_name, leader=r.leader, member_id=r.member_id,
            members=[group_pb2.JoinGroupMember(member_id=m, metadata=md, client_id=cid) for m, md, cid in r.members])

    def SyncGroup(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.READ, request.group_id, group_pb2.SyncGroupResponse)) is not None:
            return refused
        try:
            r = self.c.sync_group(request, self._wait_s(context, 300_000))
        except errors.BrookError as exc:
            return group_pb2.SyncGroupResponse(error_code=exc.code, error_message=exc.message)
        return group_pb2.SyncGroupResponse(error_code=r.error_code, error_message=r.error_message,
                                           protocol_name=r.protocol_name, assignment=r.assignment)

    def Heartbeat(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.READ, request.group_id, group_pb2.HeartbeatResponse)) is not None:
            return refused
        try:
            code = self.c.heartbeat(request.group_id, request.member_id, request.generation_id)
        except errors.BrookError as exc:
            return group_pb2.HeartbeatResponse(error_code=exc.code, error_message=exc.message)
        return group_pb2.HeartbeatResponse(error_code=code)

    def LeaveGroup(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.READ, request.group_id, group_pb2.LeaveGroupResponse)) is not None:
            return refused
        try:
            results = self.c.leave_group(request.group_id, list(request.member_ids))
        except errors.BrookError as exc:
            return group_pb2.LeaveGroupResponse(error_code=exc.code, error_message=exc.message)
        return group_pb2.LeaveGroupResponse(members=[
            group_pb2.LeaveGroupMemberResponse(member_id=m, error_code=c) for m, c in results])

    def OffsetCommit(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.READ, request.group_id,
                                     group_pb2.OffsetCommitResponse)) is not None:
            return refused
        denied, principal = self._topic_denied(context, authz.READ, request.partitions)
        refusals = []
        if denied:  # commit the partitions the member may read; refuse the others one by one
            refusals = [(p.topic, p.partition, authz.denied_error(principal, authz.READ, authz.TOPIC, p.topic))
                        for p in request.partitions if p.topic in denied]
            allowed = group_pb2.OffsetCommitRequest()
            allowed.CopyFrom(request)
            del allowed.partitions[:]
            allowed.partitions.extend(p for p in request.partitions if p.topic not in denied)
            request = allowed
        try:
            results = self.c.commit_offsets(request) if request.partitions or not refusals else []
        except errors.BrookError as exc:
            return group_pb2.OffsetCommitResponse(error_code=exc.code, error_message=exc.message)
        results = list(results) + [(t, p, e.code, e.message) for t, p, e in refusals]
        return group_pb2.OffsetCommitResponse(partitions=[
            group_pb2.PartitionError(topic=t, partition=p, error_code=c, error_message=m) for t, p, c, m in results])

    def OffsetFetch(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.DESCRIBE, request.group_id,
                                     group_pb2.OffsetFetchResponse)) is not None:
            return refused
        principal = principal_of(context)
        tps = [TopicPartition(p.topic, p.partition) for p in request.partitions]
        try:
            found = self.c.fetch_offsets(request.group_id, tps)
        except errors.BrookError as exc:
            return group_pb2.OffsetFetchResponse(error_code=exc.code, error_message=exc.message)
        resp = group_pb2.OffsetFetchResponse()
        # Kafka leaves out (all partitions) or refuses (named ones) topics the caller may not DESCRIBE.
        denied = self.authz.denied_topics(principal, authz.DESCRIBE, {tp.topic for tp, _ in found})
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

    def ListGroups(self, request, context):  # noqa: N802
        groups = self.c.list_groups(set(request.states))
        principal = principal_of(context)
        if not self.authz.authorize(principal, authz.DESCRIBE, authz.CLUSTER):  # else: only describable groups
            groups = [g for g in groups if self.authz.authorize(principal, authz.DESCRIBE, authz.GROUP, g.group_id)]
        return group_pb2.ListGroupsResponse(groups=[
            group_pb2.ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type, state=g.state.value,
                                  coordinator_id=self.c.node_id) for g in sorted(groups, key=lambda g: g.group_id)])

    def DescribeGroups(self, request, context):  # noqa: N802
        out = group_pb2.DescribeGroupsResponse()
        for gid in request.group_ids:
            refused = self._refused(context, authz.DESCRIBE, gid, group_pb2.DescribedGroup)
            if refused is not None:
                refused.group_id = gid
                out.groups.append(refused)
            else:
                out.groups.append(self.c.describe_group(gid, request.include_offsets))
        return out

    def DeleteGroups(self, request, context):  # noqa: N802
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

    def OffsetDelete(self, request, context):  # noqa: N802
        if (refused := self._refused(context, authz.DELETE, request.group_id,
                                     group_pb2.OffsetDeleteResponse)) is not None:
            return refused
        denied, principal = self._topic_denied(context, authz.READ, request.partitions)
        if denied:
            exc = authz.denied_error(principal, authz.READ, authz.TOPIC, sorted(denied)[0])
            return group_pb2.OffsetDeleteResponse(error_code=exc.code, error_message=exc.message)
        tps = [TopicPartition(p.topic, p.partition) for p in request.partitions]
        try:
            results = self.c.delete_offsets(request.group_id, tps)
        except errors.BrookError as exc:
            return group_pb2.OffsetDeleteResponse(error_code=exc.code, error_message=exc.message)
        return group_pb2.OffsetDeleteResponse(partitions=[
            group_pb2.PartitionError(topic=tp.topic, partition=tp.partition, error_code=c) for tp, c in results])

    def AlterGroupOffsets(self, request, context):  # noqa: N802
        # Kafka: resetting offsets is an offset commit (READ on the group and on each topic).
        if (refused := self._refused(context, authz.READ, request.group_id,
                                     group_pb2.AlterGroupOffsetsResponse)) is not None:
            return refused
        denied, principal = self._topic_denied(context, authz.READ, request.specs)
        if denied:
            exc = authz.denied_error(principal, authz.READ, authz.TOPIC, sorted(denied)[0])
            return group_pb2.AlterGroupOffsetsResponse(error_code=exc.code, error_message=exc.message)
        try:
            resolved = self.c.alter_offsets(request)
        except errors.BrookError as exc:
            return group_pb2.AlterGroupOffsetsResponse(error_code=exc.code, error_message=exc.message)
        return group_pb2.AlterGroupOffsetsResponse(partitions=resolved)
