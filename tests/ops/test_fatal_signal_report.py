"""A node that dies of a fatal signal says so in its log, with every thread's stack.

Found by a liveness probe: with the metadata directory on a full disk, a node died about 9 s after the
first ENOSPC and its log said nothing (pysyncobj writes its journal through mmap, and a page the file
system cannot back ends the process with SIGBUS). That case is now an error and a clean halt
(metadata_quorum/quorum_journal.py); any other fatal signal is still reported so. A real process, a real
signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_fatal_signal_writes_the_stacks_to_the_log_stream() -> None:
    script = textwrap.dedent("""
        import os, signal, threading
        from broker.node import setup_logging
        setup_logging("INFO")
        threading.Thread(target=threading.Event().wait, name="worker", daemon=True).start()
        os.kill(os.getpid(), signal.SIGBUS)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stderr)
    assert "Fatal Python error: Bus error" in done.stderr, done.stderr
    assert "Current thread" in done.stderr and "Thread 0x" in done.stderr, done.stderr  # every thread's stack
