"""Record-batch codec benchmark: ``python -m storage.codec_bench``.

Encodes and decodes batches of 100-byte records (1000 per batch by default) with
every codec and prints records/s and MB/s (MB of uncompressed record values, 10^6
bytes) for each direction, the producer's encoding with the C record encoder and with
the pure-Python fallback, the consumer's decoding (batch straight to
client.types.ConsumerRecord, storage/record_decode.py) with the C decoder and with the
pure-Python fallback, plus header-only validation throughput and the leader's full
validation (LogValidator: decompress + walk every record) per codec.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from client.types import ConsumerRecord
from storage import record_batch as rb
from storage import record_decode, record_walk
from storage.compression import CODEC_NAMES
from storage.log_config import LogConfig
from storage.log_validator import LogValidator


@dataclass(frozen=True)
class Result:
    codec: str
    batch_bytes: int
    encode_records_per_s: float
    encode_mb_per_s: float
    encode_py_records_per_s: float  # RecordBatchBuilder's pure-Python path (equal when C is not built)
    decode_records_per_s: float
    decode_mb_per_s: float
    consumer_c_records_per_s: float | None  # None: the C extension is not built
    consumer_py_records_per_s: float


def _values(record_bytes: int, count: int) -> list[bytes]:
    # Half random, half repetitive: compressible like typical JSON-ish payloads, not trivially so.
    half = record_bytes // 2
    return [os.urandom(half) + (b"%08d" % i) * ((record_bytes - half) // 8 + 1) for i in range(count)]


def _timed(fn: Callable[[], object], min_seconds: float) -> tuple[float, int]:
    """Run ``fn`` repeatedly for at least ``min_seconds``; (seconds, iterations)."""
    iterations = 0
    start = time.perf_counter()
    deadline = start + min_seconds
    while True:
        fn()
        iterations += 1
        now = time.perf_counter()
        if now >= deadline:
            return now - start, iterations


def bench_codec(codec: int, *, record_bytes: int, records_per_batch: int, min_seconds: float) -> Result:
    values = [v[:record_bytes] for v in _values(record_bytes, records_per_batch)]
    keys = [b"key-%d" % (i % 100) for i in range(records_per_batch)]
    base_ts = 1_700_000_000_000

    def encode() -> bytes:
        builder = rb.RecordBatchBuilder(codec, producer_id=1, producer_epoch=0, base_sequence=0)
        append = builder.append
        for i in range(records_per_batch):
            append(base_ts + i, keys[i], values[i])
        return builder.build()

    batch = encode()
    enc_s, enc_n = _timed(encode, min_seconds)
    compiled_writer, rb._RecordsWriter = rb._RecordsWriter, rb._PyRecordsWriter
    try:
        enc_py_s, enc_py_n = _timed(encode, min_seconds)
    finally:
        rb._RecordsWriter = compiled_writer
    dec_s, dec_n = _timed(lambda: rb.decode_batch(batch), min_seconds)

    def consumer_rate(decoder: Callable[..., object]) -> float:
        def decode() -> object:
            h, section, start, end = rb.batch_section(batch, 0)
            return decoder(ConsumerRecord, section, start, end, h.record_count, h.base_offset, h.base_timestamp,
                           None, "topic", 0, 0, 0)

        seconds, n = _timed(decode, min_seconds)
        return n * records_per_batch / seconds

    consumer_c = consumer_rate(record_decode.decode_records_c) if record_decode.COMPILED else None
    consumer_py = consumer_rate(record_decode.decode_records_py)
    payload = record_bytes * records_per_batch
    return Result(
        codec=CODEC_NAMES[codec],
        batch_bytes=len(batch),
        encode_records_per_s=enc_n * records_per_batch / enc_s,
        encode_mb_per_s=enc_n * payload / enc_s / 1e6,
        encode_py_records_per_s=enc_py_n * records_per_batch / enc_py_s,
        decode_records_per_s=dec_n * records_per_batch / dec_s,
        decode_mb_per_s=dec_n * payload / dec_s / 1e6,
        consumer_c_records_per_s=consumer_c,
        consumer_py_records_per_s=consumer_py,
    )


def bench_validate(*, record_bytes: int, records_per_batch: int, min_seconds: float) -> tuple[float, float]:
    """Header + CRC validation of a 1000-record batch: (batches/s, MB/s) — the broker's produce path."""
    builder = rb.RecordBatchBuilder()
    for value in _values(record_bytes, records_per_batch):
        builder.append(1_700_000_000_000, None, value[:record_bytes])
    batch = builder.build()
    seconds, n = _timed(lambda: rb.validate_batch(batch), min_seconds)
    return n / seconds, n * len(batch) / seconds / 1e6


def bench_log_validator(codec: int, *, record_bytes: int, records_per_batch: int, min_seconds: float) -> float:
    """LogValidator.validate of one batch (headers already checked): records/s."""
    builder = rb.RecordBatchBuilder(codec)
    for i, value in enumerate(_values(record_bytes, records_per_batch)):
        builder.append(1_700_000_000_000 + i, b"key-%d" % (i % 100), value[:record_bytes])
    buf = bytearray(builder.build())
    headers = rb.validate_batches(buf)
    validator = LogValidator(LogConfig())
    seconds, n = _timed(lambda: validator.validate(buf, headers), min_seconds)
    return n * records_per_batch / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--records-per-batch", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=1.0, help="minimum time per measurement")
    args = parser.parse_args(argv)
    print(
        f"RecordBatch v2 codec benchmark: {args.record_bytes}-byte values, "
        f"{args.records_per_batch} records per batch, keys of 5-6 bytes"
    )
    print(f"{'codec':<8}{'batch B':>10}{'encode rec/s':>15}{'enc MB/s':>10}{'encode py rec/s':>17}"
          f"{'decode rec/s':>15}{'dec MB/s':>10}"
          f"{'consumer C rec/s':>18}{'consumer py rec/s':>19}")
    for codec in sorted(CODEC_NAMES):
        r = bench_codec(
            codec,
            record_bytes=args.record_bytes,
            records_per_batch=args.records_per_batch,
            min_seconds=args.seconds,
        )
        print(
            f"{r.codec:<8}{r.batch_bytes:>10}{r.encode_records_per_s:>15,.0f}{r.encode_mb_per_s:>10.1f}"
            f"{r.encode_py_records_per_s:>17,.0f}"
            f"{r.decode_records_per_s:>15,.0f}{r.decode_mb_per_s:>10.1f}"
            f"{'not built' if r.consumer_c_records_per_s is None else f'{r.consumer_c_records_per_s:,.0f}':>18}"
            f"{r.consumer_py_records_per_s:>19,.0f}"
        )
    encoder = "C record encoder" if rb._RecordsWriter is not rb._PyRecordsWriter else "pure Python: C extension not built"
    print(f"encode: RecordBatchBuilder ({encoder}); encode py: its pure-Python fallback; "
          "decode: decode_batch to Records; consumer: batch to ConsumerRecords (storage/record_decode.py), "
          "C decoder and pure-Python fallback")
    batches_per_s, mb_per_s = bench_validate(
        record_bytes=args.record_bytes, records_per_batch=args.records_per_batch, min_seconds=args.seconds
    )
    print(f"validate_batch (header + CRC-32C): {batches_per_s:,.0f} batches/s, {mb_per_s:,.0f} MB/s")
    walk = "compiled" if record_walk.COMPILED else "pure-Python"
    rates = [f"{CODEC_NAMES[c]} {bench_log_validator(c, record_bytes=args.record_bytes, records_per_batch=args.records_per_batch, min_seconds=args.seconds):,.0f}"
             for c in sorted(CODEC_NAMES)]
    print(f"LogValidator (decompress + {walk} record walk), rec/s: {', '.join(rates)}")


if __name__ == "__main__":
    main()
