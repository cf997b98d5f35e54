"""Plain records shared by the Producer, Consumer, Admin and the low-level ClusterClient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class _OffsetAndMetadataFields(NamedTuple):
    offset: int
    metadata: str = ""


class OffsetAndMetadata(_OffsetAndMetadataFields):
    """A committed position: the offset of the *next* record to consume, plus free text.

    ``leader_epoch`` (None when unknown) is the leader epoch of the record before ``offset`` (KIP-320):
    the consumer commits its position's epoch and, resuming from a committed offset that has one,
    checks it against the partition's current leader before fetching, so a log truncated below it
    (an unclean leader election) is noticed. It is carried beside the tuple, not in it: a committed
    offset still unpacks as ``offset, metadata`` and compares equal to ``OffsetAndMetadata(offset,
    metadata)`` whatever its epoch (as confluent-kafka's ``TopicPartition.leader_epoch``)."""

    leader_epoch: int | None = None  # instances made by _make / unpickling of an old tuple: unknown

    def __new__(cls, offset: int, metadata: str = "", leader_epoch: int | None = None) -> OffsetAndMetadata:
        self = super().__new__(cls, offset, metadata)
        if leader_epoch is not None and leader_epoch >= 0:
            self.leader_epoch = int(leader_epoch)
        return self

    def __repr__(self) -> str:
        epoch = "" if self.leader_epoch is None else f", leader_epoch={self.leader_epoch}"
        return f"OffsetAndMetadata(offset={self.offset!r}, metadata={self.metadata!r}{epoch})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (OffsetAndMetadata, (self.offset, self.metadata, self.leader_epoch))

    def __copy__(self) -> OffsetAndMetadata:
        return self

    def __deepcopy__(self, memo: Any) -> OffsetAndMetadata:
        return self

    def _replace(self, **changes: Any) -> OffsetAndMetadata:
        epoch = changes.pop("leader_epoch", self.leader_epoch)
        fields = self._asdict()
        fields.update(changes)
        return OffsetAndMetadata(fields["offset"], fields["metadata"], epoch)


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record landed (the value of a producer future)."""

    topic: str
    partition: int
    offset: int  # -1 with acks=0 (the broker does not answer)
    timestamp: int  # create time, or the broker's log-append time when the topic uses it
    serialized_key_size: int = -1
    serialized_value_size: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class ConsumerRecord(NamedTuple):
    """One consumed record: an immutable named tuple, like kafka-python's ConsumerRecord.

    Fields by name or by index, in this order. The consumer's decoder
    (storage/record_decode.py) builds these tuples directly, in C when the extension is
    built. ``key``/``value`` are bytes (or None) unless a deserializer is configured;
    ``headers`` is a tuple of (key, value) pairs, ``()`` when there are none: immutable like
    the record, so a record without headers holds no container and the garbage collector
    need not track it (with a list per record, collections cost the consumer half its speed).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: Any
    value: Any
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class BrokerMetadata:
    node_id: int
    host: str
    port: int
    rack: str = ""
    fenced: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    topic: str
    partition: int
    leader: int  # -1 when offline
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: str
    is_internal: bool
    partitions: dict[int, PartitionMetadata]
    error_code: int = 0
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    cluster_id: str
    controller_id: int
    version: int
    brokers: dict[int, BrokerMetadata]
    topics: dict[str, TopicMetadata]
    controllers: list[tuple[str, int]]

    def partitions_for(self, topic: str) -> list[int] | None:
        info = self.topics.get(topic)
        if info is None or info.error_code != 0:
            return None
        return sorted(info.partitions)

    def leader_for(self, tp: TopicPartition) -> int:
        info = self.topics.get(tp.topic)
        if info is None:
            return -1
        part = info.partitions.get(tp.partition)
        return -1 if part is None else part.leader


@dataclass(frozen=True, slots=True)
class FetchResult:
    records: bytes  # whole RecordBatch v2 batches (decode with storage.record_batch)
    high_watermark: int
    log_start_offset: int
    error: Exception | None = None  # a BrookError subclass when the broker refused
    log_end_offset: int = -1
    last_stable_offset: int = -1
    # read_committed fetches: (producer id, first offset) of the aborted transactions among the records
    aborted_transactions: tuple[tuple[int, int], ...] = ()
