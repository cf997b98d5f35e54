"""Leader-side record validation through real broker processes (issue 11).

A hostile client sends crafted batches with valid CRCs over the Produce RPC: each is
refused with its code, the partition's LEO does not move on any replica, the refusal is
counted in /metrics, and a consumer reads every good record before and after it.
"""

from __future__ import annotations

import struct
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerkit import Kit, make_batch, replica_log_bytes, running_kit
from crc32c import crc32c
from waiting import wait_for

from proto.errors import ErrorCode
from storage import record_batch as rb

pytestmark = pytest.mark.slow
TOPIC, COMPACTED = "hostile", "hostile-compacted"


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    base: Path = tmp_path_factory.mktemp("validate-cluster")
    with running_kit(base, nodes=3, overrides={"auto.create.topics.enable": "false"}) as k:
        k.create_topic(TOPIC, partitions=1, rf=3, configs={"max.message.bytes": "65536"})
        k.create_topic(COMPACTED, partitions=1, rf=3, configs={"cleanup.policy": "compact"})
        yield k


def _refit(buf: bytes, **fields: int) -> bytes:
    """Rewrite header fields of a valid single batch and recompute its CRC (a hostile client)."""
    names = ("attributes", "last_offset_delta", "base_timestamp", "max_timestamp", "producer_id",
             "producer_epoch", "base_sequence", "record_count")
    after = dict(zip(names, struct.unpack_from(">hiqqqhii", buf, 21), strict=True))
    after.update(fields)
    out = bytearray(buf)
    struct.pack_into(">hiqqqhii", out, 21, *(after[n] for n in names))
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def _compressed(codec: int, section: bytes, count: int) -> bytes:
    b = rb.RecordBatchBuilder()
    b.append(1, b"k", b"v")
    plain = b.build()
    out = bytearray(plain[:rb.BATCH_HEADER_SIZE]) + section
    struct.pack_into(">i", out, 8, rb.MIN_BATCH_LENGTH + len(section))
    return _refit(bytes(out), attributes=codec, record_count=count, last_offset_delta=count - 1)


def _keyless(n: int) -> bytes:
    b = rb.RecordBatchBuilder()
    for i in range(n):
        b.append(1_700_000_000_000 + i, None, b"v%d" % i)
    return b.build()


def _gzip_bomb() -> bytes:
    one = rb.RecordBatchBuilder()
    one.append(1, b"k", bytes(8 << 20))  # 8 MiB of zeros: ~8 KiB gzipped, decompressed cap is 2 MiB
    records = one.build()[rb.BATCH_HEADER_SIZE:]
    obj = zlib.compressobj(9, zlib.DEFLATED, 31)
    return _compressed(rb.CODEC_GZIP, obj.compress(records) + obj.flush(), 1)


ATTACKS = {
    "count-overstated": (lambda: _refit(make_batch(b"a", b"b", b"c"), record_count=5, last_offset_delta=4),
                         ErrorCode.CORRUPT_MESSAGE),
    "count-understated": (lambda: _refit(make_batch(b"a", b"b", b"c"), record_count=2, last_offset_delta=1),
                          ErrorCode.CORRUPT_MESSAGE),
    "gzip-one-record-claims-a-million": (
        lambda: _compressed(rb.CODEC_GZIP, zlib.compress(make_batch(b"x")[rb.BATCH_HEADER_SIZE:], wbits=31),
                            1_000_000), ErrorCode.CORRUPT_MESSAGE),
    "random-bytes-as-zstd": (lambda: _compressed(rb.CODEC_ZSTD, bytes(range(256)) * 3, 3),
                             ErrorCode.CORRUPT_MESSAGE),
    "gzip-bomb": (_gzip_bomb, ErrorCode.MESSAGE_TOO_LARGE),  # not retriable, unlike CORRUPT_MESSAGE
    "control-batch": (lambda: rb.build_control_batch(True, producer_id=1, producer_epoch=0, timestamp_ms=1),
                      ErrorCode.INVALID_RECORD),
    "transactional": (lambda: _refit(make_batch(b"t"), attributes=rb.ATTR_TRANSACTIONAL), ErrorCode.INVALID_RECORD),
}


def _leos(kit: Kit, topic: str) -> list[int]:
    return [kit.fetch(n, topic, 0, 0, max_bytes=1).log_end_offset for n in kit.state(topic).replicas]


def _failed_batches_metric(kit: Kit, topic: str) -> float:
    total = 0.0
    for node_id in kit.cluster.node_ids:
        with urllib.request.urlopen(kit.cluster.metrics_url(node_id), timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(f'brook_topic_failed_produce_batches_total{{topic="{topic}"}}'):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def test_hostile_batches_are_refused_and_the_partition_stays_readable(kit: Kit) -> None:
    assert kit.produce(TOPIC, 0, make_batch(b"before")).error_code == ErrorCode.NONE
    for name, (build, code) in ATTACKS.items():
        before = kit.consume_all(TOPIC)[2]
        wait_for(lambda b=before: _leos(kit, TOPIC) == [b] * 3, 30, "replicas in sync before the attack")
        r = kit.produce(TOPIC, 0, build())
        assert r.error_code == code, (name, r)
        assert r.error_message, name
        assert _leos(kit, TOPIC) == [before] * 3, name
        assert kit.produce(TOPIC, 0, make_batch(name.encode())).error_code == ErrorCode.NONE
    values, _raw, hw = kit.consume_all(TOPIC)
    assert list(values.values()) == [b"before", *(n.encode() for n in ATTACKS)]
    assert sorted(values) == list(range(hw))
    wait_for(lambda: _failed_batches_metric(kit, TOPIC) >= len(ATTACKS), 30, "refusals counted in /metrics")


def test_keyless_records_are_refused_on_a_compacted_topic(kit: Kit) -> None:
    r = kit.produce(COMPACTED, 0, _keyless(3))
    assert r.error_code == ErrorCode.INVALID_RECORD and "key" in r.error_message, r
    good = rb.RecordBatchBuilder()
    good.append(1, b"k", b"v")
    assert kit.produce(COMPACTED, 0, good.build()).error_code == ErrorCode.NONE
    values, _raw, hw = kit.consume_all(COMPACTED)
    assert values == {0: b"v"} and hw == 1


def test_keyless_records_are_accepted_on_a_delete_topic(kit: Kit) -> None:
    assert kit.produce(TOPIC, 0, _keyless(2)).error_code == ErrorCode.NONE


def test_replicas_hold_identical_readable_logs_after_the_attacks(kit: Kit) -> None:
    # Nothing refused reached a follower: every replica holds the same bytes, all decodable.
    hw = kit.consume_all(TOPIC)[2]
    wait_for(lambda: _leos(kit, TOPIC) == [hw] * 3, 30, "every replica at the HW")
    logs = [replica_log_bytes(kit.cluster, n, TOPIC, 0, hw) for n in kit.state(TOPIC).replicas]
    assert logs[0] and logs.count(logs[0]) == 3
    assert [r.offset for r in rb.decode_records(logs[0])] == list(range(hw))
