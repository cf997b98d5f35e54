"""The consumer's fetcher: pipelined Fetch requests (one in flight per broker, many partitions each)
and lazily decoded partition record buffers.

Requests go as messages of one FetchStream per broker (client/streams.py; unary Fetch calls to a
broker without one free); their completions land in a queue that the consumer's thread drains in
``poll()``. Right after handing records to the application the consumer sends the next fetches,
so the brokers work while the application processes (prefetch).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from client import errors
from client.cluster import ClusterClient, rpc_error
from client.streams import RequestStream, UnaryFallback
from client.types import ConsumerRecord, TopicPartition
from proto import broker_pb2
from storage.record_batch import ATTR_CONTROL, iter_batches
from storage.record_decode import decode_batch_tuples

log = logging.getLogger(__name__)

Deserializer = Callable[[bytes | None], Any]


@dataclass
class PartitionState:
    position: int | None = None  # next offset to hand to the application; None = to be resolved
    reset_to: int | None = None  # pending seek_to_beginning (-2) / seek_to_end (-1)
    paused: bool = False
    in_flight: bool = False
    backoff_until: float = 0.0
    high_watermark: int = -1
    log_start_offset: int = -1


class PartitionRecords:
    """Whole batches fetched for one partition, decoded one batch at a time as the app consumes.

    A batch is decoded straight into ConsumerRecord tuples (storage/record_decode.py: in C
    when the extension is built); ``take`` hands them out from the position on.
    """

    __slots__ = ("tp", "data", "batches", "current", "index", "increasing")

    def __init__(self, tp: TopicPartition, data: bytes) -> None:
        self.tp = tp
        self.data = data
        self.batches = iter_batches(data)
        self.current: list[ConsumerRecord] = []
        self.index = 0
        self.increasing = True  # offsets of `current` strictly increase

    def take(self, state: PartitionState, limit: int, key_des: Deserializer | None,
             value_des: Deserializer | None) -> list[ConsumerRecord]:
        """Up to ``limit`` records at or after the position; advances the position past them."""
        out: list[ConsumerRecord] = []
        while len(out) < limit:
            if self.index >= len(self.current):
                if not self._next_batch(state):
                    break
                continue
            position = state.position
            assert position is not None
            end = min(len(self.current), self.index + limit - len(out))
            chunk = self.current[self.index:end]
            self.index = end
            if not (self.increasing and chunk[0].offset >= position):
                # Records before the position (a fetch from inside a batch) are skipped.
                # With increasing offsets only the first chunk of a batch can hold any.
                chunk = [r for r in chunk if r.offset >= position]
            if key_des is None and value_des is None:
                out += chunk
            else:
                for r in chunk:
                    out.append(ConsumerRecord(
                        r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type,
                        key_des(r.key) if key_des else r.key,
                        value_des(r.value) if value_des else r.value, r.headers))
            if out:
                state.position = max(position, out[-1].offset + 1)
        return out

    def _next_batch(self, state: PartitionState) -> bool:
        # Finishing a batch moves the position past its last offset: compacted-away
        # offsets and control batches are not records to wait for.
        if self.current:
            last = self.current[-1].offset
            if state.position is not None and state.position <= last:
                state.position = last + 1
        self.current, self.index = [], 0
        topic, partition = self.tp
        for pos, header in self.batches:
            if state.position is not None and header.next_offset <= state.position:
                continue  # wholly before the position (e.g. fetched from inside a batch)
            if header.attributes & ATTR_CONTROL:
                state.position = max(state.position or 0, header.next_offset)
                continue
            _, records, self.increasing = decode_batch_tuples(self.data, pos, ConsumerRecord, topic, partition)
            self.current = records
            if not records:
                state.position = max(state.position or 0, header.next_offset)
                continue
            return True
        self.data = b""
        return False

    def take_raw(self, state: PartitionState) -> bytes:
        """All complete batches not wholly before the position; moves the position past them."""
        start = end = -1
        for pos, header in self.batches:
            if state.position is not None and header.next_offset <= state.position:
                continue
            if start < 0:
                start = pos
            end = pos + header.size
            state.position = header.next_offset
        data, self.data = self.data, b""
        return data[start:end] if start >= 0 else b""

    def exhausted(self) -> bool:
        return not self.data and self.index >= len(self.current)


@dataclass
class CompletedFetch:
    node: int
    offsets: dict[TopicPartition, int]  # what was asked, to drop answers made stale by seek()
    response: broker_pb2.FetchResponse | None
    error: errors.BrookError | None


class Fetcher:
    def __init__(self, cluster: ClusterClient, *, fetch_min_bytes: int, fetch_max_wait_ms: int,
                 fetch_max_bytes: int, max_partition_fetch_bytes: int, request_timeout_ms: int,
                 retry_backoff_ms: int) -> None:
        self.cluster = cluster
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.cond = threading.Condition()
        self.completed: deque[CompletedFetch] = deque()
        # One fetch per broker at a time: the stream it went on, or the unary call's future.
        self.in_flight: dict[int, RequestStream | concurrent.futures.Future[None]] = {}
        self._streams: dict[int, RequestStream] = {}
        # Broker quotas (KIP-219): no fetch to a broker before its last throttle_time_ms has passed.
        self.throttled_until: dict[int, float] = {}
        self.throttle_time_ms_total = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="brook-fetch")
        self._unary = UnaryFallback("FetchStream", self._pool, self._call_fetch, self._not_sent)

    def send_fetches(self, assignment: dict[TopicPartition, PartitionState],
                     buffered: dict[TopicPartition, PartitionRecords], timeout_ms: int | None = None) -> None:
        """Send a fetch to each leader of fetchable partitions that has none in flight. A metadata
        refresh this needs takes at most ``timeout_ms`` (what is left of the poll), and once one found
        no broker, the other partitions wait for the next poll rather than try again each."""
        now = time.monotonic()
        for node, stream in list(self._streams.items()):
            if stream.cancel_if_overdue(now):  # its fetch completes with the timeout
                del self._streams[node]
            elif node not in self.in_flight and stream.old():
                # Not used for a while (the broker leads none of our partitions any more): it would
                # hold one of the broker's max.fetch.streams and a thread here for nothing.
                stream.retire()
                del self._streams[node]
        by_node: dict[int, list[TopicPartition]] = {}
        no_broker = False
        for tp, st in assignment.items():
            if st.position is None or st.paused or st.in_flight or tp in buffered or now < st.backoff_until:
                continue
            if no_broker:
                st.backoff_until = now + self.retry_backoff_s
                continue
            try:
                node = self.cluster.leader_for(tp, timeout_ms=timeout_ms)
            except errors.BrookError as exc:
                if not exc.retriable:
                    raise
                self.cluster.request_update()
                st.backoff_until = now + self.retry_backoff_s
                no_broker = exc.code in (errors.ErrorCode.NETWORK_EXCEPTION, errors.ErrorCode.REQUEST_TIMED_OUT)
                continue
            if node not in self.in_flight and now >= self.throttled_until.get(node, 0.0):
                by_node.setdefault(node, []).append(tp)
        for node, tps in by_node.items():
            self._send(node, tps, assignment)

    def _send(self, node: int, tps: list[TopicPartition], assignment: dict[TopicPartition, PartitionState]) -> None:
        offsets = {tp: assignment[tp].position for tp in tps}
        request = broker_pb2.FetchRequest(
            replica_id=-1, replica_epoch=-1, max_wait_ms=self.fetch_max_wait_ms, min_bytes=self.fetch_min_bytes,
            max_bytes=self.fetch_max_bytes,
            partitions=[broker_pb2.FetchPartition(
                topic=tp.topic, partition=tp.partition, fetch_offset=offset,
                partition_max_bytes=self.max_partition_fetch_bytes, current_leader_epoch=-1,
                last_fetched_epoch=-1, log_start_offset=-1) for tp, offset in offsets.items()],
        )
        try:
            stub = self.cluster.broker_stub(node)
        except errors.BrookError as exc:
            self._complete(CompletedFetch(node, offsets, None, exc))  # type: ignore[arg-type]
            return
        for tp in tps:
            assignment[tp].in_flight = True
        if not self._unary.active(stub):
            stream = self._streams.get(node)
            if stream is not None and (stream.stub is not stub or stream.old()):
                stream.retire()  # idle (this broker has no fetch in flight): a new channel, or an old token
                stream = None
            if stream is None or not stream.send(offsets, request):
                # None yet, or it ended since the last fetch: a new one (its thread opens the stream).
                stream = self._streams[node] = RequestStream(
                    node, stub, "FetchStream", f"Fetch from broker {node}", self._timeout_s(), self._answered,
                    self._unary, name=f"brook-fetch-stream-{node}")
                if not stream.send(offsets, request):  # it ended at once (e.g. its channel closed)
                    stream = None
            if stream is not None:
                self.in_flight[node] = stream
                return
        self.in_flight[node] = self._pool.submit(self._call_fetch, node, offsets, stub, request)

    def _timeout_s(self) -> float:
        return (self.request_timeout_ms + self.fetch_max_wait_ms) / 1000

    def _not_sent(self, node: int, offsets: dict[TopicPartition, int], exc: Exception) -> None:
        self._complete(CompletedFetch(node, offsets, None, errors.error_for(
            errors.ErrorCode.NETWORK_EXCEPTION, f"Fetch from broker {node}: {exc}")))

    def _call_fetch(self, node: int, offsets: dict[TopicPartition, int], stub: Any,
                    request: broker_pb2.FetchRequest) -> None:
        """On a pool thread: blocking calls, so gRPC does not start a polling thread per fetch."""
        try:
            response = stub.Fetch(request, timeout=self._timeout_s())
        except grpc.RpcError as exc:
            self._complete(CompletedFetch(node, offsets, None, rpc_error(exc, f"Fetch from broker {node}")))
        except Exception as exc:  # cancelled on close
            self._complete(CompletedFetch(node, offsets, None, errors.error_for(
                errors.ErrorCode.NETWORK_EXCEPTION, f"Fetch from broker {node}: {exc!r}")))
        else:
            self._answered(node, offsets, response, None)

    def _answered(self, node: int, offsets: dict[TopicPartition, int], response: broker_pb2.FetchResponse | None,
                  error: errors.BrookError | None) -> None:
        if response is not None and response.throttle_time_ms > 0:
            self.throttled_until[node] = time.monotonic() + response.throttle_time_ms / 1000
            self.throttle_time_ms_total += response.throttle_time_ms
        self._complete(CompletedFetch(node, offsets, response, error))

    def _complete(self, done: CompletedFetch) -> None:
        with self.cond:
            self.completed.append(done)
            self.cond.notify_all()

    def wait(self, timeout_s: float) -> None:
        with self.cond:
            if not self.completed and timeout_s > 0:
                self.cond.wait(timeout_s)

    def notify(self) -> None:
        """End a ``wait`` now (``Consumer.wakeup``)."""
        with self.cond:
            self.cond.notify_all()

    def take_completed(self) -> list[CompletedFetch]:
        with self.cond:
            done = list(self.completed)
            self.completed.clear()
        for c in done:
            self.in_flight.pop(c.node, None)
        return done

    def close(self) -> None:
        """Drop queued fetches and end the streams; running unary ones end when the consumer closes its channels."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for stream in self._streams.values():
            stream.cancel()
        self._streams.clear()
        self.in_flight.clear()
