"""Pure planning: checkpoint JSON, the read limit, range splitting."""

from __future__ import annotations

import pytest

from spark_source.planning import OffsetRange, from_json_offsets, plan_ranges, rate_limit, to_json_offsets


def test_offsets_json_round_trip_in_kafka_source_shape() -> None:
    offs = {("b", 1): 7, ("a", 0): 23, ("a", 10): 0}
    doc = to_json_offsets(offs)
    assert doc == {"a": {"0": 23, "10": 0}, "b": {"1": 7}}
    assert from_json_offsets(doc) == offs
    with pytest.raises(ValueError):
        from_json_offsets({"a": 5})


def test_rate_limit_caps_total_and_shares_by_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 1000, ("t", 1): 200, ("t", 2): 50}
    end = rate_limit(start, latest, 110)
    taken = {tp: end[tp] - start[tp] for tp in end}
    assert sum(taken.values()) == 110, taken
    assert taken[("t", 0)] == 100 and taken[("t", 1)] == 10 and taken[("t", 2)] == 0
    assert all(end[tp] <= latest[tp] for tp in end)


def test_rate_limit_never_exceeds_and_reaches_latest() -> None:
    start = {("t", p): 0 for p in range(7)}
    latest = {("t", p): p * 3 + 1 for p in range(7)}
    pos = dict(start)
    steps = 0
    while pos != latest:
        nxt = rate_limit(pos, latest, 5)
        assert sum(nxt[tp] - pos[tp] for tp in nxt) == min(5, sum(latest[tp] - pos[tp] for tp in pos))
        pos = nxt
        steps += 1
        assert steps < 100, pos


def test_all_available_when_under_limit() -> None:
    start = {("t", 0): 5}
    assert rate_limit(start, {("t", 0): 9}, 100) == {("t", 0): 9}


def test_plan_drops_empty_and_splits_to_min_partitions() -> None:
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 3}
    end = {("t", 0): 1000, ("t", 1): 10, ("t", 2): 103}
    assert plan_ranges(start, end) == [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 2, 3, 103)]
    ranges = plan_ranges(start, end, min_partitions=8)
    assert len(ranges) == 8, ranges
    for tp in (("t", 0), ("t", 2)):
        mine = [r for r in ranges if (r.topic, r.partition) == tp]
        assert mine[0].from_offset == start[tp] and mine[-1].until_offset == end[tp]
        assert all(a.until_offset == b.from_offset for a, b in zip(mine, mine[1:], strict=False))
    sizes = {(r.topic, r.partition): 0 for r in ranges}
    for r in ranges:
        sizes[(r.topic, r.partition)] += 1
    assert sizes[("t", 0)] > sizes[("t", 2)]


def test_min_partitions_bounded_by_record_count_and_max_records() -> None:
    assert len(plan_ranges({("t", 0): 0}, {("t", 0): 3}, min_partitions=10)) == 3
    ranges = plan_ranges({("t", 0): 0}, {("t", 0): 10}, max_records_per_partition=3)
    assert [r.size for r in ranges] == [3, 3, 2, 2]
