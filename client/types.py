"""Plain records shared by the Producer, Consumer, Admin and the low-level ClusterClient."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    """A committed position: the offset of the *next* record to consume, plus free text."""

    offset: int
    metadata: str = ""


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
