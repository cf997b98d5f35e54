"""A hostile client's toolkit: RecordBatch v2 bytes with any header and records, and a valid CRC.

Used to build batches that pass the header and CRC checks so only the LogValidator's
record walk can catch them. Encoding is written out here (not via RecordBatchBuilder)
so that every field can lie independently.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

from crc32c import crc32c

from storage import compression
from storage import record_batch as rb

BASE_TS = 1_700_000_000_000
_AFTER_CRC = struct.Struct(">hiqqqhii")
_BEFORE_CRC = struct.Struct(">qiib")

Header = tuple[str, bytes | None]


def varint(value: int) -> bytes:
    """Zigzag varint of any int64 (the same encoding as the record format)."""
    z = ((value << 1) ^ (value >> 63)) & (2**64 - 1)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def record(offset_delta: int, key: bytes | None = b"k", value: bytes | None = b"v", *, ts_delta: int = 0,
           headers: Sequence[tuple[bytes, bytes | None]] = (), length_delta: int = 0,
           key_length: int | None = None, header_count: int | None = None) -> bytes:
    """One encoded record; ``length_delta``/``key_length``/``header_count`` let its fields lie."""
    body = bytearray(b"\x00")
    body += varint(ts_delta) + varint(offset_delta)
    body += varint(-1 if key is None else len(key) if key_length is None else key_length) + (key or b"")
    body += varint(-1 if value is None else len(value)) + (value or b"")
    body += varint(len(headers) if header_count is None else header_count)
    for hk, hv in headers:
        body += varint(len(hk)) + hk + varint(-1 if hv is None else len(hv)) + (hv or b"")
    return varint(len(body) + length_delta) + bytes(body)


def records(count: int, *, keys: bool = True) -> bytes:
    return b"".join(record(i, b"key-%d" % i if keys else None, b"value-%d" % i, ts_delta=i) for i in range(count))


def batch(section: bytes, *, count: int, last_offset_delta: int | None = None, attributes: int = 0,
          base_ts: int = BASE_TS, max_ts: int | None = None, codec: int = rb.CODEC_NONE, compress: bool = True,
          producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1, magic: int = 2) -> bytes:
    """A batch around ``section`` (compressed with ``codec`` unless ``compress`` is False) with a valid CRC."""
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    if codec != rb.CODEC_NONE and compress:
        section = compression.compress(codec, section)
    after = _AFTER_CRC.pack(attributes | codec, lod, base_ts, base_ts + max(lod, 0) if max_ts is None else max_ts,
                            producer_id, producer_epoch, base_sequence, count)
    crc = crc32c(section, crc32c(after))
    before = _BEFORE_CRC.pack(0, rb.MIN_BATCH_LENGTH + len(section), -1, magic)
    return before + struct.pack(">I", crc) + after + section


def valid(count: int = 3, *, codec: int = rb.CODEC_NONE, keys: bool = True) -> bytes:
    return batch(records(count, keys=keys), count=count, codec=codec)


def mutate(rng: random.Random, data: bytes) -> bytes:
    """1-4 random edits of a records section: bytes changed, inserted or cut, extreme varints, bad UTF-8."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif op == 1:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        elif op == 2:
            del buf[pos:pos + rng.randint(1, 4)]
        elif op == 3:
            del buf[pos:]
        elif op == 4:
            buf[pos:pos] = varint(rng.choice([-(2**63), -2, -1, 0, 1, 63, 64, 2**31, 2**62, 2**63 - 1]))
        elif op == 5:
            buf[pos:pos] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])
        else:
            buf[pos:pos] = b"\xff" * rng.randint(9, 11)
    return bytes(buf)
