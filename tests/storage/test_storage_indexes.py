"""Pure pieces: offset index, time index, leader epoch cache, producer state, offset map."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto import errors
from storage.cleaner import OffsetMap
from storage.leader_epoch_cache import LeaderEpochFileCache
from storage.offset_index import OffsetIndex
from storage.producer_state import ProducerStateManager
from storage.record_batch import BatchHeader
from storage.time_index import TimeIndex


def test_offset_index_lookup_prealloc_trim_reopen(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.index"
    idx = OffsetIndex(path, 100, 8 * 10, writable=True)
    assert path.stat().st_size == 80  # preallocated
    for i in range(1, 6):
        idx.append(100 + i * 10, i * 1000)
    assert idx.lookup(99).position == 0 and idx.lookup(100).offset == 100
    assert (idx.lookup(125).offset, idx.lookup(125).position) == (120, 2000)
    assert idx.lookup(10_000).offset == 150
    with pytest.raises(ValueError):
        idx.append(140, 9000)  # offsets must grow
    idx.truncate_to(130)
    assert idx.entries == 2 and idx.last_entry().offset == 120
    idx.trim()
    assert path.stat().st_size == 16
    idx.close()
    again = OffsetIndex(path, 100, 80, writable=False)
    assert again.entries == 2 and again.lookup(125).position == 2000
    again.sanity_check(log_size=5000)
    again.close()
    # an untrimmed (crashed) file: entries found before the zero padding
    crashed = OffsetIndex(tmp_path / "00000000000000000000.index", 0, 8 * 10, writable=True)
    crashed.append(5, 100)
    crashed.append(9, 200)
    crashed.close()
    assert OffsetIndex(tmp_path / "00000000000000000000.index", 0, 80, writable=True).entries == 2


def test_offset_index_full(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "0.index", 0, 8 * 3, writable=True)
    idx.append(1, 10)
    assert not idx.is_full()
    idx.append(2, 20)
    assert idx.is_full()  # one slot stays free
    idx.close()


def test_time_index(tmp_path: Path) -> None:
    idx = TimeIndex(tmp_path / "0.timeindex", 0, 12 * 10, writable=True)
    idx.maybe_append(1000, 0)
    idx.maybe_append(1000, 5)  # not newer: ignored
    idx.maybe_append(2000, 7)
    idx.maybe_append(-1, 9)  # no timestamp: ignored
    assert idx.entries == 2
    assert idx.lookup(999).timestamp == -1
    assert (idx.lookup(1500).timestamp, idx.lookup(1500).offset) == (1000, 0)
    assert idx.lookup(5000).offset == 7
    idx.truncate_to(7)
    assert idx.entries == 1
    idx.close()


def test_leader_epoch_cache_semantics(tmp_path: Path) -> None:
    cache = LeaderEpochFileCache(tmp_path)
    assert cache.end_offset_for(0, 10) == (-1, -1)
    cache.assign(2, 0)
    cache.assign(2, 5)  # same epoch later: no-op
    cache.assign(4, 10)
    cache.assign(7, 20)
    assert [(e.epoch, e.start_offset) for e in cache.entries()] == [(2, 0), (4, 10), (7, 20)]
    assert cache.end_offset_for(7, 30) == (7, 30)
    assert cache.end_offset_for(5, 30) == (4, 20)
    assert cache.end_offset_for(3, 30) == (2, 10)
    assert cache.end_offset_for(1, 30) == (1, 0)
    assert cache.end_offset_for(8, 30) == (-1, -1)
    cache.assign(5, 15)  # conflicting: removes (7, 20)
    assert [(e.epoch, e.start_offset) for e in cache.entries()] == [(2, 0), (4, 10), (5, 15)]
    cache.truncate_from_end(12)
    assert [(e.epoch, e.start_offset) for e in cache.entries()] == [(2, 0), (4, 10)]
    cache.truncate_from_start(11)
    assert [(e.epoch, e.start_offset) for e in cache.entries()] == [(4, 11)]
    assert [(e.epoch, e.start_offset) for e in LeaderEpochFileCache(tmp_path).entries()] == [(4, 11)]
    (tmp_path / "leader-epoch-checkpoint").write_text("garbage")
    assert LeaderEpochFileCache(tmp_path).entries() == []  # corrupt file: rebuilt, not a crash


def _h(pid: int, epoch: int, seq: int, count: int = 1) -> BatchHeader:
    return BatchHeader(0, 100, 0, 2, 0, 0, count - 1, 0, 0, pid, epoch, seq, count)


def test_producer_state_rules() -> None:
    ps = ProducerStateManager(max_producers=2)
    assert ps.check_leader_append(_h(1, 0, 0, 2)) is None
    ps.update(_h(1, 0, 0, 2), 0)
    assert ps.check_leader_append(_h(1, 0, 0, 2)).first_offset == 0  # duplicate
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        ps.check_leader_append(_h(1, 0, 5))
    with pytest.raises(errors.InvalidProducerEpochError):
        ps.check_leader_append(BatchHeader(0, 100, 0, 2, 0, 0, 0, 0, 0, 1, -2, 2, 1))  # epoch -2 < 0
    for seq in range(2, 12):
        ps.update(_h(1, 0, seq), seq)
    assert len(ps.entry(1).batches) == 5  # only the last five batches are kept
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        ps.check_leader_append(_h(1, 0, 2))  # too old to be recognised: a gap
    ps.update(_h(2, 0, 0), 20)
    ps.update(_h(3, 0, 0), 21)
    assert len(ps) == 2 and ps.entry(1) is None  # bounded: least recently active forgotten
    ps.truncate_from(21)
    assert ps.entry(3) is None and ps.entry(2) is not None
    ps.update(_h(2, 0, 2**31 - 1), 30)
    assert ps.check_leader_append(_h(2, 0, 0, 2)) is None  # sequence wraps at int32


def test_offset_map_bounded() -> None:
    m = OffsetMap(2)
    assert m.put(b"a", 1) and m.put(b"b", 2) and m.put(b"a", 3)
    assert not m.put(b"c", 4)
    assert m.get(b"a") == 3 and m.get(b"c") is None and len(m) == 2
