"""Segments hold three file descriptors each for as long as they exist: logs stop rolling when the process
holds half its descriptor limit in segments, and the active segment grows instead (found by an audit: a
topic of segment.bytes=100 took a cluster's nodes to their limit in 11 s, the controller's journal failed
with EMFILE, and the nodes could not restart). Rolls resume once segments are freed."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from batch_forge import valid
from storage_testlib import read_all

from storage import log as log_module
from storage import record_batch as rb
from storage import segment
from storage.log import Log
from storage.log_config import LogConfig


def test_open_segments_are_counted_and_the_budget_follows_the_descriptor_limit(tmp_path: Path) -> None:
    before = segment.open_segments()
    lg = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=100))
    for _ in range(5):
        lg.append_as_leader(valid(1), 0)
    assert segment.open_segments() - before == len(lg.segments()) >= 5
    lg.close()
    assert segment.open_segments() == before
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:
        assert segment.segment_budget() == soft // 2 // 3


def test_past_the_budget_the_active_segment_grows_instead_of_rolling(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    base = segment.open_segments()
    budget = {"n": base + 3}
    monkeypatch.setattr(log_module, "segment_budget", lambda: budget["n"])
    lg = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=100, retention_bytes=-1))
    try:
        for _ in range(40):  # each batch alone fills a segment of 100 bytes
            lg.append_as_leader(valid(2), 0)
        assert len(lg.segments()) == 3, [s.base_offset for s in lg.segments()]
        assert lg.segments()[-1].size > 30 * 100
        assert [r.offset for r in rb.decode_records(read_all(lg))] == list(range(80))  # nothing lost
        budget["n"] = base + 10  # descriptors freed (retention, a higher limit): rolls resume
        for _ in range(5):
            lg.append_as_leader(valid(2), 0)
        assert len(lg.segments()) == 8
    finally:
        lg.close()
