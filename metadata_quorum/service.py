"""ControllerService: the gRPC face of a controller node.

Only the active controller answers (DescribeQuorum with ``any_voter`` excepted: every
voter answers it with its own view). Any other controller replies NOT_CONTROLLER with
a redirect to the Raft leader's gRPC endpoint (when one is known), never with its own
possibly stale metadata. Reads that must be current (DescribeCluster,
DescribeConfigs) first commit a no-op through the quorum, so a deposed leader that
has not noticed yet times out instead of answering from an old state.

WatchMetadata computes each update from the state's changelog (current values of the
entities changed since the watcher's version), so nothing queues up per stream: a
slow watcher just gets a larger, coalesced update. A watcher that falls further
behind than the changelog window is cut off with REQUEST_TIMED_OUT and a clear
message; it reconnects with its last version and receives a snapshot. Updates and
snapshots are copied from the state in short holds of its lock and built after it is
released (cluster_view.WatchReader); one snapshot serves every watcher that needs one
while the changelog still covers its version.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from broker import authorizer as authz
from broker import principal
from broker.authorizer import ALLOW_ALL, Authorizer
from broker.quotas import UNLIMITED, MutationQuota
from metadata_quorum import features
from metadata_quorum.cluster_view import WatchReader
from metadata_quorum.controller import QuorumController, check_request_size
from metadata_quorum.raft import MetadataRaft
from proto import common_pb2, errors
from proto import controller_pb2 as pb
from proto import controller_pb2_grpc as pb_grpc
from proto.errors import ErrorCode

log = logging.getLogger(__name__)

R = TypeVar("R")

MAX_WATCHERS = 64
WATCH_POLL_S = 1.0
_DEADLINE_MARGIN_S = 0.2  # answer before the caller's deadline so it sees our error, not its own


class ControllerService(pb_grpc.ControllerServiceServicer):
    def __init__(self, controller: QuorumController, raft: MetadataRaft,
                 redirect: Callable[[], pb.ControllerRedirect], *, cluster_id: str,
                 voter_ids: dict[str, int], default_timeout_s: float, max_watchers: int = MAX_WATCHERS,
                 authorizer: Authorizer = ALLOW_ALL) -> None:
        self._authz = authorizer  # Kafka's ACLs; the broker-only RPCs need CLUSTER_ACTION (brokers are super users)
        self._controller = controller
        self._raft = raft
        self._redirect = redirect
        self._cluster_id = cluster_id
        self._voter_ids = dict(voter_ids)  # raft address "host:port" -> node id
        self._default_timeout_s = default_timeout_s
        self._watch_slots = threading.BoundedSemaphore(max_watchers)
        self._max_watchers = max_watchers
        self._stopping = threading.Event()
        self._watch_reader = WatchReader(raft.read, cluster_id=cluster_id)

    def shutdown(self) -> None:
        """End open watch streams (they answer NOT_CONTROLLER)."""
        self._stopping.set()

    # ---- plumbing ----
    def _timeout_s(self, context: grpc.ServicerContext, timeout_ms: int = 0) -> float:
        timeout_s = timeout_ms / 1000.0 if timeout_ms > 0 else self._default_timeout_s
        remaining = context.time_remaining() if context is not None else None
        if remaining is not None:
            timeout_s = min(timeout_s, max(0.05, remaining - _DEADLINE_MARGIN_S))
        return timeout_s

    def _serve(self, response_cls: type[R], context: grpc.ServicerContext, fn: Callable[[], R]) -> R:
        if not self._controller.is_active() or self._stopping.is_set():
            response = response_cls()
            response.error_code = ErrorCode.NOT_CONTROLLER  # type: ignore[attr-defined]
            response.error_message = "this controller is not the active controller"  # type: ignore[attr-defined]
            response.redirect.CopyFrom(self._redirect())  # type: ignore[attr-defined]
            return response
        try:
            return fn()
        except errors.BrookError as exc:
            response = response_cls()
            response.error_code = exc.code  # type: ignore[attr-defined]
            response.error_message = exc.message  # type: ignore[attr-defined]
            if exc.code == ErrorCode.NOT_CONTROLLER:
                response.redirect.CopyFrom(self._redirect())  # type: ignore[attr-defined]
            return response
        except Exception as exc:  # a bug must not kill the server thread; the caller gets a code + message
            log.exception("controller request failed")
            response = response_cls()
            response.error_code = ErrorCode.UNKNOWN_SERVER_ERROR  # type: ignore[attr-defined]
            response.error_message = f"internal error: {type(exc).__name__}: {exc}"  # type: ignore[attr-defined]
            return response

    # ---- authorization ----
    def _denied(self, context: Any, response_cls: type[R], operation: str) -> R | None:
        """A refusal (CLUSTER_AUTHORIZATION_FAILED) when the caller may not ``operation`` the cluster."""
        caller = principal.principal_of(context)
        if self._authz.authorize(caller, operation, authz.CLUSTER):
            return None
        exc = authz.denied_error(caller, operation, authz.CLUSTER)
        response = response_cls()
        response.error_code, response.error_message = exc.code, exc.message  # type: ignore[attr-defined]
        return response

    def _per_topic(self, context: Any, request: Any, field: str, name_of: Callable[[Any], str],
                   check: Callable[[Any, Any], None], call: Callable[[Any], Any], response_cls: type[R],
                   result_key: str = "name") -> R:
        """Run ``call`` on the topics ``check`` lets through; refuse the others in the results, one by one. A
        request naming more topics than any may is refused whole first, whoever asks: refused one by one, a
        caller allowed none of 600,000 names had a 46 MB answer built (audit)."""
        check_request_size(len(getattr(request, field)))
        caller = principal.principal_of(context)
        refusals: dict[str, errors.BrookError] = {}
        for item in getattr(request, field):
            try:
                check(caller, item)
            except errors.BrookError as exc:
                refusals[name_of(item)] = exc
        if refusals:
            allowed = type(request)()
            allowed.CopyFrom(request)
            del getattr(allowed, field)[:]
            getattr(allowed, field).extend(i for i in getattr(request, field) if name_of(i) not in refusals)
            request = allowed
        response = call(request) if getattr(request, field) or not refusals else response_cls()
        for name, exc in refusals.items():
            response.results.add(**{result_key: name}, error_code=exc.code, error_message=exc.message)  # type: ignore[attr-defined]
        return response

    def _check_topic(self, operation: str) -> Callable[[Any, str], None]:
        def check(who: Any, name: str) -> None:
            if not self._authz.authorize(who, operation, authz.TOPIC, name):
                raise authz.denied_error(who, operation, authz.TOPIC, name)
        return check

    def _mutation_quota(self, context: Any, request: Any) -> MutationQuota:
        """The caller's controller mutation quota for this request (KIP-599). Nodes (auto-created and
        internal topics) and super users have none, as Kafka's inter-broker traffic. Strict, except for an
        older Kafka client's request a broker forwards with ``permissive_quota``."""
        auth = principal.authenticate(context)
        who = auth.principal
        if principal.is_node_auth(auth) or principal.node_id_of(who) is not None \
                or str(who) in self._authz.config.super_users:
            return UNLIMITED
        strict = not (request.permissive_quota and auth.method == principal.AUTH_FORWARDED)
        return self._controller.mutation_quotas.for_request(str(who), strict=strict)

    def _barrier(self, context: grpc.ServicerContext) -> None:
        self._raft.barrier(self._timeout_s(context))
        if not self._controller.is_active():
            raise errors.NotControllerError("leadership moved during the read")

    # ---- broker lifecycle ----
    # Broker-only RPCs: accepted only from the named broker's own principal (its node
    # certificate; see broker/principal.py), checked before anything is proposed.
    def RegisterBroker(self, request: pb.RegisterBrokerRequest, context: Any) -> pb.RegisterBrokerResponse:
        return self._serve(pb.RegisterBrokerResponse, context, lambda: self._as_node(
            context, request.node_id, lambda: self._controller.register_broker(request, self._timeout_s(context))))

    def BrokerHeartbeat(self, request: pb.BrokerHeartbeatRequest, context: Any) -> pb.BrokerHeartbeatResponse:
        self._note_broker(context, request.node_id)
        return self._serve(pb.BrokerHeartbeatResponse, context, lambda: self._as_node(
            context, request.node_id, lambda: self._controller.heartbeat(request, self._timeout_s(context))))

    def ControlledShutdown(self, request: pb.ControlledShutdownRequest,
                           context: Any) -> pb.ControlledShutdownResponse:
        return self._serve(pb.ControlledShutdownResponse, context, lambda: self._as_node(
            context, request.node_id,
            lambda: self._controller.controlled_shutdown(request, self._timeout_s(context))))

    def AlterPartition(self, request: pb.AlterPartitionRequest, context: Any) -> pb.AlterPartitionResponse:
        return self._serve(pb.AlterPartitionResponse, context, lambda: self._as_node(
            context, request.broker_id,
            lambda: self._controller.alter_partition(request, self._timeout_s(context))))

    def _note_broker(self, context: Any, node_id: int) -> None:
        """A broker reached this voter (by its own identity), active or not: an active controller that hears no
        broker asks the other voters whether brokers reach them (QuorumController._cut_off_from_brokers)."""
        if context is None or principal.is_node(context, node_id):
            self._controller.note_broker_contact()

    @staticmethod
    def _as_node(context: Any, node_id: int, fn: Callable[[], R]) -> R:
        if context is not None:  # in-process callers (tests of the controller itself) pass no context
            principal.require_node(context, node_id)
        return fn()

    # ---- topics and configs ----
    def CreateTopics(self, request: pb.CreateTopicsRequest, context: Any) -> pb.CreateTopicsResponse:
        node = principal.is_node_caller(context) if context is not None else True

        def check(who: Any, topic: pb.CreatableTopic) -> None:  # Kafka: CREATE on the cluster or the topic
            authz.check_internal_topic_change(topic.name, create=not node)  # super users included
            if not self._authz.authorize_any(who, authz.CREATE,
                                             [(authz.CLUSTER, authz.CLUSTER_NAME), (authz.TOPIC, topic.name)]):
                raise authz.denied_error(who, authz.CREATE, authz.TOPIC, topic.name)

        return self._serve(pb.CreateTopicsResponse, context, lambda: self._per_topic(
            context, request, "topics", lambda t: t.name, check, lambda r: self._controller.create_topics(
                r, self._timeout_s(context, r.timeout_ms), self._mutation_quota(context, r)),
            pb.CreateTopicsResponse))

    def DeleteTopics(self, request: pb.DeleteTopicsRequest, context: Any) -> pb.DeleteTopicsResponse:
        def check(who: Any, name: str) -> None:
            authz.check_internal_topic_change(name, delete=True)  # whoever asks, super users included
            if self._authz.authorize(who, authz.DELETE, authz.TOPIC, name):
                return
            # As Kafka's controller answers (ControllerApis.deleteTopics): a caller that may describe the
            # topic is told it does not exist, as Metadata would tell it; to anyone else a missing topic
            # and a forbidden one look alike.
            if self._authz.authorize(who, authz.DESCRIBE, authz.TOPIC, name) and \
                    not self._raft.read(lambda s: name in s.topics):
                raise errors.UnknownTopicOrPartitionError(f"topic '{name}' does not exist")
            raise authz.denied_error(who, authz.DELETE, authz.TOPIC, name)

        return self._serve(pb.DeleteTopicsResponse, context, lambda: self._per_topic(
            context, request, "names", lambda n: n, check, lambda r: self._controller.delete_topics(
                r, self._timeout_s(context, r.timeout_ms), self._mutation_quota(context, r)),
            pb.DeleteTopicsResponse))

    def CreatePartitions(self, request: pb.CreatePartitionsRequest, context: Any) -> pb.CreatePartitionsResponse:
        alter = self._check_topic(authz.ALTER)

        def check(who: Any, topic: pb.CreatePartitionsTopic) -> None:
            authz.check_internal_topic_change(topic.name, add_partitions=True)  # whoever asks
            alter(who, topic.name)

        return self._serve(pb.CreatePartitionsResponse, context, lambda: self._per_topic(
            context, request, "topics", lambda t: t.name, check,
            lambda r: self._controller.create_partitions(r, self._timeout_s(context, r.timeout_ms),
                                                         self._mutation_quota(context, r)),
            pb.CreatePartitionsResponse))

    def AlterConfigs(self, request: pb.AlterConfigsRequest, context: Any) -> pb.AlterConfigsResponse:
        def check(who: Any, resource: pb.AlterConfigsResource) -> None:
            # No client may stop __consumer_offsets from being compacted (or delete it), super users included.
            authz.check_internal_topic_change(resource.topic, config_keys=[*resource.set, *resource.delete])
            self._check_topic(authz.ALTER_CONFIGS)(who, resource.topic)

        return self._serve(pb.AlterConfigsResponse, context, lambda: self._per_topic(
            context, request, "resources", lambda r: r.topic, check,
            lambda r: self._controller.alter_configs(r, self._timeout_s(context)), pb.AlterConfigsResponse))

    def DescribeConfigs(self, request: pb.DescribeConfigsRequest, context: Any) -> pb.DescribeConfigsResponse:
        def run(allowed: pb.DescribeConfigsRequest) -> pb.DescribeConfigsResponse:
            self._barrier(context)
            return self._controller.describe_configs(allowed)

        return self._serve(pb.DescribeConfigsResponse, context, lambda: self._per_topic(
            context, request, "topics", lambda n: n, self._check_topic(authz.DESCRIBE_CONFIGS), run,
            pb.DescribeConfigsResponse, result_key="topic"))

    def DescribeCluster(self, request: pb.DescribeClusterRequest, context: Any) -> pb.DescribeClusterResponse:
        if (denied := self._denied(context, pb.DescribeClusterResponse, authz.DESCRIBE)) is not None:
            return denied
        def run() -> pb.DescribeClusterResponse:
            self._barrier(context)
            return self._controller.describe_cluster()

        return self._serve(pb.DescribeClusterResponse, context, run)

    def AllocateProducerIds(self, request: pb.AllocateProducerIdsRequest,
                            context: Any) -> pb.AllocateProducerIdsResponse:
        return self._serve(pb.AllocateProducerIdsResponse, context, lambda: self._as_node(
            context, request.broker_id,
            lambda: self._controller.allocate_producer_ids(request, self._timeout_s(context))))

    def ElectLeaders(self, request: pb.ElectLeadersRequest, context: Any) -> pb.ElectLeadersResponse:
        # Kafka: ALTER on the cluster.
        if (denied := self._denied(context, pb.ElectLeadersResponse, authz.ALTER)) is not None:
            return denied
        return self._serve(pb.ElectLeadersResponse, context, lambda: self._controller.elect_leaders(
            request, self._timeout_s(context, request.timeout_ms)))

    def AlterPartitionReassignments(self, request: pb.AlterPartitionReassignmentsRequest,
                                    context: Any) -> pb.AlterPartitionReassignmentsResponse:
        if (denied := self._denied(context, pb.AlterPartitionReassignmentsResponse, authz.ALTER)) is not None:
            return denied
        return self._serve(pb.AlterPartitionReassignmentsResponse, context, lambda: self._controller.alter_reassignments(
            request, self._timeout_s(context, request.timeout_ms)))

    def ListPartitionReassignments(self, request: pb.ListPartitionReassignmentsRequest,
                                   context: Any) -> pb.ListPartitionReassignmentsResponse:
        if (denied := self._denied(context, pb.ListPartitionReassignmentsResponse, authz.DESCRIBE)) is not None:
            return denied

        def run() -> pb.ListPartitionReassignmentsResponse:
            self._barrier(context)
            return self._controller.list_reassignments(request)

        return self._serve(pb.ListPartitionReassignmentsResponse, context, run)

    def UnregisterBroker(self, request: pb.UnregisterBrokerRequest, context: Any) -> pb.UnregisterBrokerResponse:
        if (denied := self._denied(context, pb.UnregisterBrokerResponse, authz.ALTER)) is not None:
            return denied
        return self._serve(pb.UnregisterBrokerResponse, context, lambda: self._controller.unregister_broker(
            request, self._timeout_s(context)))

    def AlterClusterConfigs(self, request: pb.AlterClusterConfigsRequest,
                            context: Any) -> pb.AlterClusterConfigsResponse:
        if (denied := self._denied(context, pb.AlterClusterConfigsResponse, authz.ALTER_CONFIGS)) is not None:
            return denied
        return self._serve(pb.AlterClusterConfigsResponse, context, lambda: self._controller.alter_cluster_configs(
            request, self._timeout_s(context)))

    def DescribeClusterConfigs(self, request: pb.DescribeClusterConfigsRequest,
                               context: Any) -> pb.DescribeClusterConfigsResponse:
        if (denied := self._denied(context, pb.DescribeClusterConfigsResponse, authz.DESCRIBE_CONFIGS)) is not None:
            return denied

        def run() -> pb.DescribeClusterConfigsResponse:
            self._barrier(context)
            return self._controller.describe_cluster_configs()

        return self._serve(pb.DescribeClusterConfigsResponse, context, run)

    # ---- finalized features ----
    def DescribeFeatures(self, request: pb.DescribeFeaturesRequest, context: Any) -> pb.DescribeFeaturesResponse:
        if (denied := self._denied(context, pb.DescribeFeaturesResponse, authz.DESCRIBE)) is not None:
            return denied

        def run() -> pb.DescribeFeaturesResponse:
            self._barrier(context)
            return self._controller.describe_features()

        return self._serve(pb.DescribeFeaturesResponse, context, run)

    def UpdateFeatures(self, request: pb.UpdateFeaturesRequest, context: Any) -> pb.UpdateFeaturesResponse:
        if (denied := self._denied(context, pb.UpdateFeaturesResponse, authz.ALTER)) is not None:
            return denied
        return self._serve(pb.UpdateFeaturesResponse, context, lambda: self._controller.update_features(
            request, self._timeout_s(context)))

    # ---- quorum ----
    def DescribeQuorum(self, request: pb.DescribeQuorumRequest, context: Any) -> pb.DescribeQuorumResponse:
        # Answered from this voter's view without a quorum round-trip: it is the diagnostic
        # an operator needs exactly when the quorum is unhealthy. With any_voter unset only
        # the active controller answers (clients use the call to find it).
        if request.HasField("caller_broker_id"):
            self._note_broker(context, request.caller_broker_id)
        if request.any_voter and not self._stopping.is_set():
            try:
                return self._quorum_for(context, self.describe_quorum())
            except Exception as exc:  # a bug must not kill the server thread
                log.exception("DescribeQuorum failed")
                return pb.DescribeQuorumResponse(error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                                 error_message=f"internal error: {type(exc).__name__}: {exc}")
        return self._quorum_for(context, self._serve(pb.DescribeQuorumResponse, context, self.describe_quorum))

    def _quorum_for(self, context: Any, response: pb.DescribeQuorumResponse) -> pb.DescribeQuorumResponse:
        """The voters (ids, Raft addresses, log positions, lags) for callers allowed DESCRIBE on the cluster, as
        Kafka's DescribeQuorum needs; any caller still learns the leader, term and the redirect, which clients
        use to find the active controller (an audit: a principal with no grant read every voter's address)."""
        if response.voters and not self._authz.authorize(principal.principal_of(context), authz.DESCRIBE,
                                                         authz.CLUSTER):
            del response.voters[:]
        return response

    def describe_quorum(self) -> pb.DescribeQuorumResponse:
        status = self._raft.status()
        voters_by_address = self._voter_ids
        is_active = self._controller.is_active()
        # Followers know their own log, not the others': their voters' positions are unknown (-1).
        leader_end = max([status.commit_index] + [v.match_index for v in status.voters])
        active_id, epoch = self._raft.read(lambda s: (s.active_controller_id, s.controller_epoch))
        response = pb.DescribeQuorumResponse(
            leader_id=voters_by_address.get(status.leader_address or "", -1), term=status.term,
            commit_index=status.commit_index, metadata_version=self._raft.version,
            last_applied=status.last_applied, responder_id=voters_by_address.get(self._raft.self_address, -1),
            responder_is_active=is_active, active_controller_id=active_id, controller_epoch=epoch,
            responder_lacks_quorum=not self._raft.has_quorum(),
            responder_supported_metadata_level=features.SUPPORTED_MAX,
            responder_hears_brokers=self._controller.hears_brokers())
        response.redirect.CopyFrom(self._redirect())
        for voter in status.voters:
            if status.is_leader:
                end = leader_end if voter.is_self else voter.match_index
            else:
                end = status.last_applied if voter.is_self else -1
            response.voters.add(
                node_id=voters_by_address.get(voter.address, -1), raft_address=voter.address,
                log_end_index=end, lag=max(0, leader_end - end) if end >= 0 and status.is_leader else -1,
                last_contact_ms_ago=-1 if voter.last_caught_up_ago_s is None
                else int(voter.last_caught_up_ago_s * 1000),
                is_leader=voters_by_address.get(voter.address, -2) == response.leader_id,
                connected=voter.connected)
        return response

    # ---- metadata stream ----
    def WatchMetadata(self, request: pb.WatchMetadataRequest, context: Any) -> Iterator[pb.MetadataUpdate]:
        # The stream carries SCRAM keys and ACLs: nodes only (a node certificate, or the documented
        # loopback trust of a single-host plaintext cluster), whatever the ACLs say.
        try:
            principal.require_any_node(context)
        except errors.BrookError as exc:
            yield self._error_update(exc.code, exc.message)
            return
        if not self._controller.is_active():
            yield self._error_update(ErrorCode.NOT_CONTROLLER, "this controller is not the active controller")
            return
        if not self._watch_slots.acquire(blocking=False):
            yield self._error_update(ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                                     f"this controller already serves {self._max_watchers} metadata watchers")
            return
        try:
            yield from self._watch(request, context)
        finally:
            self._watch_slots.release()

    def _watch(self, request: pb.WatchMetadataRequest, context: Any) -> Iterator[pb.MetadataUpdate]:
        version = request.since_version
        first = True
        while context.is_active():
            if self._stopping.is_set() or not self._controller.is_active():
                yield self._error_update(ErrorCode.NOT_CONTROLLER, "this controller is no longer active")
                return
            # First a snapshot when asked for none but everything, or when the changelog no longer covers the
            # version asked; then the changes since the version last sent. Never O(partitions) under the lock.
            update = self._watch_reader.update(version, snapshot=first and request.since_version <= 0,
                                               if_behind=first)
            if update is None:
                yield self._error_update(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"watcher (broker {request.broker_id}) fell behind the metadata changelog at version "
                    f"{version}; reconnect with since_version={version} to receive a snapshot")
                return
            if first or update.version != version:
                yield update
                version = update.version
            first = False
            self._raft.wait_for_version_beyond(version, WATCH_POLL_S)

    def _error_update(self, code: int, message: str) -> pb.MetadataUpdate:
        update = pb.MetadataUpdate(version=self._raft.version, cluster_id=self._cluster_id,
                                   error_code=code, error_message=message)
        update.redirect.CopyFrom(self._redirect())
        return update


def no_redirect() -> pb.ControllerRedirect:
    return pb.ControllerRedirect(leader_id=-1, leader=common_pb2.Endpoint())
