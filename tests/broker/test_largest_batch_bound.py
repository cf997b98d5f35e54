"""A leader stores only what every reader can take whole: the bound of max.message.bytes.

The controller refuses max.message.bytes (and the cluster default message.max.bytes) above
MAX_MESSAGE_BYTES_LIMIT (tests/replication/test_largest_batch_readers.py shows it, and that a batch of that
size reaches every reader). A value set before the bound (kept in the metadata, or in a node's file) is used
as the bound by the brokers (storage's LogConfig): here, broker 1's real ReplicaManager in process with such a topic refuses a
larger batch (MESSAGE_TOO_LARGE) instead of storing it, both as sent and when it would store it larger than
sent (compression.type=none decompresses a producer's zstd batch: a 6 KB request stored a 60 MiB batch). And
every reader's bound covers one batch of that size: a follower's gRPC receive bound, the broker's send bound,
a Brook client's receive bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessBroker

from broker.server import GRPC_MAX_MESSAGE_BYTES
from client.cluster import MAX_MESSAGE_BYTES as CLIENT_RECEIVE_BYTES
from metadata_quorum.cluster_configs import MAX_MESSAGE_BYTES_LIMIT
from proto import errors
from replication.fetcher import FetcherConfig, receive_max_bytes
from storage.log_config import LogConfig
from storage.record_batch import CODEC_NONE, CODEC_ZSTD, RecordBatchBuilder

MiB = 1024 * 1024
LEGACY = 200 * MiB  # a topic's max.message.bytes accepted before the bound


def batch_of(records_bytes: int, codec: int) -> bytes:
    """A batch of 1 MiB records of zeros (``records_bytes`` of values in all)."""
    b = RecordBatchBuilder(codec)
    value = bytes(MiB)
    for _ in range(records_bytes // MiB):
        b.append(1_700_000_000_000, None, value)
    return b.build()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    topics = {"legacy": {"max.message.bytes": str(LEGACY)},
              "legacy-none": {"max.message.bytes": str(LEGACY), "compression.type": "none"}}
    with InProcessBroker(tmp_path, topics) as b:
        yield b


def test_a_legacy_max_message_bytes_is_used_as_the_bound(broker: InProcessBroker) -> None:
    for topic in ("legacy", "legacy-none"):
        lg = broker.rm.leader_partition(topic, 0).log
        assert lg.config.max_message_bytes == MAX_MESSAGE_BYTES_LIMIT, topic

    over = MAX_MESSAGE_BYTES_LIMIT + MiB
    plain = batch_of(over, CODEC_NONE)  # as sent: larger than the bound
    small = batch_of(over, CODEC_ZSTD)  # a few KB sent, stored uncompressed: larger than the bound
    assert len(plain) > MAX_MESSAGE_BYTES_LIMIT and len(small) < MiB
    for topic, records in (("legacy", plain), ("legacy-none", small)):
        with pytest.raises(errors.MessageTooLargeError):
            broker.rm.append_records(topic, 0, records, acks=1, timeout_ms=5000).result(timeout=60)
        assert broker.rm.leader_partition(topic, 0).log.log_end_offset == 0, f"{topic}: stored"

    # Within the bound it is taken, and stored uncompressed as the topic asks.
    fits = batch_of(MAX_MESSAGE_BYTES_LIMIT - MiB, CODEC_ZSTD)
    broker.rm.append_records("legacy-none", 0, fits, acks=1, timeout_ms=5000).result(timeout=60)
    lg = broker.rm.leader_partition("legacy-none", 0).log
    assert lg.log_end_offset == (MAX_MESSAGE_BYTES_LIMIT - MiB) // MiB
    assert MAX_MESSAGE_BYTES_LIMIT - 2 * MiB < lg.size_bytes <= MAX_MESSAGE_BYTES_LIMIT


def test_a_stored_max_message_bytes_is_used_within_the_bound() -> None:
    def used(overrides: dict[str, str], defaults: dict[str, str] | None = None) -> LogConfig:
        return LogConfig.from_overrides(overrides, defaults)

    legacy = used({"max.message.bytes": str(LEGACY), "segment.bytes": "1000"})
    assert (legacy.max_message_bytes, legacy.segment_bytes) == (MAX_MESSAGE_BYTES_LIMIT, 1000)
    assert used({"max.message.bytes": str(MAX_MESSAGE_BYTES_LIMIT)}).max_message_bytes == MAX_MESSAGE_BYTES_LIMIT
    assert used({}, {"max.message.bytes": str(LEGACY)}).max_message_bytes == MAX_MESSAGE_BYTES_LIMIT  # a node file's
    assert used({}).max_message_bytes == 1024 * 1024 + 12


def test_every_reader_takes_the_largest_batch_whole() -> None:
    """A fetch answer is its records (at most the fetch's max bytes, or one batch beyond them) plus the
    answer's own fields: room for them on top of the largest batch a leader stores."""
    answer = MAX_MESSAGE_BYTES_LIMIT + 64 * 1024
    for max_bytes in (1024, MiB, 10 * MiB, 100 * MiB):  # replica.fetch.response.max.bytes
        assert receive_max_bytes(FetcherConfig(max_bytes=max_bytes)) >= max(max_bytes, answer)
    assert GRPC_MAX_MESSAGE_BYTES >= answer  # what a broker sends
    assert CLIENT_RECEIVE_BYTES >= GRPC_MAX_MESSAGE_BYTES  # what a Brook client (and Spark) receives
    assert answer < 100_000_000  # librdkafka's default receive.message.max.bytes
