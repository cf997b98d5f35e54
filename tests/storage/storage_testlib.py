"""Helpers shared by STORAGE's tests: batches built with CODEC's RecordBatchBuilder."""

from __future__ import annotations

import time
from pathlib import Path

from storage.record_batch import CODEC_NONE, BatchHeader, RecordBatchBuilder, decode_records, iter_batches


def now_ms() -> int:
    return int(time.time() * 1000)


def make_batch(count: int = 3, *, ts: int | None = None, key: bytes | None = b"k", value_size: int = 50,
               producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
               keys: list[bytes | None] | None = None, values: list[bytes | None] | None = None,
               compression: int = CODEC_NONE, base_offset: int = 0, epoch: int = -1) -> bytes:
    ts = now_ms() if ts is None else ts
    b = RecordBatchBuilder(compression, producer_id=producer_id, producer_epoch=producer_epoch,
                           base_sequence=base_sequence, base_offset=base_offset, partition_leader_epoch=epoch)
    for i in range(count):
        k = keys[i] if keys is not None else key
        v = values[i] if values is not None else bytes([65 + i % 26]) * value_size
        b.append(ts + i, k, v)
    return b.build()


def offsets_of(data: bytes) -> list[int]:
    return [r.offset for r in decode_records(data)]


def batch_bases(data: bytes) -> list[int]:
    return [h.base_offset for _p, h in iter_batches(data)]


def read_all(log, max_offset: int | None = None) -> bytes:
    """Every batch from the log start to ``max_offset`` (default: the log end)."""
    out = bytearray()
    offset = log.log_start_offset
    end = log.log_end_offset if max_offset is None else max_offset
    for _ in range(1_000_000):
        if offset >= end:
            break
        got = log.read(offset, 1 << 20, max_offset=max_offset)
        if not got.records:
            break
        out += got.records
        last_next = offset
        for _p, h in iter_batches(got.records):
            last_next = h.next_offset
        offset = last_next
    return bytes(out)


def flip_byte(path: Path, position: int, mask: int = 0x5A) -> None:
    """XOR the byte at ``position`` of the file with ``mask``: bytes that changed on disk."""
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ mask]))


def flip_value_byte(path: Path, which: int) -> BatchHeader:
    """Flip the last byte (a value's) of batch ``which`` of a segment file: its CRC no longer matches. Its header."""
    pos, h = list(iter_batches(path.read_bytes()))[which]
    flip_byte(path, pos + h.size - 1)
    return h
