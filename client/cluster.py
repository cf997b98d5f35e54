"""ClusterClient: the low-level, thread-safe view of a Brook cluster.

It keeps one gRPC channel per broker, caches cluster metadata (brokers, topics,
partition leaders, controller endpoints) and routes ListOffsets and Fetch to
partition leaders. Every call has a deadline (``request_timeout_ms``); retriable
failures (leader moved, unknown topic while metadata propagates, connection
refused) refresh metadata and retry with capped exponential backoff until that
deadline, then raise the typed ``BrookError`` (proto/errors.py).

Producer, Consumer, Admin, the Spark source and the CLI are built on it.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import grpc

from client.security import SecurityConfig, make_channel
from client.types import (
    BrokerMetadata,
    ClusterMetadata,
    FetchResult,
    PartitionMetadata,
    TopicMetadata,
    TopicPartition,
)
from proto import broker_pb2, broker_pb2_grpc
from proto import errors as errors

log = logging.getLogger(__name__)

T = TypeVar("T")

# Responses carry whole record batches; fetches of tens of MB must fit.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# A broker that stops answering without closing its connections (SIGSTOP, a hung host, a partition
# that drops packets) is noticed by HTTP/2 pings, every 5 s on a connection with a call open, each
# unanswered within 5 s ending the connection: its calls fail UNAVAILABLE and are retried against the
# leaders the controller moved meanwhile, instead of hanging until request.timeout.ms (30 s). Brokers
# accept pings this often (broker/server.py); pings are answered by gRPC's transport, not Brook's loop.
HUNG_PEER_OPTIONS = [
    ("grpc.keepalive_time_ms", 5_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # What bounds the wait for a ping's answer in this gRPC (1.8x): keepalive_timeout_ms alone is not
    # enforced, and its default, 60 s, let a call to a SIGSTOPped broker hang for 64 s.
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),  # an idle stream (a producer's, a long poll) is checked too
    # A frozen broker's kernel still accepts connections; gRPC gives up on one that brings no HTTP/2
    # SETTINGS after this long (this argument is gRPC's minimum connect timeout; its default is 20 s).
    ("grpc.min_reconnect_backoff_ms", 5_000),
    # Between connection attempts to a peer that refused or dropped them: at most 1 s, Kafka's
    # reconnect.backoff.max.ms. gRPC's own default grows by 1.6x up to 120 s: after the brokers (or the
    # controllers) had been down for a few minutes, a client (or every broker's controller client) made its next
    # attempt up to 2 minutes after they were back, and in the controllers' case every broker was fenced meanwhile.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),  # retries are ours, with metadata refresh in between
    # Each client its own connections, as a Kafka client has: gRPC would otherwise share one connection
    # to a broker among every client of the process, and a broker lets a connection have 100 streams
    # open (max.streams.per.connection), so one client's long polls could hold another's calls.
    ("grpc.use_local_subchannel_pool", 1),
    *HUNG_PEER_OPTIONS,
]
# Errors after which the cached leader is probably wrong.
REFRESH_CODES = frozenset(
    {
        errors.ErrorCode.NOT_LEADER_OR_FOLLOWER,
        errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        errors.ErrorCode.LEADER_NOT_AVAILABLE,
        errors.ErrorCode.FENCED_LEADER_EPOCH,
        errors.ErrorCode.UNKNOWN_LEADER_EPOCH,
        errors.ErrorCode.BROKER_NOT_AVAILABLE,
        errors.ErrorCode.REPLICA_NOT_AVAILABLE,
        errors.ErrorCode.NETWORK_EXCEPTION,
        errors.ErrorCode.KAFKA_STORAGE_ERROR,
    }
)
ATTEMPTS_MAX = 1000  # hard bound on any retry loop, beyond the deadline
# How a broker's RESOURCE_EXHAUSTED refusal (broker/admission.py) begins, as opposed to
# gRPC's own RESOURCE_EXHAUSTED (e.g. a message over the size limit), which is not retriable.
BROKER_OVERLOADED_PREFIX = "broker overloaded:"


def parse_bootstrap(servers: str | Iterable[str] | Iterable[tuple[str, int]]) -> list[str]:
    """``"h1:p1,h2:p2"`` or a list of ``"h:p"`` / ``(h, p)`` -> ``["h1:p1", ...]``."""
    items: list[str] = []
    raw = servers.split(",") if isinstance(servers, str) else list(servers)
    for item in raw:
        if isinstance(item, tuple):
            host, port = item
            item = f"{host}:{int(port)}"
        text = str(item).strip()
        if not text:
            continue
        host, sep, port = text.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()) or len(port) > 5:  # '²' is a digit too
            raise errors.InvalidConfigError(f"bootstrap server {text!r} is not host:port")
        if not 0 < int(port) <= 65535:
            # gRPC would dial the port modulo 65536 (70000 -> 4464): refuse it instead.
            raise errors.InvalidConfigError(f"bootstrap server {text!r}: port must be 1..65535")
        if host.startswith("[") or host.endswith("]") or ":" in host:
            # An IPv6 address is written in brackets; '[::1' was dialled as the host ':' (audit).
            try:
                ok = host[0] == "[" and host[-1] == "]" and ipaddress.IPv6Address(host[1:-1]) is not None
            except ValueError:
                ok = False
            if not ok:
                raise errors.InvalidConfigError(
                    f"bootstrap server {text!r} is not host:port (an IPv6 address is written [2001:db8::1]:9092)")
        items.append(f"{host}:{int(port)}")
    if not items:
        raise errors.InvalidConfigError("bootstrap_servers is empty")
    return items


# A TLS handshake this client refused (the broker's certificate is not from a CA it trusts, or does not name
# the address) or that met a port without TLS: the same handshake fails again, so it is not retried as a broker
# that is down is. A client certificate the broker refuses is not among them: under TLS 1.3 the client sees only
# the connection closed after its handshake, as when a broker goes down.
TLS_REFUSED = re.compile(r"CERTIFICATE_VERIFY_FAILED|Hostname Verification Check failed|WRONG_VERSION_NUMBER")


def rpc_error(exc: grpc.RpcError, what: str) -> errors.BrookError:
    """A transport failure as a typed, retriable-where-sensible BrookError."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.RequestTimedOutError(f"{what}: deadline exceeded ({details})")
    if code == grpc.StatusCode.UNAVAILABLE and TLS_REFUSED.search(str(details)):
        return errors.SslAuthenticationError(
            f"{what}: {details} (check ssl.ca.location, the CA of the brokers' certificates; that the address is one "
            "the broker's certificate names; and that the port speaks TLS)")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
        return errors.error_for(errors.ErrorCode.NETWORK_EXCEPTION, f"{what}: {code} {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and str(details).startswith(BROKER_OVERLOADED_PREFIX):
        # The broker's admission control refused the request (too much in flight from us): a
        # retriable throttle, so callers back off and retry instead of failing.
        return errors.error_for(errors.ErrorCode.THROTTLING_QUOTA_EXCEEDED, f"{what}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in str(details):
        # gRPC refused the message by its size prefix (the broker's socket.request.max.bytes, or this
        # client's receive limit): the same request would be refused again.
        return errors.MessageTooLargeError(
            f"{what}: the message is larger than the other side accepts (a broker's socket.request.max.bytes; "
            f"producers: keep max.request.size under it): {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:  # the broker refused the request as malformed: not retried
        return errors.InvalidRequestError(f"{what}: {details}")
    return errors.UnknownServerError(f"{what}: {code} {details}")


def as_timeout_ms(seconds: float) -> int:
    """What is left of a time budget as a ``timeout_ms`` argument: whole milliseconds, at least 1
    (a spent budget still gets one short attempt; None would mean request.timeout.ms)."""
    return max(1, int(seconds * 1000))


class Backoff:
    """Capped exponential backoff with jitter, bounded by a deadline."""

    def __init__(self, initial_ms: int, max_ms: int, deadline: float, stop: threading.Event | None = None) -> None:
        self.delay_s = initial_ms / 1000.0
        self.max_s = max_ms / 1000.0
        self.deadline = deadline
        self.attempts = 0
        self._stop = stop  # set: the waits end at once and no attempt follows (the client is closing)

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    def sleep(self) -> bool:
        """Wait before the next attempt; False when the deadline leaves no room."""
        self.attempts += 1
        if self.attempts >= ATTEMPTS_MAX:
            return False
        remaining = self.remaining_s()
        if remaining <= 0:
            return False
        pause = min(remaining, self.delay_s * (0.8 + 0.4 * random.random()))
        if self._stop is None:
            time.sleep(pause)
        elif self._stop.wait(pause):
            return False
        self.delay_s = min(self.max_s, self.delay_s * 2)
        return self.remaining_s() > 0


def _topic_from_proto(t: broker_pb2.TopicMetadata) -> TopicMetadata:
    parts = {
        p.partition: PartitionMetadata(
            topic=t.name,
            partition=p.partition,
            leader=p.leader,
            leader_epoch=p.leader_epoch,
            replicas=tuple(p.replicas),
            isr=tuple(p.isr),
            offline_replicas=tuple(p.offline_replicas),
            error_code=p.error_code,
        )
        for p in t.partitions
    }
    return TopicMetadata(
        name=t.name,
        topic_id=t.topic_id,
        is_internal=t.is_internal,
        partitions=parts,
        error_code=t.error_code,
        error_message=t.error_message,
    )


class ClusterClient:
    def __init__(
        self,
        bootstrap_servers: str | list[str],
        *,
        request_timeout_ms: int = 30000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
        metadata_max_age_ms: int = 300_000,
        allow_auto_topic_creation: bool = False,
        interceptors: list[Any] | None = None,
        security: SecurityConfig | None = None,
    ) -> None:
        if request_timeout_ms <= 0:
            raise errors.InvalidConfigError(f"request_timeout_ms must be > 0, got {request_timeout_ms}")
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.retry_backoff_max_ms = retry_backoff_max_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.allow_auto_topic_creation = allow_auto_topic_creation
        # gRPC client interceptors on every channel (tracing, auth, fault injection in tests).
        self.interceptors = list(interceptors or [])
        self.security = security or SecurityConfig()
        self._lock = threading.RLock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, broker_pb2_grpc.BrokerServiceStub] = {}
        self._meta = ClusterMetadata("", -1, -1, {}, {}, [])
        self._meta_time = 0.0  # monotonic time of the last successful refresh
        self._stale = True
        self._closed = False
        self._closing = threading.Event()  # set by close(): ends every retry wait of this client

    # ---- channels ----
    def stub_for_address(self, address: str) -> broker_pb2_grpc.BrokerServiceStub:
        with self._lock:
            if self._closed:
                raise errors.BrokerNotAvailableError("client is closed")
            stub = self._stubs.get(address)
            if stub is None:
                channel = make_channel(address, self.security, options=CHANNEL_OPTIONS,
                                       interceptors=self.interceptors)
                self._channels[address] = channel
                stub = broker_pb2_grpc.BrokerServiceStub(channel)
                self._stubs[address] = stub
            return stub

    def channel_for_address(self, address: str) -> grpc.Channel:
        self.stub_for_address(address)
        with self._lock:
            return self._channels[address]

    def broker_address(self, node_id: int) -> str:
        broker = self._meta.brokers.get(node_id)
        if broker is None:
            broker = self.metadata(refresh=True).brokers.get(node_id)
        if broker is None:
            raise errors.BrokerNotAvailableError(f"broker {node_id} is not in the cluster metadata")
        return broker.address

    def broker_stub(self, node_id: int) -> broker_pb2_grpc.BrokerServiceStub:
        """The pooled stub of a broker (one channel per broker, shared by all callers)."""
        return self.stub_for_address(self.broker_address(node_id))

    def broker_channel(self, node_id: int) -> grpc.Channel:
        """The pooled channel of a broker (for other services on the same server, e.g. groups)."""
        return self.channel_for_address(self.broker_address(node_id))

    def any_broker_channel(self, timeout_ms: int | None = None) -> grpc.Channel:
        """A channel to some live broker; a metadata refresh first, if one is due, of at most ``timeout_ms``."""
        meta = self.metadata(timeout_ms=timeout_ms)
        live = [b for b in meta.brokers.values() if not b.fenced] or list(meta.brokers.values())
        address = random.choice(live).address if live else self.bootstrap[0]
        return self.channel_for_address(address)

    # ---- metadata ----
    def metadata(self, topics: list[str] | None = None, *, refresh: bool = False,
                 timeout_ms: int | None = None) -> ClusterMetadata:
        """Cluster metadata; cached unless ``refresh``, stale, or a named topic is unknown.

        A refresh tries brokers until ``timeout_ms`` (default: request.timeout.ms). Metadata never goes
        back: an answer older than the version already seen (a broker that has not applied a topic
        another one showed us) is passed over for another broker's, and taken only when none is newer
        by the deadline.
        """
        if not refresh and not self._needs_refresh(topics):
            return self._meta
        return self._refresh(topics, timeout_ms)

    def metadata_snapshot(self) -> ClusterMetadata:
        """The cached metadata as it is now, never a network call (a new object after every refresh)."""
        return self._meta

    def request_update(self) -> None:
        """Mark metadata stale so the next ``metadata()`` asks a broker (after NOT_LEADER etc.)."""
        self._stale = True

    def _needs_refresh(self, topics: list[str] | None) -> bool:
        if self._stale or not self._meta.brokers:
            return True
        if (time.monotonic() - self._meta_time) * 1000 > self.metadata_max_age_ms:
            return True
        if topics is None:
            return False
        return any(t not in self._meta.topics for t in topics)

    def _metadata_candidates(self) -> list[str]:
        known = [b.address for b in self._meta.brokers.values() if not b.fenced]
        random.shuffle(known)
        boot = list(self.bootstrap)
        random.shuffle(boot)
        seen: dict[str, None] = dict.fromkeys(known + boot)
        return list(seen)

    def _refresh(self, topics: list[str] | None, timeout_ms: int | None = None) -> ClusterMetadata:
        req = broker_pb2.MetadataRequest(
            topics=topics or [],
            all_topics=topics is None,
            allow_auto_topic_creation=self.allow_auto_topic_creation,
        )
        backoff = self._backoff(timeout_ms)
        last: Exception | None = None
        behind: broker_pb2.MetadataResponse | None = None  # the newest answer older than what we have seen
        while True:
            candidates = self._metadata_candidates()
            refused: list[errors.BrookError] = []  # handshakes this client refused: they fail the same way again
            for address in candidates:
                timeout_s = max(0.05, min(self.request_timeout_ms / 1000.0, backoff.remaining_s()))
                try:
                    resp = self.stub_for_address(address).Metadata(req, timeout=timeout_s)
                except grpc.RpcError as exc:
                    last = rpc_error(exc, f"Metadata from {address}")
                    if isinstance(last, errors.SslAuthenticationError):
                        refused.append(last)
                    log.debug("metadata from %s failed: %s", address, last)
                    continue
                seen = self._meta
                if resp.cluster_id == seen.cluster_id and resp.metadata_version < seen.version:
                    # A broker that has not applied what another one showed us (a topic just created,
                    # a new leader): its answer would take them back. Ask another, or this one again.
                    log.debug("metadata from %s is at version %d, behind the %d already seen; asking again",
                              address, resp.metadata_version, seen.version)
                    if behind is None or resp.metadata_version > behind.metadata_version:
                        behind = resp
                    continue
                return self._apply_metadata(resp, topics)
            if refused and len(refused) == len(candidates):
                raise refused[-1]  # no broker it can shake hands with: at once, as Kafka's clients
            if not backoff.sleep():
                if behind is not None:
                    # Every broker that answers lags (the one ahead is gone): an answer beats none.
                    log.info("no broker has metadata version %d within %d ms; using version %d",
                             self._meta.version, timeout_ms or self.request_timeout_ms, behind.metadata_version)
                    return self._apply_metadata(behind, topics)
                raise errors.error_for(
                    errors.ErrorCode.NETWORK_EXCEPTION,
                    f"no broker answered Metadata within {timeout_ms or self.request_timeout_ms} ms "
                    f"(tried {self._metadata_candidates()}): {last}",
                )

    def _apply_metadata(self, resp: broker_pb2.MetadataResponse, topics: list[str] | None) -> ClusterMetadata:
        brokers = {
            b.node_id: BrokerMetadata(b.node_id, b.host, b.port, b.rack, b.fenced) for b in resp.brokers
        }
        fresh = {t.name: _topic_from_proto(t) for t in resp.topics}
        with self._lock:
            merged = {} if topics is None else dict(self._meta.topics)
            for name, info in fresh.items():
                if info.error_code == errors.ErrorCode.NONE:
                    merged[name] = info
                else:
                    merged.pop(name, None)
            self._meta = ClusterMetadata(
                cluster_id=resp.cluster_id,
                controller_id=resp.controller_id,
                version=resp.metadata_version,
                brokers=brokers,
                topics=merged,
                controllers=[(e.host, e.port) for e in resp.controllers],
            )
            self._meta_time = time.monotonic()
            self._stale = False
            result = self._meta
        if topics is None:
            return result
        # The caller asked about named topics: include errored ones so it can see why.
        shown = dict(result.topics)
        for name, info in fresh.items():
            if info.error_code != errors.ErrorCode.NONE:
                shown[name] = info
        return ClusterMetadata(
            result.cluster_id, result.controller_id, result.version, result.brokers, shown, result.controllers
        )

    def partitions_for(self, topic: str, *, refresh: bool = False) -> list[int]:
        """Partition ids of a topic; raises the topic's error (e.g. UnknownTopicOrPartition)."""
        meta = self.metadata([topic], refresh=refresh)
        info = meta.topics.get(topic)
        if info is None:
            raise errors.UnknownTopicOrPartitionError(f"topic {topic!r} not in metadata")
        if info.error_code != errors.ErrorCode.NONE:
            raise errors.error_for(info.error_code, info.error_message or f"topic {topic!r}")
        return sorted(info.partitions)

    def leader_for(self, tp: TopicPartition, *, refresh: bool = False, timeout_ms: int | None = None) -> int:
        """The leader's node id; raises UnknownTopicOrPartition / LeaderNotAvailable. A metadata refresh,
        when due, takes at most ``timeout_ms`` (default: request.timeout.ms)."""
        return self.leader_and_epoch(tp, refresh=refresh, timeout_ms=timeout_ms)[0]

    def leader_and_epoch(self, tp: TopicPartition, *, refresh: bool = False, timeout_ms: int | None = None
                         ) -> tuple[int, int]:
        """(leader node id, leader epoch) of ``tp`` in the metadata, as ``leader_for``."""
        tp = TopicPartition(*tp)
        meta = self.metadata([tp.topic], refresh=refresh, timeout_ms=timeout_ms)
        info = meta.topics.get(tp.topic)
        if info is None or info.error_code != errors.ErrorCode.NONE:
            code = info.error_code if info else errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            raise errors.error_for(code, (info.error_message if info else "") or f"topic {tp.topic!r}")
        part = info.partitions.get(tp.partition)
        if part is None:
            raise errors.UnknownTopicOrPartitionError(f"{tp.topic}-{tp.partition} does not exist")
        if part.leader < 0:
            raise errors.error_for(errors.ErrorCode.LEADER_NOT_AVAILABLE, f"{tp.topic}-{tp.partition} has no leader")
        return part.leader, part.leader_epoch

    def leader_epoch(self, tp: TopicPartition) -> int:
        info = self._meta.topics.get(tp.topic)
        part = info.partitions.get(tp.partition) if info else None
        return part.leader_epoch if part else -1

    def group_by_leader(self, tps: Iterable[TopicPartition], *, timeout_ms: int | None = None
                        ) -> tuple[dict[int, list[TopicPartition]], dict]:
        """Partitions per leader node, plus {tp: BrookError} for those without a usable leader."""
        by_leader: dict[int, list[TopicPartition]] = {}
        failed: dict[TopicPartition, errors.BrookError] = {}
        for tp in tps:
            try:
                by_leader.setdefault(self.leader_for(tp, timeout_ms=timeout_ms), []).append(tp)
            except errors.BrookError as exc:
                failed[tp] = exc
        return by_leader, failed

    # ---- generic retry helper ----
    def _backoff(self, timeout_ms: int | None = None) -> Backoff:
        timeout_ms = self.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000.0
        return Backoff(self.retry_backoff_ms, self.retry_backoff_max_ms, deadline, self._closing)

    def call_any(self, method: str, request: Any, *, timeout_ms: int | None = None) -> Any:
        """Send a broker RPC that any broker can answer (e.g. InitProducerId), with retries."""
        backoff = self._backoff(timeout_ms)
        while True:
            address = random.choice(self._metadata_candidates())
            try:
                return getattr(self.stub_for_address(address), method)(
                    request, timeout=max(0.05, backoff.remaining_s())
                )
            except grpc.RpcError as exc:
                err = rpc_error(exc, f"{method} to {address}")
                self.request_update()
            if not backoff.sleep():
                raise err

    def with_retries(self, attempt: Callable[[float], T], *, timeout_ms: int | None = None) -> T:
        """Run ``attempt(timeout_s)`` until it does not raise a retriable BrookError."""
        backoff = self._backoff(timeout_ms)
        while True:
            try:
                return attempt(max(0.05, backoff.remaining_s()))
            except grpc.RpcError as exc:
                err: errors.BrookError = rpc_error(exc, "request")
            except errors.BrookError as exc:
                if not exc.retriable:
                    raise
                err = exc
            if err.code in REFRESH_CODES or err.code == errors.ErrorCode.REQUEST_TIMED_OUT:
                self.request_update()
            log.debug("retrying after %s", err)
            if not backoff.sleep():
                raise err

    # ---- ListOffsets ----
    def list_offsets(
        self, timestamps: Mapping[TopicPartition, int], *, timeout_ms: int | None = None, isolation_level: int = 0
    ) -> dict[TopicPartition, tuple[int, int]]:
        """{tp: timestamp} (-1 latest/HW, -2 earliest, -3 max timestamp, else ms) -> {tp: (offset, timestamp)}.

        Offset is -1 when no record has a timestamp >= the one asked for. ``isolation_level`` 1 (read_committed):
        offsets below the last stable offset instead of the high watermark (latest is the LSO).
        """
        found = self._list_offsets(timestamps, timeout_ms, fenced=False, isolation_level=isolation_level)
        return {tp: (offset, ts) for tp, (offset, ts, _epoch, _current) in found.items()}

    def list_offsets_with_epochs(
        self, timestamps: Mapping[TopicPartition, int], *, timeout_ms: int | None = None, isolation_level: int = 0
    ) -> dict[TopicPartition, tuple[int, int, int, int]]:
        """``list_offsets`` for a consumer's positions (KIP-320): {tp: (offset, timestamp, leader epoch of the
        offset, the leader epoch the answer was given at)}. Each request carries the partition's leader
        epoch from the metadata as ``current_leader_epoch``, so only the leader at that epoch answers (a
        broker at another epoch is retried after a metadata refresh); the offset is then one of that
        leader's log, and the epoch of the offset (-1 when the leader has none) is the position's."""
        return self._list_offsets(timestamps, timeout_ms, fenced=True, isolation_level=isolation_level)

    def _list_offsets(self, timestamps: Mapping[TopicPartition, int], timeout_ms: int | None, *,
                      fenced: bool, isolation_level: int = 0) -> dict[TopicPartition, tuple[int, int, int, int]]:
        pending = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        result: dict[TopicPartition, tuple[int, int, int, int]] = {}
        backoff = self._backoff(timeout_ms)
        last: errors.BrookError | None = None
        while pending:
            by_leader, failed = self.group_by_leader(pending, timeout_ms=as_timeout_ms(backoff.remaining_s()))
            for exc in failed.values():
                if not exc.retriable:
                    raise exc
                last = exc
            for leader, tps in by_leader.items():
                last = self._list_offsets_on(leader, tps, pending, result, backoff, fenced, isolation_level) or last
            if not pending:
                break
            self.request_update()
            if not backoff.sleep():
                raise last or errors.RequestTimedOutError("list_offsets timed out")
        return result

    def _list_offsets_on(self, leader, tps, pending, result, backoff, fenced: bool,
                         isolation_level: int = 0) -> errors.BrookError | None:
        epochs = {tp: self.leader_epoch(tp) if fenced else -1 for tp in tps}
        req = broker_pb2.ListOffsetsRequest(
            replica_id=-1, isolation_level=isolation_level,
            partitions=[
                broker_pb2.ListOffsetsPartition(
                    topic=tp.topic, partition=tp.partition, timestamp=pending[tp], current_leader_epoch=epochs[tp]
                )
                for tp in tps
            ],
        )
        try:
            resp = self.broker_stub(leader).ListOffsets(req, timeout=max(0.05, backoff.remaining_s()))
        except grpc.RpcError as exc:
            return rpc_error(exc, f"ListOffsets to broker {leader}")
        last = None
        for p in resp.partitions:
            tp = TopicPartition(p.topic, p.partition)
            if tp not in pending:
                continue
            if p.error_code == errors.ErrorCode.NONE:
                result[tp] = (p.offset, p.timestamp, p.leader_epoch, epochs[tp])
                del pending[tp]
                continue
            err = errors.error_for(p.error_code, p.error_message)
            if not err.retriable:
                raise err
            last = err
        return last

    # ---- Fetch (single partition convenience; the Consumer pipelines its own) ----
    def fetch(
        self, tp: TopicPartition, offset: int, max_bytes: int, *, max_wait_ms: int = 0, min_bytes: int = 1,
        isolation_level: int = 0,
    ) -> FetchResult:
        """Fetch committed batches of one partition from its leader.

        Retriable errors (leader moved, ...) are retried within the request timeout;
        others (e.g. OFFSET_OUT_OF_RANGE) come back in ``FetchResult.error``.
        """
        tp = TopicPartition(*tp)
        backoff = self._backoff(self.request_timeout_ms + max_wait_ms)
        last: errors.BrookError | None = None
        while True:
            try:
                timeout_s = max(0.05, min(backoff.remaining_s(), self.request_timeout_ms / 1000 + max_wait_ms / 1000))
                result = self.fetch_from(self.leader_for(tp), tp, offset, max_bytes, max_wait_ms=max_wait_ms,
                                         min_bytes=min_bytes, timeout_s=timeout_s, isolation_level=isolation_level)
                if result.error is None or not result.error.retriable:
                    return result
                last = result.error
            except grpc.RpcError as exc:
                last = rpc_error(exc, f"Fetch {tp}")
            except errors.BrookError as exc:
                if not exc.retriable:
                    return FetchResult(b"", -1, -1, exc)
                last = exc
            self.request_update()
            if not backoff.sleep():
                return FetchResult(b"", -1, -1, last)

    def fetch_from(self, leader: int, tp: TopicPartition, offset: int, max_bytes: int, *, max_wait_ms: int = 0,
                   min_bytes: int = 1, timeout_s: float, isolation_level: int = 0) -> FetchResult:
        """One Fetch of ``tp`` from broker ``leader``, no retry: the partition's error comes back in the
        result (no records with it); a transport failure raises grpc.RpcError, an answer without the
        partition UnknownServerError. ``isolation_level`` 1 (read_committed): records below the last stable
        offset, and the aborted transactions among them in the result (``client.fetcher.AbortedFilter``
        drops their records)."""
        req = broker_pb2.FetchRequest(
            replica_id=-1, replica_epoch=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
            isolation_level=isolation_level,
            partitions=[broker_pb2.FetchPartition(
                topic=tp.topic, partition=tp.partition, fetch_offset=offset, partition_max_bytes=max_bytes,
                current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])
        resp = self.broker_stub(leader).Fetch(req, timeout=timeout_s)
        part = next((p for p in resp.partitions if p.topic == tp.topic and p.partition == tp.partition), None)
        if part is None:
            raise errors.UnknownServerError(f"Fetch response from broker {leader} lacks {tp}")
        if part.error_code == errors.ErrorCode.NONE:
            aborted = tuple((a.producer_id, a.first_offset) for a in part.aborted_transactions)
            return FetchResult(part.records, part.high_watermark, part.log_start_offset, None, part.log_end_offset,
                               part.last_stable_offset, aborted)
        err = errors.error_for(part.error_code, part.error_message)
        return FetchResult(b"", part.high_watermark, part.log_start_offset, err, part.log_end_offset)

    def init_producer_id(self, producer_id: int = -1, producer_epoch: int = -1) -> tuple[int, int]:
        """A producer id and epoch for an idempotent producer (any broker allocates)."""
        req = broker_pb2.InitProducerIdRequest(producer_id=producer_id, producer_epoch=producer_epoch)

        def attempt(timeout_s: float) -> tuple[int, int]:
            resp = self.call_any("InitProducerId", req, timeout_ms=int(timeout_s * 1000))
            errors.raise_for(resp.error_code, resp.error_message)
            return resp.producer_id, resp.producer_epoch

        return self.with_retries(attempt)

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for channel in channels:
            channel.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
