"""__transaction_state record layouts (Kafka's TransactionLogKey v0, TransactionLogValue v0/v1) and the
transactional id -> partition mapping."""

from __future__ import annotations

import random
import struct

import pytest

from broker import txn_records as rec

# ---- partition_for ------------------------------------------------------------------------------


def _java_hash(text: str) -> int:
    """String.hashCode written out independently: sum of unit * 31^(n-1-i) over UTF-16 code units, mod 2^32,
    as a signed int."""
    raw = text.encode("utf-16-be")
    units = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
    h = sum(u * pow(31, len(units) - 1 - i, 2**32) for i, u in enumerate(units)) % 2**32
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize(
    ("txn_id", "java_hash", "partition_of_50"),
    [
        ("a", 97, 47),  # 'a' = 97
        ("ab", 3105, 5),  # 97 * 31 + 98
        ("hello", 99162322, 22),  # the classic value of "hello".hashCode()
        ("\U0001F600", 1772899, 49),  # a surrogate pair: 0xD83D * 31 + 0xDE00
        ("polygenelubricants", -(2**31), 0),  # Integer.MIN_VALUE: Utils.abs gives 0
        # A negative hash: Kafka's Utils.abs is Math.abs (1061187895 % 50 = 45), not n & 0x7fffffff (which gives 3).
        ("my-txn", -1061187895, 45),
    ],
)
def test_partition_for_matches_kafka(txn_id: str, java_hash: int, partition_of_50: int) -> None:
    assert _java_hash(txn_id) == java_hash
    assert rec.partition_for(txn_id, 50) == partition_of_50


def test_partition_for_range_and_bad_count() -> None:
    for i in range(300):
        tid = f"producer-{i}-é"
        h = _java_hash(tid)
        assert rec.partition_for(tid, 7) == (0 if h == -(2**31) else abs(h)) % 7
    with pytest.raises(ValueError):
        rec.partition_for("x", 0)


# ---- keys ---------------------------------------------------------------------------------------


def test_key_layout_and_round_trip() -> None:
    assert rec.encode_key("txn") == b"\x00\x00" + b"\x00\x03" + b"txn"
    for tid in ("t", "ünï-€-\U0001F600", "x" * 0x7FFF):
        assert rec.decode_key(rec.encode_key(tid)) == tid
    with pytest.raises(ValueError):
        rec.encode_key("x" * 0x8000)


def test_key_errors() -> None:
    with pytest.raises(rec.UnknownVersionError) as info:
        rec.decode_key(b"\x00\x01\x00\x01t")
    assert info.value.version == 1 and info.value.what == "key"
    for bad, why in [(b"", "version"), (b"\x00", "version"), (b"\x00\x00\x00", "transactional id"),
                     (b"\x00\x00\x00\x05abc", "needs 5 bytes"), (b"\x00\x00\xff\xff", "null"),
                     (b"\x00\x00\x00\x02\xc3\x28", "not UTF-8"), (b"\x00\x00\x00\x01ab", "after the last field")]:
        with pytest.raises(rec.TxnRecordError, match=why):
            rec.decode_key(bad)
    with pytest.raises(rec.TxnRecordError, match="without a key"):
        rec.parse_record(None, None)


# ---- values -------------------------------------------------------------------------------------

ONGOING = rec.TxnLogValue(producer_id=1234, producer_epoch=7, timeout_ms=60_000, status=1,
                          partitions=(("orders", (0, 3)), ("payments", (2,))), last_update_ms=1_700_000_000_123,
                          start_ms=1_700_000_000_000)
EMPTY = rec.TxnLogValue(producer_id=9, producer_epoch=0, timeout_ms=1000, status=0, partitions=None,
                        last_update_ms=5, start_ms=-1)


def _v0_by_hand(v: rec.TxnLogValue) -> bytes:
    out = struct.pack(">hqhib", 0, v.producer_id, v.producer_epoch, v.timeout_ms, v.status)
    if v.partitions is None:
        out += struct.pack(">i", -1)
    else:
        out += struct.pack(">i", len(v.partitions))
        for topic, ids in v.partitions:
            out += struct.pack(">h", len(topic.encode())) + topic.encode() + struct.pack(">i", len(ids))
            out += b"".join(struct.pack(">i", i) for i in ids)
    return out + struct.pack(">qq", v.last_update_ms, v.start_ms)


def test_v0_value_layout_round_trip() -> None:
    for v in (ONGOING, EMPTY):
        data = rec.encode_value(v)
        assert data == _v0_by_hand(v)
        assert rec.decode_value(data) == v
    assert rec.decode_value(None) is None  # tombstone
    assert rec.parse_record(rec.encode_key("t"), None) == ("t", None)


def test_v1_value_layout_round_trip() -> None:
    v = rec.TxnLogValue(producer_id=1234, producer_epoch=7, timeout_ms=60_000, status=2,
                        partitions=(("ab", (1, 2)),), last_update_ms=10, start_ms=5, previous_producer_id=1200,
                        next_producer_id=-1, client_transaction_version=2, unknown_tags=((9, b"\x01\x02"),),
                        version=1)
    expected = (struct.pack(">hqhib", 1, 1234, 7, 60_000, 2)
                + bytes([2])  # compact array: 1 entry + 1
                + bytes([3]) + b"ab"  # compact string: 2 + 1
                + bytes([3]) + struct.pack(">ii", 1, 2)  # compact int32 array: 2 + 1
                + bytes([0])  # the entry's tagged fields: none
                + struct.pack(">qq", 10, 5)
                + bytes([3])  # three tagged fields, ascending: 0 (i64), 2 (i16), 9 (unknown, kept)
                + bytes([0, 8]) + struct.pack(">q", 1200)
                + bytes([2, 2]) + struct.pack(">h", 2)
                + bytes([9, 2, 1, 2]))
    assert rec.encode_value(v) == expected
    assert rec.decode_value(expected) == v
    # defaults are not written; null partitions is compact length 0
    plain = rec.TxnLogValue(5, 0, 100, 0, None, 1, -1, version=1)
    data = rec.encode_value(plain)
    assert data == struct.pack(">hqhib", 1, 5, 0, 100, 0) + b"\x00" + struct.pack(">qq", 1, -1) + b"\x00"
    assert rec.decode_value(data) == plain


def test_v1_next_producer_id_and_many_partitions() -> None:
    ids = tuple(range(0, 300, 3))  # lengths past one varint byte
    v = rec.TxnLogValue(1, 2, 3, 4, (("t" * 200, ids), ("u", (0,))), 6, 7, next_producer_id=77, version=1)
    assert rec.decode_value(rec.encode_value(v)) == v


def test_unknown_value_version_and_status() -> None:
    data = rec.encode_value(ONGOING)
    with pytest.raises(rec.UnknownVersionError) as info:
        rec.decode_value(b"\x00\x02" + data[2:])
    assert info.value.version == 2 and info.value.what == "value"
    with pytest.raises(rec.TxnRecordError, match="unknown transaction status 8"):
        rec.decode_value(data[:16] + b"\x08" + data[17:])  # version 2, id 8, epoch 2, timeout 4 bytes
    with pytest.raises(ValueError):
        rec.encode_value(rec.TxnLogValue(1, 1, 1, 9, None, 1, 1))
    with pytest.raises(ValueError):
        rec.encode_value(rec.TxnLogValue(1, 1, 1, 1, None, 1, 1, version=2))


@pytest.mark.parametrize("version", [0, 1])
def test_every_truncation_is_a_clean_error(version: int) -> None:
    v = rec.TxnLogValue(1234, 7, 60_000, 1, (("orders", (0, 3)), ("p", (2,))), 11, 10,
                        previous_producer_id=3 if version else -1, version=version)
    data = rec.encode_value(v)
    for n in range(len(data)):
        with pytest.raises(rec.TxnRecordError):
            rec.decode_value(data[:n])
    with pytest.raises(rec.TxnRecordError, match="after the last field"):
        rec.decode_value(data + b"\x00")


def test_hostile_lengths_and_bytes() -> None:
    head0 = struct.pack(">hqhib", 0, 1, 1, 1, 1)
    head1 = struct.pack(">hqhib", 1, 1, 1, 1, 1)
    cases = [
        (head0 + struct.pack(">i", 0x7FFFFFFF), "claims 2147483647 entries"),
        (head0 + struct.pack(">i", -2), "length -2"),
        (head0 + struct.pack(">i", 1) + struct.pack(">h", 0x7FFF) + b"x" * 20, "needs 32767 bytes"),
        (head0 + struct.pack(">i", 1) + struct.pack(">h", -1) + b"\x00" * 30, "null"),
        (head0 + struct.pack(">i", 1) + b"\x00\x02\xff\xfe" + struct.pack(">i", 0) + b"\x00" * 16, "not UTF-8"),
        (head0 + struct.pack(">i", 1) + b"\x00\x01t" + struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 16,
         "claims 2147483647 entries"),
        (head0 + struct.pack(">i", 1) + b"\x00\x01t" + struct.pack(">i", -5) + b"\x00" * 16, "null"),
        (head1 + b"\xff\xff\xff\xff\x0f" + b"\x00" * 16, "claims 4294967294 entries"),
        (head1 + b"\xff\xff\xff\xff\xff\x01", "longer than 5 bytes"),
        (head1 + b"\xff\xff\xff\xff\x7f", "exceeds 32 bits"),
        (head1 + b"\x02\x00" + b"\x00" * 20, "topic is null"),
        (head1 + b"\x02\x02t\x00" + b"\x00" * 20, "partition ids of 't' are null"),
        (head1 + b"\x00" + struct.pack(">qq", 0, 0) + b"\x01\x00\x07" + b"\x00" * 7, "has 7 bytes"),
        (head1 + b"\x00" + struct.pack(">qq", 0, 0) + b"\x01\x02\x01\x00", "has 1 bytes"),
        (head1 + b"\x00" + struct.pack(">qq", 0, 0) + b"\x02\x05\x00\x05\x00", "tags must ascend"),
        (head1 + b"\x00" + struct.pack(">qq", 0, 0) + b"\x01\x05\x7f", "needs 127 bytes"),
        (head1 + b"\x00" + struct.pack(">qq", 0, 0) + b"\x7f", "claims 127 entries"),
    ]
    for data, why in cases:
        with pytest.raises(rec.TxnRecordError, match=why):
            rec.decode_value(data)


def test_random_mutations_never_escape_as_other_errors() -> None:
    rng = random.Random(20240501)
    seeds = [rec.encode_value(ONGOING), rec.encode_value(EMPTY),
             rec.encode_value(rec.TxnLogValue(1, 2, 3, 4, (("x", (1,)),), 5, 6, previous_producer_id=8,
                                              client_transaction_version=1, version=1))]
    decoded = 0
    for _ in range(20_000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            roll = rng.random()
            if roll < 0.6 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif roll < 0.8 and data:
                del data[rng.randrange(len(data)):]
            else:
                data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        try:
            v = rec.decode_value(bytes(data))
        except rec.TxnRecordError:
            continue
        decoded += 1
        assert v is not None and v.status in rec.STATUS_IDS
        assert rec.decode_value(rec.encode_value(v)) == v
    assert decoded > 0


def test_group_partitions_sorted_and_merged() -> None:
    pairs = [("b", 2), ("a", 5), ("b", 0), ("a", 5), ("a", 1)]
    assert rec.group_partitions(pairs) == (("a", (1, 5)), ("b", (0, 2)))
    assert rec.group_partitions([]) == ()
