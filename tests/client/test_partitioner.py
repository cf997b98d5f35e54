"""murmur2 and partition choice match Kafka's DefaultPartitioner; KIP-480 stickiness."""

from __future__ import annotations

import random

import pytest
from clientkit import KAFKA_MURMUR2

from client.partitioner import StickyPartitionCache, default_partition, murmur2, to_positive


@pytest.mark.parametrize(("key", "expected"), sorted(KAFKA_MURMUR2.items()))
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


# partition = toPositive(murmur2(key)) % n, derived by hand from the hashes above:
# e.g. "foobar": -790332482 & 0x7fffffff = 1357151166; 1357151166 % 6 = 0 ; % 5 = 1.
KAFKA_PARTITIONS = [
    (b"21", 6, (-973932308 & 0x7FFFFFFF) % 6),
    (b"foobar", 6, 0),
    (b"foobar", 5, 1),
    (b"abc", 3, 479470107 % 3),
    (b"a-little-bit-long-string", 12, (-985981536 & 0x7FFFFFFF) % 12),
    (b"12345", 100, (-1188365604 & 0x7FFFFFFF) % 100),
]


@pytest.mark.parametrize(("key", "n", "expected"), KAFKA_PARTITIONS)
def test_default_partition_table(key: bytes, n: int, expected: int) -> None:
    assert default_partition(key, n) == expected


def test_to_positive_is_mask_not_abs() -> None:
    assert to_positive(-(2**31)) == 0  # abs() would overflow in Java; Kafka masks
    assert to_positive(-1) == 0x7FFFFFFF


def test_murmur2_agrees_with_kafka_python_on_random_keys() -> None:
    kafka_murmur2 = pytest.importorskip("kafka.partitioner.default").murmur2
    rng = random.Random(7)
    for _ in range(300):
        key = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        assert to_positive(murmur2(key)) == kafka_murmur2(key) & 0x7FFFFFFF, key


def test_sticky_partition_stays_until_new_batch_then_moves() -> None:
    cache = StickyPartitionCache(random.Random(1))
    parts = (0, 1, 2, 3)
    first = cache.partition("t", parts, parts)
    assert all(cache.partition("t", parts, parts) == first for _ in range(50))
    nxt = cache.next_partition("t", parts, parts, first)
    assert nxt != first and cache.partition("t", parts, parts) == nxt


def test_sticky_prefers_available_partitions() -> None:
    cache = StickyPartitionCache(random.Random(2))
    for _ in range(30):
        assert cache.next_partition("t", (0, 1, 2), (2,), None) == 2
    assert cache.next_partition("t", (0,), (0,), 0) == 0  # one partition: nothing else to pick
