"""Record-batch compression codecs with Kafka's framing, and bounded decompression.

Codec ids are the RecordBatch attribute values: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

- gzip: RFC 1952 members (several concatenated members are accepted, as Java's
  GZIPInputStream does).
- snappy: Kafka (Java) writes xerial's stream framing: an 16-byte header (magic
  ``\\x82SNAPPY\\x00``, version 1, compatible version 1) then blocks of int32 length +
  raw snappy. We write that framing and read both it and a bare raw snappy block.
- lz4: the standard LZ4 frame format with independent blocks (Kafka's v2 batches).
- zstd: a standard zstd frame.

Every decompressor refuses to produce more than ``max_output_bytes`` (a zip bomb in a
small batch must not exhaust a broker's or a consumer's memory) and reports damaged or
truncated input as CorruptMessageError.
"""

from __future__ import annotations

import logging
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from proto import errors

logger = logging.getLogger(__name__)

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES: dict[int, str] = {
    CODEC_NONE: "none",
    CODEC_GZIP: "gzip",
    CODEC_SNAPPY: "snappy",
    CODEC_LZ4: "lz4",
    CODEC_ZSTD: "zstd",
}
CODEC_BY_NAME: dict[str, int] = {name: codec for codec, name in CODEC_NAMES.items()}

# A generous multiple of the largest batch Kafka accepts by default (max.message.bytes
# ~1 MiB): legitimate batches compress 10-50x at most, a bomb compresses 1000x+.
DEFAULT_MAX_OUTPUT_BYTES = 128 * 1024 * 1024

GZIP_LEVEL = 6  # zlib's default and Java's Deflater default: Kafka's gzip output
ZSTD_LEVEL = 3  # zstd's default, as Kafka's compression.zstd.level
SNAPPY_BLOCK_BYTES = 32 * 1024  # xerial SnappyOutputStream's default block size, as Kafka writes

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_HEADER_SIZE = 16
_INT32 = struct.Struct(">i")
# Bound on frames/members per input: each needs at least a few bytes, so this only stops
# pathological inputs from turning into long loops.
_MAX_MEMBERS = 1 << 16

_zstd_compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
_zstd_decompressor = zstandard.ZstdDecompressor()


def codec_for_name(name: str) -> int:
    """Codec id for a Kafka ``compression.type`` value (none/gzip/snappy/lz4/zstd)."""
    try:
        return CODEC_BY_NAME[name.strip().lower()]
    except KeyError:
        raise errors.InvalidConfigError(f"unknown compression type {name!r}") from None


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress a batch's records section with ``codec`` (Kafka's framing)."""
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        # compressobj with wbits=31 writes a gzip member; faster than gzip.compress (no mtime call).
        obj = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        return obj.compress(data) + obj.flush()
    if codec == CODEC_SNAPPY:
        return _snappy_xerial_compress(data)
    if codec == CODEC_LZ4:
        return lz4.frame.compress(data, block_linked=False, store_size=False)
    if codec == CODEC_ZSTD:
        return _zstd_compressor.compress(data)
    raise errors.CorruptMessageError(f"unknown compression codec {codec}")


def decompress(
    codec: int, data: bytes | bytearray | memoryview, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
) -> bytes:
    """Decompress ``data``; CorruptMessageError when damaged, truncated or above ``max_output_bytes``."""
    if codec == CODEC_NONE:
        if len(data) > max_output_bytes:
            raise _too_large(codec, max_output_bytes)
        return bytes(data)
    try:
        if codec == CODEC_GZIP:
            return _gzip_decompress(data, max_output_bytes)
        if codec == CODEC_SNAPPY:
            return _snappy_decompress(data, max_output_bytes)
        if codec == CODEC_LZ4:
            return _lz4_decompress(data, max_output_bytes)
        if codec == CODEC_ZSTD:
            return _zstd_decompress(data, max_output_bytes)
    except errors.BrookError:
        raise
    except (zlib.error, zstandard.ZstdError, RuntimeError, ValueError, cramjam.DecompressionError) as exc:
        # lz4 raises RuntimeError on damaged frames; cramjam its own DecompressionError.
        raise errors.CorruptMessageError(f"{CODEC_NAMES[codec]} data is corrupt: {exc}") from exc
    raise errors.CorruptMessageError(f"unknown compression codec {codec}")


def _too_large(codec: int, limit: int) -> errors.BrookError:
    return errors.CorruptMessageError(
        f"{CODEC_NAMES.get(codec, codec)} data decompresses to more than {limit} bytes; refused"
    )


def _gzip_decompress(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    total = 0
    rest: bytes | memoryview = memoryview(data)
    for _ in range(_MAX_MEMBERS):
        obj = zlib.decompressobj(31)
        chunk = obj.decompress(rest, limit - total + 1)
        total += len(chunk)
        if total > limit:
            raise _too_large(CODEC_GZIP, limit)
        if not obj.eof:
            raise errors.CorruptMessageError("gzip data is truncated")
        out.append(chunk)
        rest = obj.unused_data
        if not rest:
            return out[0] if len(out) == 1 else b"".join(out)
        if rest[:2] != b"\x1f\x8b":
            raise errors.CorruptMessageError(f"{len(rest)} bytes of garbage after the gzip data")
    raise errors.CorruptMessageError(f"gzip data has more than {_MAX_MEMBERS} members")


def _snappy_xerial_compress(data: bytes | bytearray | memoryview) -> bytes:
    parts = [_XERIAL_HEADER]
    view = memoryview(data)
    compress_raw = cramjam.snappy.compress_raw
    for start in range(0, len(view), SNAPPY_BLOCK_BYTES):
        block = compress_raw(view[start : start + SNAPPY_BLOCK_BYTES])
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_raw_length(block: bytes | memoryview) -> int:
    """Uncompressed length from a raw snappy block's preamble (unsigned varint, <= 32 bits)."""
    result = 0
    for i in range(min(len(block), 5)):
        b = block[i]
        result |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return result
    raise errors.CorruptMessageError("snappy block has a malformed length preamble")


def _snappy_decompress(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    view = memoryview(data)
    decompress_raw = cramjam.snappy.decompress_raw
    if view[:8] != _XERIAL_MAGIC:
        if _snappy_raw_length(view) > limit:
            raise _too_large(CODEC_SNAPPY, limit)
        return bytes(decompress_raw(view))
    if len(view) < _XERIAL_HEADER_SIZE:
        raise errors.CorruptMessageError("snappy xerial header is truncated")
    parts = []
    total = 0
    pos = _XERIAL_HEADER_SIZE
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise errors.CorruptMessageError("snappy xerial block length is truncated")
        (length,) = _INT32.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise errors.CorruptMessageError(f"snappy xerial block of {length} bytes overruns the data")
        block = view[pos : pos + length]
        pos += length
        total += _snappy_raw_length(block)
        if total > limit:
            raise _too_large(CODEC_SNAPPY, limit)
        parts.append(decompress_raw(block))
    return b"".join(parts)


def _lz4_decompress(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    total = 0
    rest: bytes | memoryview = memoryview(data)
    for _ in range(_MAX_MEMBERS):
        obj = lz4.frame.LZ4FrameDecompressor()
        chunk = obj.decompress(rest, max_length=limit - total + 1)
        total += len(chunk)
        if total > limit:
            raise _too_large(CODEC_LZ4, limit)
        if not obj.eof:
            raise errors.CorruptMessageError("lz4 frame is truncated")
        out.append(chunk)
        rest = obj.unused_data
        if not rest:
            return out[0] if len(out) == 1 else b"".join(out)
    raise errors.CorruptMessageError(f"lz4 data has more than {_MAX_MEMBERS} frames")


def _zstd_decompress(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    total = 0
    rest: bytes = bytes(data)
    for _ in range(_MAX_MEMBERS):
        declared = zstandard.frame_content_size(rest)
        if declared < 0:
            # Streaming writers (Java's zstd-jni, as Kafka uses) leave the size out. Then the
            # one-shot call with an output cap is the bounded path; it also fails on a
            # truncated frame. Kafka writes one frame per batch, so this frame is the last
            # (extra frames would show up as a record-count mismatch in the decoder).
            chunk = _zstd_decompressor.decompress(rest, max_output_size=limit - total)
            out.append(chunk)
            break
        if total + declared > limit:
            raise _too_large(CODEC_ZSTD, limit)
        # The declared size bounds what this frame may produce, so an unbounded call is safe.
        obj = _zstd_decompressor.decompressobj()
        chunk = obj.decompress(rest)
        if not obj.eof:
            raise errors.CorruptMessageError("zstd frame is truncated")
        if len(chunk) != declared:
            raise errors.CorruptMessageError(f"zstd frame declared {declared} bytes, produced {len(chunk)}")
        total += declared
        out.append(chunk)
        rest = obj.unused_data
        if not rest:
            break
    else:
        raise errors.CorruptMessageError(f"zstd data has more than {_MAX_MEMBERS} frames")
    return out[0] if len(out) == 1 else b"".join(out)
