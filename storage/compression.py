"""Record-batch compression codecs with Kafka's framing, and bounded decompression.

Codec ids are the RecordBatch attribute values: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

- gzip: RFC 1952 members (several concatenated members are read, as Java's
  GZIPInputStream does; a leader accepts one, as librdkafka reads only the first).
- snappy: Kafka (Java) writes xerial's stream framing: a 16-byte header (magic
  ``\\x82SNAPPY\\x00``, version 1, compatible version 1) then blocks of int32 length +
  raw snappy. We write that framing and read both it and a bare raw snappy block.
- lz4: the standard LZ4 frame format with independent blocks (Kafka's v2 batches).
- zstd: standard zstd frames (one per batch as Kafka writes; several and skippable
  frames are accepted). Frames without a declared content size (Java's streaming
  writer) are bounded by walking their block headers before decompressing.

Every decompressor refuses to produce more than ``max_output_bytes`` (a zip bomb in a
small batch must not exhaust a broker's or a consumer's memory) and reports damaged or
truncated input as CorruptMessageError.
"""

from __future__ import annotations

import logging
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

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
LZ4_LEVEL = 9  # Kafka's compression.lz4.level default, which keeps lz4's fast compressor (as Kafka's does)
# KIP-390's compression.<codec>.level: (lowest, highest, default); gzip's -1 is zlib's default (6).
LEVELS: dict[int, tuple[int, int, int]] = {
    CODEC_GZIP: (1, 9, -1),
    CODEC_LZ4: (1, 17, LZ4_LEVEL),
    CODEC_ZSTD: (-131072, 22, ZSTD_LEVEL),
}
SNAPPY_BLOCK_BYTES = 32 * 1024  # xerial SnappyOutputStream's default block size, as Kafka writes

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_HEADER_SIZE = 16
_INT32 = struct.Struct(">i")
# Bound on frames/members per input: each needs at least a few bytes, so this only stops
# pathological inputs from turning into long loops.
_MAX_MEMBERS = 1 << 16

# zstandard's (de)compressor objects must not be used by two threads at once (producer
# sender threads, consumers and the cleaner share this module): one pair per thread.
_zstd_local = threading.local()


def _zstd_compressor(level: int = ZSTD_LEVEL) -> zstandard.ZstdCompressor:
    if level == ZSTD_LEVEL:
        obj = getattr(_zstd_local, "compressor", None)
        if obj is None:
            obj = _zstd_local.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        return obj
    by_level = getattr(_zstd_local, "by_level", None)
    if by_level is None:
        by_level = _zstd_local.by_level = {}
    obj = by_level.get(level)
    if obj is None:
        if len(by_level) >= 8:  # a thread uses one or two levels; bound the cache anyway
            by_level.clear()
        obj = by_level[level] = zstandard.ZstdCompressor(level=level)
    return obj


def check_level(codec: int, level: int) -> str | None:
    """Why ``level`` is not a valid compression.<codec>.level (None when it is)."""
    low, high, default = LEVELS[codec]
    if level == default or low <= level <= high:
        return None
    extra = f" or {default}" if not low <= default <= high else ""
    return f"must be between {low} and {high}{extra}"


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    obj = getattr(_zstd_local, "decompressor", None)
    if obj is None:
        obj = _zstd_local.decompressor = zstandard.ZstdDecompressor()
    return obj


def codec_for_name(name: str) -> int:
    """Codec id for a Kafka ``compression.type`` value (none/gzip/snappy/lz4/zstd)."""
    try:
        return CODEC_BY_NAME[name.strip().lower()]
    except KeyError:
        raise errors.InvalidConfigError(f"unknown compression type {name!r}") from None


def compress(codec: int, data: bytes | bytearray | memoryview, level: int | None = None) -> bytes:
    """Compress a batch's records section with ``codec`` (Kafka's framing), at ``level`` (KIP-390's
    compression.<codec>.level; None: the codec's default; snappy has none)."""
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        # compressobj with wbits=31 writes a gzip member; faster than gzip.compress (no mtime call).
        obj = zlib.compressobj(GZIP_LEVEL if level is None or level < 0 else level, zlib.DEFLATED, 31)
        return obj.compress(data) + obj.flush()
    if codec == CODEC_SNAPPY:
        return _snappy_xerial_compress(data)
    if codec == CODEC_LZ4:
        if level is None or level == LZ4_LEVEL:
            return lz4.frame.compress(data, block_linked=False, store_size=False)
        return lz4.frame.compress(data, compression_level=level, block_linked=False, store_size=False)
    if codec == CODEC_ZSTD:
        return _zstd_compressor(ZSTD_LEVEL if level is None else level).compress(data)
    raise errors.CorruptMessageError(f"unknown compression codec {codec}")


def decompress(
    codec: int, data: bytes | bytearray | memoryview, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    one_gzip_member: bool = False,
) -> bytes:
    """Decompress ``data``; CorruptMessageError when damaged, truncated or above ``max_output_bytes``.

    ``one_gzip_member`` (a leader validating a produce) refuses gzip data of several members: Java's reader
    takes them all, librdkafka's only the first, so its consumers skipped the records of the others without
    an error (audit). Readers take them all, as Java does."""
    if codec == CODEC_NONE:
        if len(data) > max_output_bytes:
            raise _too_large(codec, max_output_bytes)
        return bytes(data)
    try:
        if codec == CODEC_GZIP:
            return _gzip_decompress(data, max_output_bytes, one_member=one_gzip_member)
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
    """MESSAGE_TOO_LARGE, not CORRUPT_MESSAGE: the data is well formed, only larger decompressed than a broker takes,
    and clients retry CORRUPT_MESSAGE (Kafka's CorruptRecordException is retriable): a producer sent the same batch
    until its delivery timeout (platformatic/kafka audit). Kafka's Java producer splits a batch refused so."""
    return errors.MessageTooLargeError(
        f"{CODEC_NAMES.get(codec, codec)} data decompresses to more than {limit} bytes; refused"
    )


def _decompress_members(data: bytes | bytearray | memoryview, limit: int, codec: int,
                        new_decompressor: Callable[[], Any], next_magic: bytes | None, *, single: bool = False
                        ) -> bytes:
    """Decode concatenated members (gzip) or frames (lz4), never producing more than ``limit``.

    Each decompressor is asked for at most one byte past what is left of the limit, so a
    bomb is refused after ``limit + 1`` bytes of output rather than after inflating whole.
    ``next_magic``, where given, must start every member after the first; with ``single`` nothing may
    follow the first.
    """
    name = CODEC_NAMES[codec]
    out: list[bytes] = []
    total = 0
    rest: bytes | memoryview = memoryview(data)
    for _ in range(_MAX_MEMBERS):
        obj = new_decompressor()
        chunk = obj.decompress(rest, max_length=limit - total + 1)
        total += len(chunk)
        if total > limit:
            raise _too_large(codec, limit)
        if not obj.eof:
            raise errors.CorruptMessageError(f"{name} data is truncated")
        out.append(chunk)
        rest = obj.unused_data
        if not rest:
            return out[0] if len(out) == 1 else b"".join(out)
        if next_magic is not None and rest[:len(next_magic)] == next_magic and single:
            raise errors.InvalidRecordError(
                f"{name} data of more than one member ({len(rest)} bytes after the first): a batch is one member "
                f"(librdkafka's consumers read only the first)")
        if single or (next_magic is not None and rest[:len(next_magic)] != next_magic):
            raise errors.CorruptMessageError(f"{len(rest)} bytes of garbage after the {name} data")
    raise errors.CorruptMessageError(f"{name} data has more than {_MAX_MEMBERS} members")


def _gzip_decompress(data: bytes | bytearray | memoryview, limit: int, *, one_member: bool = False) -> bytes:
    return _decompress_members(data, limit, CODEC_GZIP, lambda: zlib.decompressobj(31), b"\x1f\x8b",
                               single=one_member)


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
    if view[:_XERIAL_HEADER_SIZE] != _XERIAL_HEADER:
        # Version and compatible version 1, big-endian, as every client writes: aiokafka recognises only
        # that header and read anything else as one raw block (found by an audit).
        raise errors.CorruptMessageError(
            f"snappy xerial header {bytes(view[:_XERIAL_HEADER_SIZE]).hex()} is not version 1, compatible 1")
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
    """Exactly one LZ4 frame, nothing after it: what Kafka's clients write and all of them read. A second
    frame, or a skippable frame first, decoded here but failed kafka-python (lz4.frame.decompress reads
    one frame) and Java's KafkaLZ4BlockInputStream (found by an audit)."""
    return _decompress_members(data, limit, CODEC_LZ4, lz4.frame.LZ4FrameDecompressor, None, single=True)


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK, _ZSTD_SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50
_ZSTD_BLOCK_MAX = 128 * 1024  # a compressed block regenerates at most this much (RFC 8878)
_ZSTD_MAX_BLOCKS = 1 << 20  # bounds the block walk; a frame of this many blocks is far past any limit
_ZSTD_DID_SIZES = (0, 1, 2, 4)
_ZSTD_FCS_SIZES = (0, 2, 4, 8)
_UINT32_LE = struct.Struct("<I")


def _zstd_frame_extent(data: memoryview) -> tuple[int, int, bool]:
    """Walk one zstd frame's block headers (RFC 8878) without decompressing.

    Returns (frame length in bytes, upper bound of its output, skippable?). Structure
    errors and truncation raise CorruptMessageError. The output bound is exact for raw
    and RLE blocks and 128 KiB per compressed block, which lets a frame whose header
    does not declare its size be decompressed with a cap, and frames be split exactly.
    """
    size = len(data)
    if size < 4:
        raise errors.CorruptMessageError("zstd frame is truncated (no magic)")
    (magic,) = _UINT32_LE.unpack_from(data, 0)
    if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC:
        if size < 8:
            raise errors.CorruptMessageError("zstd skippable frame is truncated")
        end = 8 + _UINT32_LE.unpack_from(data, 4)[0]
        if end > size:
            raise errors.CorruptMessageError("zstd skippable frame is truncated")
        return end, 0, True
    if magic != _ZSTD_MAGIC:
        raise errors.CorruptMessageError(f"not a zstd frame (magic {magic:#010x})")
    if size < 5:
        raise errors.CorruptMessageError("zstd frame header is truncated")
    descriptor = data[4]
    single_segment = (descriptor >> 5) & 1
    fcs_flag = descriptor >> 6
    fcs_size = _ZSTD_FCS_SIZES[fcs_flag] if fcs_flag or not single_segment else 1
    pos = 5 + (0 if single_segment else 1) + _ZSTD_DID_SIZES[descriptor & 3] + fcs_size
    checksum_size = 4 if descriptor & 0x04 else 0
    bound = 0
    for _ in range(_ZSTD_MAX_BLOCKS):
        if pos + 3 > size:
            raise errors.CorruptMessageError("zstd frame is truncated (block header)")
        header = data[pos] | (data[pos + 1] << 8) | (data[pos + 2] << 16)
        pos += 3
        block_type = (header >> 1) & 3
        block_size = header >> 3
        if block_type == 0:  # raw
            pos += block_size
            bound += block_size
        elif block_type == 1:  # RLE: one byte repeated block_size times
            pos += 1
            bound += block_size
        elif block_type == 2:  # compressed
            pos += block_size
            bound += _ZSTD_BLOCK_MAX
        else:
            raise errors.CorruptMessageError("zstd frame has a reserved block type")
        if pos > size:
            raise errors.CorruptMessageError("zstd frame is truncated (block data)")
        if header & 1:  # last block
            pos += checksum_size
            if pos > size:
                raise errors.CorruptMessageError("zstd frame is truncated (checksum)")
            return pos, bound, False
    raise errors.CorruptMessageError(f"zstd frame has more than {_ZSTD_MAX_BLOCKS} blocks")


def _zstd_decompress(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    out: list[bytes] = []
    total = 0
    view = memoryview(data)
    pos = 0
    dctx = _zstd_decompressor()
    for _ in range(_MAX_MEMBERS):
        if pos >= len(view):
            return out[0] if len(out) == 1 else b"".join(out)
        frame_len, bound, skippable = _zstd_frame_extent(view[pos:])
        frame = view[pos : pos + frame_len]
        pos += frame_len
        if skippable:
            continue
        budget = limit - total
        declared = zstandard.frame_content_size(frame)
        if declared == 0:
            # python-zstandard's decompress() answers b"" for a declared size of 0 without decoding the
            # frame, where libzstd (kafka-python, aiokafka, librdkafka) finds blocks that do not fit it
            # corrupt: decode it as they do (found by an audit).
            try:
                chunk = dctx.decompressobj().decompress(bytes(frame))
            except zstandard.ZstdError as exc:
                raise errors.CorruptMessageError(f"zstd frame declaring no content is corrupt: {exc}") from exc
            if chunk:
                raise errors.CorruptMessageError("zstd frame declaring no content has some")
        elif declared > 0:
            # zstd checks the declared size against what the frame produces.
            if declared > budget:
                raise _too_large(CODEC_ZSTD, limit)
            chunk = dctx.decompress(frame)
        elif bound <= budget:
            chunk = dctx.decompress(frame, max_output_size=max(bound, 1))
        else:
            # The structural bound is above the budget; the real output may still fit.
            try:
                chunk = dctx.decompress(frame, max_output_size=budget)
            except zstandard.ZstdError as exc:
                raise errors.MessageTooLargeError(
                    f"zstd data decompresses to more than {limit} bytes or is corrupt: {exc}"
                ) from exc
        total += len(chunk)
        if total > limit:
            raise _too_large(CODEC_ZSTD, limit)
        out.append(chunk)
    raise errors.CorruptMessageError(f"zstd data has more than {_MAX_MEMBERS} frames")
