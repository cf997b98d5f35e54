"""The consumer's C decoder (storage._record_walk.decode_records) matches the Python reference.

Valid batches (keys or not, null values, headers, LogAppendTime, every codec) decode to
equal ConsumerRecord lists both ways, and to the same fields as ``decode_batch``; malformed
sections (hand-made, then seeded mutations) raise the same exception class with the same
message both ways, so the fallback and the extension refuse the same batches alike.
"""

from __future__ import annotations

import functools
import gc
import random
import re

import pytest
from batch_forge import BASE_TS, batch, mutate, record, records, varint

from client.types import ConsumerRecord
from proto import errors
from storage import record_batch as rb
from storage import record_decode

pytestmark = pytest.mark.skipif(
    not record_decode.COMPILED, reason="storage._record_walk is not built (no C compiler at install time?)")

DECODERS = {"c": record_decode.decode_records_c, "py": record_decode.decode_records_py}


def outcome(decoder: str, section: bytes | bytearray | memoryview, count: int, *, start: int = 0,
            end: int | None = None, base_offset: int = 100, base_ts: int = BASE_TS,
            log_append_ts: int | None = None) -> tuple:
    end = len(section) if end is None else end
    try:
        records_, increasing = DECODERS[decoder](ConsumerRecord, section, start, end, count, base_offset, base_ts,
                                                 log_append_ts, "topic", 7, 0 if log_append_ts is None else 1, 42)
    except (errors.CorruptMessageError, errors.InvalidRecordError) as exc:
        return ("error", type(exc), str(exc))
    assert all(type(r) is ConsumerRecord for r in records_)
    return ("ok", records_, increasing)


def both(section: bytes | bytearray | memoryview, count: int, **kwargs: object) -> tuple:
    py = outcome("py", section, count, **kwargs)  # type: ignore[arg-type]
    c = outcome("c", section, count, **kwargs)  # type: ignore[arg-type]
    assert c == py, (bytes(section).hex(), count, kwargs)
    if py[0] == "ok":  # and the same types inside: bytes/None, str header keys, lists of headers
        for rc, rp in zip(c[1], py[1], strict=True):
            assert [type(x) for x in rc] == [type(x) for x in rp]
            assert [type(h) for h in rc.headers] == [type(h) for h in rp.headers]
    return py


def test_valid_batches_decode_alike_with_every_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    for codec in (rb.CODEC_NONE, rb.CODEC_GZIP, rb.CODEC_SNAPPY, rb.CODEC_LZ4, rb.CODEC_ZSTD):
        for append_time in (False, True):
            builder = rb.RecordBatchBuilder(
                codec, base_offset=1000,
                timestamp_type=rb.TIMESTAMP_LOG_APPEND_TIME if append_time else rb.TIMESTAMP_CREATE_TIME)
            for i in range(50):
                builder.append(BASE_TS + i * 3 - 70, None if i % 3 == 0 else b"k%d" % i,
                               None if i % 5 == 0 else b"v" * i,
                               [(f"h{j}", None if j % 2 else b"x" * j) for j in range(i % 4)] + (
                                   [("ümlaut", b"")] if i == 7 else []))
            buf = b"junk" + builder.build()
            if append_time:
                buf = bytearray(buf)
                rb.set_log_append_time(buf, 4, BASE_TS + 999)
            got = {}
            for name, fn in DECODERS.items():
                monkeypatch.setattr(record_decode, "decode_records", fn)
                got[name] = record_decode.decode_batch_tuples(buf, 4, ConsumerRecord, "t", 2)
            assert got["c"] == got["py"]
            h, recs, increasing = got["c"]
            assert increasing and len(recs) == 50
            reference = rb.decode_batch(buf, 4)[1]
            ts_type = 1 if append_time else 0
            assert recs == [ConsumerRecord("t", 2, r.offset, r.timestamp, ts_type, r.key, r.value, tuple(r.headers))
                            for r in reference]
            assert recs[7].headers == (("h0", b""), ("h1", None), ("h2", b"xx"), ("ümlaut", b""))
            assert recs[0].key is None and recs[0].value is None and recs[1].headers == (("h0", b""),)
            assert {r.timestamp for r in recs} == ({BASE_TS + 999} if append_time else {BASE_TS + i * 3 - 70
                                                                                        for i in range(50)})


def test_offsets_and_timestamps_past_int64_are_python_ints() -> None:
    section = record(5, ts_delta=2**63 - 1) + record(-3, ts_delta=-(2**63))
    _, recs, increasing = both(section, 2, base_offset=2**63 - 2, base_ts=2**63 - 1)
    assert [r.offset for r in recs] == [2**63 + 3, 2**63 - 5] and not increasing
    assert [r.timestamp for r in recs] == [2**64 - 2, -1]
    _, recs, _ = both(section, 2, base_offset=-(2**63), base_ts=-(2**63), log_append_ts=-(2**63))
    assert [r.offset for r in recs] == [-(2**63) + 5, -(2**63) - 3]
    assert [r.timestamp for r in recs] == [-(2**63)] * 2


MALFORMED = {
    # name: (section, count, exception class)
    "count short": (records(2), 3, errors.CorruptMessageError),
    "trailing bytes": (records(2) + b"\x00", 2, errors.CorruptMessageError),
    "length below 6": (varint(5) + b"\x00" * 5, 1, errors.InvalidRecordError),
    "length past the end": (record(0, length_delta=1), 1, errors.InvalidRecordError),
    "length short of the fields": (record(0, length_delta=-1) + b"\x00", 1, errors.InvalidRecordError),
    "key length -2": (record(0, key_length=-2), 1, errors.InvalidRecordError),
    "key past the section": (record(0, key_length=200), 1, errors.InvalidRecordError),
    "key past the record": (record(0, key_length=3) + b"\x00" * 5, 1, errors.InvalidRecordError),
    "value length -7": (varint(9) + b"\x00\x00\x00\x01" + varint(-7) + b"\x00\x00\x00\x00", 1,
                        errors.InvalidRecordError),
    "huge header count": (record(0, header_count=2**62), 1, errors.InvalidRecordError),
    "negative header count": (record(0, header_count=-1), 1, errors.InvalidRecordError),
    "header count too big for the record": (record(0, headers=[(b"a", b"b")], header_count=3), 1,
                                            errors.InvalidRecordError),
    "header key not UTF-8": (record(0, headers=[(b"ok", None), (b"\xff\xfe", b"v")]), 1,
                             errors.InvalidRecordError),
    "header key a lone surrogate": (record(0, headers=[(b"\xed\xa0\x80", b"v")]), 1, errors.InvalidRecordError),
    "varint over 64 bits": (varint(30) + b"\x00" + b"\xff" * 9 + b"\x02" + b"\x00" * 19, 1,
                            errors.InvalidRecordError),
    "varint of 11 bytes": (varint(30) + b"\x00" + b"\xff" * 11 + b"\x00" * 18, 1, errors.InvalidRecordError),
    "truncated varint": (b"\xff\xff", 1, errors.InvalidRecordError),
    "headers past the section": (record(0)[:-1], 1, errors.InvalidRecordError),
}


def _overrunning_header_value() -> bytes:
    body = b"\x00\x00\x00" + varint(-1) + varint(-1) + varint(1) + varint(1) + b"a" + varint(50) + b"x" * 4
    return varint(len(body)) + body


MALFORMED["header value past the record"] = (_overrunning_header_value() + b"\x00" * 60, 1,
                                             errors.InvalidRecordError)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_sections_raise_the_same_error(name: str) -> None:
    section, count, expected = MALFORMED[name]
    result = both(section, count)
    assert result[0] == "error" and result[1] is expected, result


@functools.cache
def _seeds() -> list[tuple[bytes, int]]:
    big = b"".join(record(i, b"k" * (i % 3), b"v" * (i % 5), ts_delta=(i * 7919) % 4001 - 2000)
                   for i in range(120))
    with_headers = b"".join(record(i, None if i % 2 else b"key", None if i % 3 == 0 else b"value" * i, ts_delta=-i,
                                   headers=[(b"h%d" % j, None if j % 2 else b"x" * j) for j in range(i % 4)])
                            for i in range(20))
    utf8 = record(0, headers=[("ümlaut".encode(), b"1"), ("日本".encode(), None)])
    return [(records(3), 3), (records(70, keys=False), 70), (big, 120), (with_headers, 20), (utf8, 1),
            (record(0, b"k" * 300, b"v" * 20000, ts_delta=2**40), 1)]


def test_seeded_mutations_give_identical_results() -> None:
    rng = random.Random(20261123)
    messages: set[str] = set()
    accepted = 0
    for n in range(6000):
        data, count = rng.choice(_seeds())
        mutated = mutate(rng, data)
        count = count if n % 3 else max(0, count + rng.randint(-2, 2))
        result = both(mutated, count, log_append_ts=BASE_TS if n % 4 == 0 else None)
        if result[0] == "ok":
            accepted += 1
        else:
            messages.add(re.sub(r"-?\d+", "N", result[2].split(":")[1]))
    # The mutations reach most refusals (and some survive): the comparison covers them, not just OK.
    assert accepted > 100 and len(messages) >= 10, (accepted, sorted(messages))


def test_offsets_into_a_larger_buffer_and_memoryviews() -> None:
    data, count = _seeds()[3]
    framed = b"\x01" * 61 + data + b"\x02" * 9
    expected = both(data, count)
    assert expected[0] == "ok"
    assert both(framed, count, start=61, end=61 + len(data)) == expected
    assert outcome("c", memoryview(bytearray(framed)), count, start=61, end=61 + len(data)) == expected
    bad = b"\x01" * 61 + data[:-3] + b"\x02" * 9  # truncated inside the section: no reading past `end`
    assert both(bad, count, start=61, end=61 + len(data) - 3)[0] == "error"


def test_bad_arguments_are_refused() -> None:
    data, count = _seeds()[0]
    c_decode = record_decode._decode_c
    assert c_decode is not None
    args = (data, 0, len(data), count, 0, 0, None, "t", 0, 0)
    assert len(c_decode(ConsumerRecord, *args)[0]) == count
    assert c_decode(tuple, *args)[0][0] == ("t", 0, 0, 0, 0, b"key-0", b"value-0", ())

    class WithDict(tuple):  # instances have a __dict__: refused
        pass

    for cls in (list, int, WithDict, "ConsumerRecord"):
        with pytest.raises(ValueError):
            c_decode(cls, *args)
    with pytest.raises(ValueError):
        c_decode(ConsumerRecord, data, 0, len(data) + 1, count, 0, 0, None, "t", 0, 0)
    with pytest.raises(ValueError):
        c_decode(ConsumerRecord, data, 0, len(data), count, 0, 0, "1", "t", 0, 0)


def test_batch_level_errors_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    good = batch(records(3), count=3)
    for fn in DECODERS.values():
        monkeypatch.setattr(record_decode, "decode_records", fn)
        with pytest.raises(errors.CorruptMessageError):
            record_decode.decode_batch_tuples(good[:-1] + b"\x01", 0, ConsumerRecord, "t", 0)  # CRC
        bad_count = batch(records(3), count=4)
        with pytest.raises(errors.CorruptMessageError, match="declares 4 records but holds 3"):
            record_decode.decode_batch_tuples(bad_count, 0, ConsumerRecord, "t", 0)


def test_records_without_headers_are_not_tracked_by_the_garbage_collector() -> None:
    """What the consumer's speed rests on: a tracked tuple per record made every collection walk
    them all (half the decoded-consume rate). A record with headers holds tuples and stays tracked."""
    b = rb.RecordBatchBuilder()
    for i in range(3):
        b.append(BASE_TS, None, b"v%d" % i)
    b.append(BASE_TS, b"k", b"v", [("h", b"x")])
    _, recs, _ = record_decode.decode_batch_tuples(b.build(), 0, ConsumerRecord, "t", 0)
    assert [r.headers for r in recs] == [(), (), (), (("h", b"x"),)]
    assert [gc.is_tracked(r) for r in recs] == [False, False, False, True]
