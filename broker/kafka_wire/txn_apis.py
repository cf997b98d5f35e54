"""Kafka's transactional producer APIs on the Kafka listener (KIP-98), served by broker/txn_coordinator.py.

What a client's ``init_transactions()``, ``begin_transaction()``, ``send()`` and ``commit_transaction()`` /
``abort_transaction()`` send: FindCoordinator for a transaction coordinator (key type 1), InitProducerId with a
transactional id, AddPartitionsToTxn (v0-3, the clients' versions; v4+ is Kafka's broker-to-broker batch form,
whose role Brook's VerifyTransaction RPC plays), Produce with the transactional id (broker/service.py), EndTxn.

Authorization is Kafka's: the transactional id needs DESCRIBE for FindCoordinator and WRITE for the others
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED); each partition added needs WRITE on its topic (TOPIC_AUTHORIZATION_FAILED,
and the others of the request OPERATION_NOT_ATTEMPTED, as Kafka answers).

``send_offsets_to_transaction`` (consume-transform-produce): AddOffsetsToTxn adds the group's ``__consumer_offsets``
partition to the transaction (WRITE on the transactional id, READ on the group), and TxnOffsetCommit writes the
offsets there within it (also READ on each topic), visible once the transaction commits
(broker/group_coordinator.py ``txn_commit_offsets``).

Not served: KIP-890 part 2 (EndTxn v5's epoch bump at every commit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import logging
import time
from collections import defaultdict
from typing import Any

from broker import authorizer as authz
from broker import topic_regex
from broker.group_records import OFFSETS_TOPIC
from broker.kafka_wire import codec
from broker.kafka_wire.codec import get as _get
from broker.kafka_wire.codec import get_ms as _ms
from broker.kafka_wire.context import Handler, KafkaCallContext
from broker.txn_state import (
    API_ADD_OFFSETS_TO_TXN,
    API_ADD_PARTITIONS_TO_TXN,
    API_END_TXN,
    API_INIT_PRODUCER_ID,
    TxnError,
    error_for_version,
)
from client.types import TopicPartition
from proto.common_pb2 import ErrorCode

ADD_PARTITIONS_TO_TXN, END_TXN = API_ADD_PARTITIONS_TO_TXN, API_END_TXN
ADD_OFFSETS_TO_TXN, TXN_OFFSET_COMMIT = API_ADD_OFFSETS_TO_TXN, 28
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
WRITE_TXN_MARKERS = 27
log = logging.getLogger(__name__)
SUPPORTED: dict[int, tuple[int, int]] = {
    ADD_PARTITIONS_TO_TXN: (0, 3),  # v4+: Kafka's broker-to-broker verification, not for clients
    ADD_OFFSETS_TO_TXN: (0, 3),  # v4: TRANSACTION_ABORTABLE (KIP-890): not served
    END_TXN: (0, 3),  # v4: TRANSACTION_ABORTABLE, v5: KIP-890's epoch bump: not served
    TXN_OFFSET_COMMIT: (0, 3),  # v3: the member's id and generation (KIP-447)
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 2),  # v1: a duration filter (KIP-994), v2: a transactional id pattern (KIP-1152)
    # From an operator's Admin.abortTransaction (kafka-transactions abort); brokers use gRPC. Kafka 4 serves 1-2 (v0
    # went with KIP-896); a v2 marker of transaction version 2 (KIP-890 part 2) is refused.
    WRITE_TXN_MARKERS: (1, 2),
}
CLUSTER_AUTHORIZATION_FAILED = 31
MARKER_PARTITIONS_MAX = 1_000  # partitions one WriteTxnMarkers request may name, all markers together
MARKER_TIMEOUT_MS = 30_000  # how long one request's markers wait for the in-sync replicas, all of them together
# How long an AddPartitionsToTxn that finds the producer's last transaction still being completed waits for its
# end before it is answered CONCURRENT_TRANSACTIONS (TransactionCoordinator.when_completed).
CONCURRENT_WAIT_S = 0.5
GROUP_AUTHORIZATION_FAILED = 30
# The transaction coordinator's verification of a TxnOffsetCommit's partition, as the client is told it: a
# coordinator that cannot answer now is retried.
_VERIFY_ANSWERS = {TxnError.NOT_COORDINATOR: TxnError.COORDINATOR_NOT_AVAILABLE,
                   TxnError.COORDINATOR_LOAD_IN_PROGRESS: TxnError.COORDINATOR_NOT_AVAILABLE,
                   TxnError.INVALID_PRODUCER_ID_MAPPING: TxnError.INVALID_TXN_STATE}
TRANSACTIONAL_ID = "TRANSACTIONAL_ID"
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION, OPERATION_NOT_ATTEMPTED = 29, 3, 55
# Requests wait for a write of __transaction_state to reach its in-sync replicas: on threads of their own, so a
# slow ISR holds no other request's thread. Bounded: the listener bounds each connection's requests in flight.
REQUEST_THREADS = 8
LIST_MAX = 10_000  # transactions one Describe/ListTransactions answer holds
TRANSACTION_STATE_NAMES = frozenset({"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
                                     "CompleteAbort", "Dead", "PrepareEpochFence"})


class TxnApis:
    """The transaction handlers of one Kafka listener."""

    _pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __init__(self, broker: Any, listener: str) -> None:
        self.broker = broker
        self.listener = listener

    def handlers(self) -> dict[int, Handler]:
        return {ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn, END_TXN: self.end_txn,
                ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn, TXN_OFFSET_COMMIT: self.txn_offset_commit,
                DESCRIBE_TRANSACTIONS: self.describe_transactions, LIST_TRANSACTIONS: self.list_transactions,
                WRITE_TXN_MARKERS: self.write_txn_markers}

    @property
    def txn(self) -> Any:
        return self.broker.service.txn

    def _allowed(self, ctx: KafkaCallContext, operation: str, transactional_id: str) -> bool:
        return self.broker.service.authz.authorize(ctx.brook_authentication.principal, operation, TRANSACTIONAL_ID,
                                                   transactional_id)

    @classmethod
    async def run(cls, fn: Any) -> Any:
        if cls._pool is None:
            cls._pool = concurrent.futures.ThreadPoolExecutor(REQUEST_THREADS, thread_name_prefix="kafka-txn")
        return await asyncio.get_running_loop().run_in_executor(cls._pool, fn)

    # ---- FindCoordinator (key type 1) ----
    async def find_coordinator(self, key: str, ctx: KafkaCallContext) -> dict[str, Any]:
        if not self._allowed(ctx, authz.DESCRIBE, key):
            return {"key": key, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "node_id": -1, "host": "",
                    "port": -1, "error_message": f"no DESCRIBE on transactional id {key[:100]!r}"}
        if self.txn is None:
            return {"key": key, "error_code": TxnError.COORDINATOR_NOT_AVAILABLE, "node_id": -1, "host": "",
                    "port": -1, "error_message": "this broker runs no transaction coordinator"}
        try:
            node, host, port = self.txn.find_coordinator(key, self.listener)
        except Exception as exc:  # noqa: BLE001 - a BrookError with its code, answered
            return {"key": key, "error_code": getattr(exc, "code", TxnError.COORDINATOR_NOT_AVAILABLE), "node_id": -1,
                    "host": "", "port": -1, "error_message": str(exc)[:1000]}
        return {"key": key, "error_code": 0, "error_message": None, "node_id": node, "host": host, "port": port}

    # ---- InitProducerId with a transactional id ----
    async def init_producer_id(self, req: codec.Request, ctx: KafkaCallContext) -> dict[str, Any]:
        body = req.body
        tid = body.transactional_id
        if not self._allowed(ctx, authz.WRITE, tid):
            return {"error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "producer_id": -1, "producer_epoch": -1}
        if self.txn is None:
            return {"error_code": TxnError.COORDINATOR_NOT_AVAILABLE, "producer_id": -1, "producer_epoch": -1}
        expected = (int(_get(body, "producer_id", -1)), int(_get(body, "producer_epoch", -1)))
        code, pid, epoch = await self.run(lambda: self.txn.init_producer_id(tid, _ms(body, "transaction_timeout", -1),
                                                                             expected))
        return {"error_code": error_for_version(code, API_INIT_PRODUCER_ID, req.api_version),
                "producer_id": pid, "producer_epoch": epoch}

    # ---- AddPartitionsToTxn v0-3 ----
    async def add_partitions_to_txn(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        tid = body.v3_and_below_transactional_id
        pid, epoch = int(body.v3_and_below_producer_id), int(body.v3_and_below_producer_epoch)
        named = [TopicPartition(t.name, int(i)) for t in body.v3_and_below_topics for i in t.partitions]
        codes: dict[TopicPartition, int] = {}
        if not self._allowed(ctx, authz.WRITE, tid):
            codes = dict.fromkeys(named, TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        else:
            service = self.broker.service
            denied = service.authz.denied_topics(ctx.brook_authentication.principal, authz.WRITE,
                                                 {tp.topic for tp in named})
            for tp in named:
                if tp.topic in denied:
                    codes[tp] = TOPIC_AUTHORIZATION_FAILED
                elif tp.topic.startswith("__") or service.cache.partition(tp.topic, tp.partition) is None:
                    codes[tp] = UNKNOWN_TOPIC_OR_PARTITION  # internal topics join only through AddOffsetsToTxn
            if codes:  # as Kafka: none is added when one is refused
                codes = {tp: codes.get(tp, OPERATION_NOT_ATTEMPTED) for tp in named}
            elif self.txn is None:
                codes = dict.fromkeys(named, TxnError.COORDINATOR_NOT_AVAILABLE)
            else:
                code = await self.run(lambda: self.txn.add_partitions(tid, pid, epoch, named))
                if code == TxnError.CONCURRENT_TRANSACTIONS and await self._completed(tid):
                    code = await self.run(lambda: self.txn.add_partitions(tid, pid, epoch, named))
                codes = dict.fromkeys(named, error_for_version(code, API_ADD_PARTITIONS_TO_TXN, req.api_version))
        by_topic: dict[str, list[dict[str, int]]] = defaultdict(list)
        for tp, code in codes.items():
            by_topic[tp.topic].append({"partition_index": tp.partition, "partition_error_code": code})
        return codec.response(req.api_key, req.api_version, {"throttle_time": 0, "results_by_topic_v3_and_below": [
            {"name": name, "results_by_partition": results} for name, results in by_topic.items()]})

    async def _completed(self, transactional_id: str) -> bool:
        """Wait (no thread held) up to ``CONCURRENT_WAIT_S`` for the id's transaction in Prepare* to be complete:
        True when it was (or ended otherwise: the coordinator moved or stopped), so the request may be tried once
        more; False when there was nothing to wait for, or the wait ran out."""
        loop = asyncio.get_running_loop()
        ended = loop.create_future()

        def on_end() -> None:
            try:
                loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(None))
            except RuntimeError:
                pass  # the listener's loop is closed: nobody waits any more
        if not self.txn.when_completed(transactional_id, on_end):
            return False
        try:
            await asyncio.wait_for(ended, CONCURRENT_WAIT_S)
            return True
        except TimeoutError:
            self.txn.forget_waiter(transactional_id, on_end)
            return False

    # ---- EndTxn v0-3 ----
    async def end_txn(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        tid = body.transactional_id
        if not self._allowed(ctx, authz.WRITE, tid):
            code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif self.txn is None:
            code = TxnError.COORDINATOR_NOT_AVAILABLE
        else:
            code = await self.run(lambda: self.txn.end_txn(tid, int(body.producer_id), int(body.producer_epoch),
                                                           bool(body.committed)))
            code = error_for_version(code, API_END_TXN, req.api_version)
        return codec.response(req.api_key, req.api_version, {"throttle_time": 0, "error_code": code})

    # ---- WriteTxnMarkers v1-2 (an operator's abort of a hanging transaction) ----
    async def write_txn_markers(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """Kafka's WriteTxnMarkers, for CLUSTER_ACTION on the cluster (Kafka's rule): each marker appended to each
        partition this broker leads, as the transaction coordinator's are (acks=all, the producer and coordinator
        epochs checked, ``__consumer_offsets`` told). What ``kafka-transactions abort`` sends to end a transaction
        no coordinator will: its partition's last stable offset, and every read_committed reader, stay there
        otherwise. A transaction its coordinator still runs is aborted on that partition all the same (the
        coordinator's marker later completes nothing), as in Kafka: the tool is for hanging ones.

        A request naming more than ``MARKER_PARTITIONS_MAX`` partitions is answered INVALID_REQUEST whole, nothing
        written, and so is a marker of transaction version 2 (KIP-890 part 2, not served); the markers go one at a
        time, each on a thread of the transaction pool, within ``MARKER_TIMEOUT_MS`` for the whole request (those
        left when it is up are REQUEST_TIMED_OUT, not written): one marker per partition, each waiting out its own
        timeout for replicas that are down, could hold a thread for hours."""
        body = req.body
        who = ctx.brook_authentication.principal
        wanted = [(m, [(t.name, int(p)) for t in m.topics for p in t.partition_indexes]) for m in body.markers]
        allowed = self.broker.service.authz.authorize(who, authz.CLUSTER_ACTION, authz.CLUSTER)
        total = sum(len(keys) for _m, keys in wanted)
        refused = None if allowed else CLUSTER_AUTHORIZATION_FAILED
        if refused is None and total > MARKER_PARTITIONS_MAX:
            refused = ErrorCode.INVALID_REQUEST
        rm = self.broker.service.rm
        answers = []
        deadline = time.monotonic() + MARKER_TIMEOUT_MS / 1000  # one for the request: each marker waited its own
        for marker, keys in wanted:
            pid, epoch = int(marker.producer_id), int(marker.producer_epoch)
            commit, coordinator_epoch = bool(marker.transaction_result), int(marker.coordinator_epoch)
            left_ms = int((deadline - time.monotonic()) * 1000)
            if refused is None and int(_get(marker, "transaction_version", 0)) >= 2:
                codes = dict.fromkeys(keys, ErrorCode.INVALID_REQUEST)  # Brook's transactions are version 1
            elif refused is None and left_ms <= 0:
                codes = dict.fromkeys(keys, ErrorCode.REQUEST_TIMED_OUT)  # not written: the request's time is up
            elif refused is None:
                codes = await self.run(lambda pid=pid, epoch=epoch, commit=commit, ce=coordinator_epoch, keys=keys,
                                       ms=left_ms: rm.write_markers(pid, epoch, commit, ce, keys, ms))
                log.warning("%s wrote %s markers of producer %d epoch %d (coordinator epoch %d) to %s: %s",
                            who, "COMMIT" if commit else "ABORT", pid, epoch, coordinator_epoch,
                            ", ".join(f"{t}-{p}" for t, p in keys[:20]), dict(list(codes.items())[:20]) or "written")
            else:
                codes = dict.fromkeys(keys, refused)
            by_topic: dict[str, list[dict[str, int]]] = defaultdict(list)
            for key in dict.fromkeys(keys):
                by_topic[key[0]].append({"partition_index": key[1], "error_code": int(codes.get(key, 0))})
            answers.append({"producer_id": pid, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]})
        return codec.response(req.api_key, req.api_version, {"markers": answers})

    # ---- AddOffsetsToTxn v0-3 ----
    async def add_offsets_to_txn(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        tid, group_id = body.transactional_id, body.group_id
        who = ctx.brook_authentication.principal
        if not self._allowed(ctx, authz.WRITE, tid):
            code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not self.broker.service.authz.authorize(who, authz.READ, authz.GROUP, group_id):
            code = GROUP_AUTHORIZATION_FAILED
        elif self.txn is None:
            code = TxnError.COORDINATOR_NOT_AVAILABLE
        else:
            code = await self.run(lambda: self.txn.add_offsets(tid, int(body.producer_id), int(body.producer_epoch),
                                                               group_id))
            code = error_for_version(code, API_ADD_OFFSETS_TO_TXN, req.api_version)
        return codec.response(req.api_key, req.api_version, {"throttle_time": 0, "error_code": code})

    # ---- TxnOffsetCommit v0-3 ----
    async def txn_offset_commit(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        body = req.body
        tid, group_id = body.transactional_id, body.group_id
        pid, epoch = int(body.producer_id), int(body.producer_epoch)
        named = [(TopicPartition(t.name, int(p.partition_index)), int(p.committed_offset),
                  int(_get(p, "committed_leader_epoch", -1)), p.committed_metadata or "")
                 for t in body.topics for p in t.partitions]
        who = ctx.brook_authentication.principal
        service = self.broker.service
        coordinator = getattr(self.broker, "group_coordinator", None)
        codes: dict[TopicPartition, int] = {}
        if not self._allowed(ctx, authz.WRITE, tid):
            codes = {tp: TRANSACTIONAL_ID_AUTHORIZATION_FAILED for tp, *_ in named}
        elif not service.authz.authorize(who, authz.READ, authz.GROUP, group_id):
            codes = {tp: GROUP_AUTHORIZATION_FAILED for tp, *_ in named}
        elif coordinator is None or service.txn_calls is None:
            codes = {tp: TxnError.COORDINATOR_NOT_AVAILABLE for tp, *_ in named}
        else:
            denied = service.authz.denied_topics(who, authz.READ, {tp.topic for tp, *_ in named})
            codes = {tp: TOPIC_AUTHORIZATION_FAILED for tp, *_ in named if tp.topic in denied}
            wanted = [n for n in named if n[0].topic not in denied]

            def verify(partition: int) -> tuple[int, dict[int, int] | None]:
                hosted = service.rm.partition(OFFSETS_TOPIC, partition)
                if hosted is None:
                    return TxnError.NOT_COORDINATOR, None
                mark = hosted.log.marker_mark(pid)  # first: a marker written after it voids the verification
                if pid in hosted.log.ongoing_transactions() and hosted.log.producer_epoch(pid) == epoch:
                    return TxnError.NONE, {pid: mark}
                code = service.txn_calls.verify(tid, pid, epoch, TopicPartition(OFFSETS_TOPIC, partition))
                return _VERIFY_ANSWERS.get(code, code), {pid: mark}

            def commit() -> list[tuple[str, int, int]]:
                try:
                    return coordinator.txn_commit_offsets(group_id, pid, epoch, _get(body, "member_id", "") or "",
                                                          int(_get(body, "generation_id", -1)),
                                                          _get(body, "group_instance_id", None) or "", wanted, verify)
                except Exception as exc:  # noqa: BLE001 - a CoordinatorError with its code, for every partition
                    code = getattr(exc, "code", TxnError.UNKNOWN_SERVER_ERROR)
                    return [(tp.topic, tp.partition, code) for tp, *_ in wanted]
            if wanted:
                for topic, partition, code in await self.run(commit):
                    codes[TopicPartition(topic, partition)] = error_for_version(code, API_ADD_OFFSETS_TO_TXN,
                                                                               req.api_version)
        by_topic: dict[str, list[dict[str, int]]] = defaultdict(list)
        for tp, code in codes.items():
            by_topic[tp.topic].append({"partition_index": tp.partition, "error_code": code})
        return codec.response(req.api_key, req.api_version, {"throttle_time": 0, "topics": [
            {"name": name, "partitions": results} for name, results in by_topic.items()]})

    # ---- DescribeTransactions v0 (KIP-664: kafka-transactions describe) ----
    async def describe_transactions(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """Each transactional id's state at this broker, its coordinator (NOT_COORDINATOR elsewhere); DESCRIBE on the
        id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and only the topics the caller may DESCRIBE, as Kafka answers."""
        who = ctx.brook_authentication.principal
        ids = list(dict.fromkeys(req.body.transactional_ids))
        if len(ids) > LIST_MAX:
            ids = ids[:LIST_MAX]
        found = []
        for tid in ids:
            # an error's entry: Kafka's zero values (its schema has no defaults for these)
            entry: dict[str, Any] = {"transactional_id": tid, "transaction_state": "", "transaction_timeout": 0,
                                     "transaction_start_time": _instant(0), "producer_id": 0, "producer_epoch": 0,
                                     "topics": []}
            if not self._allowed(ctx, authz.DESCRIBE, tid):
                found.append({**entry, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED})
                continue
            d = self.txn.describe(tid) if self.txn is not None else TxnError.COORDINATOR_NOT_AVAILABLE
            if isinstance(d, int):
                found.append({**entry, "error_code": int(d)})
                continue
            denied = self.broker.service.authz.denied_topics(who, authz.DESCRIBE, {t for t, _ in d.topics})
            found.append({**entry, "error_code": 0, "transaction_state": d.state.kafka_name,
                          "transaction_timeout": d.timeout_ms, "transaction_start_time": _instant(d.txn_start_ms),
                          "producer_id": d.producer_id, "producer_epoch": d.producer_epoch,
                          "topics": [{"topic": t, "partitions": list(ps)} for t, ps in d.topics if t not in denied]})
        return codec.response(req.api_key, req.api_version, {"throttle_time": 0, "transaction_states": found})

    # ---- ListTransactions v0-2 (KIP-664: kafka-transactions list, find-hanging) ----
    async def list_transactions(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        """The transactions this broker coordinates that the caller may DESCRIBE, filtered by state (Kafka's names;
        unknown ones are echoed back), producer id, (v1) running longer than a duration, (v2) a transactional id
        pattern, matched whole as Kafka's Java pattern is, with RE2 (a bad pattern: INVALID_REGULAR_EXPRESSION).
        At most LIST_MAX are listed."""
        body = req.body
        states = [str(f) for f in _get(body, "state_filters", ()) or ()]
        pids = [int(p) for p in _get(body, "producer_id_filters", ()) or ()]
        duration = int(_get(body, "duration_filter", -1) or -1)
        pattern = _get(body, "transactional_id_pattern", None)

        def answer(code: int, listed: list[dict[str, Any]], unknown: list[str]) -> Any:
            return codec.response(req.api_key, req.api_version, {"throttle_time": 0, "error_code": code,
                                                                 "unknown_state_filters": unknown,
                                                                 "transaction_states": listed})
        if pattern:
            try:
                topic_regex.check(pattern)
            except topic_regex.RegexError:
                return answer(topic_regex.INVALID_REGULAR_EXPRESSION, [], [])
        if self.txn is None:
            return answer(0, [], sorted(set(states) - TRANSACTION_STATE_NAMES))
        listing = self.txn.list_transactions(states, pids, duration)
        rows = listing.transactions
        if pattern:
            matched = topic_regex.resolve([pattern], [tid for tid, _, _ in rows]).get(pattern, frozenset())
            rows = tuple(r for r in rows if r[0] in matched)
        listed = [{"transactional_id": tid, "producer_id": pid, "transaction_state": state}
                  for tid, pid, state in rows if self._allowed(ctx, authz.DESCRIBE, tid)][:LIST_MAX]
        return answer(int(listing.error), listed, list(listing.unknown_state_filters))


def _instant(ms: int) -> datetime.datetime:
    """A Kafka timestamp field that is never null (DescribeTransactions' start time): -1, no transaction, too."""
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=ms)
