"""/metrics' group lag series are bounded: group ids are chosen by clients (found by an audit: a client
allowed READ on a prefix of groups committed offsets for 800 made-up groups in 14 s and made three
nodes' /metrics 230 MB, a scrape 1.85 s)."""

from __future__ import annotations

from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest

from broker.group_coordinator import CoordinatorConfig, GroupCoordinator
from broker.group_state import Group, OffsetEntry
from broker.metrics import GroupCollector
from client.types import TopicPartition


def _coordinator(max_series: int) -> GroupCoordinator:
    c = GroupCoordinator(node_id=1, replica_manager=None, metadata_cache=None,
                         config=CoordinatorConfig(group_lag_metrics_max_series=max_series))
    for i in range(300):
        g = Group(f"made-up-{i:03d}-" + "x" * 1000)
        for p in range(10):
            g.offsets[TopicPartition("t", p)] = OffsetEntry(100 - i % 50, -1, "", 0)
        c._groups[g.group_id] = g
    quiet = Group("unknown-end")  # a partition whose end offset is not known yet: no lag, no row
    quiet.offsets[TopicPartition("other", 0)] = OffsetEntry(5, -1, "", 0)
    c._groups[quiet.group_id] = quiet
    c._end_offsets = {TopicPartition("t", p): 200 for p in range(10)}
    return c


def test_the_largest_lags_are_shown_up_to_the_bound_and_the_rest_counted() -> None:
    c = _coordinator(max_series=50)
    try:
        s = c.stats()
        assert len(s.offsets) == 50 and s.offsets_left_out == 3000 - 50
        # Lags are 100 + i % 50: the 60 rows of lag 149 are the largest, the first 50 by group id shown.
        assert all(r.lag == 149 for r in s.offsets)
        assert [r.group[:11] for r in s.offsets[::10]] == [f"made-up-{i:03d}" for i in (49, 99, 149, 199, 249)]
        registry = CollectorRegistry()
        registry.register(GroupCollector(lambda: c))
        text = generate_latest(registry).decode()
        assert text.count("brook_consumer_group_lag{") == 50
        assert "brook_consumer_group_lag_rows_left_out 2950.0" in text
        assert len(text) < 200_000, len(text)
    finally:
        c._loader.shutdown()


def test_a_bound_of_zero_shows_no_rows() -> None:
    c = _coordinator(max_series=0)
    try:
        s = c.stats()
        assert s.offsets == [] and s.offsets_left_out == 3000
    finally:
        c._loader.shutdown()
