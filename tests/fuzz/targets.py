"""Fuzz targets: each takes arbitrary bytes and raises only when it finds a bug.

- ``batch_header``: the header parser and every whole-buffer entry point consumers and
  followers use on fetched bytes (validate_batches, iter_batches, decode_records);
  anything but a BrookError is a crash.
- ``records``: the LogValidator on a batch with a valid CRC around fuzzed records (the
  fuzz input chooses codec, count, attributes, compaction), checked three ways: only
  CORRUPT_MESSAGE / INVALID_RECORD / MESSAGE_TOO_LARGE may be raised; the compiled and
  pure-Python walks agree exactly; and whatever the validator accepts, the consumer's
  decoder must decode into exactly ``count`` records with offsets in order (and keys on a
  compacted topic) — the property issue 11 is about; and the consumer's compiled and
  pure-Python decoders (storage/record_decode.py) give the same records or the same error.
- ``rpc``: the broker's RPC handlers (BrokerService over a real ReplicaManager and
  LogManager in a temporary directory, this broker leading every partition); the first
  byte picks the handler, the rest is its serialized request. A crash is an exception
  out of a handler, an UNKNOWN_SERVER_ERROR answer, or an error logged by the broker.
- ``controller``, ``kafka``: see their harnesses below.
- ``quorum``: a pickled Raft message, as a holder of the quorum password sends it, to three in-process voters
  of the quorum's own SyncObj class (``QuorumHarness``).

Used by ``run.py`` (atheris, ``make fuzz``) and ``test_fuzz_smoke.py`` (pytest).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import itertools
import logging
import os
import pickle
import random
import shutil
import struct
import sys
import tempfile
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from crc32c import crc32c
from google.protobuf.message import DecodeError

from client.types import ConsumerRecord
from proto import errors
from storage import compression, record_decode, record_walk
from storage import record_batch as rb
from storage.log_config import LogConfig
from storage.log_validator import LogValidator

REFUSALS = (errors.CorruptMessageError, errors.InvalidRecordError, errors.MessageTooLargeError,
            errors.InvalidTimestampError)  # INVALID_TIMESTAMP: past message.timestamp.before/after.max.ms
_AFTER_CRC = struct.Struct(">hiqqqhii")
_BEFORE_CRC = struct.Struct(">qiib")
_FUZZ_MAX_MESSAGE_BYTES = 64 * 1024  # small limits keep bombs cheap to refuse (decompressed cap 2 MiB)

_VALIDATORS = {
    compact: LogValidator(LogConfig(max_message_bytes=_FUZZ_MAX_MESSAGE_BYTES,
                                    cleanup_policy=("compact",) if compact else ("delete",)))
    for compact in (False, True)
}


# ----------------------------------------------------------------------------- batch_header


def batch_header(data: bytes) -> None:
    try:
        rb.validate_batches(data, max_batch_bytes=1 << 20, allow_empty=False)
    except errors.BrookError:
        pass
    try:
        for _pos, _h in rb.iter_batches(data):
            pass
    except errors.BrookError:
        pass
    try:
        for _record in rb.decode_records(data):
            pass
    except errors.BrookError:
        pass


# ----------------------------------------------------------------------------- records


def forge_batch(data: bytes) -> tuple[bytes, bool]:
    """A batch with a valid CRC around ``data``: (batch bytes, compacted topic?).

    Byte 0: codec (bits 0-2, mod 5), compress the rest ourselves (bit 3), compacted (bit 4),
    one client-forbidden attribute bit (bits 5-7 pick it, 0 = none). Bytes 1-2: record
    count (big-endian). The rest: the records section.
    """
    if len(data) < 3:
        data = data + b"\x00" * (3 - len(data))
    flags = data[0]
    codec = (flags & 7) % 5
    section = data[3:]
    if codec != rb.CODEC_NONE and flags & 8:
        section = compression.compress(codec, section)
    extra = (0, rb.ATTR_TRANSACTIONAL, rb.ATTR_CONTROL, rb.ATTR_TIMESTAMP_TYPE, rb.ATTR_DELETE_HORIZON, 0x80,
             0, 0)[flags >> 5]
    count = max(1, int.from_bytes(data[1:3], "big"))
    after = _AFTER_CRC.pack(codec | extra, count - 1, 1_700_000_000_000, 1_700_000_000_000, -1, -1, -1, count)
    crc = crc32c(section, crc32c(after))
    before = _BEFORE_CRC.pack(0, rb.MIN_BATCH_LENGTH + len(section), -1, rb.MAGIC)
    return before + struct.pack(">I", crc) + after + section, bool(flags & 16)


def records(data: bytes) -> None:
    buf, compact = forge_batch(data)
    try:
        headers = rb.validate_batches(buf, max_batch_bytes=_FUZZ_MAX_MESSAGE_BYTES, allow_empty=False)
    except REFUSALS:
        return
    h = headers[0]
    _check_walks_agree(buf, h, compact)
    try:
        _VALIDATORS[compact].validate(bytearray(buf), headers)
    except REFUSALS:
        return
    # Accepted: every consumer must be able to read it.
    decoded_h, recs = rb.decode_batch(buf, verify_crc=True)
    if len(recs) != h.record_count or [r.offset for r in recs] != list(range(h.record_count)):
        raise AssertionError(f"validator accepted a batch the decoder reads as {len(recs)} records")
    if compact and any(r.key is None for r in recs):
        raise AssertionError("validator accepted a keyless record on a compacted topic")


def _check_walks_agree(buf: bytes, h: rb.BatchHeader, compact: bool) -> None:
    if record_walk.walk_c is None:
        return
    codec = h.attributes & rb.ATTR_CODEC_MASK
    section: bytes = buf[rb.BATCH_HEADER_SIZE:]
    if codec != rb.CODEC_NONE:
        try:
            section = compression.decompress(codec, section, max_output_bytes=1 << 21)
        except (errors.CorruptMessageError, errors.MessageTooLargeError):  # the validator refuses both
            return
    args = (section, 0, len(section), h.record_count, compact)
    py, c = record_walk.walk_py(*args), record_walk.walk_c(*args)
    if py != c:
        raise AssertionError(f"compiled walk {c} != Python walk {py}")
    _check_decoders_agree(section, h)


def _decode_outcome(decoder: Any, section: bytes, h: rb.BatchHeader) -> tuple:
    log_append_ts = h.max_timestamp if h.attributes & rb.ATTR_TIMESTAMP_TYPE else None
    try:
        return ("ok", decoder(ConsumerRecord, section, 0, len(section), h.record_count, h.base_offset,
                              h.base_timestamp, log_append_ts, "t", 0, 0, 0))
    except (errors.CorruptMessageError, errors.InvalidRecordError) as exc:
        return (type(exc), str(exc))


def _check_decoders_agree(section: bytes, h: rb.BatchHeader) -> None:
    """The consumer's C decoder and the Python reference: same records, or same exception and message."""
    if not record_decode.COMPILED:
        return
    py = _decode_outcome(record_decode.decode_records_py, section, h)
    c = _decode_outcome(record_decode.decode_records_c, section, h)
    if py != c:
        raise AssertionError(f"compiled decoder {c} != Python decoder {py}")


# ----------------------------------------------------------------------------- rpc


class _Context:
    """The ServicerContext calls the handlers make, for an in-process call."""

    def is_active(self) -> bool:
        return True

    def peer(self) -> str:
        return "ipv4:127.0.0.1:0"

    def auth_context(self) -> dict:
        return {}

    def invocation_metadata(self) -> tuple:
        return ()

    def time_remaining(self) -> float:
        return 0.6  # the group servicer waits (join, sync) at most this minus its 0.5 s margin

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"handler aborted the call: {code} {details}")


class _ErrorLog(logging.Handler):
    """Collects ERROR records from the broker, replication and storage loggers."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) < 100:  # bounded: only the first few matter
            self.records.append(record)


def import_broker_modules() -> None:
    """Import what RpcHarness and ControllerHarness use (run.py does it under atheris' instrumentation)."""
    import broker.kafka_wire.apis  # noqa: F401
    import broker.kafka_wire.codec  # noqa: F401
    import broker.metadata_cache  # noqa: F401
    import broker.replica_manager  # noqa: F401
    import broker.service  # noqa: F401
    import metadata_quorum.controller  # noqa: F401
    import metadata_quorum.service  # noqa: F401
    import metadata_quorum.state  # noqa: F401
    import storage.log_manager  # noqa: F401


class _InProcessControllerClient:
    """ControllerClient.call (or, with ``servicer="security"``, SecurityControllerClient.call), answered by
    a ControllerHarness's servicer in this process."""

    def __init__(self, harness: ControllerHarness, servicer: str = "service") -> None:
        self._harness = harness
        self._servicer = servicer

    def call(self, method: str, request: Any, timeout_s: float = 10.0, metadata: Any = None) -> Any:
        response = getattr(getattr(self._harness, self._servicer), method)(request, _SyncContext())
        if response.error_code:
            raise errors.error_for(response.error_code, response.error_message)
        return response

    def describe_quorum(self, *, timeout_s: float | None = None) -> Any:
        """ControllerClient.describe_quorum (the Kafka listener's DescribeQuorum): any voter answers, here the
        harness's one."""
        from proto import controller_pb2

        return self.call("DescribeQuorum", controller_pb2.DescribeQuorumRequest(any_voter=True))

    def close(self) -> None:
        pass


BROKER_RPCS = ("Produce", "Fetch", "ListOffsets", "OffsetsForLeaderEpoch", "Metadata", "InitProducerId",
               "DeleteRecords", "DescribeLogDirs")
GROUP_RPCS = ("FindCoordinator", "JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "OffsetCommit", "OffsetFetch",
              "ListGroups", "DescribeGroups", "DeleteGroups", "OffsetDelete", "AlterGroupOffsets")
# After the unary handlers (so their corpus indexes keep their meaning): the follower fetch
# session stream. Its input is the session's messages, each after a 2-byte big-endian length.
REPLICA_FETCH = "ReplicaFetch"
REPLICA_FETCH_MAX_MESSAGES = 8
# After it: a producer's ProduceStream, its messages framed the same way.
PRODUCE_STREAM = "ProduceStream"
# After that: a consumer's FetchStream, framed the same way.
FETCH_STREAM = "FetchStream"


class RpcHarness:
    """One broker's BrokerService, ReplicaManager and LogManager in a temporary directory.

    Topics: ``t`` (3 partitions, delete) and ``c`` (1 partition, compacted), RF 1, led
    here; ``r`` (1 partition, RF 2, led here, follower broker 2 in the ISR); and one ``__consumer_offsets`` partition for the group coordinator, whose gRPC
    servicer's RPCs are fuzzed too (waits bounded by a near-zero call deadline); one ``__transaction_state``
    partition for the transaction coordinator the Kafka APIs reach (its markers written here).
    InitProducerId allocates from an in-process controller (ControllerHarness); auto-create
    is off. Rebuilt when its logs grow past ``max_log_bytes``.
    """

    def __init__(self, max_log_bytes: int = 64 << 20) -> None:
        from broker.admission import ByteBudget, ClientLimits
        from broker.group_coordinator import CoordinatorConfig, GroupCoordinator
        from broker.group_records import OFFSETS_TOPIC
        from broker.group_service import GroupCoordinatorServicer
        from broker.metadata_cache import MetadataCache
        from broker.producer_ids import ProducerIdManager
        from broker.replica_manager import ReplicaManager
        from broker.service import BrokerService, Capacity
        from broker.txn_coordinator import BrokerCalls, TransactionCoordinator, TxnConfig
        from broker.txn_records import TRANSACTION_STATE_TOPIC
        from proto import broker_pb2, common_pb2, controller_pb2, group_pb2
        from storage.log_manager import LogManager

        self.pb = broker_pb2
        self.max_log_bytes = max_log_bytes
        # Under run.py's SCRATCH_ENV directory when it runs us (libFuzzer's end skips our exit handlers).
        self.dir = Path(tempfile.mkdtemp(prefix="brook-fuzz-rpc-", dir=os.environ.get("BROOK_FUZZ_SCRATCH")))
        # Topic r's follower (broker 2) is in the ISR and never shrinks out of it: the harness has no
        # controller to send the AlterPartition to.
        defaults = {"auto.create.topics.enable": "false", "log.cleaner.enable": "false",
                    "replica.lag.time.max.ms": str(10**9)}
        self.log_manager = LogManager([self.dir], defaults, cleaner_threads=0)
        self.log_manager.startup()
        cache = MetadataCache(1)
        self.rm = ReplicaManager(1, self.log_manager, cache, None, defaults=defaults, broker_epoch=lambda: 1)
        update = controller_pb2.MetadataUpdate(version=1, is_snapshot=True, cluster_id="fuzz", active_controller_id=-1)
        update.brokers.add(node_id=1, incarnation_id="x", broker_epoch=1,
                           endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=1)])
        update.topics.add(name="t", topic_id="t" * 32, partition_count=3)
        update.topics.add(name="c", topic_id="c" * 32, partition_count=1, configs={"cleanup.policy": "compact"})
        update.topics.add(name="r", topic_id="r" * 32, partition_count=1)
        update.partitions.add(topic="r", topic_id="r" * 32, partition=0, replicas=[1, 2], isr=[1, 2], leader=1,
                              leader_epoch=0, partition_epoch=0)
        for p in range(3):
            update.partitions.add(topic="t", topic_id="t" * 32, partition=p, replicas=[1], isr=[1], leader=1,
                                  leader_epoch=0, partition_epoch=0)
        update.partitions.add(topic="c", topic_id="c" * 32, partition=0, replicas=[1], isr=[1], leader=1,
                              leader_epoch=0, partition_epoch=0)
        update.topics.add(name=OFFSETS_TOPIC, topic_id="o" * 32, partition_count=1,
                          configs={"cleanup.policy": "compact"})
        update.partitions.add(topic=OFFSETS_TOPIC, topic_id="o" * 32, partition=0, replicas=[1], isr=[1], leader=1,
                              leader_epoch=0, partition_epoch=0)
        self.coordinator = GroupCoordinator(node_id=1, replica_manager=self.rm, metadata_cache=cache, config=(
            CoordinatorConfig(offsets_topic_num_partitions=1, offsets_topic_replication_factor=1,
                              group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=1)))
        self.coordinator.start()  # listens for the __consumer_offsets leadership the update below gives
        update.topics.add(name=TRANSACTION_STATE_TOPIC, topic_id="x" * 32, partition_count=1,
                          configs={"cleanup.policy": "compact"})
        update.partitions.add(topic=TRANSACTION_STATE_TOPIC, topic_id="x" * 32, partition=0, replicas=[1], isr=[1],
                              leader=1, leader_epoch=0, partition_epoch=0)
        calls = BrokerCalls(1, cache, self.rm, None, lambda: self.txn)
        self.txn = TransactionCoordinator(
            node_id=1, replica_manager=self.rm, metadata_cache=cache,
            config=TxnConfig(num_partitions=1, replication_factor=1, min_isr=1, write_timeout_ms=1000),
            new_producer_id=lambda: self.service.producer_ids.next_id(),
            write_markers=lambda leader, req: calls.write_markers(leader, req, 1000), offsets_partitions=1)
        self.txn.calls = calls
        self.txn.start()  # the transaction coordinator of the fuzzed Kafka APIs, over __transaction_state-0
        self.rm.apply_metadata_delta(cache.apply(update))
        # The handlers are coroutines (grpc.aio): one private event loop runs each call to completion.
        self.loop = asyncio.new_event_loop()
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="fuzz-io")
        capacity = Capacity(io=self.executor, replication=self.executor, limits=ClientLimits(2000, 1000),
                            budget=ByteBudget(256 << 20))
        # InitProducerId allocates id blocks from a real (in-process, simulated-Raft) controller.
        self.controller = ControllerHarness()
        producer_ids = ProducerIdManager(1, _InProcessControllerClient(self.controller),
                                         broker_epoch=lambda: self.controller.broker_epochs[1])
        self.service = BrokerService(1, self.rm, cache, None, producer_ids, defaults=defaults,
                                     controller_endpoints=[], capacity=capacity)
        self.service.txn, self.service.txn_calls = self.txn, calls
        # Fetch answers as the gRPC port hands them over (records kept apart, a long answer already joined).
        self.handlers: list[tuple[str, type, Any]] = [
            (name, getattr(broker_pb2, f"{name}Request"),
             self.service.fetch_over_grpc if name == "Fetch" else getattr(self.service, name)) for name in BROKER_RPCS]
        self.groups = GroupCoordinatorServicer(self.coordinator, self.executor)
        for name in GROUP_RPCS:
            self.handlers.append((name, getattr(group_pb2, f"{name}Request"), getattr(self.groups, name)))
        self.handlers.append((REPLICA_FETCH, broker_pb2.FetchRequest, self._replica_fetch_session))
        self.handlers.append((PRODUCE_STREAM, broker_pb2.ProduceRequest, self._produce_stream_session))
        self.handlers.append((FETCH_STREAM, broker_pb2.FetchRequest, self._fetch_stream_session))
        self.errors = _ErrorLog()
        for name in ("broker", "replication", "storage"):
            logging.getLogger(name).addHandler(self.errors)

    def close(self) -> None:
        for name in ("broker", "replication", "storage"):
            logging.getLogger(name).removeHandler(self.errors)
        self.coordinator.stop()
        self.txn.stop()
        self.controller.close()
        self.rm.shutdown()
        self.log_manager.shutdown()
        self.executor.shutdown(wait=True)
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def size_bytes(self) -> int:
        return sum(p.log.size_bytes for p in self.rm.hosted_partitions())

    def call(self, data: bytes) -> None:
        if not data:
            return
        name, request_type, handler = self.handlers[data[0] % len(self.handlers)]
        if name in (REPLICA_FETCH, PRODUCE_STREAM, FETCH_STREAM):
            self.errors.records.clear()
            text = handler(data[1:])
        else:
            request = request_type()
            try:
                request.ParseFromString(data[1:])
            except (DecodeError, RecursionError):
                return  # not a request gRPC would hand to the handler either
            _bound_waits(request)
            self.errors.records.clear()
            response = _as_sent(self.loop.run_until_complete(handler(request, _Context())))
            if name == "Fetch":
                _check_distinct_partitions([request], [response], name)
            text = str(response)
        if "UNKNOWN_SERVER_ERROR" in text or self.errors.records:
            logged = "; ".join(r.getMessage() + (f" [{r.exc_info[1]!r}]" if r.exc_info else "")
                               for r in self.errors.records[:3])
            raise AssertionError(f"{name} failed on broker: {logged or text[:500]}")


    def _replica_fetch_session(self, data: bytes) -> str:
        """One ReplicaFetch stream: every message ``data`` holds, in order, through the stream handler.

        The stream ends at the first message that does not parse (gRPC ends the call there too).
        Each request must get exactly one response, in order: a follower waits for the answer
        to its last request before it sends the next. The stream is a fetch session
        (broker/fetch_session.py): an answer names every partition its request listed and only
        partitions of the session (a refused request: only its own). Returns the responses as text.
        """
        return self._stream_session(REPLICA_FETCH, self.pb.FetchRequest, self.service.replica_fetch_over_grpc, data,
                                    self._check_fetch_session)

    def _check_fetch_session(self, requests: list[Any], responses: list[Any]) -> None:
        from broker.fetch_session import MIN_SESSION_BOUND
        bound = max(MIN_SESSION_BOUND, 2 * len(self.rm._partitions))
        held: set[tuple[str, int]] = set()  # the session's partitions, as the leader keeps them
        for request, response in zip(requests, responses, strict=True):
            asked = {(p.topic, p.partition) for p in request.partitions}
            named = {(p.topic, p.partition) for p in response.partitions}
            if len(named) != len(response.partitions):
                raise AssertionError(f"{REPLICA_FETCH} answered a partition twice: {list(response.partitions)[:4]}")
            allowed = asked
            if request.replica_id >= 0:
                forgotten = {(f.topic, f.partition) for f in request.forgotten}
                after = (held - forgotten) | asked if request.incremental else asked
                if len(after) <= bound:  # else refused, the session unchanged
                    held = allowed = after
            if not asked <= named or not named <= allowed:
                raise AssertionError(f"{REPLICA_FETCH} answered partitions {sorted(named)[:4]} for a request of "
                                     f"{sorted(asked)[:4]} (incremental {request.incremental}) in a session of "
                                     f"{sorted(held)[:4]}")

    def _produce_stream_session(self, data: bytes) -> str:
        """One ProduceStream: its messages (framed as ReplicaFetch's) pipelined through the stream handler,
        each answered once, in order."""
        return self._stream_session(PRODUCE_STREAM, self.pb.ProduceRequest, self.service.ProduceStream, data,
                                    _check_same_partitions)

    def _fetch_stream_session(self, data: bytes) -> str:
        """One FetchStream: its messages (framed as ReplicaFetch's) one after the other through the stream
        handler, each answered once, in order, naming each partition it asked about once (a partition asked
        twice is read and answered once, as Kafka's fetch request map collapses duplicates)."""
        return self._stream_session(FETCH_STREAM, self.pb.FetchRequest, self.service.fetch_stream_over_grpc, data,
                                    _check_distinct_partitions)

    def _stream_session(self, name: str, request_type: type, handler: Any, data: bytes,
                        check: Callable[[list[Any], list[Any]], None]) -> str:
        """Each message of ``data`` (a 2-byte big-endian length, then the message) into one
        request-and-response stream of ``handler``, at most REPLICA_FETCH_MAX_MESSAGES of them; every
        request must get one response, in request order, whose partitions ``check`` accepts."""
        requests: list[Any] = []
        pos = 0
        while pos + 2 <= len(data) and len(requests) < REPLICA_FETCH_MAX_MESSAGES:
            size = int.from_bytes(data[pos:pos + 2], "big")
            request = request_type()
            try:
                request.ParseFromString(data[pos + 2:pos + 2 + size])
            except (DecodeError, RecursionError):
                break
            pos += 2 + size
            _bound_waits(request)
            requests.append(request)

        async def session() -> list[Any]:
            async def stream() -> AsyncIterator[Any]:
                for request in requests:
                    yield request
            return [_as_sent(response) async for response in handler(stream(), _Context())]

        responses = self.loop.run_until_complete(session())
        if len(responses) != len(requests):
            raise AssertionError(f"{name} answered {len(responses)} of {len(requests)} requests")
        check(requests, responses)
        return "\n".join(str(r) for r in responses)


def _as_sent(response: Any) -> Any:
    """The answer as a client decodes it: a Fetch answer handed to gRPC (a FetchAnswer, or its bytes joined off the
    loop) goes through the broker's serializer and is parsed back, so the fuzzer checks the wire form too."""
    from broker.bytes_apart import BytesApart
    from proto import broker_pb2
    if isinstance(response, BytesApart):
        return broker_pb2.FetchResponse.FromString(response.to_bytes())
    if isinstance(response, bytes):
        return broker_pb2.FetchResponse.FromString(response)
    return response


def _check_same_partitions(requests: list[Any], responses: list[Any]) -> None:
    """Each answer names exactly the partitions its request asked about (ProduceStream, FetchStream)."""
    for request, response in zip(requests, responses, strict=True):
        asked = sorted((p.topic, p.partition) for p in request.partitions)
        if sorted((p.topic, p.partition) for p in response.partitions) != asked:
            raise AssertionError(f"{PRODUCE_STREAM} answered partitions {list(response.partitions)[:4]} "
                                 f"for a request of {asked[:4]}")


def _check_distinct_partitions(requests: list[Any], responses: list[Any], name: str = FETCH_STREAM) -> None:
    """Each answer names each partition its request asked about exactly once (Fetch, FetchStream), refused or not."""
    for request, response in zip(requests, responses, strict=True):
        asked = sorted({(p.topic, p.partition) for p in request.partitions})
        if sorted((p.topic, p.partition) for p in response.partitions) != asked:
            raise AssertionError(f"{name} answered partitions {list(response.partitions)[:4]} "
                                 f"for a request of {asked[:4]}")


def _bound_waits(request: Any) -> None:
    """Long polls and acks=all waits would make each input take seconds: the harness checks
    handling, not waiting, so they are cut to zero (the handlers' own caps are unit-tested)."""
    if hasattr(request, "max_wait_ms"):
        request.max_wait_ms = 0
    if hasattr(request, "timeout_ms"):
        request.timeout_ms = 0


_harness: RpcHarness | None = None


def _get_harness() -> RpcHarness:
    global _harness
    if _harness is not None and _harness.size_bytes() > _harness.max_log_bytes:
        _harness.close()
        _harness = None
    if _harness is None:
        _harness = RpcHarness()
        atexit.register(_close_harness)
    return _harness


def _close_harness() -> None:
    global _harness
    if _harness is not None:
        _harness.close()
        _harness = None


def rpc(data: bytes) -> None:
    _get_harness().call(data)


# ---------------------------------------------------------------- controller RPCs

CONTROLLER_RPCS = ("RegisterBroker", "BrokerHeartbeat", "ControlledShutdown", "AlterPartition", "CreateTopics",
                   "DeleteTopics", "CreatePartitions", "AlterConfigs", "DescribeConfigs", "DescribeCluster",
                   "DescribeQuorum", "AllocateProducerIds", "WatchMetadata", "ElectLeaders",
                   "AlterPartitionReassignments", "ListPartitionReassignments", "UnregisterBroker",
                   "AlterClusterConfigs", "DescribeClusterConfigs")
SECURITY_RPCS = ("SaslAuthenticate", "UpsertScramCredentials", "DeleteScramCredentials", "DescribeUsers",
                 "CreateAcls", "DescribeAcls", "DeleteAcls", "AlterClientQuotas", "DescribeClientQuotas")
SELF_ADDRESS = "127.0.0.1:19093"


class _SyncContext:
    """The ServicerContext calls the controller's (sync) handlers make: a plaintext caller on loopback."""

    def __init__(self, peer: str = "ipv4:127.0.0.1:50000") -> None:
        self._peer = peer

    def is_active(self) -> bool:
        return True

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict:
        return {}

    def invocation_metadata(self) -> tuple:
        return ()

    def time_remaining(self) -> None:
        return None

    def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"handler aborted the call: {code} {details}")


class ControllerHarness:
    """The controller's gRPC servicers over a real QuorumController and MetadataState, committed through
    tests/sim's deterministic SimRaft (one voter, no threads): every ControllerService and
    SecurityService RPC (the first input byte picks it: CONTROLLER_RPCS, then SECURITY_RPCS).

    Three registered, unfenced brokers so topic RPCs do real placement. Half of the inputs come
    from a loopback peer (trusted as a node: broker-only RPCs run), half from a remote peer
    (refused before anything is proposed). ``max.cluster.partitions`` is kept small so one input
    stays cheap; the harness is rebuilt when the state grows past ``max_partitions``.
    """

    def __init__(self, max_partitions: int = 2000) -> None:
        sim_dir = str(Path(__file__).resolve().parent.parent / "sim")
        if sim_dir not in sys.path:
            sys.path.insert(0, sim_dir)
        from brooksim.quorum import SimQuorum, SimRaft

        from broker.authorizer import ALLOW_ALL
        from broker.sasl import ScramAuthenticator
        from metadata_quorum.controller import ControllerConfig, QuorumController
        from metadata_quorum.raft import QuorumStatus, VoterStatus
        from metadata_quorum.security_service import QuorumSecurityAdmin, SecurityService
        from metadata_quorum.service import ControllerService
        from proto import common_pb2, security_pb2
        from proto import controller_pb2 as cpb

        class FuzzRaft(SimRaft):  # the MetadataRaft calls the service makes beyond the controller's
            self_address = SELF_ADDRESS

            def barrier(self, timeout_s: float) -> int:
                return self.version

            def wait_for_version_beyond(self, version: int, timeout_s: float) -> int:
                return self.version

            def leader_address(self) -> str:
                return SELF_ADDRESS

            def has_quorum(self) -> bool:
                return True

            def status(self) -> QuorumStatus:
                v = self.version
                return QuorumStatus(True, SELF_ADDRESS, self.term, v, v, [VoterStatus(SELF_ADDRESS, True, True, v, 0.0)])

        self.pb = cpb
        self.max_partitions = max_partitions
        self.quorum = SimQuorum([1])
        self.quorum.elect(1)
        self.raft = FuzzRaft(self.quorum, 1)
        ids = iter(range(1, 1 << 62))
        config = ControllerConfig(node_id=1, cluster_id="fuzz",
                                  defaults={"max.cluster.partitions": str(max_partitions)})
        self.controller = QuorumController(config, self.raft, clock=lambda: 0.0, rng=random.Random(0),
                                           new_topic_id=lambda: f"{next(ids):032x}")
        self.controller.tick()  # proposes ActivateController
        while self.quorum.commit_next() is not None:
            pass
        self.controller.tick()  # sees it applied: active
        if not self.controller.is_active():
            raise AssertionError("the fuzz controller did not activate")
        self.broker_epochs: dict[int, int] = {}
        for b in (1, 2, 3):
            reg = self.controller.register_broker(cpb.RegisterBrokerRequest(
                node_id=b, incarnation_id=f"inc-{b}", cluster_id="fuzz",
                endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=9000 + b)]), 1.0)
            self.broker_epochs[b] = reg.broker_epoch
            self.controller.heartbeat(cpb.BrokerHeartbeatRequest(node_id=b, broker_epoch=reg.broker_epoch,
                                                                 current_metadata_version=self.raft.version), 1.0)
        self.service = ControllerService(self.controller, self.raft, lambda: cpb.ControllerRedirect(leader_id=1),
                                         cluster_id="fuzz", voter_ids={SELF_ADDRESS: 1}, default_timeout_s=1.0)
        self.handlers = [(name, getattr(cpb, f"{name}Request"), getattr(self.service, name))
                         for name in CONTROLLER_RPCS]
        # The security admin API of the same controller (SCRAM exchange, users, ACLs, quotas).
        raft = self.raft
        authenticator = ScramAuthenticator(lambda u, m: raft.read(lambda st: st.scram.get((u, m))))
        admin = QuorumSecurityAdmin(self.controller, raft, lambda: cpb.ControllerRedirect(leader_id=1))
        self.security = SecurityService(authenticator, ALLOW_ALL, admin)
        self.handlers += [(name, getattr(security_pb2, f"{name}Request"), getattr(self.security, name))
                          for name in SECURITY_RPCS]
        self.errors = _ErrorLog()
        for name in ("metadata_quorum", "broker"):
            logging.getLogger(name).addHandler(self.errors)

    def close(self) -> None:
        for name in ("metadata_quorum", "broker"):
            logging.getLogger(name).removeHandler(self.errors)

    def partitions(self) -> int:
        return self.raft.read(lambda st: sum(len(t.partitions) for t in st.topics.values()))

    def call(self, data: bytes) -> Any:
        if len(data) < 2:
            return None
        name, request_type, handler = self.handlers[data[0] % len(self.handlers)]
        remote = data[1] & 1
        request = request_type()
        try:
            request.ParseFromString(data[2:])
        except (DecodeError, RecursionError):
            return None
        _bound_waits(request)
        self.errors.records.clear()
        context = _SyncContext("ipv4:203.0.113.9:40000" if remote else "ipv4:127.0.0.1:50000")
        response = handler(request, context)
        if name == "WatchMetadata":
            response = next(iter(response), None)
        text = str(response)
        if "UNKNOWN_SERVER_ERROR" in text or self.errors.records:
            logged = "; ".join(r.getMessage() + (f" [{r.exc_info[1]!r}]" if r.exc_info else "")
                               for r in self.errors.records[:3])
            raise AssertionError(f"{name} failed on the controller: {logged or text[:500]}")
        return response


_controller_harness: ControllerHarness | None = None


def controller(data: bytes) -> None:
    global _controller_harness
    if _controller_harness is not None and _controller_harness.partitions() > _controller_harness.max_partitions // 2:
        _controller_harness.close()
        _controller_harness = None
    if _controller_harness is None:
        _controller_harness = ControllerHarness()
    _controller_harness.call(data)


# ---------------------------------------------------------------- the Kafka listener's requests


class KafkaHarness:
    """The Kafka listener's request path (broker/kafka_wire) over an RpcHarness's broker: a frame (without its
    size prefix) is parsed with kio, handed to its handler and the answer encoded. Only MalformedRequest (the
    listener closes the connection) may come out; any other exception, an UNKNOWN_SERVER_ERROR answer or an
    error logged by the broker is a crash."""

    def __init__(self, rpc_harness: RpcHarness) -> None:
        from types import SimpleNamespace

        from broker import principal
        from broker.authorizer import EMPTY_INDEX, Authorizer, AuthorizerConfig
        from broker.kafka_wire import apis

        self.h = rpc_harness
        # An authorizer on, the fuzzing caller a super user: every check passes, and the ACL APIs are served
        # (a broker without one answers them SECURITY_DISABLED before reading them).
        authorizer = Authorizer(AuthorizerConfig(enabled=True, super_users=frozenset({str(principal.ANONYMOUS)})),
                                lambda: EMPTY_INDEX)
        broker = SimpleNamespace(service=rpc_harness.service, group_servicer=rpc_harness.groups,
                                 metadata_cache=rpc_harness.service.cache, log_manager=rpc_harness.log_manager,
                                 controller_client=_InProcessControllerClient(rpc_harness.controller),
                                 settings=SimpleNamespace(defaults={}, node_id=1), node_id=1,
                                 authorizer=authorizer)  # a BrokerServer's (BROKER config resources, the ACL APIs)
        self.apis = apis.KafkaApis(broker, "KAFKA")
        # ACL requests go to the controller's security service (the listener opens a client of its own).
        self.apis.admin._security_client = _InProcessControllerClient(rpc_harness.controller, "security")

    def call(self, frame: bytes) -> None:
        import dataclasses
        import datetime

        from broker import principal
        from broker.kafka_wire import apis, codec
        from broker.kafka_wire.context import KafkaCallContext

        try:
            api_key, version, _ = codec.peek_header(frame)
        except codec.MalformedRequest:
            return
        served = apis.SUPPORTED.get(api_key)
        if served is None or not served[0] <= version <= served[1] or api_key not in self.apis.handlers:
            return
        try:
            req = codec.parse_request(frame, api_key, version)
        except codec.MalformedRequest:
            return
        body = req.body  # waits are cut to zero, as in the rpc target
        for name in ("max_wait", "timeout", "session_timeout", "rebalance_timeout"):
            if hasattr(body, name):
                body = dataclasses.replace(body, **{name: datetime.timedelta(0)})
        req = dataclasses.replace(req, body=body)
        ctx = KafkaCallContext(principal.Authentication(principal.ANONYMOUS, principal.AUTH_NONE, "kafka:fuzz"),
                               "ipv4:127.0.0.1:1", "KAFKA", 0.6)
        self.h.errors.records.clear()
        try:
            response = self.h.loop.run_until_complete(self.apis.handlers[api_key](req, ctx))
            if response is None or response is False:
                return  # acks=0: no answer (None), or the connection closed for a failed write (False)
            codec.encode_response_bytes(api_key, version, req.correlation_id, response)
        finally:
            ctx.finish()  # as the listener does once the answer is written: a fetch gives its bytes back
        text = repr(response)
        if "unknown_server_error" in text or self.h.errors.records:
            logged = "; ".join(r.getMessage() for r in self.h.errors.records[:3])
            raise AssertionError(f"Kafka API {api_key} v{version} failed on the broker: {logged or text[:500]}")


_kafka_harness: KafkaHarness | None = None


def kafka(data: bytes) -> None:
    global _kafka_harness
    h = _get_harness()
    if _kafka_harness is None or _kafka_harness.h is not h:
        _kafka_harness = KafkaHarness(h)
    _kafka_harness.call(data)


# ---------------------------------------------------------------- the quorum port's Raft messages


class QuorumHarness:
    """Three voters of the quorum's own SyncObj class (``QuorumSyncObj``, file journals, no sockets and no tick
    threads: tests/metadata_quorum/raft_sim.py), A elected with entries replicated to B and C. An input is what a
    holder of the quorum password sends once past the key exchange: its first byte picks the receiver (A, the leader,
    or B, a follower) and the voter it names itself as; the rest is the pickle, read as the voter reads it
    (``quorum_pickle``). It is then handled as the quorum port does (raft_transport): dropped when
    ``raft_messages.problem`` or ``_transmission_problem`` names something, else handed to pysyncobj.

    A crash is an exception out of that handling or out of the receiver's next tick (on a voter, an ERROR and a
    paused tick, each time), an ERROR logged by pysyncobj, committed entries changed, a message the receiver sends
    that voters drop (raft_sim's router checks every one), or
    a receiver whose state could no longer be written or read: a term, vote, commit index or log entry of the wrong
    type or range. The voters are rebuilt every ``REBUILD_EVERY`` inputs, so hostile terms do not pile up."""

    REBUILD_EVERY = 500

    def __init__(self) -> None:
        tests = Path(__file__).resolve().parent.parent
        for helpers in (str(tests), str(tests / "metadata_quorum")):  # waiting.py; raft_sim.py, quorum_helpers.py
            if helpers not in sys.path:
                sys.path.insert(0, helpers)
        from pysyncobj.node import TCPNode
        from raft_sim import Network, conf

        from metadata_quorum import quorum_pickle, raft_messages, raft_transport

        self.loads, self.problem = quorum_pickle.loads, raft_messages.problem
        self.transmission_problem = raft_transport.BoundedTCPTransport._transmission_problem
        self.malformed = raft_transport._MALFORMED
        self.dir = tempfile.mkdtemp(prefix="brook-fuzz-quorum-", dir=os.environ.get("BROOK_FUZZ_SCRATCH"))
        self.net = Network(["A", "B", "C"], lambda name, _voter: conf(journalFile=f"{self.dir}/{name}.journal"))
        self.net.elect("A", ["B", "C"])
        self.net.write("A", ["x", "y", "z"], ["B", "C"])
        self.node = {name: TCPNode(address) for name, address in self.net.addresses.items()}
        self.inputs = 0
        self.errors = _ErrorLog()  # pysyncobj's own ERROR and CRITICAL lines (a failed tick, a truncated commit)
        logging.getLogger("pysyncobj").addHandler(self.errors)
        # What entries may carry: the no-op, the harness's own commands, and the corpus's (make_corpus.py).
        self.commands = {e[0] for e in self.net["A"].obj._SyncObj__raftLog[:]}
        self.commands |= {b"\x00" + pickle.dumps((0, ("w",)), 2), b"\x01"}

    def close(self) -> None:
        logging.getLogger("pysyncobj").removeHandler(self.errors)
        self.net.destroy()
        for voter in self.net.voters.values():  # pysyncobj's destroy leaves its pipe notifier's two descriptors open
            notifier = getattr(voter.obj, "_SyncObj__pipeNotifier", None)
            for end in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
                with contextlib.suppress(OSError, TypeError):
                    os.close(getattr(notifier, end, None))  # type: ignore[arg-type]
        shutil.rmtree(self.dir, ignore_errors=True)

    def call(self, data: bytes) -> None:
        if len(data) < 2:
            return
        self.inputs += 1
        receiver = "A" if data[0] & 1 else "B"
        sender = {("A", 0): "B", ("A", 1): "C", ("B", 0): "A", ("B", 1): "C"}[receiver, (data[0] >> 1) & 1]
        try:
            message = self.loads(data[1:])
        except Exception:  # noqa: BLE001 - pysyncobj's frame parser drops what does not unpickle (bare except)
            return
        voter = self.net[receiver].obj
        if self.problem(message) is not None:
            return
        if not self._commands_known(voter, message):
            return
        if message.get("transmission") is not None and \
                self.transmission_problem(types.SimpleNamespace(_syncObj=voter), message) is not None:
            return
        committed = self._committed(voter)
        try:
            voter._SyncObj__onMessageReceived(self.node[sender], message)
        except ValueError as exc:
            if "committed entries" not in str(exc):  # log_matching's refusal, dropped as the transport does
                raise AssertionError(f"a message that passed the check failed: {message!r:.300}") from exc
        except self.malformed as exc:
            raise AssertionError(f"a message that passed the check failed in the handler: {message!r:.300}") from exc
        self.net[receiver].tick()
        self._check(receiver)
        if self.errors.records:
            logged = "; ".join(r.getMessage()[:200] for r in self.errors.records[:3])
            self.errors.records.clear()
            raise AssertionError(f"pysyncobj logged an error on {receiver}: {logged}")
        held = {e[1]: e[2] for e in voter._SyncObj__raftLog[:]}
        changed = [(index, term, held[index]) for index, term in committed if held.get(index, term) != term]
        assert not changed, f"{receiver} changed committed entries (index, term, now): {changed}"
        for queue in self.net.router.queues.values():
            queue.clear()

    def _commands_known(self, voter: Any, message: dict[Any, Any]) -> bool:
        """Do the commands the message carries come from ``self.commands``? Raft trusts its leader: a sender holding
        the password and naming itself as the leader has its entries committed and applied, and a command that
        does not decode stops every voter's applying (as a lying leader could anyway, README "The quorum port").
        What a command says is the controller target's part; this target's is the messages around them."""
        if message.get("type") == "apply_command":
            return message.get("command") in self.commands
        if message.get("type") != "append_entries":
            return True
        entries = message.get("entries") or []
        if message.get("transmission") == "finish":
            held = voter._SyncObj__recvTransmission
            try:
                entries = [self.loads(held + message.get("data", b""))]
            except Exception:  # noqa: BLE001 - not whole yet: gathered as a part (log_matching)
                return True
        return all(isinstance(e, (tuple, list)) and e and isinstance(e[0], bytes) and e[0] in self.commands
                   for e in entries)

    @staticmethod
    def _committed(voter: Any) -> list[tuple[int, int]]:
        """(index, term) of the entries up to the voter's commit index (a snapshot may drop the first ones)."""
        commit = voter._SyncObj__raftCommitIndex
        return [(e[1], e[2]) for e in voter._SyncObj__raftLog[:] if e[1] <= commit]

    def _check(self, name: str) -> None:
        obj = self.net[name].obj
        term = obj._SyncObj__raftCurrentTerm
        commit = obj._SyncObj__raftCommitIndex
        voted = obj._SyncObj__votedForNodeId
        assert type(term) is int and 0 <= term < 1 << 63, f"{name} holds term {term!r}"
        assert type(commit) is int and 0 <= commit, f"{name} holds commit index {commit!r}"
        assert voted is None or voted in self.net.addresses.values(), f"{name} voted for {voted!r}"
        entries = obj._SyncObj__raftLog[:]
        for before, entry in itertools.pairwise(entries):
            assert isinstance(entry[0], bytes) and entry[1] == before[1] + 1 and type(entry[2]) is int \
                and before[2] <= entry[2] <= term, f"{name} holds entry {entry!r:.200} after {before!r:.200}"
        assert commit <= entries[-1][1], f"{name} commit index {commit} past its last entry {entries[-1][1]}"


_quorum_harness: QuorumHarness | None = None


def _close_quorum_harness() -> None:
    global _quorum_harness
    if _quorum_harness is not None:
        _quorum_harness.close()
        _quorum_harness = None


def quorum(data: bytes) -> None:
    global _quorum_harness
    if _quorum_harness is not None and _quorum_harness.inputs >= QuorumHarness.REBUILD_EVERY:
        _close_quorum_harness()
    if _quorum_harness is None:
        _quorum_harness = QuorumHarness()
        atexit.unregister(_close_quorum_harness)  # registered once, whatever the rebuilds
        atexit.register(_close_quorum_harness)
    _quorum_harness.call(data)


TARGETS = {"batch_header": batch_header, "records": records, "rpc": rpc, "controller": controller, "kafka": kafka,
           "quorum": quorum}
