"""The compiled record walk (storage._record_walk) gives exactly the pure-Python walk's results.

Seeded mutations of valid records sections (byte flips, inserted and deleted bytes,
truncation, lying lengths and counts) go through both walks; the result tuples
(kind, record, a, b, min/max timestamp delta) must be equal, so the fallback and the
extension refuse the same batches with the same messages.
"""

from __future__ import annotations

import functools
import random

import pytest
from batch_forge import mutate, record, records

from storage import record_walk

pytestmark = pytest.mark.skipif(
    record_walk.walk_c is None, reason="storage._record_walk is not built (no C compiler at install time?)")


@functools.cache
def _seeds() -> list[tuple[bytes, int]]:
    big = b"".join(record(i, b"k" * (i % 3), b"v" * (i % 5), ts_delta=(i * 7919) % 4001 - 2000)
                   for i in range(200))
    with_headers = b"".join(record(i, None if i % 2 else b"key", b"value" * i, ts_delta=-i,
                                   headers=[(b"h%d" % j, None if j % 2 else b"x" * j) for j in range(i % 4)])
                            for i in range(20))
    utf8 = record(0, headers=[("ümlaut".encode(), b"1"), (b"\xed\xa0\x80", b"surrogate")])
    return [(records(3), 3), (records(70), 70), (big, 200), (with_headers, 20), (utf8, 1),
            (record(0, b"k" * 300, b"v" * 20000, ts_delta=2**40), 1)]


def both(data: bytes, count: int, compact: bool, start: int = 0, end: int | None = None) -> tuple:
    end = len(data) if end is None else end
    py = record_walk.walk_py(data, start, end, count, compact)
    c = record_walk.walk_c(data, start, end, count, compact)
    assert c == py, (data[start:end].hex(), count, compact)
    return py


def test_valid_sections_walk_cleanly_in_both() -> None:
    for data, count in _seeds():
        for compact in (False, True):
            kind = both(data, count, compact)[0]
            assert kind in (record_walk.OK, record_walk.NO_KEY, record_walk.HEADER_KEY_UTF8)


def test_seeded_mutations_give_identical_results() -> None:
    rng = random.Random(20261122)
    kinds: set[int] = set()
    for n in range(20_000):
        data, count = rng.choice(_seeds())
        mutated = mutate(rng, data)
        count = count if n % 3 else max(1, count + rng.randint(-2, 2))
        kinds.add(both(mutated, count, compact=bool(n % 2))[0])
    # The mutations reach most refusal kinds: the comparison covers them, not just OK.
    assert len(kinds) >= 10, sorted(kinds)


def test_offsets_into_a_larger_buffer_and_memoryviews() -> None:
    data, count = _seeds()[1]
    framed = b"\x01" * 61 + data + b"\x02" * 9
    assert both(framed, count, False, 61, 61 + len(data))[0] == record_walk.OK
    assert record_walk.walk_c(memoryview(bytearray(framed)), 61, 61 + len(data), count, False)[0] == record_walk.OK
    with pytest.raises(ValueError):
        record_walk.walk_c(framed, 10, len(framed) + 1, count, False)
