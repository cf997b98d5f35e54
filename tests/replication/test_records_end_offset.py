"""records_end_offset: where a read_committed fetch's records end (the upper bound of the aborted transactions it
names), from bytes and from segment-file slices (the Kafka listener's sendfile reads), whatever the batch sizes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replication.partition import records_end_offset
from storage.file_records import FileRecords
from storage.record_batch import RecordBatchBuilder


def batch(base: int, n: int, value_size: int) -> bytes:
    b = RecordBatchBuilder(base_offset=base)
    for i in range(n):
        b.append(1_700_000_000_000 + i, None, os.urandom(value_size))  # incompressible, not that it matters here
    return b.build()


@pytest.mark.parametrize("sizes", [[10] * 200, [20_000] * 5, [10, 70_000, 10, 10, 5_000, 100_000, 10], [70_000]])
def test_the_end_of_bytes_and_of_a_slice(tmp_path: Path, sizes: list[int]) -> None:
    data, offset = b"", 100
    for size in sizes:
        data += batch(offset, 3, size)
        offset += 3
    assert records_end_offset(data) == offset
    assert records_end_offset(data + batch(offset, 2, 10)[:-1]) == offset, "a torn tail is not counted"
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 1000 + data + b"y" * 500)
    fd = os.open(path, os.O_RDONLY)
    try:
        with_tail = FileRecords(fd, 1000, len(data) + 500, 100)
        exact = FileRecords(fd, 1000, len(data), 100)
        try:
            assert records_end_offset(exact) == offset
            assert records_end_offset(with_tail) == offset, "bytes after the last whole batch are not one"
        finally:
            exact.close()
            with_tail.close()
    finally:
        os.close(fd)


def test_nothing_whole_is_minus_one() -> None:
    assert records_end_offset(b"") == -1
    assert records_end_offset(batch(0, 1, 10)[:-1]) == -1
