"""Fixtures shared by the storage tests."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from storage.segment import LogSegment


@pytest.fixture
def preads(monkeypatch: pytest.MonkeyPatch) -> Callable[[LogSegment], int]:
    """Bytes read from a segment's log file since the last call for it (os.pread wrapped): what a
    lookup cost, counted rather than timed."""
    read: dict[int, int] = {}
    real = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        data = real(fd, n, offset)
        read[fd] = read.get(fd, 0) + len(data)
        return data

    monkeypatch.setattr(os, "pread", counting)
    return lambda seg: read.pop(seg._fd, 0)
