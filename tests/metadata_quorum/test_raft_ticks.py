"""The Raft tick thread's gaps: measured on every tick, a stall (half the shortest election timeout)
counted and logged, rate-limited, on one real voter (pysyncobj on loopback) whose tick thread a
test callback holds up."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from quorum_helpers import free_port
from waiting import wait_for

from broker.metrics import ControllerCollector
from metadata_quorum import raft as raft_module
from metadata_quorum.node import ControllerStats
from metadata_quorum.quorum_journal import FLUSH_BUCKETS_S
from metadata_quorum.raft import MetadataRaft, RaftTiming

TIMING = RaftTiming()
STALL_S = TIMING.election_timeout_min_s / 2
HOLD_S = STALL_S * 1.5  # how long the test keeps the tick thread from running: the stall itself


@pytest.fixture(scope="module")
def voter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetadataRaft]:
    raft = MetadataRaft(f"127.0.0.1:{free_port()}", [], tmp_path_factory.mktemp("ticks"),
                        password=secrets.token_urlsafe(24), timing=TIMING)
    try:
        raft.wait_bound()
        wait_for(lambda: raft.leadership()[0], 30, "the single voter to lead")
        yield raft
    finally:
        raft.destroy_synchronous()


def hold_next_tick(raft: MetadataRaft) -> threading.Event:
    """Hold the tick thread once, for HOLD_S; the returned event is set once it runs again."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        if not held.is_set():
            held.set()
            threading.Event().wait(HOLD_S)
        else:
            done.set()

    raft._syncobj.addOnTickCallback(hold)
    wait_for(done.is_set, 30, "the tick thread to run again after the hold")
    raft._syncobj.removeOnTickCallback(hold)
    return done


def above(raft: MetadataRaft, seconds: float) -> int:
    cumulative, _, count = raft.tick_gaps.snapshot()
    return count - max((n for bound, n in cumulative if bound <= seconds), default=0)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == raft_module.__name__ and "Raft tick thread ran" in r.getMessage()]


def test_a_healthy_tick_thread_ticks_well_inside_the_stall_threshold(voter: MetadataRaft) -> None:
    start = voter.tick_gaps.snapshot()[2]
    wait_for(lambda: voter.tick_gaps.snapshot()[2] >= start + 20, 30, "20 more ticks")
    _, total, count = voter.tick_gaps.snapshot()
    assert total / count < STALL_S, (total, count)
    assert above(voter, 0.25) >= voter.tick_stalls_total  # every stall (>= 0.3 s) is above the 0.25 bound


def test_held_ticks_are_counted_and_logged_rate_limited(voter: MetadataRaft,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=raft_module.__name__)
    voter._last_stall_report = float("-inf")  # an earlier test's stall does not silence this one
    stalls = voter.tick_stalls_total
    hold_next_tick(voter)
    assert voter.tick_stalls_total >= stalls + 1
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert "as the leader it sent no heartbeats meanwhile" in logged[0], logged[0]
    assert f"stall threshold {STALL_S * 1000:.0f} ms" in logged[0], logged[0]
    hold_next_tick(voter)  # within the report interval: counted, not logged
    assert voter.tick_stalls_total >= stalls + 2
    assert len(warnings(caplog)) == 1, warnings(caplog)
    assert above(voter, 0.25) >= voter.tick_stalls_total >= 2


def test_exported_with_the_controller_families() -> None:
    from broker.request_times import LatencyHistogram

    gaps = LatencyHistogram(raft_module.TICK_GAP_BUCKETS_S)
    for seconds in (0.04, 0.05, 0.6):
        gaps.observe(seconds)
    flushes = LatencyHistogram(FLUSH_BUCKETS_S)
    for seconds in (0.0002, 0.3):
        flushes.observe(seconds)

    class Node:
        def stats(self) -> ControllerStats:
            return ControllerStats(False, 2, 3, 10, 10, 10, 0, 0, 3, 1, 1, gaps, 1, raft_journal_flushes=flushes,
                                   raft_connections_refused=2, cut_off_handed_over=1, cut_off_fenced=3)

    registry = CollectorRegistry()
    registry.register(ControllerCollector(lambda: Node()))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    samples = {(s.name, s.labels.get("le")): s.value for s in families["brook_raft_tick_gap_seconds"].samples}
    assert samples[("brook_raft_tick_gap_seconds_count", None)] == 3
    assert samples[("brook_raft_tick_gap_seconds_bucket", "0.05")] == 2
    assert samples[("brook_raft_tick_gap_seconds_bucket", "0.5")] == 2
    assert families["brook_raft_tick_stalls"].samples[0].value == 1
    flushed = {(s.name, s.labels.get("le")): s.value for s in families["brook_raft_journal_flush_seconds"].samples}
    assert flushed[("brook_raft_journal_flush_seconds_count", None)] == 2
    assert flushed[("brook_raft_journal_flush_seconds_bucket", "0.0005")] == 1
    assert families["brook_raft_connections_refused"].samples[0].value == 2
    cut_off = {s.labels["outcome"]: s.value for s in families["brook_controller_cut_off_from_brokers"].samples}
    assert cut_off == {"handed_over": 1, "fenced": 3}, cut_off

    class NotStarted:
        def stats(self) -> ControllerStats:
            return ControllerStats(False, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    registry = CollectorRegistry()
    registry.register(ControllerCollector(lambda: NotStarted()))
    names = {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert "brook_raft_tick_gap_seconds" not in names and "brook_controller_active" in names
