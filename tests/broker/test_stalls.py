"""broker.stalls: the event loop's lag, its stalls (counted, and reported with the loop's stack while
they last) and garbage collection pauses, on a real asyncio loop in its own thread."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable, Iterator

import pytest
import waiting
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker import stalls
from broker.metrics import PauseCollector
from broker.stalls import GcPauses, LoopMonitor

INTERVAL_S = 0.01
STALL_S = 0.25  # well above what a loaded test machine delays an idle loop by
DEADLINE_S = 20.0


class RunningLoop:
    """An asyncio loop running forever in a thread, stopped and closed by ``close``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def running() -> Iterator[RunningLoop]:
    r = RunningLoop()
    yield r
    r.close()


@pytest.fixture
def monitor(running: RunningLoop) -> Iterator[LoopMonitor]:
    m = LoopMonitor("broker 9", interval_s=INTERVAL_S, stall_s=STALL_S)
    m.start(running.loop, running.thread)
    yield m
    m.stop()


def wait_for(check: Callable[[], object], what: str) -> None:
    waiting.wait_for(check, DEADLINE_S, what, poll_s=0.005)


def count_above(monitor: LoopMonitor, seconds: float) -> int:
    cumulative, _, count = monitor.lag.snapshot()
    return count - max((n for bound, n in cumulative if bound <= seconds), default=0)


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == stalls.__name__ and text in r.getMessage()]


def hold_the_loop(release: threading.Event) -> None:
    """A callback that keeps the loop from running anything else until the test lets it go."""
    release.wait(DEADLINE_S)


def test_an_idle_loop_is_probed_with_a_small_lag_and_no_stall(monitor: LoopMonitor,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    wait_for(lambda: monitor.lag.snapshot()[2] >= 20, "20 probes of the loop")
    cumulative, total, count = monitor.lag.snapshot()
    assert 0 <= total < count * STALL_S, (total, count)
    assert count_above(monitor, STALL_S) == monitor.stalls_total >= len(messages(caplog, "ran again"))
    beat = monitor.last_beat
    wait_for(lambda: monitor.last_beat > beat, "the liveness stamp moving")


def test_a_blocked_loop_is_reported_while_it_lasts_with_the_stack_then_counted(
        monitor: LoopMonitor, running: RunningLoop, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    wait_for(lambda: monitor.lag.snapshot()[2] >= 3, "the first probes")
    stalls, above = monitor.stalls_total, count_above(monitor, STALL_S)  # 0 unless the machine itself stalled
    reported, resumed_before = len(messages(caplog, "is stalled")), len(messages(caplog, "ran again"))
    monitor._last_stack_report = monitor._last_resume_report = float("-inf")  # such a stall silences no report
    release = threading.Event()
    running.loop.call_soon_threadsafe(hold_the_loop, release)
    try:
        wait_for(lambda: messages(caplog, "is stalled")[reported:], "the watchdog's report of the stalled loop")
        assert monitor.stalls_total == stalls, "counted before the loop ran again"
    finally:
        release.set()
    report = messages(caplog, "is stalled")[reported:]
    assert len(report) == 1, report
    assert report[0].startswith("broker 9: the event loop is stalled") and "hold_the_loop" in report[0], report[0]
    wait_for(lambda: monitor.stalls_total == stalls + 1, "the stall counted once the loop runs again")
    resumed = messages(caplog, "ran again")[resumed_before:]
    assert len(resumed) == 1 and f"{stalls + 1} stall(s) since start" in resumed[0], resumed
    assert count_above(monitor, STALL_S) == above + 1, monitor.lag.snapshot()


def test_stall_reports_are_rate_limited_and_the_count_is_not(monitor: LoopMonitor, running: RunningLoop,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    for n in (1, 2, 3):
        release = threading.Event()
        running.loop.call_soon_threadsafe(hold_the_loop, release)
        try:
            # Held until the watchdog has seen this stall (reported or skipped), so each is a real stall.
            wait_for(lambda n=n: len(messages(caplog, "is stalled")) + monitor._stacks_skipped >= n,
                     f"the watchdog seeing stall {n}")
        finally:
            release.set()
        wait_for(lambda n=n: monitor.stalls_total >= n, f"stall {n} counted")
    assert len(messages(caplog, "is stalled")) == 1
    assert len(messages(caplog, "ran again")) == 1
    assert count_above(monitor, STALL_S) == monitor.stalls_total >= 3


def test_a_monitor_stopped_before_its_loop_reports_nothing(running: RunningLoop) -> None:
    m = LoopMonitor("broker 9", interval_s=INTERVAL_S, stall_s=STALL_S)
    m.start(running.loop, running.thread)
    wait_for(lambda: m.lag.snapshot()[2] >= 3, "the first probes")
    m.stop()
    running.loop.call_soon_threadsafe(running.loop.stop)
    running.thread.join(timeout=10)
    # The watchdog is gone before the loop stops: nothing is left to take a stopped loop for a stall.
    assert m._watchdog is not None and not m._watchdog.is_alive()
    running.thread = threading.Thread(target=running.loop.run_forever, daemon=True)  # for the fixture's close
    running.thread.start()


@pytest.mark.parametrize("interval_s, stall_s", [(0, 0.1), (0.01, 0), (-1, 1)])
def test_refuses_a_period_or_threshold_that_is_not_positive(interval_s: float, stall_s: float) -> None:
    with pytest.raises(ValueError):
        LoopMonitor("broker 9", interval_s=interval_s, stall_s=stall_s)


def test_gc_pauses_are_timed_by_generation_while_installed() -> None:
    pauses = GcPauses()
    pauses.install()
    try:
        pauses.install()  # once only: a second install adds no second callback
        assert gc.callbacks.count(pauses._on_gc) == 1
        before = [h.snapshot()[2] for h in pauses.by_generation]
        gc.collect(0)
        gc.collect(2)
        after = [h.snapshot()[2] for h in pauses.by_generation]
        assert after[0] >= before[0] + 1 and after[2] >= before[2] + 1, (before, after)
        assert pauses.by_generation[2].snapshot()[1] > 0
    finally:
        pauses.uninstall()
    assert pauses._on_gc not in gc.callbacks
    gc.collect(2)
    assert pauses.by_generation[2].snapshot()[2] == after[2]


def test_exported_as_prometheus_families(monitor: LoopMonitor) -> None:
    pauses = GcPauses()
    pauses.by_generation[1].observe(0.003)
    registry = CollectorRegistry()
    registry.register(PauseCollector(lambda: monitor, pauses))
    wait_for(lambda: monitor.lag.snapshot()[2] >= 1, "a probe")
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    lag = families["brook_event_loop_lag_seconds"]
    assert lag.type == "histogram"
    assert [s.value for s in lag.samples if s.name.endswith("_count")][0] >= 1
    assert families["brook_event_loop_stalls"].samples[0].value == 0
    gc_samples = families["brook_gc_pause_seconds"].samples
    counts = {s.labels["generation"]: s.value for s in gc_samples if s.name.endswith("_count")}
    assert counts == {"0": 0, "1": 1, "2": 0}
    assert [s.value for s in gc_samples if s.labels == {"generation": "1", "le": "0.005"}] == [1]

    # A controller-only node has no broker loop: GC pauses only.
    registry = CollectorRegistry()
    registry.register(PauseCollector(lambda: None, pauses))
    names = {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert names == {"brook_gc_pause_seconds"}
