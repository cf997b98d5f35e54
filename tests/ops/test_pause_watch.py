"""The benchmark's watchers of machine stalls: real processes, one per core, stopped for real."""

from __future__ import annotations

import os
import signal
import time

import pytest

from deploy.local import pause_watch
from deploy.local.pause_watch import PauseWatch, Stall, merge


def test_a_watcher_stopped_for_300_ms_reports_a_stall_of_its_core():
    cpus = sorted(os.sched_getaffinity(0))
    with PauseWatch(interval_ms=2, threshold_ms=10) as w:
        procs = dict(w._procs)
        assert sorted(procs) == cpus  # each sleeping already: entering waits for them
        # One watcher stopped, as the host stops one of a VM's cores: it resumes with its sleep long overdue.
        stopped = cpus[-1]
        proc = procs[stopped]
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)  # the stall itself
        assert proc.stdin is not None
        proc.stdin.close()  # the run ends while it is stopped: the stall it wakes from is still reported
        proc.stdin = None
        os.kill(proc.pid, signal.SIGCONT)
    long = [s for s in w.stalls if s.ms >= 250]
    assert len(long) == 1 and long[0].ms <= 5000 and stopped in long[0].cpus, w.stalls
    assert all(p.returncode == 0 for p in procs.values())
    assert "time(s) during the run" in w.line()
    # The stall names its cores: the stopped one, and any other that was late at the same time (a loaded machine,
    # such as the suite's other worker, delays them too: CI saw it); a stall of every core names none.
    if len(cpus) > 1:
        named = "" if long[0].cpus >= set(cpus) else f" (core {', '.join(str(c) for c in sorted(long[0].cpus))})"
        assert f"{long[0].ms:.0f}{named}" in w.line(), (w.stalls, w.line())


def test_closing_their_stdin_ends_the_watchers_within_their_sleep():
    w = PauseWatch(interval_ms=60_000, threshold_ms=10)
    w.__enter__()
    procs = list(w._procs.values())
    started = time.monotonic()
    assert w.stop() == []
    assert procs and all(p.returncode == 0 for p in procs)
    assert time.monotonic() - started < 9  # well inside their 60 s sleep and stop()'s 10 s before a kill


def test_reports_of_several_cores_that_overlap_are_one_stall():
    # Core 0 woke 35 ms late at t=10.035 (stalled from 10.000); core 1 woke 30 ms late at 10.040 (from 10.010):
    # one stall of both. Core 1 alone, 12 ms late at 11.0: another, of one core.
    stalls = merge({0: [(35.0, 10.035)], 1: [(30.0, 10.040), (12.0, 11.0)]})
    assert stalls == [Stall(35.0, 10.040, {0, 1}), Stall(12.0, 11.0, {1})]
    assert merge({0: [], 1: []}) == []


def test_the_line_names_each_stall_its_cores_and_their_sum():
    w = PauseWatch(cpus=[0, 1])
    assert w.line().endswith("0 times during the run")
    w.stalls = [Stall(35.2, 1.0, {0, 1}), Stall(64.7, 2.0, {1})]
    line = w.line()
    assert "2 time(s)" in line and "(35, 65 (core 1) ms; 100 ms in all)" in line
    w.stalls = [Stall(12.0, float(i), {0, 1}) for i in range(12)]
    assert "12, ..." in w.line() and "144 ms in all" in w.line()


def test_a_machine_of_many_cores_gets_one_unpinned_watcher(monkeypatch):
    monkeypatch.setattr(pause_watch.os, "sched_getaffinity", lambda pid: set(range(pause_watch.MAX_PINNED + 1)))
    w = PauseWatch()
    assert w.cpus == [pause_watch.UNPINNED]
    with w:
        assert len(w._procs) == 1
    assert w.line().startswith("the machine: a process that only sleeps")
    w.stalls = [Stall(20.0, 1.0, {pause_watch.UNPINNED})]
    assert "(20 ms; 20 ms in all)" in w.line()


def test_without_core_affinity_one_unpinned_watcher_is_used(monkeypatch):
    monkeypatch.delattr(pause_watch.os, "sched_getaffinity")  # as on macOS
    assert PauseWatch().cpus == [pause_watch.UNPINNED]


@pytest.mark.parametrize("argv", [["--interval-ms", "0"], ["--threshold-ms", "-1"]])
def test_a_watcher_without_a_positive_interval_or_threshold_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        pause_watch.main(argv)
    assert e.value.code == 2
    assert "must be positive" in capsys.readouterr().err


def test_a_watcher_pinned_to_a_core_that_does_not_exist_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        pause_watch.main(["--cpu", "4096"])
    assert e.value.code == 2
    assert "--cpu 4096" in capsys.readouterr().err


def test_steal_time_is_read_from_the_cpu_line_of_proc_stat(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice: steal is the 8th value.
    stat.write_text(f"cpu  19363 0 7179 74386 339 0 872 {3 * ticks} 0 0\ncpu0 9000 0 3000 37000 100 0 400 7 0 0\n")
    assert pause_watch.steal_seconds(str(stat)) == 3.0
    stat.write_text("cpu  1 2 3 4\n")  # a kernel without the column
    assert pause_watch.steal_seconds(str(stat)) is None
    assert pause_watch.steal_seconds(str(tmp_path / "missing")) is None
    real = pause_watch.steal_seconds()
    assert real is None or real >= 0


def test_a_run_the_hypervisor_took_half_a_percent_of_the_cores_from_is_marked(monkeypatch):
    cores = os.cpu_count() or 1
    readings = iter([10.0, 10.0 + 0.006 * 10 * cores])  # 0.6% of 10 s of every core's time
    now = [100.0]
    monkeypatch.setattr(pause_watch, "steal_seconds", lambda: next(readings))
    monkeypatch.setattr(pause_watch.time, "monotonic", lambda: now[0])
    w = PauseWatch(cpus=[])  # no watcher processes: the steal time alone
    with w:
        now[0] += 10.0  # the run
    assert w.stalls == [] and w.steal_ms is not None and abs(w.steal_ms - 60.0 * cores) < 1e-6
    assert w.disturbed, (w.steal_ms, w.watched_s)
    assert "steal time, 0.60% of their time, marked" in w.line(), w.line()
    w.steal_ms = 0.004 * 10_000 * cores  # 0.4%: shown, not marked
    assert not w.disturbed and w.line().endswith("(steal time, 0.40% of their time)"), w.line()
    w.steal_ms = None  # no /proc/stat: nothing said about it
    assert not w.disturbed and w.line().endswith("0 times during the run")
