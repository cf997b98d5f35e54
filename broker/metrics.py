"""Prometheus metrics of a Brook node.

Pull model: the roles keep plain counters and expose ``stats()`` snapshots (see
CONTRACTS.md "Stats for metrics"); the collectors here read them at scrape time and turn
them into metric families, so nothing outside this module imports prometheus_client.
The one push-style family is per-RPC request counts and latency, recorded by a gRPC
server interceptor that wraps every handler of every gRPC server in the process.

Names follow Prometheus conventions: ``brook_`` prefix, ``_total`` for counters,
base units ``_seconds`` and ``_bytes``.
"""

from __future__ import annotations

import asyncio
import gzip
import inspect
import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from broker.http_serving import BoundedHTTPServer, tls_context
from broker.request_times import LatencyHistogram, ProduceTimes
from broker.stalls import GcPauses, LoopMonitor

if TYPE_CHECKING:  # annotations only: the roles import this module, not the other way round
    from broker.receiving import ReceiveStats
    from broker.replica_manager import PartitionStats

log = logging.getLogger(__name__)

# Latency buckets for RPCs: sub-millisecond in-memory calls up to long-poll fetches.
RPC_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                         10.0, 30.0)


# ----------------------------------------------------------------------------- RPC interceptor


class RpcMetrics:
    """Per-RPC counters and latency histograms, registered on one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("brook_rpc_requests", "gRPC requests handled, by method and status code.",
                                ["service", "method", "code"], registry=registry)
        self.latency = Histogram("brook_rpc_request_duration_seconds",
                                 "Time from request arrival to the last response message, by method.",
                                 ["service", "method"], buckets=RPC_LATENCY_BUCKETS_S, registry=registry)
        self.in_flight = Gauge("brook_rpc_in_flight_requests", "gRPC requests being handled now.",
                               ["service", "method"], registry=registry)

    def record(self, service: str, method: str, code: str, elapsed_s: float) -> None:
        self.requests.labels(service, method, code).inc()
        self.latency.labels(service, method).observe(elapsed_s)

    def method_recorder(self, service: str, method: str) -> tuple[Any, Callable[[str, float], None]]:
        """One method's in-flight gauge and a ``record(code, elapsed_s)`` whose label lookups are done
        once, not per request (prometheus-client's ``labels()`` takes a lock and builds a key)."""
        gauge = self.in_flight.labels(service, method)
        latency = self.latency.labels(service, method)
        by_code: dict[str, Any] = {}

        def record(code: str, elapsed_s: float) -> None:
            counter = by_code.get(code)
            if counter is None:  # status codes are a fixed set of 17: this dict stays small
                counter = by_code[code] = self.requests.labels(service, method, code)
            counter.inc()
            latency.observe(elapsed_s)
        return gauge, record


def _split_method(full: str) -> tuple[str, str]:
    # "/brook.BrokerService/Produce" -> ("brook.BrokerService", "Produce")
    _, _, rest = full.partition("/")
    service, _, method = rest.partition("/")
    return service or "unknown", method or "unknown"


def _code_of(context: grpc.ServicerContext, error: BaseException | None) -> str:
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if error is not None:
        return grpc.StatusCode.UNKNOWN.name
    return grpc.StatusCode.OK.name


class MetricsInterceptor(grpc.ServerInterceptor):
    """Wraps each handler to count requests by status code and time them.

    Unary responses are timed to the return; streamed responses to the last message, so a
    long-lived stream (WatchMetadata) records its whole life once, when it ends.
    """

    def __init__(self, metrics: RpcMetrics) -> None:
        self._metrics = metrics

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        service, method = _split_method(handler_call_details.method)
        m = self._metrics
        if handler.response_streaming:
            inner = handler.unary_stream or handler.stream_stream

            def streaming(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                started = time.perf_counter()
                gauge = m.in_flight.labels(service, method)
                gauge.inc()
                error: BaseException | None = None
                try:
                    yield from inner(request, context)
                except BaseException as e:  # re-raised; only observed for the status label
                    error = e
                    raise
                finally:
                    gauge.dec()
                    m.record(service, method, _code_of(context, error), time.perf_counter() - started)

            wrapped = streaming
        else:
            inner = handler.unary_unary or handler.stream_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                started = time.perf_counter()
                gauge = m.in_flight.labels(service, method)
                gauge.inc()
                error: BaseException | None = None
                try:
                    return inner(request, context)
                except BaseException as e:  # re-raised; only observed for the status label
                    error = e
                    raise
                finally:
                    gauge.dec()
                    m.record(service, method, _code_of(context, error), time.perf_counter() - started)

            wrapped = unary
        return _replace_behaviour(handler, wrapped)


class AioMetricsInterceptor(grpc.aio.ServerInterceptor):
    """``MetricsInterceptor`` for grpc.aio servers (the broker's): times each unary coroutine handler,
    and each answer of a request-and-response stream (ReplicaFetch: one response per request, timed
    from that request's arrival, counted as one request of the method).

    Other streaming handlers (health Watch, reflection) pass through untimed.
    """

    def __init__(self, metrics: RpcMetrics) -> None:
        self._metrics = metrics
        # method -> (the servicer's handler, its timed wrapper): built once per method, not per request.
        # Only methods the server serves get here (an unknown one has no handler), so this stays small.
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming != handler.response_streaming:
            return handler
        cached = self._wrapped.get(handler_call_details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        if handler.request_streaming:
            if not inspect.isasyncgenfunction(handler.stream_stream):
                return handler
            wrapped = self._timed_stream(handler, handler_call_details.method)
            self._wrapped[handler_call_details.method] = (handler, wrapped)
            return wrapped
        inner = handler.unary_unary
        if not asyncio.iscoroutinefunction(inner):
            return handler
        gauge, record = self._metrics.method_recorder(*_split_method(handler_call_details.method))

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            gauge.inc()
            error: BaseException | None = None
            try:
                return await inner(request, context)
            except BaseException as e:  # re-raised; only observed for the status label
                error = e
                raise
            finally:
                gauge.dec()
                record(_code_of(context, error), time.perf_counter() - started)

        wrapped = _replace_behaviour(handler, unary)
        self._wrapped[handler_call_details.method] = (handler, wrapped)
        return wrapped


    def _timed_stream(self, handler: Any, method: str) -> Any:
        inner = handler.stream_stream
        gauge, record = self._metrics.method_recorder(*_split_method(method))

        async def stream(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            arrived: list[float] = []

            async def requests() -> AsyncIterator[Any]:
                async for request in request_iterator:
                    arrived.append(time.perf_counter())
                    gauge.inc()
                    yield request
            error: BaseException | None = None
            try:
                async for response in inner(requests(), context):
                    if arrived:
                        gauge.dec()
                        record(grpc.StatusCode.OK.name, time.perf_counter() - arrived.pop(0))
                    yield response
            except BaseException as e:  # re-raised; only observed for the status label
                error = e
                raise
            finally:
                # Requests the stream ended without answering: counted with the status that ended it
                # (a ProduceStream refused RESOURCE_EXHAUSTED, a cancelled follower stream), as the
                # unary call each stands for would have been.
                code = None if error is None else grpc.StatusCode.CANCELLED.name if isinstance(
                    error, (asyncio.CancelledError, GeneratorExit)) else _code_of(context, error)
                now = time.perf_counter()
                for started in arrived:
                    gauge.dec()
                    if code is not None:
                        record(code, now - started)

        return _replace_behaviour(handler, stream)


def _replace_behaviour(handler: Any, behaviour: Callable[..., Any]) -> Any:
    kinds = (handler.request_streaming, handler.response_streaming)
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[kinds]
    return make(behaviour, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


# ----------------------------------------------------------------------------- stats collectors


class _SafeCollector(Collector):
    """A collector that never fails a scrape: a role's stats() error drops its families only."""

    name = "stats"

    def collect(self) -> Iterable[Metric]:
        try:
            return list(self._collect())
        except Exception:  # a broken stats() must not take the whole /metrics page down
            log.exception("metrics: collecting %s stats failed", self.name)
            return []

    def _collect(self) -> Iterable[Metric]:
        raise NotImplementedError


class PoolCollector(_SafeCollector):
    """The broker's request executors: threads and tasks waiting for one (saturation)."""

    name = "pools"

    def __init__(self, stats: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self._stats = stats

    def _collect(self) -> Iterable[Metric]:
        threads = GaugeMetricFamily("brook_request_pool_threads", "Threads of a broker request pool.",
                                    labels=["pool"])
        queued = GaugeMetricFamily("brook_request_pool_queued_tasks",
                                   "Requests waiting for a free thread of the pool (saturated when > 0).",
                                   labels=["pool"])
        for pool, (n, waiting) in sorted(self._stats().items()):
            threads.add_metric([pool], float(n))
            queued.add_metric([pool], float(waiting))
        yield threads
        yield queued


class BudgetCollector(_SafeCollector):
    """The broker's byte budget (queued.max.request.bytes) and who holds fetch answers in it."""

    name = "budget"

    def __init__(self, stats: Callable[[], tuple[int, int, int]]) -> None:
        self._stats = stats

    def _collect(self) -> Iterable[Metric]:
        held, limit, clients = self._stats()
        yield GaugeMetricFamily("brook_request_budget_bytes",
                                "Bytes of client produce requests being handled and fetch answers being read or not "
                                "yet written out to their clients (at most brook_request_budget_limit_bytes).",
                                value=float(held))
        yield GaugeMetricFamily("brook_request_budget_limit_bytes", "queued.max.request.bytes.", value=float(limit))
        yield GaugeMetricFamily("brook_fetch_clients_holding_bytes",
                                "Client addresses with fetch answers being read or not yet written out "
                                "(each holds at most max.fetch.response.bytes.per.ip).", value=float(clients))


class CpuShareCollector(_SafeCollector):
    """Requests held to their address's share of the broker's interpreter (broker/cpu_shares.py)."""

    name = "cpu_shares"

    def __init__(self, shares: Callable[[], Any]) -> None:
        self._shares = shares

    def _collect(self) -> Iterable[Metric]:
        cpu = self._shares()
        if cpu is None:
            return
        yield CounterMetricFamily("brook_requests_throttled",
                                  "Client requests that waited before they started: their address was over "
                                  "request.cpu.max.percent.per.ip while other addresses had requests too.",
                                  value=float(cpu.throttled_total))
        yield CounterMetricFamily("brook_request_throttle_seconds",
                                  "Time those requests waited, in all.", value=float(cpu.throttle_seconds_total))
        yield GaugeMetricFamily("brook_request_throttled_addresses",
                                "Client addresses whose requests now go one at a time, over their share.",
                                value=float(cpu.held_addresses()))


class ReceiveCollector(_SafeCollector):
    """The broker's gRPC receive gate (broker/receiving.py): request messages being received, calls
    waiting for their turn, and request streams open."""

    name = "receive"

    def __init__(self, stats: Callable[[], ReceiveStats]) -> None:
        self._stats = stats

    def _collect(self) -> Iterable[Metric]:
        s = self._stats()
        yield GaugeMetricFamily("brook_receiving_requests",
                                "gRPC request messages being received (at most brook_receiving_requests_limit).",
                                value=float(s.receiving))
        yield GaugeMetricFamily("brook_receiving_requests_limit",
                                "max.receiving.requests, for clients and for followers together.", value=float(s.limit))
        yield GaugeMetricFamily("brook_receive_waiting_requests",
                                "gRPC calls waiting, unread, for their turn to be received.", value=float(s.waiting))
        yield CounterMetricFamily("brook_receive_refused",
                                  "gRPC calls refused before their message was read: too many waiting from their "
                                  "address, or no turn within request.receive.timeout.ms.", value=float(s.refused_total))
        yield CounterMetricFamily("brook_receive_timeouts",
                                  "gRPC calls ended because their message did not arrive within "
                                  "request.receive.timeout.ms, or no turn came.", value=float(s.timed_out_total))
        yield GaugeMetricFamily("brook_request_streams_open", "ProduceStream, FetchStream and ReplicaFetch calls open.",
                                value=float(s.streams_open))
        yield CounterMetricFamily("brook_request_streams_refused",
                                  "Request streams refused by max.request.streams.per.ip, max.produce.streams or max.fetch.streams.",
                                  value=float(s.streams_refused_total))


class PauseCollector(_SafeCollector):
    """What holds up every request of the node (broker.stalls): the broker's event loop lag and
    stalls, and garbage collection pauses by generation."""

    name = "pauses"

    def __init__(self, loop_monitor: Callable[[], LoopMonitor | None], gc_pauses: GcPauses) -> None:
        self._loop_monitor = loop_monitor
        self._gc = gc_pauses

    def _collect(self) -> Iterable[Metric]:
        monitor = self._loop_monitor()
        if monitor is not None:
            yield _histogram("brook_event_loop_lag_seconds",
                             "How late the broker's event loop ran a timer (probed every 50 ms): the wait for the "
                             "loop that every request ready at that moment had beyond its own work.", monitor.lag)
            yield CounterMetricFamily("brook_event_loop_stalls",
                                      "Times the broker's event loop ran event.loop.stall.warn.ms or more late "
                                      "(each logged at WARNING, with the loop's stack while it lasted).",
                                      value=monitor.stalls_total)
        pauses = HistogramMetricFamily("brook_gc_pause_seconds",
                                       "Garbage collections of this process, by generation: every thread stops "
                                       "for their duration.", labels=["generation"])
        for generation, histogram in enumerate(self._gc.by_generation):
            cumulative, total, _ = histogram.snapshot()
            pauses.add_metric([str(generation)], [(floatToGoString(b), n) for b, n in cumulative], sum_value=total)
        yield pauses


class ReplicationListenerCollector(_SafeCollector):
    """The replication listener (broker/replication_listener.py): followers' connections and fetches."""

    name = "replication_listener"

    def __init__(self, listener: Callable[[], Any]) -> None:
        self._listener = listener

    def _collect(self) -> Iterable[Metric]:
        lst = self._listener()
        if lst is None:
            return
        st = lst.stats
        yield GaugeMetricFamily("brook_replication_connections", "Followers' open connections to the replication "
                                "listener.", value=float(st.connections))
        for key, name, doc in (
                ("connections_total", "brook_replication_connections_accepted", "Connections accepted."),
                ("refused_connections_total", "brook_replication_connections_refused",
                 "Connections closed before a request was read: over a bound, or not from a node."),
                ("closed_for_errors_total", "brook_replication_connections_broken",
                 "Connections closed for a frame that broke the protocol (length, magic, not a FetchRequest)."),
                ("requests_total", "brook_replication_fetches", "Follower fetches answered.")):
            yield CounterMetricFamily(name, doc, value=float(getattr(st, key)))
        bar = lst.bar
        yield CounterMetricFamily("brook_replication_address_bars", "Addresses barred from the replication listener "
                                  "(their new connections dropped by the kernel) for connecting again and again at "
                                  "their bound.", value=float(bar.bars_total if bar is not None else 0))
        yield GaugeMetricFamily("brook_replication_barred_addresses", "Addresses barred from the replication "
                                "listener now.", value=float(len(bar.barred) if bar is not None else 0))


def _roles_up(getters: Mapping[str, Callable[[], Any]]) -> list[tuple[str, Any]]:
    """(role, its object) of the roles whose object exists yet (a role's getter gives None until it starts)."""
    return [(role, obj) for role, get in getters.items() if (obj := get()) is not None]


class GrpcConnectionsCollector(_SafeCollector):
    """max.connections.per.ip on each role's gRPC ports (broker/grpc_connections.py): connections closed,
    addresses barred (broker/address_bar.py).
    ``bounds``: {role: its PerAddressConnections, None until it starts}; one family for every role (as
    ``SecurityCollector``)."""

    name = "grpc_connections"

    def __init__(self, bounds: Mapping[str, Callable[[], Any]]) -> None:
        self._bounds = bounds

    def _collect(self) -> Iterable[Metric]:
        up = _roles_up(self._bounds)
        if not up:
            return
        closed = CounterMetricFamily("brook_grpc_connections_closed_per_ip",
                                     "gRPC connections closed because their client address had more than "
                                     "max.connections.per.ip open on the role's ports.", labels=["role"])
        bars = CounterMetricFamily("brook_grpc_address_bars",
                                   "Client addresses barred from the role's gRPC ports (their new connections "
                                   "dropped by the kernel) after opening more than max.connections.per.ip.",
                                   labels=["role"])
        barred = GaugeMetricFamily("brook_grpc_barred_addresses",
                                   "Client addresses barred from the role's gRPC ports now.", labels=["role"])
        for role, bound in up:
            closed.add_metric([role], float(bound.closed_total))
            bars.add_metric([role], float(bound.bar.bars_total))
            barred.add_metric([role], float(len(bound.bar.barred)))
        yield closed
        yield bars
        yield barred


class KafkaListenerCollector(_SafeCollector):
    """The Kafka-protocol listeners (broker/kafka_wire): connections, requests, refusals, sendfile bytes."""

    name = "kafka_listener"

    def __init__(self, listeners: Callable[[], Sequence[Any]]) -> None:
        self._listeners = listeners

    def _collect(self) -> Iterable[Metric]:
        conns = GaugeMetricFamily("brook_kafka_connections", "Open connections of a Kafka-protocol listener.",
                                  labels=["listener"])
        families = {
            "connections_total": ("brook_kafka_connections_accepted", "Connections accepted."),
            "refused_connections_total": ("brook_kafka_connections_refused",
                                          "Connections closed at accept (max.connections or max.connections.per.ip reached)."),
            "malformed_requests_total": ("brook_kafka_malformed_requests",
                                         "Requests that could not be read, or of an API or version not served; "
                                         "each closed its connection."),
            "authentication_failures_total": ("brook_kafka_authentication_failures",
                                              "Failed SASL authentications, requests before authentication, and failed TLS handshakes "
                                              "(a client certificate the listener does not trust, or none)."),
            "sendfile_bytes_total": ("brook_kafka_sendfile_bytes", "Record bytes sent from segment files by sendfile."),
            "sendfile_fallbacks_total": ("brook_kafka_sendfile_fallbacks",
                                         "Segment slices sent through a buffer because sendfile failed."),
        }
        counters = {k: CounterMetricFamily(n, h, labels=["listener"]) for k, (n, h) in families.items()}
        requests = CounterMetricFamily("brook_kafka_requests", "Requests answered, by API key.",
                                       labels=["listener", "api_key"])
        held = GaugeMetricFamily("brook_kafka_request_bytes", "Bytes of request frames being read or handled "
                                 "(bounded by queued.max.request.bytes).", labels=["listener"])
        bars = CounterMetricFamily("brook_kafka_address_bars", "Client addresses barred from a Kafka listener (their "
                                   "new connections dropped by the kernel) for connecting again and again at their "
                                   "max.connections.per.ip.", labels=["listener"])
        barred = GaugeMetricFamily("brook_kafka_barred_addresses", "Client addresses barred from a Kafka listener now.",
                                   labels=["listener"])
        sessions = GaugeMetricFamily("brook_kafka_fetch_sessions", "Incremental fetch sessions (KIP-227) cached "
                                     "(at most 1,000 a listener, as Kafka's max.incremental.fetch.session.cache.slots).",
                                     labels=["listener"])
        session_parts = GaugeMetricFamily("brook_kafka_fetch_session_partitions", "Partitions the incremental fetch "
                                          "sessions hold between them.", labels=["listener"])
        evictions = CounterMetricFamily("brook_kafka_fetch_session_evictions", "Fetch sessions evicted to make room "
                                        "for another (Kafka's IncrementalFetchSessionEvictionsPerSec).",
                                        labels=["listener"])
        for lst in self._listeners():
            st = lst.stats
            cache = lst.apis.fetch_sessions
            sessions.add_metric([lst.spec.name], float(len(cache)))
            session_parts.add_metric([lst.spec.name], float(cache.partitions))
            evictions.add_metric([lst.spec.name], float(cache.evictions_total))
            conns.add_metric([lst.spec.name], float(st.connections))
            held.add_metric([lst.spec.name], float(lst.frame_budget.used_bytes))
            bar = lst.bar
            bars.add_metric([lst.spec.name], float(bar.bars_total if bar is not None else 0))
            barred.add_metric([lst.spec.name], float(len(bar.barred) if bar is not None else 0))
            for key, fam in counters.items():
                fam.add_metric([lst.spec.name], float(getattr(st, key)))
            for api_key, n in sorted(st.requests_by_api.items()):
                requests.add_metric([lst.spec.name, str(api_key)], float(n))
        yield conns
        yield held
        yield from counters.values()
        yield requests
        yield bars
        yield barred
        yield sessions
        yield session_parts
        yield evictions


class BrokerCollector(_SafeCollector):
    """Partition-level and per-topic families from ``ReplicaManager.stats()``."""

    name = "broker"

    def __init__(self, replica_manager: Callable[[], Any], log_dirs: Sequence[Path] = ()) -> None:
        self._replica_manager = replica_manager
        self._log_dirs = list(log_dirs)

    def _collect(self) -> Iterable[Metric]:
        rm = self._replica_manager()
        parts: list[PartitionStats] = list(rm.stats()) if rm is not None else []
        by_topic: dict[str, dict[str, float]] = {}
        size = GaugeMetricFamily("brook_log_size_bytes", "Bytes on disk of a partition's log.",
                                 labels=["topic", "partition"])
        leo = GaugeMetricFamily("brook_log_end_offset", "Log end offset of a partition replica.",
                                labels=["topic", "partition"])
        lso = GaugeMetricFamily("brook_log_start_offset", "Log start offset of a partition replica.",
                                labels=["topic", "partition"])
        hw = GaugeMetricFamily("brook_partition_high_watermark", "High watermark of a partition replica.",
                               labels=["topic", "partition"])
        isr = GaugeMetricFamily("brook_partition_isr_size", "ISR size of a partition this broker leads.",
                                labels=["topic", "partition"])
        leaders = under = under_min = shrinks = expands = 0.0
        for p in parts:
            topic, partition = p.topic, str(p.partition)
            size.add_metric([topic, partition], p.size_bytes)
            leo.add_metric([topic, partition], p.leo)
            lso.add_metric([topic, partition], p.log_start)
            hw.add_metric([topic, partition], p.hw)
            t = by_topic.setdefault(topic, {"msgs": 0.0, "in": 0.0, "out": 0.0, "invalid": 0.0})
            t["msgs"] += p.messages_in_total
            t["in"] += p.bytes_in_total
            t["out"] += p.bytes_out_total
            t["invalid"] += p.invalid_appends_total
            shrinks += p.isr_shrinks_total
            expands += p.isr_expands_total
            if p.is_leader:
                leaders += 1
                isr.add_metric([topic, partition], len(p.isr))
                under += p.under_replicated
                under_min += p.under_min_isr
        msgs = CounterMetricFamily("brook_topic_messages_in", "Records appended to partitions this broker leads.",
                                   labels=["topic"])
        bin_ = CounterMetricFamily("brook_topic_bytes_in", "Record batch bytes appended as leader.",
                                   labels=["topic"])
        bout = CounterMetricFamily("brook_topic_bytes_out", "Record batch bytes served to consumers (follower fetches excluded, as in Kafka).",
                                   labels=["topic"])
        invalid = CounterMetricFamily(
            "brook_topic_failed_produce_batches",
            "Produce appends refused by record validation (CORRUPT_MESSAGE, INVALID_RECORD, MESSAGE_TOO_LARGE).",
            labels=["topic"])
        for topic, t in sorted(by_topic.items()):
            msgs.add_metric([topic], t["msgs"])
            bin_.add_metric([topic], t["in"])
            bout.add_metric([topic], t["out"])
            invalid.add_metric([topic], t["invalid"])
        yield from (msgs, bin_, bout, invalid, size, leo, lso, hw, isr)
        yield GaugeMetricFamily("brook_partitions", "Partition replicas hosted by this broker.", value=len(parts))
        yield GaugeMetricFamily("brook_leader_partitions", "Partitions this broker leads.", value=leaders)
        yield GaugeMetricFamily("brook_under_replicated_partitions",
                                "Led partitions whose ISR is smaller than the replica set.", value=under)
        yield GaugeMetricFamily("brook_under_min_isr_partitions",
                                "Led partitions whose ISR is below min.insync.replicas.", value=under_min)
        yield CounterMetricFamily("brook_isr_shrinks", "Replicas removed from ISRs of led partitions.",
                                  value=shrinks)
        yield CounterMetricFamily("brook_isr_expands", "Replicas added back to ISRs of led partitions.",
                                  value=expands)
        if rm is not None:
            delayed = GaugeMetricFamily(
                "brook_purgatory_delayed_operations",
                "Requests waiting in a purgatory now (Kafka's NumDelayedOperations): acks=all produces for "
                "the HW, follower and consumer fetches parked for data.", labels=["operation"])
            for kind, n in sorted(rm.delayed_operations().items()):
                delayed.add_metric([kind], float(n))
            yield delayed
            yield from _produce_time_families(rm.produce_times)
            throttle = rm.fetchers.config.throttle
            yield GaugeMetricFamily("brook_replication_throttle_rate_bytes",
                                    "follower.replication.throttled.rate in force (0: no limit).",
                                    value=float(throttle.rate or 0))
            yield CounterMetricFamily("brook_replication_throttled_seconds",
                                      "Time out-of-sync partitions sat out fetches to keep the copy throttle.",
                                      value=throttle.throttled_seconds_total)
            yield CounterMetricFamily("brook_replication_listener_fallbacks",
                                      "Times this broker's follower fetches from a leader went over to its gRPC "
                                      "ReplicaFetch stream because the leader's replication listener could not "
                                      "be reached (once until the listener answers again).",
                                      value=float(rm.fetchers.stats.listener_fallbacks_total))
        yield from self._disk()
        if rm is not None:
            yield self._stray(rm.log_manager.stray_logs())
            yield GaugeMetricFamily("brook_log_cleaner_uncleanable_partitions",
                                    "Compacted partitions the cleaner stopped at a corrupt batch (Kafka's "
                                    "uncleanable-partitions-count): not compacted until their log is opened again.",
                                    value=float(len(rm.log_manager.cleaner.uncleanable())))
            scrub = rm.log_manager.scrubber.stats
            for name, doc, value in (
                    ("passes", "Passes of the log scrubber over every log.", scrub.passes_total),
                    ("bytes", "Bytes of closed segments the log scrubber read.", scrub.bytes_total),
                    ("batches", "Batches the log scrubber checked.", scrub.batches_total),
                    ("corrupt_batches", "Corrupt batches the log scrubber found (each handled as any reader's "
                                        "find: repaired from in-sync replicas, or reported).",
                     scrub.corrupt_batches_total)):
                yield CounterMetricFamily(f"brook_log_scrubber_{name}", doc, value=float(value))

    def _stray(self, stray: list[Path]) -> Metric:
        family = GaugeMetricFamily("brook_log_dir_stray_logs", "Stray logs set aside in a log directory (a "
                                   "snapshot of the metadata did not place them here): kept until an operator "
                                   "removes them.", labels=["dir"])
        by_dir = {str(d): 0 for d in self._log_dirs}
        for path in stray:
            by_dir[str(path.parent)] = by_dir.get(str(path.parent), 0) + 1
        for d, n in by_dir.items():
            family.add_metric([d], n)
        return family

    def _disk(self) -> Iterable[Metric]:
        free = GaugeMetricFamily("brook_log_dir_free_bytes", "Free bytes on a log directory's filesystem.",
                                 labels=["dir"])
        total = GaugeMetricFamily("brook_log_dir_capacity_bytes", "Size of a log directory's filesystem.",
                                  labels=["dir"])
        for d in self._log_dirs:
            try:
                usage = shutil.disk_usage(d)
            except OSError:
                continue  # a missing or failed dir shows as an absent series, which alerts via absent()
            free.add_metric([str(d)], usage.free)
            total.add_metric([str(d)], usage.total)
        yield free
        yield total


def _histogram(name: str, documentation: str, histogram: LatencyHistogram) -> HistogramMetricFamily:
    cumulative, total, _ = histogram.snapshot()
    return HistogramMetricFamily(name, documentation, sum_value=total,
                                 buckets=[(floatToGoString(bound), count) for bound, count in cumulative])


def _produce_time_families(times: ProduceTimes) -> Iterable[Metric]:
    """Kafka's RequestMetrics LocalTimeMs and RemoteTimeMs of Produce (see broker.request_times)."""
    yield _histogram("brook_produce_local_time_seconds",
                     "Produce requests led here: time from the handler's start to every partition appended "
                     "(validation, writes, waits for the I/O executor or a partition lock).", times.local)
    yield _histogram("brook_produce_remote_time_seconds",
                     "acks=all produce requests led here: time from the appends to the high watermark passing "
                     "them (the in-sync followers fetching the records), or to the request's timeout.", times.remote)


class ControllerCollector(_SafeCollector):
    """Quorum and cluster families from ``ControllerNode.stats()``."""

    name = "controller"

    def __init__(self, controller: Callable[[], Any]) -> None:
        self._controller = controller

    def _collect(self) -> Iterable[Metric]:
        node = self._controller()
        if node is None:
            return
        s = node.stats()
        gauges = [
            ("brook_controller_active", "1 when this node is the active controller (Raft leader).", "is_active"),
            ("brook_raft_leader_id", "Node id of the Raft leader this controller knows (-1 none).", "leader_id"),
            ("brook_raft_term", "Current Raft term.", "term"),
            ("brook_raft_commit_index", "Raft commit index.", "commit_index"),
            ("brook_raft_last_applied", "Last Raft log index applied to the metadata state.", "last_applied"),
            ("brook_metadata_version", "Version of the metadata state (bumped per applied command).",
             "metadata_version"),
            ("brook_fenced_brokers", "Registered brokers that are fenced.", "fenced_brokers"),
            ("brook_offline_partitions", "Partitions without a leader.", "offline_partitions"),
            ("brook_cluster_brokers", "Registered brokers.", "brokers"),
            ("brook_cluster_topics", "Topics in the cluster.", "topics"),
            ("brook_cluster_partitions", "Partitions in the cluster.", "partitions"),
        ]
        for name, doc, attr in gauges:
            yield GaugeMetricFamily(name, doc, value=float(getattr(s, attr)))
        if s.raft_tick_gaps is not None:
            yield _histogram("brook_raft_tick_gap_seconds",
                             "Time between two runs of this controller's Raft tick thread (it sends heartbeats and "
                             "answers votes; at most ~50 ms apart when healthy).", s.raft_tick_gaps)
            if s.raft_journal_flushes is not None:
                yield _histogram("brook_raft_journal_flush_seconds",
                                 "Time to flush this controller's Raft journal (msync) before it sends anything that "
                                 "counts new entries (etcd's wal_fsync_duration): every message waits for it.",
                                 s.raft_journal_flushes)
            yield CounterMetricFamily("brook_raft_connections_refused",
                                      "Connections to this controller's quorum port that held the quorum password and "
                                      "were closed for what they said they were: a pysyncobj admin command, a readonly "
                                      "node, a voter this one dials itself, no voter, or a Raft message it cannot read "
                                      "(each logged, throttled).",
                                      value=s.raft_connections_refused)
            yield CounterMetricFamily("brook_raft_tick_stalls",
                                      "Raft tick gaps of half the shortest election timeout or more (each logged at "
                                      "WARNING): as leader, heartbeats were late enough for an election.",
                                      value=s.raft_tick_stalls)
            rounds = CounterMetricFamily(
                "brook_raft_pre_vote_rounds", "Pre-vote rounds this voter ran before an election (it asks whether it "
                "could win without taking a term). Lost rounds that keep coming mean it cannot hear the leader the "
                "others hear: its link to the leader is cut.", labels=["result"])
            rounds.add_metric(["won"], s.pre_vote_rounds_won)
            rounds.add_metric(["lost"], s.pre_vote_rounds - s.pre_vote_rounds_won)
            yield rounds
        yield CounterMetricFamily("brook_controller_receive_refused",
                                  "Calls to the controller's gRPC server refused unread: their client address had "
                                  "as many request messages being received as it may.", value=float(s.receive_refused))
        yield CounterMetricFamily("brook_controller_receive_timeouts",
                                  "Calls to the controller's gRPC server cancelled because their request message "
                                  "had not arrived in time after a worker took them.", value=float(s.receive_cancelled))
        yield CounterMetricFamily("brook_controller_client_calls_refused",
                                  "Calls from clients (not the cluster's nodes) refused by the controller's gRPC "
                                  "server because only the workers kept for the nodes were free.",
                                  value=float(s.client_calls_refused))
        yield GaugeMetricFamily("brook_controller_calls_served",
                                "Calls the controller's gRPC server is serving (each holds one of its workers).",
                                value=float(s.calls_served))
        cut_off = CounterMetricFamily(
            "brook_controller_cut_off_from_brokers",
            "Times this voter, as the active controller, heard no broker for half a session and asked the other "
            "voters whether brokers reach them: it handed Raft leadership to one that did (outcome=handed_over), or "
            "none did and it fenced the brokers it missed (outcome=fenced).", labels=["outcome"])
        cut_off.add_metric(["handed_over"], float(s.cut_off_handed_over))
        cut_off.add_metric(["fenced"], float(s.cut_off_fenced))
        yield cut_off
        throttled = CounterMetricFamily(
            "brook_controller_mutations_throttled",
            "Partition mutations (created, added or deleted partitions) over a principal's controller_mutation_rate "
            "quota: refused with THROTTLING_QUOTA_EXCEEDED (mode=strict), or accepted from an older Kafka client "
            "with only throttle_time_ms set (mode=permissive).", labels=["mode"])
        throttled.add_metric(["strict"], float(s.mutations_throttled))
        throttled.add_metric(["permissive"], float(s.mutations_over_quota))
        yield throttled
        if s.is_active:
            yield from self._voters(node)

    @staticmethod
    def _voters(node: Any) -> Iterable[Metric]:
        """Per-voter replication state, as the Raft leader sees it (only the active controller knows)."""
        service = getattr(node, "service", None)
        describe = getattr(service, "describe_quorum", None)
        if describe is None:
            return
        q = describe()
        lag = GaugeMetricFamily("brook_raft_voter_lag", "Raft entries a voter trails the leader by.",
                                labels=["voter"])
        connected = GaugeMetricFamily("brook_raft_voter_connected",
                                      "1 when the leader has a live quorum connection to the voter.", labels=["voter"])
        caught_up = GaugeMetricFamily("brook_raft_voter_last_caught_up_seconds",
                                      "Seconds since the voter was last caught up with the commit index (-1 never).",
                                      labels=["voter"])
        for v in q.voters:
            label = [str(v.node_id)]
            lag.add_metric(label, float(v.lag))
            connected.add_metric(label, 1.0 if v.connected or v.is_leader else 0.0)
            caught_up.add_metric(label, -1.0 if v.last_contact_ms_ago < 0 else v.last_contact_ms_ago / 1000)
        yield lag
        yield connected
        yield caught_up


class GroupCollector(_SafeCollector):
    """Consumer group families from ``GroupCoordinator.stats()`` (``GroupCoordinatorStats``)."""

    name = "groups"

    def __init__(self, coordinator: Callable[[], Any]) -> None:
        self._coordinator = coordinator

    def _collect(self) -> Iterable[Metric]:
        coord = self._coordinator()
        if coord is None:
            return
        s = coord.stats()
        states = GaugeMetricFamily("brook_consumer_groups", "Consumer groups this broker coordinates, by state.",
                                   labels=["state"])
        for state, count in sorted(s.groups_by_state.items()):
            states.add_metric([state], count)
        yield states
        consumer = GaugeMetricFamily("brook_consumer_protocol_groups",
                                     "Groups of Kafka's consumer protocol (KIP-848) this broker coordinates, by state "
                                     "(not in brook_consumer_groups).", labels=["state"])
        for state, count in sorted(s.consumer_groups_by_state.items()):
            consumer.add_metric([state], count)
        yield consumer
        yield GaugeMetricFamily("brook_consumer_protocol_members",
                                "Members of those groups (each heartbeats ConsumerGroupHeartbeat).",
                                value=s.consumer_group_members)
        committed = GaugeMetricFamily("brook_consumer_group_committed_offset",
                                      "Committed offset of a group on a partition.",
                                      labels=["group", "topic", "partition"])
        lag = GaugeMetricFamily("brook_consumer_group_lag", "High watermark minus committed offset (records).",
                                labels=["group", "topic", "partition"])
        for row in s.offsets:
            if row.lag < 0:
                continue  # the partition's end offset is not known yet: no lag to report
            labels = [row.group, row.topic, str(row.partition)]
            committed.add_metric(labels, row.committed_offset)
            lag.add_metric(labels, row.lag)
        yield committed
        yield lag
        yield GaugeMetricFamily("brook_consumer_group_lag_rows_left_out",
                                "Group-partition rows with a known lag not shown above (group.lag.metrics.max.series "
                                "shows the largest lags).", value=s.offsets_left_out)


class SecurityCollector(_SafeCollector):
    """Authorization denials, SCRAM outcomes and quota throttling of each role (broker.security.NodeSecurity),
    ``roles``: {role: its NodeSecurity, None until it starts}. One collector for every role of a node: a metric
    family may appear once on a page, and a combined node's two families of one name made its OpenMetrics
    exposition (the format Prometheus asks for) invalid ("Clashing name")."""

    name = "security"

    def __init__(self, roles: Mapping[str, Callable[[], Any]]) -> None:
        self._roles = roles

    def _collect(self) -> Iterable[Metric]:
        up = _roles_up(self._roles)
        if not up:
            return
        denied = CounterMetricFamily("brook_authorization_denied", "Requests (or parts) refused by the authorizer.",
                                     labels=["role", "resource_type", "operation"])
        auth = CounterMetricFamily("brook_sasl_authentications", "SASL/SCRAM exchanges, by result.",
                                   labels=["role", "result"])
        revoked = CounterMetricFamily(
            "brook_sasl_sessions_revoked", "SASL sessions and Kafka-listener connections ended because their user "
            "was deleted or its password changed.", labels=["role"])
        certificates = CounterMetricFamily(
            "brook_tls_connections_revoked", "Connections ended because the listener's CA bundle no longer trusts "
            "their client certificate.", labels=["role"])
        quotas: dict[str, list[float]] = {}  # quota kind -> [throttled responses, throttle ms]: brokers' only
        for role, sec in up:
            for (rtype, operation), count in sorted(sec.authorizer.denied_total().items()):
                denied.add_metric([role, rtype, operation], count)
            auth.add_metric([role, "success"], sec.authenticator.succeeded_total)
            auth.add_metric([role, "failure"], sec.authenticator.failed_total)
            revoked.add_metric([role], sec.authenticator.revoked_total)
            certificates.add_metric([role], sec.certificates_revoked_total)
            for kind, stats in (sec.quotas.stats.items() if sec.quotas is not None else ()):
                sums = quotas.setdefault(kind, [0.0, 0.0])
                sums[0] += stats.throttled_responses
                sums[1] += stats.throttle_ms_total
        yield denied
        yield auth
        yield revoked
        yield certificates
        if not any(sec.quotas is not None for _, sec in up):
            return
        throttled = CounterMetricFamily("brook_quota_throttled_responses", "Responses with throttle_time_ms > 0.",
                                        labels=["quota"])
        throttle_ms = CounterMetricFamily("brook_quota_throttle_time_ms", "Throttle time handed out (ms).",
                                          labels=["quota"])
        for kind, (responses, ms) in sorted(quotas.items()):
            throttled.add_metric([kind], responses)
            throttle_ms.add_metric([kind], ms)
        enforced = CounterMetricFamily(
            "brook_quota_enforced_requests", "Produce and fetch requests (and older Kafka clients' topic mutations) "
            "that came before their principal's throttle time was over: held until it was (a stream, a Kafka "
            "connection) or refused (a unary gRPC call).",
            labels=["action"])
        enforced.add_metric(["held"], sum(sec.quotas.held_total for _, sec in up if sec.quotas is not None))
        enforced.add_metric(["refused"], sum(sec.quotas.refused_total for _, sec in up if sec.quotas is not None))
        yield throttled
        yield throttle_ms
        yield enforced


class NodeInfoCollector(Collector):
    def __init__(self, node_id: int, roles: Sequence[str], cluster_id: str) -> None:
        self._labels = [str(node_id), ",".join(roles), cluster_id]

    def collect(self) -> Iterable[Metric]:
        info = GaugeMetricFamily("brook_node_info", "Constant 1, labelled with this node's identity.",
                                 labels=["node_id", "roles", "cluster_id"])
        info.add_metric(self._labels, 1)
        yield info


# ----------------------------------------------------------------------------- the node's metrics


@dataclass
class NodeMetrics:
    """The registry of one node, its RPC interceptor, and the /metrics HTTP server."""

    registry: CollectorRegistry
    rpc: RpcMetrics
    interceptor: MetricsInterceptor
    aio_interceptor: AioMetricsInterceptor
    _httpd: BoundedHTTPServer | None = None

    @classmethod
    def create(cls, node_id: int, roles: Sequence[str], cluster_id: str) -> NodeMetrics:
        # Counters' *_created series double the page size for no operational use.
        disable_created_metrics()
        registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        registry.register(NodeInfoCollector(node_id, roles, cluster_id))
        rpc = RpcMetrics(registry)
        return cls(registry=registry, rpc=rpc, interceptor=MetricsInterceptor(rpc),
                   aio_interceptor=AioMetricsInterceptor(rpc))

    def add(self, collector: Collector) -> None:
        self.registry.register(collector)

    def serve(self, host: str, port: int, tls: dict[str, Any] | None = None,
              may_scrape: Callable[[Any], bool] | None = None) -> int:
        """Serve /metrics on host:port (0 picks a free port); returns the bound port.

        ``tls``: certfile/keyfile (and client_cafile + client_auth_required for mTLS) for HTTPS;
        None serves plain HTTP. The server is broker.http_serving's: bounded in connections and
        threads, each connection within a deadline (a scrape takes milliseconds).
        ``may_scrape``: whether the caller's principal (its verified client certificate's, else
        ANONYMOUS; broker.console.principal_of_socket) may read the page (403 otherwise); None: anyone.
        """
        context = None if tls is None else tls_context(
            tls["certfile"], tls["keyfile"], tls.get("client_cafile"), bool(tls.get("client_auth_required")))
        self._httpd = BoundedHTTPServer((host, port), _metrics_handler(self.registry, may_scrape), name="metrics-http",
                                        tls=context, workers=METRICS_WORKERS, max_pending=METRICS_PENDING,
                                        per_address=METRICS_PER_ADDRESS, deadline_s=METRICS_DEADLINE_S)
        self._httpd.serve_in_thread()
        bound = int(self._httpd.server_address[1])
        log.info("metrics: serving /metrics on %s://%s:%d/metrics", "https" if tls else "http", host, bound)
        return bound

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.close()
            self._httpd = None


# The /metrics server's bounds (broker/http_serving.py): Prometheus scrapes one page at a time per
# server, and a page takes milliseconds to build.
METRICS_WORKERS = 2
METRICS_PENDING = 16
METRICS_PER_ADDRESS = 4
METRICS_DEADLINE_S = 10.0  # Prometheus' default scrape timeout


def _metrics_handler(registry: CollectorRegistry,
                     may_scrape: Callable[[Any], bool] | None = None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "brook-metrics"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if may_scrape is not None:
                # The page names every topic, partition and consumer group with their offsets, sizes and lags:
                # with an authorizer, only for a caller allowed DESCRIBE on the cluster (what Kafka's
                # DescribeLogDirs and ListGroups of every group need), as the console (found by an audit:
                # any caller, even without a client certificate, read it).
                from broker.console import principal_of_socket

                try:
                    caller = principal_of_socket(self.connection)
                    allowed = bool(may_scrape(caller))
                except Exception:  # a certificate no mapping rule accepts, or no authorizer yet
                    caller, allowed = "this caller", False
                if not allowed:
                    self._send(403, "text/plain; charset=utf-8",
                               f"{caller} may not DESCRIBE the cluster: /metrics needs that ACL\n".encode())
                    return
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self._send(404, "text/plain; charset=utf-8", b"not found: the metrics are at /metrics\n")
                return
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            body = encoder(registry)
            if gzip_accepted(self.headers.get("Accept-Encoding", "")):
                self._send(200, content_type, gzip.compress(body), gzipped=True)
            else:
                self._send(200, content_type, body)

        def _send(self, code: int, content_type: str, body: bytes, gzipped: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
            log.debug("metrics %s - %s", self.address_string(), format % args)

    return Handler


def stats_as_dict(stats: Any) -> dict[str, Any]:
    """A dataclass stats snapshot as a plain dict (for logging and tests)."""
    if is_dataclass(stats) and not isinstance(stats, type):
        return {f.name: getattr(stats, f.name) for f in fields(stats)}
    return dict(stats) if isinstance(stats, dict) else {}
