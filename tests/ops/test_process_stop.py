"""``stop_process``: once it returns, no thread of the process runs any more.

``kill(pid, SIGSTOP)`` alone returns while other threads of the target still run (the kernel
hands the stop to one thread, which must be scheduled to stop the rest): a CI run saw a
"frozen" Raft follower acknowledge an entry after the test had sent it SIGSTOP.
"""

from __future__ import annotations

import mmap
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local.processes import stop_process, thread_states
from tests.waiting import wait_for

# The main thread sleeps; four others each count in their own 8 bytes of a shared file as fast as they can.
SPINNER = r"""
import mmap, sys, threading
f = open(sys.argv[1], "r+b")
m = mmap.mmap(f.fileno(), 32)
def spin(slot):
    n = 0
    while True:
        n += 1
        m[slot * 8:slot * 8 + 8] = n.to_bytes(8, "little")
for slot in range(4):
    threading.Thread(target=spin, args=(slot,), daemon=True).start()
threading.Event().wait()
"""


@pytest.fixture()
def spinner(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], mmap.mmap]]:
    counters = tmp_path / "counters"
    counters.write_bytes(bytes(32))
    proc = subprocess.Popen([sys.executable, "-c", SPINNER, str(counters)])
    with counters.open("r+b") as f:
        shared = mmap.mmap(f.fileno(), 32)
    try:
        yield proc, shared
    finally:
        proc.kill()
        proc.wait(10)
        shared.close()


def read(shared: mmap.mmap) -> list[int]:
    return [int.from_bytes(shared[i * 8:i * 8 + 8], "little") for i in range(4)]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc (Linux)")
def test_no_thread_runs_after_stop_process_returns(
        spinner: tuple[subprocess.Popen[bytes], mmap.mmap]) -> None:
    proc, shared = spinner
    wait_for(lambda: all(read(shared)), 20, "all four counting threads to start")
    for round_ in range(30):
        stop_process(proc.pid)
        frozen = read(shared)
        # Absence of progress can only be shown by letting time pass: 20 ms is thousands of
        # increments for a thread that still runs (plain kill() left some running in most rounds).
        time.sleep(0.02)
        after = read(shared)
        states = thread_states(proc.pid)
        assert after == frozen, (f"round {round_}: counters moved after stop_process returned: {frozen} -> {after} "
                                 f"(thread states {states})")
        assert states is not None and set(states) == {"T"}, states
        proc.send_signal(signal.SIGCONT)
        wait_for(lambda frozen=frozen: all(a > b for a, b in zip(read(shared), frozen, strict=True)), 20,
                 lambda round_=round_: f"round {round_}: every thread to count again after SIGCONT ({read(shared)})")


def test_stop_process_of_no_process_raises() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    with pytest.raises(ProcessLookupError):
        stop_process(proc.pid)
