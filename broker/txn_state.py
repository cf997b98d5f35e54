"""The transaction coordinator's state machine (Kafka's TransactionCoordinator and TransactionMetadata), pure.

It holds the state of every transactional id of the ``__transaction_state`` partitions this
coordinator owns. It never reads a clock, a socket or a disk: every call takes ``now_ms``, new
producer ids come from a callable, and what must be persisted is handed back as a ``Transition``
(the new metadata and its record's key and value bytes). The caller appends the record and then
calls ``complete(transition)`` once the write is acknowledged, or ``abort(transition)`` when it
failed; until then the transactional id has a *pending state* and every other request for it is
answered CONCURRENT_TRANSACTIONS, as Kafka's ``pendingState`` does. So the state in memory is always
what the log says, and replaying the log (``load``) gives the same state.

States (Kafka's, with their on-disk ids)::

    Empty(0) --AddPartitions--> Ongoing(1) --EndTxn commit--> PrepareCommit(2) --markers--> CompleteCommit(4)
                                     |       --EndTxn abort --> PrepareAbort(3)  --markers--> CompleteAbort(5)
                                     +--InitProducerId / timeout: epoch bumped--> PrepareAbort
    Empty, Complete* --InitProducerId--> Empty (epoch + 1, or a new producer id once the epoch is exhausted)
    Empty, Complete* --idle past transactional.id.expiration.ms--> removed (a tombstone; Kafka's Dead(6))

PrepareEpochFence(7) is never written: Kafka passes through it in memory on the way from Ongoing to
PrepareAbort when it fences a producer; here that is one transition (``TransitionKind.FENCE_ABORT``).

After a Prepare* record is written the markers must go to the partitions' leaders; ``complete``
returns them (``PendingMarkers``), the id stays pending (its pending state is the Complete* to come,
as in Kafka) until ``markers_written`` gives the Complete* transition. Loading a partition ends
with the Prepare* transactions, whose markers the caller (re)sends, as Kafka's coordinator does when
it takes a partition over.

Handlers answer as Kafka's coordinator does for clients of transaction version 0 and 1 (EndTxn up to
v4: no epoch bump at every commit, KIP-890 part 2). Error codes are Kafka's (``TxnError``);
``error_for_version`` turns PRODUCER_FENCED into INVALID_PRODUCER_EPOCH for clients older than it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from broker import txn_records as rec
from broker.group_records import OFFSETS_TOPIC
from client.types import TopicPartition

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 0x7FFF  # Short.MaxValue: only reached by fencing (a client never gets it)
DEFAULT_MAX_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms
DEFAULT_ID_EXPIRATION_MS = 7 * 24 * 60 * 60 * 1000  # Kafka's transactional.id.expiration.ms
# Bounds on what one transaction may hold (Kafka has none): the partitions it names, and the bytes of
# its record (the topic's message limit is about 1 MiB). Beyond them AddPartitionsToTxn is INVALID_REQUEST,
# which Kafka's producer turns into an abortable error.
DEFAULT_MAX_PARTITIONS = 10_000
DEFAULT_MAX_VALUE_BYTES = 1_000_000
PARTITION_ID_MAX = 0x7FFFFFFF


class TxnError(enum.IntEnum):
    """Kafka's error codes (org.apache.kafka.common.protocol.Errors) the coordinator answers."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_REQUEST = 42
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    PRODUCER_FENCED = 90
    TRANSACTIONAL_ID_NOT_FOUND = 105


API_INIT_PRODUCER_ID = 22
API_ADD_PARTITIONS_TO_TXN = 24
API_ADD_OFFSETS_TO_TXN = 25
API_END_TXN = 26
# The first version of each API whose clients know PRODUCER_FENCED (older ones get INVALID_PRODUCER_EPOCH,
# as KafkaApis maps it).
_PRODUCER_FENCED_SINCE = {API_INIT_PRODUCER_ID: 4, API_ADD_PARTITIONS_TO_TXN: 2, API_ADD_OFFSETS_TO_TXN: 2,
                          API_END_TXN: 2}


def error_for_version(error: int, api_key: int, api_version: int) -> int:
    """The code to answer a client of ``api_version``: PRODUCER_FENCED is INVALID_PRODUCER_EPOCH for
    InitProducerId < v4 and AddPartitionsToTxn, AddOffsetsToTxn, EndTxn < v2 (KafkaApis)."""
    if error == TxnError.PRODUCER_FENCED and api_version < _PRODUCER_FENCED_SINCE.get(api_key, 0):
        return TxnError.INVALID_PRODUCER_EPOCH
    return error


# A failed append's error as the coordinator answers it (TransactionStateManager.appendTransactionToLog).
_APPEND_ERRORS = {
    3: TxnError.COORDINATOR_NOT_AVAILABLE,  # UNKNOWN_TOPIC_OR_PARTITION
    19: TxnError.COORDINATOR_NOT_AVAILABLE,  # NOT_ENOUGH_REPLICAS
    20: TxnError.COORDINATOR_NOT_AVAILABLE,  # NOT_ENOUGH_REPLICAS_AFTER_APPEND
    7: TxnError.COORDINATOR_NOT_AVAILABLE,  # REQUEST_TIMED_OUT
    6: TxnError.NOT_COORDINATOR,  # NOT_LEADER_OR_FOLLOWER
    56: TxnError.NOT_COORDINATOR,  # KAFKA_STORAGE_ERROR
    10: TxnError.UNKNOWN_SERVER_ERROR,  # MESSAGE_TOO_LARGE
    18: TxnError.UNKNOWN_SERVER_ERROR,  # RECORD_LIST_TOO_LARGE
}


def append_error(error: int) -> int:
    """What to answer the client when appending a transition's record failed with ``error``."""
    return _APPEND_ERRORS.get(error, error)


class TransactionState(enum.IntEnum):
    """Kafka's TransactionState; the values are the status ids written in the log."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use ("Empty", "PrepareCommit", ...)."""
        return _NAMES[self]

    @classmethod
    def from_name(cls, name: str) -> TransactionState | None:
        return _BY_NAME.get(name)


S = TransactionState
_NAMES = {S.EMPTY: "Empty", S.ONGOING: "Ongoing", S.PREPARE_COMMIT: "PrepareCommit", S.PREPARE_ABORT: "PrepareAbort",
          S.COMPLETE_COMMIT: "CompleteCommit", S.COMPLETE_ABORT: "CompleteAbort", S.DEAD: "Dead",
          S.PREPARE_EPOCH_FENCE: "PrepareEpochFence"}
_BY_NAME = {name: state for state, name in _NAMES.items()}

# Kafka's validPreviousStates: the states each state may be entered from.
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
PREPARE_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
COMPLETE_STATES = frozenset({S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
EXPIRABLE_STATES = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})  # Kafka's isExpirationAllowed


def can_transition(source: TransactionState, target: TransactionState) -> bool:
    return source in VALID_PREVIOUS_STATES[target]


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps Short.MaxValue for fencing: a client never gets an epoch above MAX_EPOCH - 1."""
    return epoch >= MAX_EPOCH - 1


@dataclass(frozen=True, slots=True)
class TxnSnapshot:
    """A transactional id's metadata as a transition will leave it (Kafka's TxnTransitMetadata)."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    txn_start_ms: int
    last_update_ms: int


@dataclass(slots=True)
class TransactionMetadata:
    """One transactional id. ``last_producer_id`` is Kafka's previousProducerId (the id before the last
    InitProducerId), ``last_producer_epoch`` the epoch a KIP-360 retry may name; neither is in the v0
    record, so both are -1 after a load, as in Kafka. ``failed_epoch_fence``: a fence's write failed
    and the epoch in memory is already bumped (never returned to a client), so the next fence keeps it."""

    transactional_id: str
    producer_id: int
    timeout_ms: int
    last_update_ms: int
    last_producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    state: TransactionState = TransactionState.EMPTY
    partitions: frozenset[TopicPartition] = frozenset()
    txn_start_ms: int = -1
    pending_state: TransactionState | None = None
    failed_epoch_fence: bool = False

    def snapshot(self) -> TxnSnapshot:
        return TxnSnapshot(self.producer_id, self.last_producer_id, self.producer_epoch, self.last_producer_epoch,
                           self.timeout_ms, self.state, self.partitions, self.txn_start_ms, self.last_update_ms)

    def _apply(self, s: TxnSnapshot) -> None:
        self.producer_id, self.last_producer_id = s.producer_id, s.last_producer_id
        self.producer_epoch, self.last_producer_epoch = s.producer_epoch, s.last_producer_epoch
        self.timeout_ms, self.state, self.partitions = s.timeout_ms, s.state, s.partitions
        self.txn_start_ms, self.last_update_ms = s.txn_start_ms, s.last_update_ms


class TransitionKind(enum.StrEnum):
    INIT_PRODUCER_ID = "InitProducerId"  # -> Empty with the next epoch or a new producer id
    ADD_PARTITIONS = "AddPartitions"  # -> Ongoing (AddPartitionsToTxn, AddOffsetsToTxn)
    END_TXN = "EndTxn"  # Ongoing -> PrepareCommit / PrepareAbort
    FENCE_ABORT = "FenceAbort"  # Ongoing -> PrepareAbort with the epoch bumped (InitProducerId, timeout)
    COMPLETE = "Complete"  # Prepare* -> Complete*: the markers are written
    EXPIRE_ID = "ExpireId"  # a tombstone: the id was idle past transactional.id.expiration.ms


@dataclass(frozen=True, slots=True, eq=False)
class Transition:
    """A change to persist: append (key, value) to ``__transaction_state`` partition ``partition``, then
    ``complete`` or ``abort`` it. ``target`` is None (and ``value`` None) for a tombstone. ``reply`` is what
    the request is answered once the write succeeded: NONE, or CONCURRENT_TRANSACTIONS for an
    InitProducerId that had to abort the ongoing transaction first (the client retries)."""

    transactional_id: str
    kind: TransitionKind
    target: TxnSnapshot | None
    key: bytes
    value: bytes | None
    partition: int
    reply: TxnError = TxnError.NONE
    created: bool = False  # InitProducerId of an unknown id: abort forgets the id again

    @property
    def producer_id(self) -> int:
        return self.target.producer_id if self.target is not None else NO_PRODUCER_ID

    @property
    def producer_epoch(self) -> int:
        return self.target.producer_epoch if self.target is not None else NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class PendingMarkers:
    """Transaction markers to write: a COMMIT (``commit``) or ABORT marker with this producer id and epoch
    to each partition; then ``markers_written``."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class Completed:
    """What ``complete`` did: ``error`` answers the request (NOT_COORDINATOR: the partition was unloaded or
    reloaded since, nothing applied); ``producer_id``/``producer_epoch`` answer an InitProducerId;
    ``markers`` are to be sent now (a Prepare* was written)."""

    error: TxnError
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    markers: PendingMarkers | None = None


@dataclass(frozen=True, slots=True)
class TxnDescription:
    """DescribeTransactions' answer for one id."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: TransactionState
    timeout_ms: int
    txn_start_ms: int
    topics: tuple[tuple[str, tuple[int, ...]], ...]  # topics and partitions, sorted


@dataclass(frozen=True, slots=True)
class TxnListing:
    """ListTransactions' answer: (transactional id, producer id, state name) per transaction."""

    error: TxnError
    transactions: tuple[tuple[str, int, str], ...] = ()
    unknown_state_filters: tuple[str, ...] = ()


def _log_value(s: TxnSnapshot) -> bytes:
    """The TransactionLogValue of a target: partitions null for Empty, as Kafka's valueToBytes."""
    partitions = None if s.state == S.EMPTY else rec.group_partitions(s.partitions)
    return rec.encode_value(rec.TxnLogValue(s.producer_id, s.producer_epoch, s.timeout_ms, int(s.state), partitions,
                                            s.last_update_ms, s.txn_start_ms))


def _producer_mismatch(meta: TransactionMetadata | None, producer_id: int, producer_epoch: int) -> TxnError | None:
    """Kafka's first checks of a request naming a producer: the id's producer (INVALID_PRODUCER_ID_MAPPING), then
    its epoch, older or newer (PRODUCER_FENCED)."""
    if meta is None or meta.producer_id != producer_id:
        return TxnError.INVALID_PRODUCER_ID_MAPPING
    if meta.producer_epoch != producer_epoch:
        return TxnError.PRODUCER_FENCED
    return None


def _check_id(transactional_id: str) -> TxnError | None:
    """Kafka answers INVALID_REQUEST for an empty id; one that is no Kafka string cannot be a key."""
    if not transactional_id:
        return TxnError.INVALID_REQUEST
    try:
        raw = transactional_id.encode("utf-8")
    except UnicodeEncodeError:
        return TxnError.INVALID_REQUEST
    return TxnError.INVALID_REQUEST if len(raw) > rec.STRING_BYTES_MAX else None


class TransactionCoordinatorState:
    """All transactional ids of the ``__transaction_state`` partitions this coordinator owns.

    A partition is owned from ``begin_load`` (its requests answer COORDINATOR_LOAD_IN_PROGRESS until
    ``finish_load``) or from the constructor's ``owned``, until ``unload``; the ids of other partitions
    answer NOT_COORDINATOR. Not thread-safe: the caller serialises calls."""

    def __init__(self, num_partitions: int, *, owned: Iterable[int] = (),
                 max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS,
                 id_expiration_ms: int = DEFAULT_ID_EXPIRATION_MS,
                 max_partitions: int = DEFAULT_MAX_PARTITIONS,
                 max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        if num_partitions <= 0:
            raise ValueError(f"{rec.TRANSACTION_STATE_TOPIC} needs at least one partition, got {num_partitions}")
        self.num_partitions = num_partitions
        self.max_timeout_ms = max_timeout_ms
        self.id_expiration_ms = id_expiration_ms
        self.max_partitions = max_partitions
        self.max_value_bytes = max_value_bytes
        self._txns: dict[int, dict[str, TransactionMetadata]] = {}
        self._loading: set[int] = set()
        self._inflight: dict[str, Transition] = {}  # the transition each id waits on, by id
        for p in owned:
            self._check_partition(p)
            self._txns[p] = {}

    # ---- ownership and loading -------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return rec.partition_for(transactional_id, self.num_partitions)

    def owned_partitions(self) -> frozenset[int]:
        return frozenset(self._txns)

    def is_loading(self, partition: int) -> bool:
        return partition in self._loading

    def begin_load(self, partition: int) -> None:
        """Take ``partition`` over: its previous state (if any) is dropped, and records are ``load``-ed."""
        self._check_partition(partition)
        self._drop(partition)
        self._txns[partition] = {}
        self._loading.add(partition)

    def load(self, key: bytes | None, value: bytes | None) -> None:
        """Replay one record of a partition being loaded: the last record of an id wins, a tombstone
        removes it. Raises ``rec.TxnRecordError`` (``rec.UnknownVersionError`` for an unknown version) for a
        record to skip, leaving the state as it was; also for a record whose id hashes to a partition
        that is not being loaded (misplaced)."""
        transactional_id, v = rec.parse_record(key, value)
        p = self.partition_for(transactional_id)
        if p not in self._loading:
            raise rec.TxnRecordError(f"record for transactional id {transactional_id!r} belongs to partition {p}, "
                                     "which is not being loaded")
        if v is None:
            self._txns[p].pop(transactional_id, None)
            return
        if v.status in (S.DEAD, S.PREPARE_EPOCH_FENCE):
            raise rec.TxnRecordError(f"transactional id {transactional_id!r} has state {S(v.status).kafka_name}, "
                                     "which is never written")
        if v.producer_id < 0 or v.producer_epoch < 0:
            raise rec.TxnRecordError(f"transactional id {transactional_id!r} has producer id {v.producer_id} "
                                     f"epoch {v.producer_epoch}")
        state = S(v.status)
        partitions: frozenset[TopicPartition] = frozenset()
        if state != S.EMPTY and v.partitions is not None:  # as Kafka's readTxnRecordValue: Empty has none
            partitions = frozenset(TopicPartition(topic, i) for topic, ids in v.partitions for i in ids)
        self._txns[p][transactional_id] = TransactionMetadata(
            transactional_id, producer_id=v.producer_id, timeout_ms=v.timeout_ms, last_update_ms=v.last_update_ms,
            last_producer_id=v.previous_producer_id, producer_epoch=v.producer_epoch,
            last_producer_epoch=NO_PRODUCER_EPOCH, state=state, partitions=partitions, txn_start_ms=v.start_ms)

    def finish_load(self, partition: int) -> list[PendingMarkers]:
        """End the load of ``partition``: its ids are served, and the markers of its Prepare* transactions
        are to be sent (then ``markers_written``), as Kafka's loadTransactionsForTxnTopicPartition."""
        if partition not in self._loading:
            raise ValueError(f"partition {partition} is not being loaded")
        self._loading.discard(partition)
        markers = []
        for meta in self._txns[partition].values():
            if meta.state in PREPARE_STATES:
                meta.pending_state = S.COMPLETE_COMMIT if meta.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
                markers.append(self._markers(meta))
        return markers

    def unload(self, partition: int) -> None:
        """Give ``partition`` up (another broker leads it now): its ids and their pending writes are forgotten;
        ``complete`` of those writes answers NOT_COORDINATOR."""
        self._drop(partition)

    def _drop(self, partition: int) -> None:
        for transactional_id in self._txns.pop(partition, {}):
            self._inflight.pop(transactional_id, None)
        self._loading.discard(partition)

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.num_partitions:
            raise ValueError(f"{rec.TRANSACTION_STATE_TOPIC} has no partition {partition}")

    def _owner(self, transactional_id: str) -> tuple[int, TxnError | None]:
        p = self.partition_for(transactional_id)
        if p in self._loading:
            return p, TxnError.COORDINATOR_LOAD_IN_PROGRESS
        if p not in self._txns:
            return p, TxnError.NOT_COORDINATOR
        return p, None

    def _served(self) -> Iterator[TransactionMetadata]:
        for p, txns in self._txns.items():
            if p not in self._loading:
                yield from txns.values()

    # ---- reading ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(len(txns) for txns in self._txns.values())

    def __contains__(self, transactional_id: object) -> bool:
        return isinstance(transactional_id, str) and self.get(transactional_id) is not None

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        """A copy of an id's metadata (loading partitions included), or None."""
        if _check_id(transactional_id):
            return None
        meta = self._txns.get(self.partition_for(transactional_id), {}).get(transactional_id)
        return None if meta is None else replace(meta)

    def describe(self, transactional_id: str) -> TxnDescription | TxnError:
        """DescribeTransactions (TransactionCoordinator.handleDescribeTransactions)."""
        if err := _check_id(transactional_id):
            return err
        p, err = self._owner(transactional_id)
        if err:
            return err
        meta = self._txns[p].get(transactional_id)
        if meta is None:
            return TxnError.TRANSACTIONAL_ID_NOT_FOUND
        return TxnDescription(transactional_id, meta.producer_id, meta.producer_epoch, meta.state, meta.timeout_ms,
                              meta.txn_start_ms, rec.group_partitions(meta.partitions))

    def list_transactions(self, states_filter: Iterable[str] = (), producer_id_filter: Iterable[int] = (),
                          *, duration_filter_ms: int = -1, now_ms: int = 0) -> TxnListing:
        """ListTransactions (TransactionStateManager.listTransactionStates): states by Kafka's names (unknown
        names reported back), producer ids, and (v1) transactions running longer than ``duration_filter_ms``."""
        if self._loading:
            return TxnListing(TxnError.COORDINATOR_LOAD_IN_PROGRESS)
        wanted_states: set[TransactionState] = set()
        unknown: list[str] = []
        names = list(states_filter)
        for name in names:
            state = S.from_name(name)
            if state is None:
                unknown.append(name)
            else:
                wanted_states.add(state)
        pids = set(producer_id_filter)
        found = []
        for meta in self._served():
            if pids and meta.producer_id not in pids:
                continue
            if names and meta.state not in wanted_states:
                continue
            if duration_filter_ms >= 0 and now_ms - meta.txn_start_ms <= duration_filter_ms:
                continue
            found.append((meta.transactional_id, meta.producer_id, meta.state.kafka_name))
        return TxnListing(TxnError.NONE, tuple(found), tuple(unknown))

    def pending_markers(self) -> list[PendingMarkers]:
        """The Prepare* transactions whose markers are not written yet (no Complete* write in flight): what
        to (re)send, e.g. after the marker sender lost them."""
        return [self._markers(meta) for meta in self._served()
                if meta.state in PREPARE_STATES and meta.transactional_id not in self._inflight]

    # ---- requests --------------------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int, now_ms: int,
                         new_producer_id: Callable[[], int], expected: tuple[int, int] | None = None,
                         max_timeout_ms: int | None = None) -> Transition | TxnError:
        """InitProducerId with a transactional id (TransactionCoordinator.handleInitProducerId).
        ``expected`` is the request's (producer id, epoch) of v3+ (KIP-360), (-1, -1) or None when absent.
        A Transition of kind FENCE_ABORT (reply CONCURRENT_TRANSACTIONS) aborts the ongoing transaction;
        the client retries. ``new_producer_id`` is called only for a new id or an exhausted epoch, before
        anything changes (an exception from it leaves the state as it was)."""
        if err := _check_id(transactional_id):
            return err
        limit = self.max_timeout_ms if max_timeout_ms is None else max_timeout_ms
        if not 0 < timeout_ms <= limit:  # TransactionStateManager.validateTransactionTimeoutMs
            return TxnError.INVALID_TRANSACTION_TIMEOUT
        if expected is not None:
            if expected == (NO_PRODUCER_ID, NO_PRODUCER_EPOCH):
                expected = None
            elif NO_PRODUCER_ID in expected:  # KafkaApis: one without the other
                return TxnError.INVALID_REQUEST
        p, err = self._owner(transactional_id)
        if err:
            return err
        meta = self._txns[p].get(transactional_id)
        created = meta is None
        if meta is None:
            # Kafka puts this in its cache before the write; here it is dropped again if the write fails.
            meta = TransactionMetadata(transactional_id, producer_id=new_producer_id(), timeout_ms=timeout_ms,
                                       last_update_ms=now_ms)
        if meta.pending_state is not None:
            return TxnError.CONCURRENT_TRANSACTIONS
        if expected is not None and not (
                meta.producer_epoch == NO_PRODUCER_EPOCH or expected[0] == meta.producer_id
                or (expected[0] == meta.last_producer_id and is_epoch_exhausted(expected[1]))):
            return TxnError.PRODUCER_FENCED  # prepareInitProducerIdTransit's isValidProducerId
        if meta.state in PREPARE_STATES:
            return TxnError.CONCURRENT_TRANSACTIONS
        if meta.state == S.ONGOING:
            # The epoch bumped here is never returned: the client's retry bumps it again (and gets a new
            # producer id if that exhausts it).
            return self._fence(p, meta, now_ms, TxnError.CONCURRENT_TRANSACTIONS)
        producer_id = meta.producer_id
        if is_epoch_exhausted(meta.producer_epoch) and (expected is None or expected[1] == meta.producer_epoch):
            # prepareProducerIdRotation: the last epoch is kept for a KIP-360 retry only
            producer_id = new_producer_id()
            epoch, last_epoch = 0, meta.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
        elif expected is None:
            epoch, last_epoch = meta.producer_epoch + 1, NO_PRODUCER_EPOCH
        elif meta.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == meta.producer_epoch:
            epoch, last_epoch = meta.producer_epoch + 1, meta.producer_epoch
        elif expected[1] == meta.last_producer_epoch:
            # a retry of a bump whose answer the producer did not get: the same epoch again
            epoch, last_epoch = meta.producer_epoch, meta.last_producer_epoch
        else:
            return TxnError.PRODUCER_FENCED
        target = TxnSnapshot(producer_id, meta.producer_id, epoch, last_epoch, timeout_ms, S.EMPTY, frozenset(), -1,
                             now_ms)
        if created:
            self._txns[p][transactional_id] = meta
        return self._begin(p, meta, TransitionKind.INIT_PRODUCER_ID, target, created=created)

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[tuple[str, int]], now_ms: int) -> Transition | TxnError:
        """AddPartitionsToTxn v0-3 (TransactionCoordinator.handleAddPartitionsToTransaction). TxnError.NONE:
        all are in the ongoing transaction already, nothing to write. More than ``max_partitions`` in the
        transaction, or a record over ``max_value_bytes``: INVALID_REQUEST."""
        if err := _check_id(transactional_id):
            return err
        added: set[TopicPartition] = set()
        for topic, partition in partitions:
            if (not isinstance(topic, str) or _check_id(topic) or not isinstance(partition, int)
                    or not 0 <= partition <= PARTITION_ID_MAX):
                return TxnError.INVALID_REQUEST
            added.add(TopicPartition(topic, partition))
            if len(added) > self.max_partitions:
                return TxnError.INVALID_REQUEST
        p, err = self._owner(transactional_id)
        if err:
            return err
        meta = self._txns[p].get(transactional_id)
        if err := _producer_mismatch(meta, producer_id, producer_epoch):
            return err
        if meta.pending_state is not None or meta.state in PREPARE_STATES:
            return TxnError.CONCURRENT_TRANSACTIONS
        if meta.state == S.ONGOING and added <= meta.partitions:
            return TxnError.NONE
        union = meta.partitions | added
        if len(union) > self.max_partitions:
            return TxnError.INVALID_REQUEST
        # prepareAddPartitions: a transaction starts when its first partitions are added
        start = now_ms if meta.state in EXPIRABLE_STATES else meta.txn_start_ms
        target = replace(meta.snapshot(), state=S.ONGOING, partitions=frozenset(union), txn_start_ms=start,
                         last_update_ms=now_ms)
        value = _log_value(target)
        if len(value) > self.max_value_bytes:
            return TxnError.INVALID_REQUEST
        return self._begin(p, meta, TransitionKind.ADD_PARTITIONS, target, value=value)

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, offsets_partition: int,
                    now_ms: int) -> Transition | TxnError:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition (the caller computes it with
        group_records.partition_for_group) joins the transaction."""
        return self.add_partitions(transactional_id, producer_id, producer_epoch,
                                   [(OFFSETS_TOPIC, offsets_partition)], now_ms)

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                now_ms: int) -> Transition | TxnError:
        """EndTxn v0-4 (TransactionCoordinator.endTransaction from a client, transaction version < 2).
        TxnError.NONE: a retry of an end that completed, nothing to write."""
        if err := _check_id(transactional_id):
            return err
        p, err = self._owner(transactional_id)
        if err:
            return err
        meta = self._txns[p].get(transactional_id)
        if err := _producer_mismatch(meta, producer_id, producer_epoch):
            return err
        if meta.pending_state is not None:  # also while the markers are written (pending Complete*)
            return TxnError.CONCURRENT_TRANSACTIONS
        state = meta.state
        if state == S.ONGOING:
            target = replace(meta.snapshot(), state=S.PREPARE_COMMIT if commit else S.PREPARE_ABORT,
                             last_update_ms=now_ms)
            return self._begin(p, meta, TransitionKind.END_TXN, target)
        if state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            return TxnError.NONE if commit == (state == S.COMPLETE_COMMIT) else TxnError.INVALID_TXN_STATE
        if state in PREPARE_STATES:
            return TxnError.CONCURRENT_TRANSACTIONS if commit == (state == S.PREPARE_COMMIT) \
                else TxnError.INVALID_TXN_STATE
        return TxnError.INVALID_TXN_STATE  # Empty: no transaction to end

    def markers_written(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        now_ms: int) -> Transition | TxnError:
        """Every marker of the Prepare* transaction (``PendingMarkers``) is written: Complete* to persist
        (Kafka's prepareComplete). Errors: the id or its producer changed (INVALID_PRODUCER_ID_MAPPING,
        PRODUCER_FENCED), it is in no Prepare* state (INVALID_TXN_STATE), the Complete* write is in flight
        (CONCURRENT_TRANSACTIONS), or the partition moved (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS)."""
        p, err = self._owner(transactional_id)
        if err:
            return err
        meta = self._txns[p].get(transactional_id)
        if err := _producer_mismatch(meta, producer_id, producer_epoch):
            return err
        if meta.state not in PREPARE_STATES:
            return TxnError.INVALID_TXN_STATE
        if transactional_id in self._inflight:
            return TxnError.CONCURRENT_TRANSACTIONS
        target = replace(meta.snapshot(),
                         state=S.COMPLETE_COMMIT if meta.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT,
                         partitions=frozenset(), last_update_ms=now_ms)
        return self._begin(p, meta, TransitionKind.COMPLETE, target)

    # ---- timers ----------------------------------------------------------------------------------

    def expired(self, now_ms: int) -> list[Transition]:
        """Ongoing transactions open longer than their timeout (``start + timeout < now``), each to abort with
        the epoch bumped so that its producer is fenced (Kafka's abortTimedOutTransactions with
        prepareFenceProducerEpoch). Ids with a pending state are skipped, as Kafka's timedOutTransactions."""
        out = []
        for meta in list(self._served()):
            if (meta.state == S.ONGOING and meta.pending_state is None
                    and meta.txn_start_ms + meta.timeout_ms < now_ms):
                t = self._fence(self.partition_for(meta.transactional_id), meta, now_ms, TxnError.NONE)
                if isinstance(t, Transition):
                    out.append(t)
                else:
                    log.warning("cannot abort timed-out transaction of %r: producer epoch %d cannot be bumped",
                                meta.transactional_id, meta.producer_epoch)
        return out

    def expire_ids(self, now_ms: int) -> list[Transition]:
        """Tombstones for ids idle (in Empty or Complete*, nothing pending) since ``id_expiration_ms``
        (Kafka's removeExpiredTransactionalIds); ``complete`` removes the id."""
        out = []
        for meta in list(self._served()):
            if (meta.state in EXPIRABLE_STATES and meta.pending_state is None
                    and meta.last_update_ms <= now_ms - self.id_expiration_ms):
                out.append(self._begin(self.partition_for(meta.transactional_id), meta, TransitionKind.EXPIRE_ID,
                                       None))
        return out

    # ---- writes ----------------------------------------------------------------------------------

    def complete(self, transition: Transition) -> Completed:
        """The transition's record is written: apply it (Kafka's completeTransitionTo)."""
        tid = transition.transactional_id
        if self._inflight.get(tid) is not transition:
            return Completed(TxnError.NOT_COORDINATOR)  # unloaded or reloaded since: the load has the record
        del self._inflight[tid]
        txns = self._txns[transition.partition]
        target = transition.target
        if target is None:
            del txns[tid]
            return Completed(TxnError.NONE)
        meta = txns[tid]
        meta._apply(target)
        meta.pending_state = None
        markers = None
        if transition.kind == TransitionKind.FENCE_ABORT:
            meta.failed_epoch_fence = False
        if target.state in PREPARE_STATES:
            meta.pending_state = S.COMPLETE_COMMIT if target.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
            markers = self._markers(meta)
        return Completed(transition.reply, target.producer_id, target.producer_epoch, markers)

    def abort(self, transition: Transition) -> None:
        """The transition's write failed: the id is as before it (a new id is forgotten). As in Kafka, a failed
        FENCE_ABORT leaves the epoch bumped in memory (the write may yet surface; the fenced producer must
        stay fenced) and the next fence reuses it; a failed COMPLETE leaves the markers written and the id
        pending: call ``markers_written`` again. Stale transitions are ignored."""
        tid = transition.transactional_id
        if self._inflight.get(tid) is not transition:
            return
        del self._inflight[tid]
        txns = self._txns[transition.partition]
        if transition.created:
            del txns[tid]
            return
        if transition.kind == TransitionKind.COMPLETE:
            return
        meta = txns[tid]
        meta.pending_state = None
        if transition.kind == TransitionKind.FENCE_ABORT and transition.target is not None:
            meta.producer_epoch = transition.target.producer_epoch
            meta.last_producer_epoch = NO_PRODUCER_EPOCH
            meta.failed_epoch_fence = True

    def _fence(self, p: int, meta: TransactionMetadata, now_ms: int, reply: TxnError) -> Transition | TxnError:
        """Ongoing -> PrepareAbort with the epoch bumped: prepareFenceProducerEpoch followed by the abort
        endTransaction makes of it (PrepareEpochFence is only ever pending in Kafka)."""
        if meta.failed_epoch_fence:
            epoch = meta.producer_epoch
        elif meta.producer_epoch >= MAX_EPOCH:
            return TxnError.UNKNOWN_SERVER_ERROR  # Kafka: IllegalStateException, "would overflow"
        else:
            epoch = meta.producer_epoch + 1
        target = replace(meta.snapshot(), state=S.PREPARE_ABORT, producer_epoch=epoch,
                         last_producer_epoch=NO_PRODUCER_EPOCH, last_update_ms=now_ms)
        return self._begin(p, meta, TransitionKind.FENCE_ABORT, target, reply=reply)

    def _begin(self, p: int, meta: TransactionMetadata, kind: TransitionKind, target: TxnSnapshot | None, *,
               value: bytes | None = None, reply: TxnError = TxnError.NONE, created: bool = False) -> Transition:
        tid = meta.transactional_id
        if target is not None:
            if not can_transition(meta.state, target.state):
                raise AssertionError(f"{tid!r}: no transition from {meta.state.kafka_name} to "
                                     f"{target.state.kafka_name}")
            if value is None:
                value = _log_value(target)
        t = Transition(tid, kind, target, rec.encode_key(tid), value, p, reply, created)
        if kind != TransitionKind.COMPLETE:  # a Complete* is pending since its Prepare* was written
            meta.pending_state = S.DEAD if target is None else target.state
        self._inflight[tid] = t
        return t

    @staticmethod
    def _markers(meta: TransactionMetadata) -> PendingMarkers:
        return PendingMarkers(meta.transactional_id, meta.producer_id, meta.producer_epoch,
                              meta.state == S.PREPARE_COMMIT, meta.partitions)
