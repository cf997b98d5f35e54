"""The quorum journal: pysyncobj's FileJournal, fail-stop on a failing disk, on disk before it is acknowledged.

pysyncobj's FileJournal keeps every entry in memory and writes it into an mmap of ``quorum.journal``.
Three things went wrong when the disk under it failed (found by faulting the metadata directory of a
running controller):

- a full disk killed the process with SIGBUS: growing the file (``mmap.resize``) only sets its size, and
  the first write into a page the file system could not allocate is a page fault the kernel answers with
  SIGBUS, not an error. ``_AllocatingFile`` allocates the blocks first (``posix_fallocate``), so a full disk
  is an ``OSError`` at the write;
- a failed write (read-only file system, EIO) left the mmap closed (pysyncobj closes it before reopening
  the file to grow it) and every later write raised, on every tick, forever. The voter kept its
  leadership and heartbeats and committed nothing: no metadata change, ISR change or fencing for as long
  as the process lived, and no failover;
- FileJournal adds an entry to its in-memory list *before* writing it. A follower whose writes failed
  still acknowledged appends it had not stored, so the quorum counted a voter that held nothing on disk:
  5 acknowledged CreateTopics were lost when the leader then died.

So any I/O error of the journal or its ``.meta`` file halts the process at once (``on_failure``), before
an acknowledgement or a vote can follow, as a broker halts on a failed log directory: the other voters
elect a leader among themselves, and the node is started again once its disk is fixed.

pysyncobj also never flushed the journal (only ``_destroy`` did): what reached the disk was up to the
kernel's writeback, about 30 s, and a voter acknowledged entries it held only in memory. Raft counts an
entry as committed once a majority *stores* it, so a power loss of every voter could lose acknowledged
metadata changes (once a second flush still left up to a second of them). Now entries are on disk before
anything this voter says can count them (``sync``): before any message leaves the voter (a follower's
answer to an append, the leader's appends themselves: ``journal_first`` in metadata_quorum/raft.py wraps the
transport), and before a commit index over them is set (a leader, a single voter too, applies and answers
only what it flushed). Kafka's KRaft flushes its metadata log the same way, and etcd its WAL. A flush
writes only what changed since the last one (``msync``; 0.08 ms on the development machine). The one-second
timer still flushes before it stores the commit index; the term and vote file is fsynced before it is
renamed into place and with its directory, and one that does not read back stops the voter. A compaction
writes the kept entries to a new file renamed over the journal, so a kill midway leaves the whole journal or
the trimmed one (pysyncobj emptied it in place and wrote them back one by one).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj.journal import FileJournal, MetaStorer, ResizableFile

from broker.log_limits import ThrottledWarning
from broker.request_times import LatencyHistogram
from metadata_quorum import pysyncobj_compat  # noqa: F401  (undoes pysyncobj's socket.inet_ntop)
from storage.checkpoints import fsync_dir, fsync_file, write_atomically
from storage.disk_errors import EXIT_DISK_FAILURE, halt_for_disk_failure

log = logging.getLogger(__name__)

# What a failing disk raises through pysyncobj's journal: OSError (ENOSPC, EIO, EROFS...), ValueError
# ("mmap closed or invalid" after a failed grow), SystemError (a failed mmap resize).
_DISK_ERRORS = (OSError, ValueError, SystemError)

FailureHandler = Callable[[str, str, BaseException], None]

# A flush (msync) writes what changed since the last one: well under a millisecond on a healthy disk. Every message
# a voter sends waits for it, heartbeats included, so one that takes half the shortest election timeout can cost
# the leader its term (etcd warns of the same for its WAL's fdatasync, at 1 s).
FLUSH_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
SLOW_FLUSH_S = 0.1


class _AllocatingFile(ResizableFile):  # type: ignore[misc]
    """pysyncobj's ResizableFile whose growth allocates the file's blocks before they are written."""

    def reserve(self) -> None:
        """Allocate every block of what is mapped now (a journal made by pysyncobj is sparse)."""
        mm = self._ResizableFile__mm
        os.posix_fallocate(self._ResizableFile__f.fileno(), 0, len(mm))

    def write(self, offset: int, values: bytes) -> None:
        mm = self._ResizableFile__mm
        end = offset + len(values)
        if end > len(mm):
            size = max(int(len(mm) * self._ResizableFile__resizeFactor), end)
            os.posix_fallocate(self._ResizableFile__f.fileno(), 0, size)  # ENOSPC here, not SIGBUS below
            mm.resize(size)
        mm[offset:end] = values


class _DurableMetaStorer(MetaStorer):  # type: ignore[misc]
    """The term and vote file, on disk before pysyncobj acts on them: written to a temporary file that is fsynced
    before it is renamed into place, then the directory fsynced. pysyncobj renamed first and fsynced nothing; the
    file was fsynced after its rename, so a power loss in between could leave an empty file in its place, which
    pysyncobj reads as no term and no vote (a second vote in a term already voted in: audit)."""

    def storeMeta(self, meta: Any) -> None:  # noqa: N802 - pysyncobj's name
        write_atomically(Path(self.getPath()), pysyncobj_pickle.dumps(meta))


def _read_meta(path: Path) -> None:
    """Raise if the term and vote file exists but does not read back (pysyncobj's own reading takes any error for
    no term and no vote)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    meta = pysyncobj_pickle.loads(data)
    if not isinstance(meta, dict):
        raise ValueError(f"{type(meta).__name__}, not the dict pysyncobj writes")


class FailStopJournal(FileJournal):  # type: ignore[misc]
    """A FileJournal that calls ``on_failure`` (which halts the process) on the first disk error."""

    def __init__(self, path: str, on_failure: FailureHandler) -> None:
        self._path = path
        self._on_failure = on_failure
        self._dirty = False
        self.flush_times = LatencyHistogram(FLUSH_BUCKETS_S)  # brook_raft_journal_flush_seconds
        self._slow_flushes = ThrottledWarning(log)
        try:
            super().__init__(path)
            journal_file = self._FileJournal__journalFile
            journal_file.__class__ = _AllocatingFile
            journal_file.reserve()
            self._FileJournal__metaStorer.__class__ = _DurableMetaStorer
        except _DISK_ERRORS as exc:
            on_failure(path, "open", exc)
            raise
        meta = Path(path + ".meta")
        try:
            _read_meta(meta)
        except Exception as exc:  # noqa: BLE001 - whatever unpickling an unreadable file raises
            on_failure(path, f"read its term and vote file {meta} (it does not read back; starting without the "
                             "vote it holds could vote twice in one term: replace this voter as the README's 'Replacing a "
                             "controller voter' says, with an empty metadata.log.dir)", exc)
            raise OSError(f"unreadable {meta}: {exc}") from exc

    @contextlib.contextmanager
    def _guard(self, what: str, *, changes: bool = True) -> Iterator[None]:
        try:
            yield
        except _DISK_ERRORS as exc:
            self._on_failure(self._path, what, exc)
            raise
        if changes:
            self._dirty = True

    def add(self, command: Any, idx: int, term: int) -> None:
        with self._guard("append"):
            super().add(command, idx, term)

    def clear(self) -> None:
        with self._guard("clear"):
            super().clear()

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803 - pysyncobj's names
        with self._guard("truncate"):
            super().deleteEntriesFrom(entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802, N803 - pysyncobj's names
        """Drop the entries before position ``entryTo`` (a compaction, once the snapshot is on disk): the kept
        ones are written to a new file, fsynced and renamed over the journal. pysyncobj emptied the journal in
        place and wrote the kept entries back one by one, so a process killed meanwhile kept only those written
        so far: entries it had acknowledged were gone when it restarted (audit)."""
        with self._guard("compact"):
            kept = self._FileJournal__journal[entryTo:]
            path = Path(self._path)
            compacted = path.with_name(path.name + ".compacting")
            compacted.unlink(missing_ok=True)  # left by a kill midway: written again
            fresh = FailStopJournal(str(compacted), self._on_failure)  # pysyncobj's own format and writer
            try:
                for entry in kept:
                    fresh.add(*entry)
                fresh.flush()
                end = fresh._FileJournal__currentOffset
            finally:
                fresh._destroy()
            fsync_file(compacted)  # its size too: msync wrote the pages only
            self._FileJournal__journalFile._destroy()  # flushed and closed: nothing more is written to it
            os.replace(compacted, path)
            fsync_dir(path.parent)
            journal_file = _AllocatingFile(str(path))
            journal_file.reserve()
            self._FileJournal__journalFile = journal_file
            self._FileJournal__journal = list(kept)
            self._FileJournal__currentOffset = end

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803 - pysyncobj's names
        with self._guard("store the term and vote", changes=False):
            self._flush_entries()  # the commit index stored with the term covers only entries on disk
            super().setCurrentTerm(term, votedForNodeId)

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803 - pysyncobj's names
        """A commit index is set before the entries it covers are applied (and their proposers answered): they
        are flushed first. A leader whose followers' answers came before its own flush (or a single voter, which
        sends nothing) applied entries it held only in memory."""
        self.sync()
        super().setRaftCommitIndex(raftCommitIndex)

    def sync(self) -> None:
        """Flush the entries written since the last flush (nothing when there are none): called before this voter
        acknowledges anything (see the module doc)."""
        if self._dirty:
            with self._guard("flush", changes=False):
                self._flush_entries()

    def onOneSecondTimer(self) -> None:  # noqa: N802 - pysyncobj's name
        with self._guard("flush", changes=False):
            # Entries first, then the commit index that covers them. In pysyncobj's order, a power loss between
            # the two left a commit index over entries not on disk: the voter restarted and applied what its
            # journal held there, an old leader's uncommitted entries among them (audit).
            self._flush_entries()
            super().onOneSecondTimer()

    def _flush_entries(self) -> None:
        if self._dirty:
            self._dirty = False
            started = time.monotonic()
            self.flush()
            took = time.monotonic() - started
            self.flush_times.observe(took)
            if took >= SLOW_FLUSH_S:
                self._slow_flushes.warn("flushing the quorum journal %s took %.0f ms: every message this voter sends "
                                        "waits for it, heartbeats too; the disk under metadata.log.dir is slow",
                                        self._path, took * 1000)


def halt_on_journal_failure(path: str, what: str, exc: BaseException) -> None:
    """The default ``on_failure``: log one line naming the file, and exit at once (code 4, as a broker
    whose log directory failed): pysyncobj's tick thread is calling, and nothing else of this voter may
    run (no acknowledgement, no vote)."""
    log.critical("the controller quorum journal %s failed (%s: %s); halting (exit code %d) so that the other "
                 "voters elect a leader among themselves. Fix the disk under metadata.log.dir (free space, "
                 "replace it) and start the node again.", path, what, exc, EXIT_DISK_FAILURE)
    halt_for_disk_failure()
