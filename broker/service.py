"""BrokerService: the gRPC servicer clients and replicas talk to.

Thin: each handler validates the request shape, hands the work to the ReplicaManager
(produce, fetch, offsets) or the metadata cache (Metadata), and maps BrookErrors to
per-partition error codes. Any unexpected exception is caught here, logged with the
request's context and answered as UNKNOWN_SERVER_ERROR — no request can take the broker
down.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from broker import authorizer as authz
from broker.authorizer import ALLOW_ALL, Authorizer
from broker.metadata_cache import MetadataCache
from broker.producer_ids import ProducerIdManager
from broker.quotas import QuotaManager
from broker.replica_manager import CANCEL_CHECK_S, MAX_PRODUCE_TIMEOUT_MS, AppendResult, ReplicaManager
from broker.sasl import ANONYMOUS, principal_of
from proto import broker_pb2, broker_pb2_grpc, common_pb2, controller_pb2, errors
from proto.errors import ErrorCode

log = logging.getLogger(__name__)

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_LEADER_ERRORS = (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH)
AUTO_CREATE_WAIT_S = 5.0
PRODUCE_WAIT_SLACK_S = 5.0


class BrokerService(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(self, node_id: int, replica_manager: ReplicaManager, metadata_cache: MetadataCache,
                 controller_client: Any, producer_ids: ProducerIdManager, *, defaults: dict[str, str],
                 controller_endpoints: Sequence[tuple[str, int]],
                 metadata_lock: threading.RLock | None = None, authorizer: Authorizer = ALLOW_ALL,
                 quotas: QuotaManager | None = None) -> None:
        self.node_id = node_id
        self.authz = authorizer  # ACL checks (broker/authorizer.py); ALLOW_ALL when no authorizer is configured
        self.quotas = quotas
        self.rm = replica_manager
        self.cache = metadata_cache
        self.controller_client = controller_client
        self.producer_ids = producer_ids
        self.defaults = defaults
        self.controller_endpoints = list(controller_endpoints)
        self.auto_create = defaults.get("auto.create.topics.enable", "true").strip().lower() == "true"
        # Held by the metadata thread while an update goes into the cache *and* the replica manager:
        # a Metadata answer never names this broker leader of a partition it has not taken over yet.
        self.metadata_lock = metadata_lock or threading.RLock()

    # ---- boundary ----
    def _guard(self, name: str, request: Any, work: Callable[[], Any], on_error: Callable[[], Any]) -> Any:
        try:
            return work()
        except Exception:
            log.exception("%s failed on broker %d; request: %.500s", name, self.node_id, request)
            return on_error()

    # ---- Produce ----
    def Produce(self, request: broker_pb2.ProduceRequest, context: grpc.ServicerContext) -> Any:
        return self._guard("Produce", request, lambda: self._produce(request, context.is_active, principal_of(context)),
                           lambda: _produce_error_all(request, ErrorCode.UNKNOWN_SERVER_ERROR, "internal error"))

    def _produce(self, req: broker_pb2.ProduceRequest, is_active: Callable[[], bool] = lambda: True,
                 principal: object = ANONYMOUS) -> broker_pb2.ProduceResponse:
        if req.acks not in (0, 1, -1):
            return _produce_error_all(req, ErrorCode.INVALID_REQUIRED_ACKS,
                                      f"acks must be 0, 1 or -1 (all), not {req.acks}")
        denied = self.authz.denied_topics(principal, authz.WRITE, {pd.topic for pd in req.partitions})
        self._maybe_auto_create({pd.topic for pd in req.partitions} - denied, wait=True, principal=principal)
        futures: list[concurrent.futures.Future] = []
        for pd in req.partitions:
            if pd.topic in denied:
                refused: concurrent.futures.Future = concurrent.futures.Future()
                refused.set_exception(authz.denied_error(principal, authz.WRITE, authz.TOPIC, pd.topic))
                futures.append(refused)
                continue
            if pd.topic.startswith("__"):
                # Internal topics (__consumer_offsets) are written by the broker itself only.
                fut: concurrent.futures.Future = concurrent.futures.Future()
                fut.set_exception(errors.InvalidTopicException(f"cannot produce to internal topic {pd.topic}"))
                futures.append(fut)
                continue
            futures.append(self.rm.append_records(pd.topic, pd.partition, pd.records, acks=req.acks,
                                                  timeout_ms=req.timeout_ms))
        if req.acks == -1:
            # The purgatory times each wait out at timeout_ms; the slack only guards a lost completion.
            # Waiting in slices lets a cancelled RPC give its worker thread back early.
            deadline = time.monotonic() + min(max(0, req.timeout_ms), MAX_PRODUCE_TIMEOUT_MS) / 1000 \
                + PRODUCE_WAIT_SLACK_S
            pending = list(futures)
            while pending and is_active() and (left := deadline - time.monotonic()) > 0:
                pending = list(concurrent.futures.wait(pending, timeout=min(left, CANCEL_CHECK_S)).not_done)
        resp = broker_pb2.ProduceResponse()
        for pd, fut in zip(req.partitions, futures, strict=True):
            out = resp.partitions.add(topic=pd.topic, partition=pd.partition, base_offset=-1,
                                      log_append_time_ms=-1, log_start_offset=-1)
            if not fut.done():
                out.error_code, out.error_message = ErrorCode.REQUEST_TIMED_OUT, "acks=all wait did not complete"
                continue
            exc = fut.exception()
            if exc is None:
                r: AppendResult = fut.result()
                out.base_offset, out.log_append_time_ms, out.log_start_offset = (
                    r.base_offset, r.log_append_time_ms, r.log_start_offset)
            elif isinstance(exc, errors.BrookError):
                out.error_code, out.error_message = exc.code, exc.message
                if exc.code in _LEADER_ERRORS:
                    out.current_leader.CopyFrom(self.cache.leader_and_epoch(pd.topic, pd.partition))
            else:
                log.error("produce to %s-%d failed unexpectedly", pd.topic, pd.partition, exc_info=exc)
                out.error_code, out.error_message = ErrorCode.UNKNOWN_SERVER_ERROR, "internal error"
        if self.quotas is not None:
            resp.throttle_time_ms = self.quotas.produce(principal, sum(
                len(pd.records) for pd in req.partitions if pd.topic not in denied))
        return resp

    # ---- Fetch ----
    def Fetch(self, request: broker_pb2.FetchRequest, context: grpc.ServicerContext) -> Any:
        def on_error() -> broker_pb2.FetchResponse:
            resp = broker_pb2.FetchResponse()
            for fp in request.partitions:
                resp.partitions.add(topic=fp.topic, partition=fp.partition, error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                    error_message="internal error", high_watermark=-1, log_start_offset=-1,
                                    log_end_offset=-1)
            return resp
        return self._guard("Fetch", request, lambda: self._fetch(request, context.is_active, principal_of(context)),
                           on_error)

    def _fetch(self, req: broker_pb2.FetchRequest, is_active: Callable[[], bool],
               principal: object) -> broker_pb2.FetchResponse:
        if req.replica_id >= 0:  # a follower: Kafka's CLUSTER_ACTION, granted to the brokers' own principals
            if not self.authz.authorize(principal, authz.CLUSTER_ACTION, authz.CLUSTER):
                return _partition_errors(broker_pb2.FetchResponse(), req.partitions,
                                         authz.denied_error(principal, authz.CLUSTER_ACTION, authz.CLUSTER),
                                         high_watermark=-1, log_start_offset=-1, log_end_offset=-1)
            return self.rm.fetch(req, is_active)
        denied = self.authz.denied_topics(principal, authz.READ, {fp.topic for fp in req.partitions})
        allowed = _without_topics(req, denied)
        resp = self.rm.fetch(allowed, is_active) if allowed.partitions or not denied else broker_pb2.FetchResponse()
        for fp in req.partitions:
            if fp.topic in denied:
                _partition_errors(resp, [fp], authz.denied_error(principal, authz.READ, authz.TOPIC, fp.topic),
                                  high_watermark=-1, log_start_offset=-1, log_end_offset=-1)
        if self.quotas is not None:
            resp.throttle_time_ms = self.quotas.fetch(principal, sum(len(p.records) for p in resp.partitions))
        return resp

    # ---- ListOffsets / OffsetsForLeaderEpoch ----
    def ListOffsets(self, request: broker_pb2.ListOffsetsRequest, context: grpc.ServicerContext) -> Any:
        def on_error() -> broker_pb2.ListOffsetsResponse:
            resp = broker_pb2.ListOffsetsResponse()
            for lp in request.partitions:
                resp.partitions.add(topic=lp.topic, partition=lp.partition, error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                    error_message="internal error", offset=-1, timestamp=-1, leader_epoch=-1)
            return resp
        return self._guard("ListOffsets", request, lambda: self._list_offsets(request, principal_of(context)),
                           on_error)

    def _list_offsets(self, req: broker_pb2.ListOffsetsRequest, principal: object) -> broker_pb2.ListOffsetsResponse:
        denied = self.authz.denied_topics(principal, authz.DESCRIBE, {p.topic for p in req.partitions})
        allowed = _without_topics(req, denied)
        resp = self.rm.list_offsets(allowed) if allowed.partitions else broker_pb2.ListOffsetsResponse()
        for lp in req.partitions:
            if lp.topic in denied:
                _partition_errors(resp, [lp], authz.denied_error(principal, authz.DESCRIBE, authz.TOPIC, lp.topic),
                                  offset=-1, timestamp=-1, leader_epoch=-1)
        return resp

    def OffsetsForLeaderEpoch(self, request: broker_pb2.OffsetsForLeaderEpochRequest,
                              context: grpc.ServicerContext) -> Any:
        def on_error() -> broker_pb2.OffsetsForLeaderEpochResponse:
            resp = broker_pb2.OffsetsForLeaderEpochResponse()
            for p in request.partitions:
                resp.partitions.add(topic=p.topic, partition=p.partition, error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                    error_message="internal error", leader_epoch=-1, end_offset=-1)
            return resp
        return self._guard("OffsetsForLeaderEpoch", request,
                           lambda: self._offsets_for_leader_epoch(request, principal_of(context)), on_error)

    def _offsets_for_leader_epoch(self, req: broker_pb2.OffsetsForLeaderEpochRequest,
                                  principal: object) -> broker_pb2.OffsetsForLeaderEpochResponse:
        # Followers need CLUSTER_ACTION (Kafka); consumers validating their position need DESCRIBE on the topic.
        if req.replica_id >= 0:
            if self.authz.authorize(principal, authz.CLUSTER_ACTION, authz.CLUSTER):
                return self.rm.offsets_for_leader_epoch(req)
            denied = {p.topic for p in req.partitions}
        else:
            denied = self.authz.denied_topics(principal, authz.DESCRIBE, {p.topic for p in req.partitions})
        allowed = _without_topics(req, denied)
        resp = (self.rm.offsets_for_leader_epoch(allowed) if allowed.partitions
                else broker_pb2.OffsetsForLeaderEpochResponse())
        for p in req.partitions:
            if p.topic in denied:
                _partition_errors(resp, [p], authz.denied_error(principal, authz.DESCRIBE, authz.TOPIC, p.topic),
                                  leader_epoch=-1, end_offset=-1)
        return resp

    # ---- Metadata ----
    def Metadata(self, request: broker_pb2.MetadataRequest, context: grpc.ServicerContext) -> Any:
        return self._guard("Metadata", request, lambda: self._metadata(request, principal_of(context)),
                           lambda: broker_pb2.MetadataResponse(topics=[broker_pb2.TopicMetadata(
                               name=t, error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message="internal error")
                               for t in request.topics]))

    def _metadata(self, req: broker_pb2.MetadataRequest, principal: object = ANONYMOUS) -> broker_pb2.MetadataResponse:
        create_errors: dict[str, errors.BrookError] = {}
        # Kafka: topics the caller may not DESCRIBE are left out of an all-topics answer and
        # answered TOPIC_AUTHORIZATION_FAILED when named (and are never auto-created).
        denied = set() if req.all_topics else self.authz.denied_topics(principal, authz.DESCRIBE, req.topics)
        for name in denied:
            create_errors[name] = authz.denied_error(principal, authz.DESCRIBE, authz.TOPIC, name)
        if not req.all_topics and req.allow_auto_topic_creation:
            create_errors.update(self._maybe_auto_create(set(req.topics) - denied, wait=True, principal=principal))
        with self.metadata_lock:
            resp = self._metadata_response(req, create_errors)
        if req.all_topics and self.authz.enabled:
            keep = [t for t in resp.topics if self.authz.may_describe_topic(principal, t.name)]
            del resp.topics[:]
            resp.topics.extend(keep)
        return resp

    def _metadata_response(self, req: broker_pb2.MetadataRequest,
                           create_errors: dict[str, errors.BrookError]) -> broker_pb2.MetadataResponse:
        resp = broker_pb2.MetadataResponse(cluster_id=self.cache.cluster_id, controller_id=self.cache.controller_id,
                                           metadata_version=self.cache.version)
        for b in self.cache.brokers():
            resp.brokers.add(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack, fenced=b.fenced)
        for host, port in self.controller_endpoints:
            resp.controllers.add(name="CONTROLLER", host=host, port=port)
        names = [t.name for t in self.cache.topics()] if req.all_topics else list(dict.fromkeys(req.topics))
        for name in names:
            self._topic_metadata(resp.topics.add(name=name), name, create_errors.get(name))
        return resp

    def _topic_metadata(self, out: broker_pb2.TopicMetadata, name: str, create_error: errors.BrookError | None) -> None:
        topic = self.cache.topic(name)
        if create_error is not None and create_error.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
            out.error_code, out.error_message = create_error.code, create_error.message
            return
        if topic is None:
            if create_error is not None:
                out.error_code, out.error_message = create_error.code, create_error.message
            elif not _LEGAL_TOPIC.match(name):
                out.error_code, out.error_message = ErrorCode.INVALID_TOPIC_EXCEPTION, f"illegal topic name {name!r}"
            else:
                out.error_code, out.error_message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name}"
            return
        out.topic_id = topic.topic_id
        out.is_internal = name.startswith("__")
        for p in self.cache.partitions_of(name):
            offline = [r for r in p.replicas if not self._broker_alive(r)]
            pm = out.partitions.add(partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
                                    replicas=list(p.replicas), isr=list(p.isr), offline_replicas=offline)
            if p.leader < 0:
                pm.error_code = ErrorCode.LEADER_NOT_AVAILABLE

    def _broker_alive(self, node_id: int) -> bool:
        b = self.cache.broker(node_id)
        return b is not None and not b.fenced

    def _maybe_auto_create(self, topics: set[str], *, wait: bool = False,
                           principal: object = ANONYMOUS) -> dict[str, errors.BrookError]:
        """Create unknown, legal topics through the controller when auto.create.topics.enable."""
        missing = sorted(t for t in topics if self.cache.topic(t) is None and _LEGAL_TOPIC.match(t)
                         and not t.startswith("__"))
        if not missing or not self.auto_create:
            return {}
        refused: dict[str, errors.BrookError] = {}
        if self.authz.enabled and not self.authz.authorize(principal, authz.CREATE, authz.CLUSTER):
            # Kafka: auto-creation needs CREATE on the cluster or on the topic itself.
            refused = {t: authz.denied_error(principal, authz.CREATE, authz.TOPIC, t)
                       for t in self.authz.denied_topics(principal, authz.CREATE, missing)}
            missing = [t for t in missing if t not in refused]
            if not missing:
                return refused
        parts = int(self.defaults.get("num.partitions", "1"))
        rf = int(self.defaults.get("default.replication.factor", "1"))
        req = controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=t, num_partitions=parts, replication_factor=rf)
                    for t in missing], timeout_ms=int(AUTO_CREATE_WAIT_S * 1000))
        failures: dict[str, errors.BrookError] = dict(refused)
        try:
            resp = self.controller_client.call("CreateTopics", req, timeout_s=AUTO_CREATE_WAIT_S)
            for r in resp.results:
                if r.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                    failures[r.name] = errors.error_for(r.error_code, r.error_message)
            log.info("auto-created topics %s (%d partitions, RF %d)", missing, parts, rf)
        except errors.BrookError as e:
            log.warning("auto-creating %s failed: %s", missing, e)
            return dict.fromkeys(missing, e)
        if wait:
            created = [t for t in missing if t not in failures]

            def ready(c: MetadataCache) -> bool:
                return all(c.topic(t) is not None and c.partitions_of(t)
                           and all(p.leader >= 0 for p in c.partitions_of(t)) for t in created)
            self.cache.wait_for(ready, AUTO_CREATE_WAIT_S)
        return failures

    # ---- InitProducerId ----
    def InitProducerId(self, request: broker_pb2.InitProducerIdRequest, context: grpc.ServicerContext) -> Any:
        return self._guard("InitProducerId", request, lambda: self._init_producer_id(request, principal_of(context)),
                           lambda: broker_pb2.InitProducerIdResponse(
                               error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message="internal error",
                               producer_id=-1, producer_epoch=-1))

    def _init_producer_id(self, req: broker_pb2.InitProducerIdRequest,
                          principal: object = ANONYMOUS) -> broker_pb2.InitProducerIdResponse:
        try:
            # Kafka >= 2.8: IDEMPOTENT_WRITE on the cluster, or WRITE on any topic.
            if not (self.authz.authorize(principal, authz.IDEMPOTENT_WRITE, authz.CLUSTER)
                    or self.authz.may_write_some_topic(principal)):
                raise authz.denied_error(principal, authz.IDEMPOTENT_WRITE, authz.CLUSTER)
            if req.producer_id >= 0 and 0 <= req.producer_epoch < 32766:
                # A known producer restarting: same id, next epoch fences its older incarnation.
                return broker_pb2.InitProducerIdResponse(producer_id=req.producer_id,
                                                         producer_epoch=req.producer_epoch + 1)
            return broker_pb2.InitProducerIdResponse(producer_id=self.producer_ids.next_id(), producer_epoch=0)
        except errors.BrookError as e:
            return broker_pb2.InitProducerIdResponse(error_code=e.code, error_message=e.message,
                                                     producer_id=-1, producer_epoch=-1)


def _produce_error_all(req: broker_pb2.ProduceRequest, code: int, message: str) -> broker_pb2.ProduceResponse:
    resp = broker_pb2.ProduceResponse()
    for pd in req.partitions:
        resp.partitions.add(topic=pd.topic, partition=pd.partition, error_code=code, error_message=message,
                            base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                            current_leader=common_pb2.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1))
    return resp


def _without_topics(req: Any, denied: set[str]) -> Any:
    """A copy of a partition-list request without the denied topics' partitions (the request itself if none)."""
    if not denied:
        return req
    out = type(req)()
    out.CopyFrom(req)
    del out.partitions[:]
    out.partitions.extend(p for p in req.partitions if p.topic not in denied)
    return out


def _partition_errors(resp: Any, partitions: Any, error: errors.BrookError, **fields: int) -> Any:
    for p in partitions:
        resp.partitions.add(topic=p.topic, partition=p.partition, error_code=error.code,
                            error_message=error.message, **fields)
    return resp
