"""Follower side of replication: one ReplicaFetcher thread per source (leader) broker.

Each fetcher sends one Fetch for all the partitions it follows from that broker, from
each partition's log end offset, with the partition's last epoch (KIP-320). The leader
answers with whole batches (appended as they came, offsets already assigned), its high
watermark, or a *diverging epoch* when this replica's log forked from the leader's —
then the replica truncates to the end of the last epoch both share before fetching on
(KIP-101/279). Out-of-range answers truncate to the leader's log end or restart the log
at the leader's log start.

Fetches go over one ``ReplicaFetch`` stream per fetcher (a fetch session: a message costs the
leader about half of what a unary call does), opened again after any failure; a leader that does
not know the stream (an older version, mid-upgrade) gets unary ``Fetch`` calls instead. A fetch
gets no answer for longer than ``max_wait_ms`` + 10 s (a stopped leader) cancels the stream.

A partition added (a new topic, a new leader or leader epoch) while the fetch in flight does not
carry it cuts that fetch short: the stream is cancelled and opened again at once, so the new
partition's first acks=all writes wait for one fetch round trip, not for the leader's long poll
(``replica.fetch.wait.max.ms``) to run out. Kafka's fetcher threads leave the poll running.

Role changes remove a partition from its fetcher *before* the partition changes role;
responses are processed under the fetcher's lock, so once ``remove_partitions`` returns
no fetcher will append to that log again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc

from client.security import SecurityConfig, make_channel
from proto import broker_pb2, broker_pb2_grpc, errors
from proto.errors import ErrorCode
from replication import isr as isr_rules
from replication.partition import Partition
from replication.throttle import ReplicationThrottle

log = logging.getLogger(__name__)

# Just added (a new topic, a leader change), a partition is often fetched before its leader has applied
# the same metadata: it answers one of these. The first QUICK_RETRIES of them back off a quarter of
# replica.fetch.backoff.ms, as UNKNOWN_LEADER_EPOCH always does; later ones the whole of it.
_LEADER_BEHIND = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
QUICK_RETRIES = 10

_RETRY_LATER = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.REPLICA_NOT_AVAILABLE,
}


@dataclass(slots=True)
class FetcherConfig:
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 16 * 1024 * 1024
    partition_max_bytes: int = 1024 * 1024
    backoff_ms: int = 200
    # A fetch unanswered for max_wait_ms + this is given up (its stream cancelled and opened again).
    response_slack_ms: int = 10_000
    max_truncation_rounds: int = 64  # bound on repeated divergence answers per partition
    # How this broker reaches the leaders' inter-broker listener (its own node certificate on SSL).
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # Shared by every fetcher of the broker: the copy rate of partitions not in sync here.
    throttle: ReplicationThrottle = field(default_factory=ReplicationThrottle)


class _FetchSession:
    """One ReplicaFetch stream: ``fetch`` sends a request and waits for its response.

    Only the fetcher's thread calls ``fetch``; ``cancel`` may come from any thread (the watchdog,
    shutdown) and makes a waiting ``fetch`` raise.
    """

    def __init__(self, stub: broker_pb2_grpc.BrokerServiceStub) -> None:
        self._requests: queue.SimpleQueue[broker_pb2.FetchRequest | None] = queue.SimpleQueue()
        self._call = stub.ReplicaFetch(iter(self._requests.get, None))
        self.opened_at = time.monotonic()
        self.waiting_since: float | None = None  # monotonic time of the unanswered request
        self.interrupted = False  # cancelled to send a request with more partitions: no failure
        # The leader keeps this stream's partitions (it said so in an answer): requests carry changes only.
        self.incremental = False
        self.sent: dict[tuple[str, int], _Want] = {}  # each partition's fetch as the leader has it

    def fetch(self, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
        self.waiting_since = time.monotonic()
        self._requests.put(request)
        try:
            return next(self._call)
        except StopIteration:  # the leader ended the stream (it is stopping)
            raise _SessionEnded from None
        finally:
            self.waiting_since = None

    def cancel(self) -> None:
        self._requests.put(None)  # ends the request stream
        self._call.cancel()

    def interrupt(self) -> None:
        self.interrupted = True
        self.cancel()


class _SessionEnded(Exception):
    pass


# What a fetch asks of one partition: (fetch_offset, partition_max_bytes, current_leader_epoch,
# last_fetched_epoch, log_start_offset), the FetchPartition fields after topic and partition.
_Want = tuple[int, int, int, int, int]


@dataclass(slots=True)
class _Wanted:
    """The next fetch: the partitions ready to fetch and how long the leader may hold it."""
    parts: dict[tuple[str, int], _Want]
    max_wait_ms: int


class _CutShort(Exception):
    """A partition was added while the request was being sent: it is built again with the partition."""


# How often a fetch rebuilds every partition's part from its log, not only those it processed since.
WANTS_REFRESH_S = 1.0

# A stream keeps the credentials it opened with (a SCRAM session token ages): it is opened anew
# after this long, and at once when the leader refuses it as unauthorized.
STREAM_MAX_AGE_S = 60.0
_AUTH_REFUSALS = {ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.SASL_AUTHENTICATION_FAILED}


@dataclass(slots=True)
class _FetchState:
    partition: Partition
    leader_epoch: int
    delayed_until_s: float = 0.0
    truncation_rounds: int = 0
    quick_retries: int = 0  # short backoffs taken for "not the leader (yet)" since the partition was added


class ReplicaFetcher:
    def __init__(self, local_id: int, source_id: int, address: str, broker_epoch: Callable[[], int],
                 config: FetcherConfig) -> None:
        self.local_id = local_id
        self.source_id = source_id
        self.address = address
        self._broker_epoch = broker_epoch
        self.config = config
        self._lock = threading.Condition()
        self._states: dict[tuple[str, int], _FetchState] = {}
        self._stopped = False
        self._channel = make_channel(address, config.security, options=[
            ("grpc.max_receive_message_length", config.max_bytes + 4 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            # a restarted leader is found again within a second, not after gRPC's default 2 min backoff
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ])
        self._failures = 0
        self._stub = broker_pb2_grpc.BrokerServiceStub(self._channel)
        self._session: _FetchSession | None = None
        # (partition, leader epoch) of the fetch in flight, None between fetches; under _lock
        self._in_flight: dict[tuple[str, int], int] | None = None
        self._cut_short = False  # add() wants the request in flight rebuilt; under _lock
        self._next_ready_s = float("inf")  # when the first partition held back by _build_request is ready
        self._use_stream = True  # False once the leader answered UNIMPLEMENTED (an older version)
        # Each partition's fetch as last built, and the partitions it may have changed for since (a
        # response processed, added): a fetch rebuilds those only, and all of them once per
        # WANTS_REFRESH_S (a log start moved by this broker's retention). Under _lock.
        self._wants: dict[tuple[str, int], _Want] = {}
        self._changed: set[tuple[str, int]] = set()
        self._next_full_build_s = 0.0
        self._thread = threading.Thread(target=self._run, name=f"replica-fetcher-{local_id}-from-{source_id}",
                                        daemon=True)
        self._thread.start()

    # ---- partition set ----
    def add(self, partition: Partition, leader_epoch: int) -> None:
        with self._lock:
            self._states[partition.key] = _FetchState(partition, leader_epoch)
            self._changed.add(partition.key)
            self._lock.notify_all()
            # The fetch in flight may be parked at the leader for up to max_wait_ms without this partition.
            # The fetcher thread checks _cut_short under this lock after opening its stream and before
            # sending: a request either is not sent, or goes on the stream interrupted here.
            cut_short = self._in_flight is not None and self._in_flight.get(partition.key) != leader_epoch
            self._cut_short = self._cut_short or cut_short
            session = self._session
        if cut_short and session is not None:
            log.debug("fetcher %d<-%d: %s-%d added at epoch %d; cutting the fetch in flight short",
                      self.local_id, self.source_id, partition.topic, partition.partition, leader_epoch)
            session.interrupt()

    def remove(self, keys: Iterable[tuple[str, int]]) -> None:
        with self._lock:
            for k in keys:
                self._states.pop(k, None)
                self._wants.pop(k, None)

    def partition_count(self) -> int:
        with self._lock:
            return len(self._states)

    def shutdown(self) -> None:
        with self._lock:
            self._stopped = True
            self._states.clear()
            self._lock.notify_all()
        session = self._session
        if session is not None:
            session.cancel()
        self._channel.close()  # cancels an in-flight long poll
        self._thread.join(timeout=5)

    # ---- loop ----
    def _run(self) -> None:
        backoff_s = self.config.backoff_ms / 1000
        while True:
            with self._lock:
                if self._stopped:
                    return
                request, epochs = self._build_request()
                if request is None:
                    # Until the first partition's backoff ends (a quarter backoff is shorter than backoff_s).
                    self._lock.wait(timeout=min(backoff_s, max(0.001, self._next_ready_s - time.monotonic())))
                    continue
                self._in_flight = epochs
                self._cut_short = False
            try:
                response = self._send(request)
            except _CutShort:
                continue  # a partition was added before the request went out: build it again
            except (grpc.RpcError, _SessionEnded) as e:
                interrupted = self._session is not None and self._session.interrupted
                with self._lock:
                    self._in_flight = None
                self._close_session()
                if self._stopped:
                    return
                if interrupted:
                    continue  # add() cut the long poll short for a new partition: fetch again at once
                if isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNIMPLEMENTED and self._use_stream:
                    log.info("fetcher %d<-%d: leader has no ReplicaFetch stream (an older version); "
                             "using unary fetches", self.local_id, self.source_id)
                    self._use_stream = False
                    continue
                self._failures += 1
                if self._failures == 1 or self._failures % 50 == 0:  # one line per outage, not 5 per second
                    log.info("fetcher %d<-%d (%s): fetch failed (%d in a row): %s", self.local_id, self.source_id,
                             self.address, self._failures, e.code() if hasattr(e, "code") else e)
                with self._lock:
                    self._lock.wait(timeout=backoff_s)
                continue
            except ValueError:  # channel closed under us during shutdown
                return
            self._failures = 0
            with self._lock:
                self._in_flight = None
                if self._stopped:
                    return
                for pr in response.partitions:
                    key = (pr.topic, pr.partition)
                    st = self._states.get(key)
                    if st is None or epochs.get(key) != st.leader_epoch:
                        continue  # removed or re-added at another epoch while the request was out
                    self._changed.add(key)
                    try:
                        self._process(st, pr)
                    except errors.BrookError as e:
                        log.warning("fetcher %d<-%d: %s-%d: %s; backing off", self.local_id, self.source_id,
                                    pr.topic, pr.partition, e)
                        st.delayed_until_s = time.monotonic() + backoff_s
                    except Exception:
                        log.exception("fetcher %d<-%d: %s-%d: unexpected failure; backing off",
                                      self.local_id, self.source_id, pr.topic, pr.partition)
                        st.delayed_until_s = time.monotonic() + backoff_s

    def _send(self, wanted: _Wanted) -> broker_pb2.FetchResponse:
        if not self._use_stream:
            return self._stub.Fetch(self._request(wanted, None), timeout=self.response_timeout_s())
        if self._session is not None and time.monotonic() - self._session.opened_at > STREAM_MAX_AGE_S:
            self._close_session()
        if self._session is None:
            self._session = _FetchSession(self._stub)
        with self._lock:
            if self._cut_short:
                self._in_flight = None
                raise _CutShort
        session = self._session
        response = session.fetch(self._request(wanted, session))
        if response.incremental:
            session.incremental = True
        if any(pr.error_code in _AUTH_REFUSALS or pr.error_code == ErrorCode.INVALID_REQUEST
               for pr in response.partitions):
            # Refused for who we are: open the stream again. (A session the leader does not know ends
            # the stream UNAUTHENTICATED instead, which drops the channel's token: the next stream
            # authenticates afresh.) A request the leader found invalid may have left its view of the
            # fetch session other than ours: the next stream starts a new one with a full request.
            self._close_session()
        return response

    def _request(self, wanted: _Wanted, session: _FetchSession | None) -> broker_pb2.FetchRequest:
        """The FetchRequest of ``wanted``: every partition, or on an incremental stream only those whose
        fetch changed since the last request on it, and the ones it no longer carries as forgotten."""
        c = self.config
        req = broker_pb2.FetchRequest(replica_id=self.local_id, replica_epoch=self._broker_epoch(),
                                      max_wait_ms=wanted.max_wait_ms, min_bytes=c.min_bytes, max_bytes=c.max_bytes)
        parts = wanted.parts
        if session is not None:
            if session.incremental:
                req.incremental = True
                sent = session.sent
                parts = {k: w for k, w in parts.items() if sent.get(k) != w}
                req.forgotten.extend(broker_pb2.FetchForgotten(topic=k[0], partition=k[1])
                                     for k in sent.keys() - wanted.parts.keys())
            session.sent = wanted.parts  # built afresh for each fetch: nothing changes it after
        req.partitions.extend(
            broker_pb2.FetchPartition(topic=k[0], partition=k[1], fetch_offset=w[0], partition_max_bytes=w[1],
                                      current_leader_epoch=w[2], last_fetched_epoch=w[3], log_start_offset=w[4])
            for k, w in parts.items())
        return req

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.cancel()

    def response_timeout_s(self) -> float:
        """How long a fetch may go unanswered: the long poll plus slack for a loaded leader."""
        return (self.config.max_wait_ms + self.config.response_slack_ms) / 1000

    def cancel_if_overdue(self, now: float) -> bool:
        """The watchdog's check: cancel the stream whose request has waited past the timeout."""
        session = self._session
        since = session.waiting_since if session is not None else None
        if session is None or since is None or now - since <= self.response_timeout_s():
            return False
        log.warning("fetcher %d<-%d (%s): no answer for %.1f s; reopening the fetch stream", self.local_id,
                    self.source_id, self.address, now - since)
        session.cancel()
        return True

    def _build_request(self) -> tuple[_Wanted | None, dict[tuple[str, int], int]]:
        now = time.monotonic()
        parts: dict[tuple[str, int], _Want] = {}
        epochs: dict[tuple[str, int], int] = {}
        partition_max_bytes = self.config.partition_max_bytes
        wants, changed = self._wants, self._changed
        full = now >= self._next_full_build_s
        if full:
            self._next_full_build_s = now + WANTS_REFRESH_S
        next_ready_s = float("inf")
        throttle_wait_s = self.config.throttle.wait_s()
        held_back = []
        for key, st in self._states.items():
            if st.delayed_until_s > now:
                next_ready_s = min(next_ready_s, st.delayed_until_s)
                held_back.append(key)
                continue
            if throttle_wait_s > 0 and self.local_id not in st.partition.isr:
                next_ready_s = min(next_ready_s, now + throttle_wait_s)  # the copy throttle is in debt
                held_back.append(key)
                continue
            w = None if full or key in changed else wants.get(key)
            if w is None:
                lg = st.partition.log
                w = wants[key] = (lg.log_end_offset, partition_max_bytes, st.leader_epoch, lg.latest_epoch,
                                  lg.log_start_offset)
            parts[key] = w
            epochs[key] = st.leader_epoch
        self._changed = changed & set(held_back)  # built when they are fetched again
        self._next_ready_s = next_ready_s
        if not parts:
            return None, epochs
        # A partition in backoff is not in this request: do not let the long poll outlast its
        # backoff, or it would sit out a whole max_wait (e.g. just after a leader change).
        max_wait_ms = min(self.config.max_wait_ms, max(0, int((next_ready_s - now) * 1000) + 1)) \
            if next_ready_s != float("inf") else self.config.max_wait_ms
        return _Wanted(parts, max_wait_ms), epochs

    def _process(self, st: _FetchState, pr: broker_pb2.FetchPartitionResponse) -> None:
        lg = st.partition.log
        if pr.error_code == ErrorCode.NONE:
            if pr.HasField("diverging_epoch"):
                self._truncate_diverged(st, pr.diverging_epoch.epoch, pr.diverging_epoch.end_offset)
                return
            st.truncation_rounds = 0
            if pr.records:
                lg.append_as_follower(pr.records)
                if self.local_id not in st.partition.isr:
                    self.config.throttle.charge(len(pr.records))  # _build_request holds it back while in debt
            lg.update_high_watermark(min(pr.high_watermark, lg.log_end_offset))
            if pr.log_start_offset > lg.log_start_offset:
                # The leader's log start moved (DeleteRecords or its retention): records before it are
                # gone for every reader, so this replica must not serve them after a failover either.
                lg.set_log_start_offset(min(pr.log_start_offset, lg.high_watermark))
            return
        if pr.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            self._handle_out_of_range(st, pr)
            return
        backoff_ms = self.config.backoff_ms
        if pr.error_code == ErrorCode.UNKNOWN_LEADER_EPOCH:
            backoff_ms = max(10, backoff_ms // 4)  # the leader is about to apply the same metadata
        elif pr.error_code in _LEADER_BEHIND and st.quick_retries < QUICK_RETRIES:
            st.quick_retries += 1
            backoff_ms = max(10, backoff_ms // 4)
        elif pr.error_code not in _RETRY_LATER:
            log.warning("fetcher %d<-%d: %s-%d: %s %s", self.local_id, self.source_id, pr.topic, pr.partition,
                        errors.code_name(pr.error_code), pr.error_message)
        st.delayed_until_s = time.monotonic() + backoff_ms / 1000

    def _truncate_diverged(self, st: _FetchState, epoch: int, end_offset: int) -> None:
        lg = st.partition.log
        st.truncation_rounds += 1
        if st.truncation_rounds > self.config.max_truncation_rounds:
            raise errors.KafkaStorageError(f"no convergence after {self.config.max_truncation_rounds} truncations")
        target = isr_rules.truncation_offset(epoch, end_offset, lg.end_offset_for_epoch(epoch) if epoch >= 0
                                             else (-1, -1), lg.log_end_offset, lg.high_watermark)
        log.info("%s-%d: diverged from leader %d at epoch %d end %d; truncating %d -> %d",
                 st.partition.topic, st.partition.partition, self.source_id, epoch, end_offset,
                 lg.log_end_offset, target)
        if target < lg.log_end_offset:
            lg.truncate_to(target)
        elif lg.latest_epoch > epoch:
            # No data to cut, but our epoch cache holds epochs past the shared history (a
            # leadership that appended nothing): drop them so the next fetch reports the shared one.
            lg.epoch_cache.truncate_from_end(target)

    def _handle_out_of_range(self, st: _FetchState, pr: broker_pb2.FetchPartitionResponse) -> None:
        lg = st.partition.log
        leo = lg.log_end_offset
        if 0 <= pr.log_end_offset < leo:
            log.warning("%s-%d: our end %d is past leader %d's end %d; truncating", pr.topic, pr.partition,
                        leo, self.source_id, pr.log_end_offset)
            lg.truncate_to(pr.log_end_offset)
        elif pr.log_start_offset > leo:
            log.warning("%s-%d: our end %d is before leader %d's log start %d; restarting the log there",
                        pr.topic, pr.partition, leo, self.source_id, pr.log_start_offset)
            lg.truncate_fully_and_start_at(pr.log_start_offset)
        else:
            st.delayed_until_s = time.monotonic() + self.config.backoff_ms / 1000


class ReplicaFetcherManager:
    """Owns the fetcher threads, one per source broker endpoint."""

    def __init__(self, local_id: int, broker_epoch: Callable[[], int], config: FetcherConfig | None = None) -> None:
        self.local_id = local_id
        self._broker_epoch = broker_epoch
        self.config = config or FetcherConfig()
        self._lock = threading.Lock()
        self._fetchers: dict[tuple[int, str], ReplicaFetcher] = {}
        self._where: dict[tuple[str, int], tuple[int, str]] = {}
        # One thread for every fetcher's response deadline (a stream has none of its own).
        self._stopped = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name=f"replica-fetch-watchdog-{local_id}",
                                          daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._stopped.wait(1.0):
            with self._lock:
                fetchers = list(self._fetchers.values())
            now = time.monotonic()
            for f in fetchers:
                f.cancel_if_overdue(now)

    def add_partition(self, partition: Partition, leader_id: int, address: str, leader_epoch: int) -> None:
        with self._lock:
            fkey = (leader_id, address)
            old = self._where.get(partition.key)
            if old is not None and old != fkey:
                self._fetchers[old].remove([partition.key])
            f = self._fetchers.get(fkey)
            if f is None:
                f = ReplicaFetcher(self.local_id, leader_id, address, self._broker_epoch, self.config)
                self._fetchers[fkey] = f
            f.add(partition, leader_epoch)
            self._where[partition.key] = fkey
        self._close_idle()

    def remove_partitions(self, keys: Iterable[tuple[str, int]]) -> None:
        with self._lock:
            for k in keys:
                fkey = self._where.pop(k, None)
                if fkey is not None:
                    self._fetchers[fkey].remove([k])
        self._close_idle()

    def _close_idle(self) -> None:
        with self._lock:
            idle = [k for k, f in self._fetchers.items() if f.partition_count() == 0]
            closing = [self._fetchers.pop(k) for k in idle]
        for f in closing:
            f.shutdown()

    def fetcher_count(self) -> int:
        with self._lock:
            return len(self._fetchers)

    def shutdown(self) -> None:
        self._stopped.set()
        with self._lock:
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
            self._where.clear()
        for f in fetchers:
            f.shutdown()
