"""Fixtures shared by the replica fetcher's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from replication.partition import Partition
from storage.log import Log
from storage.log_config import LogConfig


@pytest.fixture
def follower(tmp_path: Path) -> Partition:
    """t-0 on broker 2, following broker 1 at leader epoch 0 (replicas and ISR 1 and 2), its log empty."""
    lg = Log.open(tmp_path / "t-0", LogConfig.from_overrides({}))
    p = Partition("t", 0, "T", lg, 2, broker_usable=lambda b: True)
    p.make_follower(1, (1, 2), (1, 2), 0, 0)
    return p
