"""Batch compression codecs: Kafka framing, interop with kafka-python's codecs, bounded output."""

from __future__ import annotations

import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

import cramjam
import lz4.frame
import pytest
import zstandard
from kafka import codec as kafka_codec

from proto import errors
from storage import compression as c

COMPRESSED = [c.CODEC_GZIP, c.CODEC_SNAPPY, c.CODEC_LZ4, c.CODEC_ZSTD]
ALL = [c.CODEC_NONE, *COMPRESSED]
# Mixed data: incompressible and repetitive parts, spanning several snappy/lz4 blocks.
DATA = os.urandom(50_000) + b"brook " * 40_000 + os.urandom(3)


@pytest.mark.parametrize("codec", ALL)
@pytest.mark.parametrize("data", [b"", b"x", DATA], ids=["empty", "one-byte", "mixed"])
def test_round_trip(codec: int, data: bytes) -> None:
    packed = c.compress(codec, data)
    assert c.decompress(codec, packed) == data
    assert c.decompress(codec, bytearray(packed)) == data
    assert c.decompress(codec, memoryview(packed)) == data
    assert c.compress(codec, memoryview(data)) == packed  # deterministic: same input, same bytes


@pytest.mark.parametrize(
    ("codec", "encode", "decode"),
    [
        (c.CODEC_GZIP, kafka_codec.gzip_encode, kafka_codec.gzip_decode),
        (c.CODEC_SNAPPY, lambda d: kafka_codec.snappy_encode(d, xerial_compatible=True), kafka_codec.snappy_decode),
        (c.CODEC_LZ4, kafka_codec.lz4_encode, kafka_codec.lz4_decode),
        (c.CODEC_ZSTD, kafka_codec.zstd_encode, kafka_codec.zstd_decode),
    ],
)
def test_interop_with_kafka_python_codecs(codec: int, encode: object, decode: object) -> None:
    assert decode(c.compress(codec, DATA)) == DATA  # type: ignore[operator]
    assert c.decompress(codec, encode(DATA)) == DATA  # type: ignore[operator]


def test_snappy_writes_xerial_framing_and_reads_raw_too() -> None:
    packed = c.compress(c.CODEC_SNAPPY, DATA)
    assert packed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    (first_block,) = struct.unpack_from(">i", packed, 16)
    assert len(bytes(cramjam.snappy.decompress_raw(packed[20 : 20 + first_block]))) == c.SNAPPY_BLOCK_BYTES
    assert c.decompress(c.CODEC_SNAPPY, bytes(cramjam.snappy.compress_raw(DATA))) == DATA
    assert c.decompress(c.CODEC_SNAPPY, kafka_codec.snappy_encode(DATA, xerial_compatible=False)) == DATA


def test_lz4_uses_independent_blocks_as_kafka_requires() -> None:
    info = lz4.frame.get_frame_info(c.compress(c.CODEC_LZ4, DATA))
    assert info["block_linked"] is False


def test_multi_member_and_multi_frame_inputs() -> None:
    a, b = DATA[:1000], DATA[1000:]
    assert c.decompress(c.CODEC_GZIP, c.compress(c.CODEC_GZIP, a) + c.compress(c.CODEC_GZIP, b)) == DATA
    assert c.decompress(c.CODEC_ZSTD, c.compress(c.CODEC_ZSTD, a) + c.compress(c.CODEC_ZSTD, b)) == DATA


def test_lz4_data_is_exactly_one_frame() -> None:
    """kafka-python (lz4.frame.decompress) and Java's KafkaLZ4BlockInputStream read one frame: data of two
    frames, or a skippable frame first, decoded here but not there (found by an audit), so it is refused."""
    a, b = DATA[:1000], DATA[1000:]
    assert c.decompress(c.CODEC_LZ4, lz4.frame.compress(DATA)) == DATA
    with pytest.raises(errors.CorruptMessageError, match="garbage after"):
        c.decompress(c.CODEC_LZ4, lz4.frame.compress(a) + lz4.frame.compress(b))
    skippable = struct.pack("<II", 0x184D2A50, 4) + b"JUNK"
    for packed in (skippable + lz4.frame.compress(DATA), lz4.frame.compress(DATA) + skippable):
        with pytest.raises(errors.CorruptMessageError):
            c.decompress(c.CODEC_LZ4, packed)


def test_snappy_xerial_data_has_the_header_every_client_writes() -> None:
    """aiokafka recognises only the 16-byte header of version 1, compatible 1, and read any other as one raw
    block (found by an audit): other versions are refused."""
    packed = c.compress(c.CODEC_SNAPPY, DATA)
    assert packed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    assert c.decompress(c.CODEC_SNAPPY, packed) == DATA
    for version in (struct.pack(">ii", 2, 2), struct.pack("<ii", 1, 1)):
        with pytest.raises(errors.CorruptMessageError, match="not version 1"):
            c.decompress(c.CODEC_SNAPPY, packed[:8] + version + packed[16:])


def test_a_zstd_frame_declaring_no_content_must_have_none() -> None:
    """python-zstandard answers b"" for a frame declaring size 0 without decoding it; libzstd (the other
    clients) finds blocks that do not fit corrupt. Such a frame ahead of the records was accepted here and
    unreadable there (found by an audit)."""
    def declaring_nothing(content: bytes) -> bytes:  # single segment, 1-byte content size 0, one raw last block
        return struct.pack("<I", 0xFD2FB528) + bytes([0x20, 0]) + ((len(content) << 3) | 1).to_bytes(3, "little") + content

    assert c.decompress(c.CODEC_ZSTD, declaring_nothing(b"") + c.compress(c.CODEC_ZSTD, DATA)) == DATA
    with pytest.raises(errors.CorruptMessageError, match="declaring no content"):
        c.decompress(c.CODEC_ZSTD, declaring_nothing(b"JUNKJUNK") + c.compress(c.CODEC_ZSTD, DATA))


def _zstd_streamed(data: bytes) -> bytes:
    """A frame without a content size, as Java's streaming zstd writer (Kafka's) produces."""
    obj = zstandard.ZstdCompressor().compressobj()
    return obj.compress(data) + obj.flush()


def test_zstd_frame_without_content_size() -> None:
    packed = _zstd_streamed(DATA)
    assert zstandard.frame_content_size(packed) == -1
    assert c.decompress(c.CODEC_ZSTD, packed) == DATA
    with pytest.raises(errors.MessageTooLargeError):
        c.decompress(c.CODEC_ZSTD, packed, max_output_bytes=len(DATA) - 1)


@pytest.mark.parametrize("codec", ALL)
def test_output_limit_is_exact(codec: int) -> None:
    packed = c.compress(codec, DATA)
    assert c.decompress(codec, packed, max_output_bytes=len(DATA)) == DATA
    with pytest.raises(errors.MessageTooLargeError, match="more than"):
        c.decompress(codec, packed, max_output_bytes=len(DATA) - 1)


@pytest.mark.parametrize(
    "bomb",
    [
        pytest.param(lambda z: (c.CODEC_GZIP, c.compress(c.CODEC_GZIP, z)), id="gzip"),
        pytest.param(lambda z: (c.CODEC_GZIP, c.compress(c.CODEC_GZIP, z[:100_000]) * 50), id="gzip-members"),
        pytest.param(lambda z: (c.CODEC_SNAPPY, c.compress(c.CODEC_SNAPPY, z)), id="snappy-xerial"),
        pytest.param(lambda z: (c.CODEC_SNAPPY, bytes(cramjam.snappy.compress_raw(z))), id="snappy-raw"),
        pytest.param(lambda z: (c.CODEC_LZ4, c.compress(c.CODEC_LZ4, z)), id="lz4"),
        pytest.param(lambda z: (c.CODEC_ZSTD, c.compress(c.CODEC_ZSTD, z)), id="zstd"),
        pytest.param(lambda z: (c.CODEC_ZSTD, _zstd_streamed(z)), id="zstd-streamed"),
    ],
)
def test_decompression_bomb_is_refused(bomb: object) -> None:
    codec, packed = bomb(b"\x00" * (32 << 20))  # type: ignore[operator]
    assert len(packed) < 2 << 20, f"bomb is {len(packed)} bytes"
    with pytest.raises(errors.MessageTooLargeError, match="more than"):
        c.decompress(codec, packed, max_output_bytes=1 << 20)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_truncated_input_is_corrupt(codec: int) -> None:
    packed = c.compress(codec, DATA)
    for cut in (1, len(packed) // 2, len(packed) - 1):
        with pytest.raises(errors.CorruptMessageError):
            c.decompress(codec, packed[:cut])


@pytest.mark.parametrize("codec", COMPRESSED)
def test_garbage_is_corrupt(codec: int) -> None:
    for garbage in (b"\x00" * 64, b"\xff" * 64, b"not compressed at all, just text"):
        with pytest.raises(errors.CorruptMessageError):
            c.decompress(codec, garbage)


def test_damaged_xerial_framing_is_corrupt() -> None:
    header = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    block = bytes(cramjam.snappy.compress_raw(b"hello" * 100))
    assert c.decompress(c.CODEC_SNAPPY, header + struct.pack(">i", len(block)) + block) == b"hello" * 100
    cases = {
        "short header": header[:12],
        "short block length": header + b"\x00\x00",
        "negative block length": header + struct.pack(">i", -5) + block,
        "overrunning block length": header + struct.pack(">i", len(block) + 1) + block,
        "bad length preamble": header + struct.pack(">i", 6) + b"\xff" * 6,
    }
    for why, data in cases.items():
        with pytest.raises(errors.CorruptMessageError):
            c.decompress(c.CODEC_SNAPPY, data)
            pytest.fail(f"accepted {why}")


def test_trailing_garbage_after_gzip_is_corrupt() -> None:
    with pytest.raises(errors.CorruptMessageError, match="garbage"):
        c.decompress(c.CODEC_GZIP, c.compress(c.CODEC_GZIP, DATA) + b"junk")
    assert zlib.decompress(c.compress(c.CODEC_GZIP, DATA), 31) == DATA  # a plain RFC 1952 member


def test_unknown_codec_and_names() -> None:
    for codec in (5, 7, -1):
        with pytest.raises(errors.CorruptMessageError):
            c.compress(codec, b"x")
        with pytest.raises(errors.CorruptMessageError):
            c.decompress(codec, b"x")
    assert [c.codec_for_name(n) for n in ("none", "gzip", "snappy", "lz4", "ZSTD ")] == [0, 1, 2, 3, 4]
    with pytest.raises(errors.InvalidConfigError):
        c.codec_for_name("producer")  # Kafka's topic-level 'producer' means "keep what came": not a codec


def test_zstd_streamed_frames_concatenated_and_skippable_frames() -> None:
    a, b = DATA[:70_000], DATA[70_000:]
    skippable = struct.pack("<II", 0x184D2A53, 5) + b"12345"
    packed = _zstd_streamed(a) + skippable + _zstd_streamed(b) + c.compress(c.CODEC_ZSTD, b"tail")
    assert c.decompress(c.CODEC_ZSTD, packed) == DATA + b"tail"
    with pytest.raises(errors.MessageTooLargeError, match="more than"):
        c.decompress(c.CODEC_ZSTD, packed, max_output_bytes=len(DATA))


def test_zstd_frame_walk_reports_structure_damage() -> None:
    packed = _zstd_streamed(DATA)
    for cut in (3, 5, 7, len(packed) - 2):
        with pytest.raises(errors.CorruptMessageError, match="truncated"):
            c.decompress(c.CODEC_ZSTD, packed[:cut])
    with pytest.raises(errors.CorruptMessageError, match="skippable"):
        c.decompress(c.CODEC_ZSTD, struct.pack("<II", 0x184D2A50, 100) + b"short")
    # Reserved block type (3) right after a minimal single-segment header.
    frame = struct.pack("<I", 0xFD2FB528) + bytes([0x20, 0x05]) + bytes([0x07, 0x00, 0x00])
    with pytest.raises(errors.CorruptMessageError, match="reserved"):
        c.decompress(c.CODEC_ZSTD, frame)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_codecs_are_safe_from_many_threads(codec: int) -> None:
    # Producers, consumers and the cleaner compress/decompress concurrently in one process.
    inputs = [os.urandom(2000) + bytes([i]) * (20_000 + i) for i in range(16)]

    def work(data: bytes) -> bool:
        return all(c.decompress(codec, c.compress(codec, data)) == data for _ in range(5))

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(work, inputs))
