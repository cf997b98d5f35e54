"""Partitioners: Kafka's murmur2 key hashing and the KIP-480 sticky choice for keyless records.

``murmur2`` is Kafka's ``Utils.murmur2`` (seed 0x9747b28c, m 0x5bd1e995, r 24) on
32-bit two's-complement ints, and ``default_partition`` is
``toPositive(murmur2(key)) % num_partitions`` as in Kafka's default partitioner, so a
key lands on the same partition number it would in Kafka.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence

from storage import record_walk

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF

# partitioner(key_bytes, all_partitions, available_partitions) -> partition (kafka-python's shape)
Partitioner = Callable[[bytes | None, Sequence[int], Sequence[int]], int]


_WORDS: dict[int, struct.Struct] = {}  # little-endian uint32 unpackers by word count (bounded)
_WORDS_CACHE_MAX = 512


def _words(count: int) -> struct.Struct:
    unpacker = _WORDS.get(count)
    if unpacker is None:
        unpacker = struct.Struct(f"<{count}I")
        if len(_WORDS) < _WORDS_CACHE_MAX:
            _WORDS[count] = unpacker
    return unpacker


def murmur2_py(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data`` as a signed Java int (the reference for the compiled one)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    count = length >> 2
    m = _M
    mask = _MASK
    if count:
        # Kafka reads each 4-byte block little-endian; one C-level unpack for all of them.
        for k in _words(count).unpack_from(data):
            k = (k * m) & mask
            k ^= k >> 24
            h = ((h * m) & mask) ^ ((k * m) & mask)
    tail = count << 2
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


# The compiled murmur2 (storage/_record_walk.c, also what the producer's compiled send() hashes with)
# when the extension is built; the same function otherwise.
murmur2: Callable[[bytes], int] = getattr(record_walk._compiled, "murmur2", None) or murmur2_py


def to_positive(n: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not abs, which overflows on MIN_VALUE)."""
    return n & 0x7FFFFFFF


def default_partition(key: bytes, num_partitions: int) -> int:
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be > 0, got {num_partitions}")
    return to_positive(murmur2(key)) % num_partitions


def default_partitioner(key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]) -> int:
    """Keyed: murmur2 over all partitions (stable even when a leader is down). Keyless: random available."""
    if key is not None:
        return all_partitions[default_partition(key, len(all_partitions))]
    pool = available or all_partitions
    return pool[random.randrange(len(pool))]


class StickyPartitionCache:
    """KIP-480: keyless records of a topic stick to one partition until its batch is full or sent.

    The accumulator calls ``next_partition`` when appending to the sticky partition
    would start a new batch, so consecutive keyless records fill one batch instead of
    spreading single records over every partition.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self.current: dict[str, int] = {}  # topic -> its sticky partition (also read by the compiled send())
        self._rng = rng or random.Random()

    def partition(self, topic: str, all_partitions: Sequence[int], available: Sequence[int]) -> int:
        current = self.current.get(topic)
        if current is None:
            return self.next_partition(topic, all_partitions, available, None)
        return current

    def next_partition(
        self, topic: str, all_partitions: Sequence[int], available: Sequence[int], previous: int | None
    ) -> int:
        """Pick a new sticky partition, different from ``previous`` when there is a choice."""
        pool = list(available) or list(all_partitions)
        if previous is not None and len(pool) > 1 and previous in pool:
            pool.remove(previous)
        choice = pool[self._rng.randrange(len(pool))]
        self.current[topic] = choice
        return choice
