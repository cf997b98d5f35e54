"""Record batches -> Arrow: values, offsets, ranges, compression, headers, schema."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from proto import errors
from spark_source.columns import Columns, arrow_schema, decode_into, spark_schema, to_record_batch
from storage.record_batch import (
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_ZSTD,
    TIMESTAMP_LOG_APPEND_TIME,
    RecordBatchBuilder,
    decode_batch,
    set_log_append_time,
)


def _batch(base: int, n: int, codec: int = CODEC_NONE, headers: bool = False) -> bytes:
    b = RecordBatchBuilder(codec, base_offset=base)
    for i in range(n):
        key = None if i % 3 == 0 else f"k{base + i}".encode()
        hdrs = [("h", f"{i}".encode()), ("n", None)] if headers and i % 2 else []
        b.append(1_700_000_000_000 + i * 300, key, b"v" * (i % 200) + bytes([i % 256]), hdrs)
    return b.build()


@pytest.mark.parametrize("include_headers", [False, True])
def test_arrow_schema_is_what_spark_expects(include_headers: bool) -> None:
    expected = to_arrow_schema(spark_schema(include_headers), timezone="UTC")
    assert arrow_schema(include_headers).equals(expected), (arrow_schema(include_headers), expected)


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_LZ4, CODEC_ZSTD])
def test_decode_matches_reference_decoder(codec: int) -> None:
    buf = _batch(100, 150, codec, headers=True) + _batch(250, 40, codec, headers=True)
    cols = Columns(headers=[])
    res = decode_into(buf, cols, 100, 290)
    assert res.records == 190 and res.next_offset == 290 and res.batches == 2
    reference = decode_batch(buf)[1] + decode_batch(buf, len(_batch(100, 150, codec, headers=True)))[1]
    assert cols.offsets == [r.offset for r in reference]
    assert cols.keys == [r.key for r in reference]
    assert cols.values == [r.value for r in reference]
    assert cols.timestamps_ms == [r.timestamp for r in reference]
    assert cols.headers == [r.headers or None for r in reference]
    rb = to_record_batch(cols, "tópic", 3, arrow_schema(True))
    assert rb.schema.equals(arrow_schema(True))
    assert rb.column("topic").to_pylist() == ["tópic"] * 190
    assert rb.column("partition").to_pylist() == [3] * 190
    assert rb.column("offset").to_pylist() == list(range(100, 290))
    assert rb.column("value").to_pylist() == [r.value for r in reference]
    first_ts = rb.column("timestamp")[0].as_py()
    assert int(first_ts.timestamp() * 1000) == reference[0].timestamp
    assert rb.column("headers")[1].as_py() == [{"key": "h", "value": b"1"}, {"key": "n", "value": None}]
    assert rb.column("headers")[0].as_py() is None


def test_range_bounds_cut_inside_batches_and_torn_tail_is_left() -> None:
    whole = _batch(0, 10) + _batch(10, 10)
    cols = Columns()
    res = decode_into(whole, cols, 5, 13)
    assert cols.offsets == list(range(5, 13)), cols.offsets
    assert res.next_offset == 20
    torn = whole[:-7]
    cols = Columns()
    res = decode_into(torn, cols, 0, 20)
    assert cols.offsets == list(range(10)) and res.next_offset == 10 and res.batches == 1


def test_log_append_time_uses_batch_max_timestamp() -> None:
    b = RecordBatchBuilder(CODEC_NONE, base_offset=0)
    for i in range(3):
        b.append(1000 + i, None, b"x")
    buf = bytearray(b.build())
    set_log_append_time(buf, 0, 99_000)
    cols = Columns()
    decode_into(bytes(buf), cols, 0, 3)
    assert cols.timestamps_ms == [99_000] * 3 and cols.timestamp_types == [TIMESTAMP_LOG_APPEND_TIME] * 3


def test_corruption_is_detected() -> None:
    buf = bytearray(_batch(0, 5))
    buf[-3] ^= 0xFF
    with pytest.raises(errors.CorruptMessageError):
        decode_into(bytes(buf), Columns(), 0, 5)


def test_empty_columns_make_an_empty_batch() -> None:
    rb = to_record_batch(Columns(), "t", 0, arrow_schema(False))
    assert rb.num_rows == 0 and isinstance(rb, pa.RecordBatch)
