"""Fixtures shared by the broker tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from h2client import H2Sender


@pytest.fixture
def senders() -> Iterator[list[H2Sender]]:
    """Raw HTTP/2 senders a test opens (tests/h2client.py), closed when it ends."""
    made: list[H2Sender] = []
    yield made
    for s in made:
        s.close()
