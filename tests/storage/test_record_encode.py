"""The producer's C record encoder (storage._record_walk.RecordsWriter) matches the Python reference.

RecordBatchBuilder encodes each appended record with the compiled records writer when the
extension is built, and with ``_PyRecordsWriter`` otherwise. Both must write the same bytes for every record a caller
can append (null and empty keys and values, lengths past the one-byte and the table
varints, headers, negative and extreme timestamp deltas, every codec), refuse the same
records the same way, and leave a batch unchanged when they refuse. The batches they
build must decode back to what was appended.
"""

from __future__ import annotations

import logging
import random
import sys
import time
import types

import pytest

import storage
from proto import errors
from storage import record_batch as rb
from storage import record_walk

needs_c = pytest.mark.skipif(
    rb._RecordsWriter is rb._PyRecordsWriter, reason="storage._record_walk is not built (no C compiler at install time?)")

BASE_TS = 1_700_000_000_000


def build(records: list[tuple], codec: int, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> bytes:
    with monkeypatch.context() as m:
        if not compiled:
            m.setattr(rb, "_RecordsWriter", rb._PyRecordsWriter)
        builder = rb.RecordBatchBuilder(codec, producer_id=9, producer_epoch=1, base_sequence=5)
        sizes = []
        for ts, key, value, headers in records:
            builder.append(ts, key, value, headers)
            sizes.append(builder.size_estimate)
        return builder.build() + repr(sizes).encode()


def random_records(rng: random.Random, n: int) -> list[tuple]:
    def blob() -> bytes | None:
        return rng.choice([None, b"", rng.randbytes(rng.choice([1, 63, 64, 200, 8191, 8192, 20000]))])

    out = []
    for _ in range(n):
        ts = BASE_TS + rng.choice([0, 1, -1, 63, 64, -65, 10**6, -(10**9), 2**40])
        headers = rng.choice([(), [("h", b"v")], [("k" * 70, None), ("é", b"\x00" * 300)]])
        out.append((ts, blob(), blob(), headers))
    return out


@needs_c
@pytest.mark.parametrize("codec", [rb.CODEC_NONE, rb.CODEC_GZIP, rb.CODEC_SNAPPY, rb.CODEC_LZ4, rb.CODEC_ZSTD])
def test_compiled_and_python_encoders_write_the_same_batches(codec: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(f"encode-{codec}")
    for n in (1, 2, 17, 300):
        records = random_records(rng, n)
        c = build(records, codec, True, monkeypatch)
        py = build(records, codec, False, monkeypatch)
        assert c == py, f"{n} records, codec {codec}: the C and Python encoders differ"
    # And the bytes are right, not only alike: the batch decodes to what was appended.
    builder = rb.RecordBatchBuilder(codec)
    for ts, key, value, headers in records:
        builder.append(ts, key, value, headers)
    decoded = rb.decode_batch(builder.build())[1]
    assert [(r.timestamp, r.key, r.value) for r in decoded] == [(ts, k, v) for ts, k, v, _ in records]
    assert [[(hk, hv) for hk, hv in r.headers] for r in decoded] == [list(h) for _, _, _, h in records]


@needs_c
def test_extreme_timestamp_deltas_encode_alike_and_refuse_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    # The largest deltas a varlong holds are written by both; one past it is refused by both,
    # with the Python path's error, and the batch keeps only the records before it.
    for delta in (2**63 - 1, -(2**63)):
        first, second = (0, delta) if delta > 0 else (2**62, 2**62 + delta)
        records = [(first, b"k", b"v", ()), (second, None, b"v", ())]
        assert build(records, rb.CODEC_NONE, True, monkeypatch) == build(records, rb.CODEC_NONE, False, monkeypatch)
    for compiled in (True, False):
        with monkeypatch.context() as m:
            if not compiled:
                m.setattr(rb, "_RecordsWriter", rb._PyRecordsWriter)
            builder = rb.RecordBatchBuilder()
            builder.append(-(2**62), b"k", b"v")
            before = builder.size_estimate
            with pytest.raises(errors.InvalidRecordError, match="does not fit a varlong"):
                builder.append(2**62, b"k", b"v")  # delta 2**63
            assert builder.size_estimate == before and builder.record_count == 1
            header, records = rb.decode_batch(builder.build())
            assert len(records) == 1 and header.max_timestamp == -(2**62)


@needs_c
def test_bytes_like_keys_and_values_are_copied_at_append(monkeypatch: pytest.MonkeyPatch) -> None:
    # A caller's bytearray may change after send(): the batch holds what it was at append.
    for compiled in (True, False):
        with monkeypatch.context() as m:
            if not compiled:
                m.setattr(rb, "_RecordsWriter", rb._PyRecordsWriter)
            key, value = bytearray(b"key"), memoryview(b"value")
            builder = rb.RecordBatchBuilder()
            builder.append(BASE_TS, key, value)
            key[0:3] = b"KEY"
            record = rb.decode_batch(builder.build())[1][0]
            assert (record.key, record.value) == (b"key", b"value")


@needs_c
def test_the_writer_refuses_wrong_types_and_spent_records_without_writing() -> None:
    w = rb._RecordsWriter(rb.BATCH_HEADER_SIZE)
    w.append(BASE_TS, None, b"v", b"\x00")
    size = w.size
    for args in ((BASE_TS, "k", None, b"\x00"), (BASE_TS, None, None, None), (BASE_TS, None, bytearray(b"v"), b"\x00"),
                 ("now", None, None, b"\x00"), (BASE_TS, None, None)):
        with pytest.raises(TypeError):
            w.append(*args)
    with pytest.raises(OverflowError):
        w.append(2**63, None, None, b"\x00")
    with pytest.raises(OverflowError):
        w.append(BASE_TS - 2**63 - 1, None, None, b"\x00")  # fits an int64, its delta does not
    assert (w.count, w.size) == (1, size)
    records, count, base_ts, max_ts = w.take()
    assert (count, base_ts, max_ts) == (1, BASE_TS, BASE_TS)
    with pytest.raises(ValueError):
        w.append(BASE_TS, None, None, b"\x00")
    with pytest.raises(ValueError):
        w.take()


@needs_c
def test_append_future_writes_what_append_writes_and_declines_what_it_cannot() -> None:
    # The producer's hot path: the record without headers and its future in one call. What needs
    # the builder (bytes-like keys, a delta beyond a varlong, spent records) it declines with None,
    # having written nothing.
    from client.accumulator import BatchCompletion, RecordFuture

    completion = BatchCompletion("t", 0)
    fast, ref = rb._RecordsWriter(rb.BATCH_HEADER_SIZE), rb._PyRecordsWriter(rb.BATCH_HEADER_SIZE)
    for ts, key, value in ((BASE_TS, None, b"v"), (BASE_TS - 5, b"k", b""), (BASE_TS + 2**40, b"", None)):
        f = fast.append_future(RecordFuture, completion, ts, key, value)
        delta = ref.append(ts, key, value, b"\x00")
        assert isinstance(f, RecordFuture) and f._completion is completion
        assert (f._delta, f._timestamp, f._key_size, f._value_size) == (
            delta, ts, -1 if key is None else len(key), -1 if value is None else len(value))
    size = fast.size
    assert fast.append_future(RecordFuture, completion, BASE_TS, bytearray(b"k"), None) is None
    assert fast.append_future(RecordFuture, completion, BASE_TS - 2**63 - 1, None, None) is None
    assert fast.append_future(RecordFuture, completion, 2**64, None, None) is None
    assert fast.size == size and fast.count == ref.count == 3
    now = fast.append_future(RecordFuture, completion, None, None, b"now")  # no timestamp: the wall clock
    ref.append(now._timestamp, None, b"now", b"\x00")
    assert abs(now._timestamp - time.time() * 1000) < 60_000
    assert fast.take() == ref.take()
    assert fast.append_future(RecordFuture, completion, BASE_TS, None, None) is None
    with pytest.raises(TypeError):
        fast.append_future(object, completion, BASE_TS, None, None)


def test_an_extension_from_an_older_checkout_is_named_not_silently_half_used(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    old_build = types.ModuleType("storage._record_walk")
    old_build.walk = lambda *a: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "storage._record_walk", old_build)
    monkeypatch.setattr(storage, "_record_walk", old_build, raising=False)
    monkeypatch.delenv("BROOK_PURE_PYTHON_WALK", raising=False)
    with caplog.at_level(logging.WARNING, logger=record_walk.logger.name):
        assert record_walk._load_compiled() is old_build
    assert "older build without decode_records, RecordsWriter, RecordFutureBase" in caplog.text
    assert "pip install -e ." in caplog.text
