"""The benchmark's watcher of machine-wide stalls: a real process, stopped for real."""

from __future__ import annotations

import os
import signal
import time

import pytest

from deploy.local import pause_watch
from deploy.local.pause_watch import PauseWatch


def test_a_watcher_stopped_for_300_ms_reports_a_pause_of_that_length():
    with PauseWatch(interval_ms=2, threshold_ms=10) as w:
        proc = w._proc
        assert proc is not None
        time.sleep(0.5)  # its interpreter starts, then it sleeps
        # Stopped as the host stops a virtual machine's CPUs: it resumes with its sleep long overdue.
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.05)
    assert any(250 <= p <= 5000 for p in w.pauses_ms), w.pauses_ms
    assert proc.returncode == 0
    assert "time(s) during the run" in w.line()


def test_closing_its_stdin_ends_the_watcher_within_its_sleep():
    w = PauseWatch(interval_ms=60_000, threshold_ms=10)
    w.__enter__()
    proc = w._proc
    started = time.monotonic()
    assert w.stop() == []
    assert proc is not None and proc.returncode == 0
    assert time.monotonic() - started < 9  # well inside its 60 s sleep and stop()'s 10 s before a kill


def test_the_line_names_each_pause_and_their_sum():
    w = PauseWatch()
    assert w.line().endswith("0 times during the run")
    w.pauses_ms = [35.2, 64.7]
    line = w.line()
    assert "2 time(s)" in line and "(35, 65 ms; 100 ms in all)" in line
    w.pauses_ms = [12.0] * 12
    assert "12, ..." in w.line() and "144 ms in all" in w.line()


@pytest.mark.parametrize("argv", [["--interval-ms", "0"], ["--threshold-ms", "-1"]])
def test_a_watcher_without_a_positive_interval_or_threshold_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        pause_watch.main(argv)
    assert e.value.code == 2
    assert "must be positive" in capsys.readouterr().err
