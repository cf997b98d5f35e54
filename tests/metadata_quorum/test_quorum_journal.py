"""The quorum journal (metadata_quorum/quorum_journal.py) on real file systems that fail.

Each failing case runs in a child process: with pysyncobj's own journal a full disk killed the process with
SIGBUS, which would take the test runner with it. The child writes entries until the journal's failure
handler is called, and prints what it was told.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from mounts import tmpfs

from metadata_quorum import quorum_journal
from metadata_quorum.quorum_journal import SLOW_FLUSH_S, FailStopJournal

REPO = Path(__file__).resolve().parents[2]

_WRITER = """
import os, resource, signal, sys
from metadata_quorum.quorum_journal import FailStopJournal

path, fsize = sys.argv[1], int(sys.argv[2])
if fsize:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past RLIMIT_FSIZE: EFBIG, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

def on_failure(where, what, exc):
    print(f"FAILED {what} {type(exc).__name__} {getattr(exc, 'errno', None)} {len(journal) if journal else -1}",
          flush=True)
    os._exit(3)

journal = None
journal = FailStopJournal(path, on_failure)
if len(sys.argv) > 3:  # fill what is left of the file system first
    try:
        with open(sys.argv[3], "wb", buffering=0) as f:
            while True:
                f.write(b"x" * 4096)
    except OSError:
        pass
for i in range(1, 200_000):
    journal.add(b"c" * 200, i, 1)
    if i % 100 == 0:
        journal.onOneSecondTimer()
print("NO FAILURE", len(journal), flush=True)
"""


def _write_until_failure(journal: Path, fsize: int = 0, filler: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-c", _WRITER, str(journal), str(fsize)] + ([str(filler)] if filler else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_a_journal_past_the_file_size_limit_calls_the_failure_handler(tmp_path: Path) -> None:
    done = _write_until_failure(tmp_path / "quorum.journal", fsize=256 * 1024)
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr[-2000:])
    what, error, errno_, entries = done.stdout.split()[1:5]
    assert (what, error, int(errno_)) == ("append", "OSError", 27), done.stdout  # EFBIG, on the append
    assert 0 < int(entries) < 200_000


def test_a_full_disk_is_an_error_of_the_append_not_sigbus(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root: the journal is on a small tmpfs (mount -t tmpfs)")
    disk = tmp_path / "meta"
    with tmpfs(disk, "1m"):
        done = _write_until_failure(disk / "quorum.journal", filler=disk / "filler")
    assert done.returncode == 3, (
        f"the writer ended with {done.returncode} (-7 is SIGBUS: a page of the journal the full file system could "
        f"not allocate): {done.stdout} {done.stderr[-2000:]}")
    what, error, errno_ = done.stdout.split()[1:4]
    assert (error, int(errno_)) == ("OSError", 28), done.stdout  # ENOSPC
    assert what in ("append", "flush"), done.stdout


def test_the_journal_is_flushed_once_a_second_only_when_it_changed(tmp_path: Path) -> None:
    failures: list[str] = []
    journal = FailStopJournal(str(tmp_path / "quorum.journal"), lambda p, what, exc: failures.append(what))
    flushes: list[int] = []
    journal.flush = lambda: flushes.append(len(journal))  # type: ignore[method-assign]
    journal.onOneSecondTimer()
    assert flushes == []  # nothing written since it was opened
    journal.add(b"entry", 1, 1)
    journal.onOneSecondTimer()
    journal.onOneSecondTimer()
    assert flushes == [1]
    journal.deleteEntriesFrom(0)
    journal.onOneSecondTimer()
    assert flushes == [1, 0]
    assert failures == []
    journal._destroy()


def test_each_flush_is_timed_and_a_slow_one_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]  # the journal's clock, moved by the flushes below: no real waiting
    monkeypatch.setattr(quorum_journal, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    journal = FailStopJournal(str(tmp_path / "quorum.journal"), lambda *a: pytest.fail(f"journal failure {a}"))
    try:
        journal.sync()  # nothing written: no flush
        assert journal.flush_times.snapshot()[2] == 0
        journal.add(b"entry", 1, 1)
        journal.sync()
        journal.sync()
        _, _, count = journal.flush_times.snapshot()
        assert count == 1, f"{count} flushes timed for one change"
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        flush = journal.flush

        def slow() -> None:  # a disk that takes longer than SLOW_FLUSH_S
            now[0] += SLOW_FLUSH_S + 0.02
            flush()
        journal.flush = slow  # type: ignore[method-assign]
        journal.add(b"entry", 2, 1)
        with caplog.at_level("WARNING", logger="metadata_quorum.quorum_journal"):
            journal.sync()
        cumulative, total, count = journal.flush_times.snapshot()
        assert count == 2 and total >= SLOW_FLUSH_S, (cumulative, total, count)
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and "quorum.journal took" in warned[0] and "metadata.log.dir is slow" in warned[0], \
            warned
    finally:
        journal._destroy()


def test_entries_and_term_survive_a_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "quorum.journal")
    journal = FailStopJournal(path, lambda *a: pytest.fail(f"journal failure {a}"))
    for i in range(1, 2_000):  # past the first sizes: the file grows by allocation several times
        journal.add(b"x" * 100 + str(i).encode(), i, 3)
    journal.setCurrentTerm(3, "node-b")
    journal.onOneSecondTimer()
    journal._destroy()
    again = FailStopJournal(path, lambda *a: pytest.fail(f"journal failure {a}"))
    assert len(again) == 1_999
    assert again[-1] == (b"x" * 100 + b"1999", 1999, 3)
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (3, "node-b")
    again._destroy()
