"""The producer's C record encoder (storage._record_walk.append_record) matches the Python reference.

RecordBatchBuilder encodes each appended record in C when the extension is built, and
with ``_append_py`` otherwise. Both must write the same bytes for every record a caller
can append (null and empty keys and values, lengths past the one-byte and the table
varints, headers, negative and extreme timestamp deltas, every codec), refuse the same
records the same way, and leave a batch unchanged when they refuse. The batches they
build must decode back to what was appended.
"""

from __future__ import annotations

import logging
import random
import sys
import types

import pytest

import storage
from proto import errors
from storage import record_batch as rb
from storage import record_walk

needs_c = pytest.mark.skipif(
    rb._append_record_c is None, reason="storage._record_walk is not built (no C compiler at install time?)")

BASE_TS = 1_700_000_000_000


def build(records: list[tuple], codec: int, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> bytes:
    with monkeypatch.context() as m:
        if not compiled:
            m.setattr(rb, "_append_record_c", None)
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
                m.setattr(rb, "_append_record_c", None)
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
                m.setattr(rb, "_append_record_c", None)
            key, value = bytearray(b"key"), memoryview(b"value")
            builder = rb.RecordBatchBuilder()
            builder.append(BASE_TS, key, value)
            key[0:3] = b"KEY"
            record = rb.decode_batch(builder.build())[1][0]
            assert (record.key, record.value) == (b"key", b"value")


@needs_c
def test_the_encoder_refuses_wrong_types_without_writing() -> None:
    buf = bytearray(b"x")
    for args in ((bytes(buf), 0, 0, None, None, b"\x00"), (buf, 0, 0, "k", None, b"\x00"),
                 (buf, 0, 0, None, None, None), (buf, 0, 0, None, bytearray(b"v"), b"\x00")):
        with pytest.raises(TypeError):
            rb._append_record_c(*args)  # type: ignore[misc]
    with pytest.raises(OverflowError):
        rb._append_record_c(buf, 2**63, 0, None, None, b"\x00")  # type: ignore[misc]
    with pytest.raises(TypeError):
        rb._append_record_c(buf, 0, 0, None, None)  # type: ignore[misc]
    assert buf == b"x"


def test_an_extension_from_an_older_checkout_is_named_not_silently_half_used(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    old_build = types.ModuleType("storage._record_walk")
    old_build.walk = lambda *a: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "storage._record_walk", old_build)
    monkeypatch.setattr(storage, "_record_walk", old_build, raising=False)
    monkeypatch.delenv("BROOK_PURE_PYTHON_WALK", raising=False)
    with caplog.at_level(logging.WARNING, logger=record_walk.logger.name):
        assert record_walk._load_compiled() is old_build
    assert "older build without decode_records, append_record" in caplog.text
    assert "pip install -e ." in caplog.text
