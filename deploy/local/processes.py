"""Freezing a local process for a fault: SIGSTOP, and wait until it has really stopped.

``kill(pid, SIGSTOP)`` returns before the process stops. The kernel hands the signal to
one thread, and only when that thread next runs does it stop the others; meanwhile every
other thread runs on. Measured here on 2 cores: a thread kept running for thousands of
Python loop iterations after ``kill`` returned (tens of thousands under load). A fault
test that acts right after the signal therefore acts on a node that may still answer:
a "frozen" Raft follower still acknowledged the next entry, and the test saw a commit it
believed impossible. ``stop_process`` returns only once every thread of the process is in
the stopped state (``/proc/<pid>/task/*/stat``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

# Stopped by a signal, or by a tracer; zombie/dead threads will never run again either.
_NOT_RUNNING = frozenset("TtZX")
STOP_TIMEOUT_S = 5.0
_POLL_S = 0.001


def thread_states(pid: int) -> list[str] | None:
    """The state letter of each thread of ``pid`` (``R``, ``S``, ``D``, ``T``...); None without /proc
    (not Linux) or once the process is gone."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    states = []
    for task in tasks:
        try:
            # "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ")".
            states.append(task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # the thread exited meanwhile
    return states


def stop_process(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGSTOP ``pid`` and return once none of its threads can run.

    Raises ProcessLookupError when there is no such process, and TimeoutError (naming the
    threads' states) when some thread has not stopped within ``timeout_s`` (one in
    uninterruptible disk sleep, ``D``, stops only when its I/O completes).
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while True:
        states = thread_states(pid)
        if states is None or all(s in _NOT_RUNNING for s in states):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"process {pid} was sent SIGSTOP but {timeout_s:.0f} s later its threads are in "
                               f"states {''.join(sorted(states))} (T = stopped)")
        time.sleep(_POLL_S)
