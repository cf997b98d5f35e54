"""The Raft quorum (pysyncobj) that replicates MetadataState.

``MetadataRaft`` owns one pysyncobj ``SyncObj`` whose only consumer holds the
``MetadataState``. A command becomes true only once a majority of voters has it in
their journals and it is applied; ``propose`` waits for exactly that (callback +
``threading.Event``) and gives up with REQUEST_TIMED_OUT after its timeout.

pysyncobj hazards handled here:
- ``useFork=False``: compaction would fork the process, which gRPC does not survive.
  Without a fork pysyncobj pickled and gzipped (level 9) the whole state on its tick thread:
  3.3 s without a heartbeat at 200,000 partitions, every compaction (at least every
  ``snapshot_min_interval_s``), longer than the election timeout. ``_DumpWriter`` (pysyncobj's
  custom serializer hooks) takes the state as builtins on the tick thread at the compacted
  index, as before, and writes the file on a thread of its own; pysyncobj trims the journal
  only once the file is in place. The file's format is unchanged.
- journal (``journalFile``) and full dump (``fullDumpFile``) live under the
  controller's data directory, so a full restart of every voter loses nothing.
- pysyncobj unpickles every frame it receives, so whoever can talk to the quorum port
  unauthenticated can run code on the voter. ``password`` turns on pysyncobj's Fernet
  encryption, whose HMAC is checked *before* anything is unpickled; ``quorum_security``
  refuses to start a voter without a strong password unless every voter is on loopback,
  and the port binds only the configured host (never 0.0.0.0).
- leadership and term are read together on pysyncobj's tick thread (``leadership()``):
  read from another thread they can be torn (pysyncobj sets the new term before it
  leaves the leader state), which once made a deposed leader propose an activation
  for a term it never led.
- Commands travel as dicts of builtins (``commands.to_dict``), never as pickled classes.

Reads of the state happen under ``lock``; pysyncobj applies commands on its tick
thread, under the same lock.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import itertools
import logging
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj import FAIL_REASON, SERIALIZER_STATE, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.journal import Journal, MemoryJournal
from pysyncobj.transport import TCPTransport, Transport

from broker.request_times import LatencyHistogram
from metadata_quorum import commands as c
from metadata_quorum import (
    pysyncobj_compat,  # noqa: F401  (undoes pysyncobj's socket.inet_ntop)
    quorum_pickle,
)
from metadata_quorum.journal_repair import repair_journal
from metadata_quorum.log_matching import LogMatchingSyncObj
from metadata_quorum.prevote import PreVoteSyncObj
from metadata_quorum.quorum_journal import FailStopJournal, FailureHandler, halt_on_journal_failure
from metadata_quorum.quorum_security import bind_address, check_quorum_protection
from metadata_quorum.raft_transport import BoundedTCPTransport
from metadata_quorum.state import (
    DEFAULT_CHANGELOG_MAX_KEYS,
    ApplyResult,
    MetadataInvariantError,
    MetadataState,
)
from proto import errors
from storage.checkpoints import fsync_dir, fsync_file

log = logging.getLogger(__name__)

T = TypeVar("T")

JOURNAL_FILE = "quorum.journal"
DUMP_FILE = "quorum.snapshot"
_STATUS_SAMPLE_INTERVAL_S = 0.1
# Gaps between two runs of pysyncobj's tick thread (it ticks at least every 50 ms when healthy).
TICK_GAP_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TICK_STALL_REPORT_EVERY_S = 10.0

_FAIL_NAMES = {
    getattr(FAIL_REASON, name): name
    for name in dir(FAIL_REASON) if name.isupper()
}


@dataclass(frozen=True)
class RaftTiming:
    """pysyncobj timing. Defaults favour fast failover on a LAN."""

    election_timeout_min_s: float = 0.6
    election_timeout_max_s: float = 1.5
    append_entries_period_s: float = 0.1
    # A leader that has not heard from a majority for this long steps down, so a
    # partitioned ex-leader stops serving (as non-leader it only redirects).
    leader_fallback_timeout_s: float = 2.0
    connection_timeout_s: float = 3.5
    connection_retry_s: float = 0.5
    snapshot_min_entries: int = 5000
    snapshot_min_interval_s: float = 300.0


@dataclass(frozen=True)
class VoterStatus:
    address: str
    is_self: bool
    connected: bool
    match_index: int  # -1 unknown (not the leader)
    last_caught_up_ago_s: float | None


@dataclass(frozen=True)
class QuorumStatus:
    is_leader: bool
    leader_address: str | None
    term: int
    commit_index: int
    last_applied: int
    voters: list[VoterStatus]


class _MetadataConsumer(SyncObjConsumer):
    """The replicated object: the state plus the one method the Raft log calls."""

    def __init__(self, state: MetadataState, lock: threading.RLock,
                 on_applied: Callable[[int], None], on_fatal: Callable[[BaseException], None]) -> None:
        super().__init__()
        self.state = state
        self.lock = lock
        self.on_applied = on_applied
        self.on_fatal = on_fatal
        self.failed: BaseException | None = None

    @replicated
    def apply_command(self, payload: dict[str, Any], controller_epoch: int | None = None) -> ApplyResult:
        if self.failed is not None:
            # Fail-stop: after a broken invariant this voter applies nothing more (it is being halted).
            return ApplyResult(errors.ErrorCode.UNKNOWN_SERVER_ERROR, "this controller stopped on an internal error")
        try:
            with self.lock:
                result = self.state.apply(payload, controller_epoch=controller_epoch)
                version = self.state.version
        except MetadataInvariantError as exc:
            # Raising into pysyncobj would make it retry this entry forever on its tick thread
            # (a silent stall, possibly over a half-applied state). Like Kafka's controller, stop.
            self.failed = exc
            log.critical("metadata state machine failed on %r: %s", payload, exc, exc_info=exc)
            self.on_fatal(exc)
            return ApplyResult(errors.ErrorCode.UNKNOWN_SERVER_ERROR, f"internal error: {exc}")
        self.on_applied(version)
        return result

    @replicated
    def barrier(self) -> int:
        """A no-op through the log: its commit proves this node still leads a majority."""
        with self.lock:
            return self.state.version

    def _serialize(self) -> dict[str, Any]:
        with self.lock:
            return {"metadata": self.state.to_snapshot()}

    def _deserialize(self, data: dict[str, Any]) -> None:
        with self.lock:
            self.state.restore(data["metadata"])
            version = self.state.version
        log.info("metadata restored from the quorum snapshot at version %d", version)
        self.on_applied(version)


class SnapshotRefusedError(Exception):
    """A snapshot received from the leader that does not read back, or that this voter has applied past
    (``_DumpWriter.load``, which logs why)."""


class _RefusedSnapshotsSaidOnce(logging.Filter):
    """pysyncobj logs any failed load as an ERROR with a traceback; a refusal is logged by ``_DumpWriter``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], SnapshotRefusedError))


logging.getLogger(pysyncobj_syncobj.__name__).addFilter(_RefusedSnapshotsSaidOnce())


class _DumpJob:
    __slots__ = ("path", "loads", "started", "done", "error")

    def __init__(self, path: Path, loads: int) -> None:
        self.path = path  # a file of this job's own, renamed over the dump when done
        self.loads = loads  # dumps loaded when it started: one loaded since makes this one stale
        self.started = time.monotonic()
        self.done = threading.Event()
        self.error: BaseException | None = None


class _DumpWriter:
    """pysyncobj's full dump (log compaction), written off its tick thread.

    pysyncobj calls ``start`` on its tick thread at the compacted index: the state is taken there as
    builtins (``MetadataState.to_snapshot`` under the state lock: exactly the state at that index, the
    one part that is still O(partitions) on that thread), with pysyncobj's own fields and the index's
    log entries, all copies. A thread of this writer's own pickles and gzips them to a file of its own
    and fsyncs it. ``status`` (on the tick thread) renames it over the dump once written and only then
    reports success, on which pysyncobj trims the journal; until then pysyncobj starts no other dump
    and sends no snapshot to a follower. A dump loaded meanwhile (one received from the leader) makes
    the one being written stale: it is dropped. The file is what pysyncobj writes: gzip of a pickle of
    (object data, last entry, previous entry, cluster) (``load_snapshot_file``).

    ``<dump>.own`` is a hard link to the dump this voter last wrote or accepted. pysyncobj renames a snapshot
    received from the leader over the dump before it loads it, so the voter's own dump was gone whether or not
    the received one was then loaded: a snapshot cut short on a dropped connection (pysyncobj sends the rest on
    the next) does not read back, and the voter, restarted, stopped on it; a snapshot older than what the voter
    had applied (a late "reset") was loaded over its state, and its journal emptied. ``load`` refuses both and
    puts the voter's own dump back. ``<dump>.receiving`` is there from a received snapshot's last piece (before
    pysyncobj's rename) until ``load`` has decided: a voter stopped in between starts from its own dump. Without
    it, a dump that is not the ``.own`` one is trusted (another version of Brook wrote it: a rolled-back node).
    """

    # pysyncobj's level 9 took 6-10 times as long on metadata for the same size. (Protocol 4's memo opcodes
    # carry no index, so metadata's repeated shapes compress far better too: 1.5 MB became 30 KB at 200,000
    # partitions.)
    COMPRESS_LEVEL = 6
    _jobs = itertools.count()

    def __init__(self, path: Path, consumer: _MetadataConsumer,
                 on_unreadable: Callable[[BaseException], None] | None = None) -> None:
        self.path = path
        self._own = path.with_name(path.name + ".own")
        self._receiving = path.with_name(path.name + ".receiving")
        _dump_writers[str(path)] = self  # QuorumSyncObj marks a receipt through it
        self._consumer = consumer
        self._job: _DumpJob | None = None
        self._loads = 0
        # The voter's own dump, loaded at its first tick, that does not read back stops the process. pysyncobj
        # logged the error and went on with a journal that starts past the dump: a voter that votes and
        # acknowledges but never applies, and whose state, were it elected, is empty.
        self._on_unreadable = on_unreadable or _halt_process
        # For tests and the operator's log: the last dump's time on the tick thread (taking the state) and
        # in all.
        self.last_take_s = 0.0
        self.last_write_s = 0.0
        self.written = 0
        self._keep_own_at_start()

    def _keep_own_at_start(self) -> None:
        """Before pysyncobj looks for the dump: the voter's own is the one it starts from."""
        own, dump = self._own, self.path
        same = own.exists() and dump.exists() and os.path.samefile(own, dump)
        if self._receiving.exists() and not same:
            log.warning("the quorum snapshot %s was received from the leader and never accepted (the voter stopped "
                        "between its last piece and its load): starting from the voter's own", dump)
            self._restore_own()
        elif dump.exists() and not same:  # this version's first start, or another version wrote it
            self._link(dump, own)
        self._receiving.unlink(missing_ok=True)

    def mark_receiving(self) -> None:
        """A received snapshot's last piece: pysyncobj renames it over the dump next (see the class)."""
        with open(self._receiving, "wb"):
            pass
        fsync_dir(self._receiving.parent)

    def _link(self, source: Path, target: Path) -> None:
        """``target`` is ``source``'s file, atomically and durably (a hard link: no copy)."""
        tmp = target.with_name(target.name + ".linking")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.link(source, tmp)
        os.replace(tmp, target)
        fsync_dir(target.parent)

    def _put_own_back(self, why: str) -> None:
        """The received snapshot is refused: the dump is the voter's own again (none: no dump)."""
        log.warning("refused the quorum snapshot received from the leader (%s); keeping this voter's own state, "
                    "journal and snapshot", why)
        self._restore_own()
        self._receiving.unlink(missing_ok=True)

    def _restore_own(self) -> None:
        """The dump is the voter's own again; a voter that had none has none (its journal holds everything)."""
        if self._own.exists():
            self._link(self._own, self.path)
        else:
            self.path.unlink(missing_ok=True)
            fsync_dir(self.path.parent)

    def start(self, tmp_file: str, rest: tuple[Any, ...]) -> None:
        """pysyncobj's ``serializer(fileName, data)``; ``rest`` is (last entry, previous entry, cluster).
        pysyncobj renames ``tmp_file`` over the dump as this returns: it must not exist (the rename fails,
        quietly, and ``status`` takes over)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_file)
        job = _DumpJob(self.path.with_name(f"{self.path.name}.{os.getpid()}-{next(self._jobs)}.writing"), self._loads)
        self._job = job  # from here on ``status`` reports this dump (pysyncobj waits for it, whatever happens)
        try:
            started = time.perf_counter()
            syncobj = self._consumer._syncObj
            hidden = getattr(syncobj, "_SyncObj__properies", ())
            self_data = {k: v for k, v in vars(syncobj).items() if k not in hidden}  # as pysyncobj stores it
            small = pickle.loads(pickle.dumps((self_data, rest)))  # own copies of pysyncobj's small parts
            data = ([small[0], self._consumer._serialize()], *small[1])
            self.last_take_s = time.perf_counter() - started
            for stale in self.path.parent.glob(self.path.name + ".*.writing"):  # a crashed or stopped voter's
                if stale != job.path:
                    with contextlib.suppress(OSError):
                        stale.unlink()
            threading.Thread(target=self._write, args=(job, data), name="quorum-dump-writer", daemon=True).start()
        except BaseException as exc:  # noqa: BLE001 - ``status`` reports it; pysyncobj tries again later
            job.error = exc
            job.done.set()

    def _write(self, job: _DumpJob, data: tuple[Any, ...]) -> None:
        try:
            with open(job.path, "wb") as f:
                with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=self.COMPRESS_LEVEL) as g:
                    # Protocol 4 frames the pickle: the pickler hands the file 64 KiB at a time (the tick
                    # thread gets the GIL in between; zlib compresses without it).
                    pickle.dump(data, g, protocol=4)
                f.flush()
                os.fsync(f.fileno())
        except BaseException as exc:  # noqa: BLE001 - reported by ``status`` on the tick thread
            job.error = exc
        finally:
            job.done.set()

    def status(self) -> int:
        """pysyncobj's ``serializeChecker``, on the tick thread."""
        job = self._job
        if job is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        if not job.done.is_set():
            return SERIALIZER_STATE.SERIALIZING
        self._job = None
        if job.error is None and job.loads != self._loads:
            job.error = RuntimeError("a dump received from the leader was loaded meanwhile")
        if job.error is None:
            try:
                self._link(job.path, self._own)  # this voter's own from now on, whatever it receives
                os.replace(job.path, self.path)
                # The rename must be on disk before pysyncobj trims the journal (on SUCCESS): after a power
                # loss, the old dump and a trimmed journal would have lost the entries in between.
                fsync_dir(self.path.parent)
            except OSError as exc:
                job.error = exc
        if job.error is not None:
            log.warning("the quorum snapshot was not written (%s); the journal is kept, pysyncobj tries again",
                        job.error)
            with contextlib.suppress(OSError):
                job.path.unlink()
            return SERIALIZER_STATE.FAILED
        self.last_write_s = time.monotonic() - job.started
        self.written += 1
        return SERIALIZER_STATE.SUCCESS

    def load(self, file_name: str) -> tuple[Any, ...]:
        """pysyncobj's ``deserializer``, on the tick thread: restore what the dump holds (as pysyncobj does
        itself without custom hooks) and hand back (last entry, previous entry, cluster)."""
        self._loads += 1
        # A dump received from the leader was written by pysyncobj without an fsync and renamed without a
        # directory fsync, and pysyncobj clears the journal once this returns: after a power loss the voter
        # would have neither. Both are made durable first (at a start, where the dump is on disk already,
        # that costs two fsyncs).
        try:
            fsync_file(file_name)
            fsync_dir(Path(file_name).parent)
        except OSError as exc:  # pysyncobj would acknowledge the dump anyway, unloaded: stop instead
            _halt_process(exc)
        syncobj = self._consumer._syncObj
        at_start = syncobj._SyncObj__needLoadDumpFile  # its own dump, not a leader's
        try:
            with open(file_name, "rb") as f, gzip.GzipFile(fileobj=f) as g:
                data = pysyncobj_pickle.load(g)
        except Exception as exc:  # noqa: BLE001 - whatever an unreadable gzip or pickle raises
            if at_start:
                log.critical("the quorum snapshot %s does not read back (%s: %s): this voter cannot rebuild the "
                             "metadata its journal does not hold. Replace it as the README's 'Replacing a "
                             "controller voter' says (an empty metadata.log.dir)", file_name, type(exc).__name__,
                             exc)
                self._on_unreadable(exc)
                raise
            # pysyncobj answers it as loaded, at this voter's own index: the leader sends it again
            self._put_own_back(f"it does not read back: {type(exc).__name__}: {exc}")
            raise SnapshotRefusedError("the leader's snapshot does not read back") from exc
        if not at_start:
            applied = syncobj._SyncObj__raftLastApplied
            if data[1][1] <= applied:
                # Committed at the snapshot's index and applied here past it: nothing in it is new, and loading
                # it would take the state back and empty a journal compacted past it (acknowledged entries).
                self._put_own_back(f"it ends at {data[1][1]}, and this voter has applied up to {applied}")
                raise SnapshotRefusedError(f"the leader's snapshot ends at {data[1][1]}, applied here: {applied}")
            self._link(Path(file_name), self._own)  # accepted: before pysyncobj touches the journal
            self._receiving.unlink(missing_ok=True)
        if data[0] is not None:
            self_data, consumers = data[0][0], data[0][1:]
            vars(self._consumer._syncObj).update(self_data)
            self._consumer._deserialize(consumers[0])
        self._trim_compacted(data[1], data[2], at_start=at_start)
        return tuple(data[1:])

    def _trim_compacted(self, last: Any, previous: Any, *, at_start: bool) -> None:
        """Drop from the journal the entries before the dump's previous entry, when it holds the dump's last
        two entries. A compaction renames the dump into place and only then trims the journal: a process killed
        in between restarted with a journal that did not start at the dump, and pysyncobj then emptied it,
        entries after the dump included, acknowledged ones among them (audit). A leader's snapshot sent to a
        follower that holds more is the same case. pysyncobj keeps a journal that starts with those two entries
        (log_matching.py: for a leader's snapshot too); one that does not hold them it empties, as before."""
        journal = self._consumer._syncObj._SyncObj__raftLog
        if len(journal) < 2:
            return
        position = previous[1] - journal[0][1]
        if position <= 0 or position + 1 >= len(journal) or journal[position] != previous or \
                journal[position + 1] != last:
            return
        if at_start:
            log.warning("the quorum journal still holds entries %d..%d, which the snapshot at %d covers (a "
                        "compaction stopped before it trimmed the journal): trimming them, and keeping the %d "
                        "after it", journal[0][1], previous[1] - 1, last[1], len(journal) - position - 2)
        else:
            log.info("the leader's snapshot at %d covers entries %d..%d of this voter's journal: trimming them, "
                     "and keeping the %d after it", last[1], journal[0][1], previous[1] - 1,
                     len(journal) - position - 2)
        journal.deleteEntriesTo(position)


@functools.cache
def journal_first(transport_class: type[Transport]) -> type[Transport]:
    """``transport_class`` whose ``send`` first flushes its voter's journal (``FailStopJournal.sync``).

    Whatever a voter sends may count entries it holds: a follower's answer to an append (the leader then counts
    them as stored there), a leader's appends (whose answers commit them), a vote. So nothing leaves before those
    entries are on disk. Every message pysyncobj sends passes here; a flush with nothing new written costs
    nothing, so heartbeats pay nothing."""

    class JournalFirst(transport_class):  # type: ignore[misc,valid-type]
        def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803 - pysyncobj's names
            # The journal is made before the transport (SyncObj's constructor), and kept for the voter's life.
            self._journal_sync = getattr(syncObj._SyncObj__raftLog, "sync", None)
            super().__init__(syncObj, selfNode, otherNodes)

        def send(self, node: Any, message: Any) -> bool:
            if self._journal_sync is not None:
                self._journal_sync()
            return bool(super().send(node, message))

    JournalFirst.__name__ = JournalFirst.__qualname__ = f"JournalFirst{transport_class.__name__}"
    return JournalFirst


class QuorumSyncObj(PreVoteSyncObj, LogMatchingSyncObj):  # type: ignore[misc]
    """pysyncobj's SyncObj with pre-vote (metadata_quorum/prevote.py), a follower that truncates only conflicting
    entries (metadata_quorum/log_matching.py), and a journal flushed before anything is sent (``journal_first``)."""

    def __init__(self, *args: Any, transportClass: type[Transport] = TCPTransport,  # noqa: N803 - pysyncobj's name
                 **kwargs: Any) -> None:
        super().__init__(*args, transportClass=journal_first(transportClass), **kwargs)

    def _lm_snapshot_append(self, node: Any, message: dict[str, Any]) -> None:
        piece = message.get("serialized")
        if isinstance(piece, (tuple, list)) and len(piece) == 3 and piece[2]:  # the last: renamed over the dump
            writer = _dump_writers.get(str(self._SyncObj__conf.fullDumpFile))
            if writer is not None:
                writer.mark_receiving()
        super()._lm_snapshot_append(node, message)


# The dump writers by their dump's path, for QuorumSyncObj (whose own fields go into every dump: it keeps none).
_dump_writers: weakref.WeakValueDictionary[str, _DumpWriter] = weakref.WeakValueDictionary()


# pysyncobj makes its journal itself (``createJournal`` in SyncObj's constructor), with no way to pass a
# class: its module's name is pointed at ours. The handler a MetadataRaft gives is found by the journal's path.
_journal_failure_handlers: dict[str, FailureHandler] = {}
_journal_handlers_lock = threading.Lock()


def _create_journal(journal_file: str | None = None) -> Journal:
    if journal_file is None:
        return MemoryJournal()
    with _journal_handlers_lock:
        on_failure = _journal_failure_handlers.get(journal_file, halt_on_journal_failure)
    return FailStopJournal(journal_file, on_failure)


pysyncobj_syncobj.createJournal = _create_journal


def _halt_process(exc: BaseException) -> None:
    """Kafka's answer to a metadata invariant violation: the controller process exits."""
    log.critical("halting: the metadata state machine is broken (%s)", exc)
    logging.shutdown()
    os._exit(70)  # EX_SOFTWARE; os._exit because pysyncobj's tick thread is calling us


def load_snapshot_file(path: Path) -> MetadataState:
    """Read a voter's full dump (``quorum.snapshot``) offline: the metadata as of its last compaction.

    The file is pysyncobj's format: gzip of a pickled (object data, last entry, previous
    entry, cluster) tuple, where our consumer's data is ``{"metadata": snapshot dict}``.
    It is unpickled as data only (metadata_quorum/quorum_pickle.py): a file that names a callable does not read.
    """
    with gzip.open(path, "rb") as f:
        data = quorum_pickle.load(f)  # a snapshot may have come from the leader: data only
    consumers = data[0][1:]
    return MetadataState.from_snapshot(consumers[0]["metadata"])


class PendingProposal:
    """A command handed to pysyncobj; its callback fires once committed and applied (or failed)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._done = threading.Event()
        self._result: Any = None
        self._error: int | None = None

    def on_result(self, result: Any, error: int) -> None:  # pysyncobj's tick thread
        self._result, self._error = result, error
        self._done.set()

    def wait(self, timeout_s: float) -> Any:
        if not self._done.wait(max(0.0, timeout_s)):
            raise errors.RequestTimedOutError(
                f"{self.what}: the controller quorum did not commit it within {timeout_s:.1f}s "
                f"(fewer than a majority of controllers reachable?); it was not acknowledged, and "
                f"takes effect entirely or not at all if the quorum commits it later")
        if self._error == FAIL_REASON.SUCCESS:
            return self._result
        name = _FAIL_NAMES.get(self._error, str(self._error))
        if self._error == FAIL_REASON.QUEUE_FULL:
            raise errors.error_class(errors.ErrorCode.THROTTLING_QUOTA_EXCEEDED)(
                f"{self.what}: the quorum's command queue is full, retry later")
        raise errors.NotControllerError(f"{self.what}: not committed, leadership changed ({name})")


class MetadataRaft:
    """One voter of the metadata quorum."""

    def __init__(
        self,
        self_address: str,
        partner_addresses: list[str],
        data_dir: Path,
        *,
        password: str | None = None,
        timing: RaftTiming | None = None,
        on_applied: Callable[[int], None] | None = None,
        on_state_changed: Callable[[], None] | None = None,
        changelog_max_keys: int = DEFAULT_CHANGELOG_MAX_KEYS,
        on_fatal: Callable[[BaseException], None] | None = None,
        on_journal_failure: FailureHandler | None = None,
    ) -> None:
        """``on_fatal``: called (on pysyncobj's tick thread) when applying a committed command breaks
        the state machine (``MetadataInvariantError``). The voter has already stopped applying and
        leaves the quorum; the default halts the process, as Kafka does. ``on_journal_failure``: called
        (path, what, error) when the journal's disk fails (metadata_quorum/quorum_journal.py); the default
        halts the process."""
        self.self_address = self_address
        self.partner_addresses = list(partner_addresses)
        self.lock = threading.RLock()
        self.state = MetadataState(changelog_max_keys=changelog_max_keys)
        self._on_applied_cb = on_applied
        self._on_state_changed_cb = on_state_changed
        self._version_cond = threading.Condition()
        self._published_version = 0
        timing = timing or RaftTiming()
        data_dir.mkdir(parents=True, exist_ok=True)
        check_quorum_protection(self_address, self.partner_addresses, password)
        self._on_fatal_cb = on_fatal or _halt_process
        self._consumer = _MetadataConsumer(self.state, self.lock, self._publish_version, self._fatal)
        # Made before the SyncObj: its tick thread loads an existing dump before the constructor returns.
        self.dump_writer = _DumpWriter(data_dir / DUMP_FILE, self._consumer, on_fatal)
        repair_journal(data_dir / JOURNAL_FILE)  # pysyncobj would replay a damaged entry at every tick, for good
        conf = SyncObjConf(
            password=password or None,
            # Bind exactly the configured host: pysyncobj's default is 0.0.0.0.
            bindAddress=bind_address(self_address),
            useFork=False,
            journalFile=str(data_dir / JOURNAL_FILE),  # a FailStopJournal (see _create_journal)
            fullDumpFile=str(data_dir / DUMP_FILE),
            serializer=self.dump_writer.start,
            serializeChecker=self.dump_writer.status,
            deserializer=self.dump_writer.load,
            raftMinTimeout=timing.election_timeout_min_s,
            raftMaxTimeout=timing.election_timeout_max_s,
            appendEntriesPeriod=timing.append_entries_period_s,
            leaderFallbackTimeout=timing.leader_fallback_timeout_s,
            connectionTimeout=timing.connection_timeout_s,
            connectionRetryTime=timing.connection_retry_s,
            appendEntriesUseBatch=False,  # send each proposal at once: lower commit latency
            logCompactionMinEntries=timing.snapshot_min_entries,
            logCompactionMinTime=timing.snapshot_min_interval_s,
            commandsWaitLeader=True,
            maxBindRetries=20,
            onStateChanged=self._on_raft_state_changed,
        )
        self._status_lock = threading.Lock()
        self._status: dict[str, Any] = {}
        self._caught_up_at: dict[str, float] = {}
        self._last_sample = 0.0
        # (is leader, term) as one consistent read on the tick thread; see ``leadership``.
        self._leadership: tuple[bool, int] = (False, 0)
        self._step_down_requested = False
        self._step_down_to: str | None = None
        # The tick thread sends heartbeats and answers votes: a gap of half the shortest election
        # timeout means a leader's followers came close to (or did) start an election.
        self.tick_gaps = LatencyHistogram(TICK_GAP_BUCKETS_S)
        self.tick_stalls_total = 0
        self._tick_stall_s = timing.election_timeout_min_s / 2
        self._last_tick: float | None = None
        self._last_stall_report = float("-inf")
        self._stall_reports_skipped = 0
        # The quorum port bounds what a connection that has not proven the password can hold
        # (metadata_quorum/raft_transport.py).
        journal = str(data_dir / JOURNAL_FILE)
        with _journal_handlers_lock:
            _journal_failure_handlers[journal] = on_journal_failure or halt_on_journal_failure
        try:
            self._syncobj = QuorumSyncObj(self_address, self.partner_addresses, conf, consumers=[self._consumer],
                                          transportClass=BoundedTCPTransport)
        finally:
            with _journal_handlers_lock:
                _journal_failure_handlers.pop(journal, None)
        self._syncobj.addOnTickCallback(self._on_tick)
        state = self.state
        # Read on pysyncobj's tick thread, which applies the commands: no lock needed for one attribute.
        self._syncobj._SyncObj__transport.metadata_level = lambda: state.metadata_level

    # ---- lifecycle ----
    @property
    def failed(self) -> BaseException | None:
        """The internal error that stopped this voter's state machine, if any."""
        return self._consumer.failed

    def _fatal(self, exc: BaseException) -> None:
        # Leave the quorum at once: no votes, no leadership, no replication of a state we distrust.
        self._syncobj.destroy()
        self._on_fatal_cb(exc)

    def wait_bound(self) -> None:
        """Raise SyncObjException('BindError') if the quorum port cannot be bound."""
        self._syncobj.waitBinded()

    def destroy(self) -> None:
        self._syncobj.destroy()

    def destroy_synchronous(self, timeout_s: float = 5.0) -> None:
        self._syncobj.destroy()
        deadline = time.monotonic() + timeout_s
        while self._syncobj.tick_thread_alive() and time.monotonic() < deadline:
            time.sleep(0.02)

    # ---- proposals ----
    def submit(self, cmd: c.Command, controller_epoch: int | None = None) -> PendingProposal:
        """Hand ``cmd`` to the quorum without waiting; ``wait`` on the result.

        ``controller_epoch``: the proposer's activation term (see ``MetadataState.apply``).
        """
        pending = PendingProposal(type(cmd).__name__)
        self._consumer.apply_command(c.to_dict(cmd), controller_epoch, callback=pending.on_result)
        return pending

    def propose(self, cmd: c.Command, timeout_s: float, controller_epoch: int | None = None) -> ApplyResult:
        """Replicate and apply ``cmd``; return its result once the quorum committed it.

        Raises NotControllerError when leadership was lost before the commit, and
        RequestTimedOutError when no commit happened within ``timeout_s``. A command is
        atomic: it is applied entirely or not at all, on every voter alike.
        """
        return self.submit(cmd, controller_epoch).wait(timeout_s)

    def barrier(self, timeout_s: float) -> int:
        """Wait until a no-op commits; afterwards this node's state is at least as new as any acknowledged write."""
        pending = PendingProposal("read barrier")
        self._consumer.barrier(callback=pending.on_result)
        return pending.wait(timeout_s)

    # ---- reads ----
    def read(self, fn: Callable[[MetadataState], T]) -> T:
        with self.lock:
            return fn(self.state)

    @property
    def version(self) -> int:
        return self._published_version

    def wait_for_version_beyond(self, version: int, timeout_s: float) -> int:
        """Block until the applied metadata version exceeds ``version`` (or timeout); return the newest."""
        with self._version_cond:
            self._version_cond.wait_for(lambda: self._published_version > version, timeout=timeout_s)
            return self._published_version

    def _publish_version(self, version: int) -> None:
        with self._version_cond:
            self._published_version = version
            self._version_cond.notify_all()
        if self._on_applied_cb is not None:
            self._on_applied_cb(version)

    # ---- Raft status ----
    def leadership(self) -> tuple[bool, int]:
        """(is leader, current term), read together on pysyncobj's tick thread.

        Use this, not ``is_leader()`` and ``term`` one after the other, for anything
        that is stamped with the term (ActivateController): a separate read can see the
        new term of an election this node just lost while it still shows as leader.
        ``(True, T)`` means this node *was* the leader of term T (there is one per term).
        """
        return self._leadership

    @property
    def connections_refused(self) -> int:
        """Connections to the quorum port closed after the key exchange for what they said they were: pysyncobj
        admin commands, readonly nodes, a voter this voter dials itself, no voter (raft_transport._refusal), and
        voters' connections whose Raft message pysyncobj could not read (raft_transport._drop_malformed)."""
        return int(getattr(self._syncobj._SyncObj__transport, "refused_connections", 0))

    @property
    def journal_flushes(self) -> LatencyHistogram | None:
        """The journal's flush times (None for a journal in memory)."""
        journal = self._syncobj._SyncObj__raftLog
        return journal.flush_times if isinstance(journal, FailStopJournal) else None

    def pre_vote_rounds(self) -> tuple[int, int]:
        """(pre-vote rounds run, rounds a majority granted) of this voter (metadata_quorum/prevote.py)."""
        return self._syncobj.pre_vote_rounds_total, self._syncobj.pre_vote_rounds_won_total

    def request_step_down(self, to: str | None = None) -> None:
        """Give up leadership (Raft TimeoutNow to voter ``to``, a Raft address, or by default to the most
        caught-up follower), on the next tick. Refused by pysyncobj (and logged) while that voter lags.

        Used when this leader cannot become the active controller of its term; a new
        election (higher term) lets another voter, or this one again, activate cleanly. And by an active
        controller that hears no broker, to a voter that does.
        """
        self._step_down_to = to
        self._step_down_requested = True

    def is_leader(self) -> bool:
        return bool(self._syncobj._isLeader())

    def ticking(self) -> bool:
        """The Raft tick thread ran within the shortest election timeout. A leader whose tick thread is stuck
        (a journal write waiting on a hung disk) still believes it leads, but it sends no heartbeats: the other
        voters elect a new leader after that long. Past it, this voter must not act as the active controller."""
        last = self._last_tick
        return last is None or time.monotonic() - last < self._tick_stall_s * 2

    def has_quorum(self) -> bool:
        """Does this voter reach a majority of the voters (itself included)? From the tick thread's
        latest status sample (at most _STATUS_SAMPLE_INTERVAL_S old); True until the first sample."""
        with self._status_lock:
            return bool(self._status.get("has_quorum", True))

    def leader_address(self) -> str | None:
        leader = self._syncobj._getLeader()
        return None if leader is None else str(leader.id)

    @property
    def term(self) -> int:
        return int(self._syncobj.raftCurrentTerm)

    @property
    def commit_index(self) -> int:
        return int(self._syncobj.raftCommitIndex)

    @property
    def last_applied(self) -> int:
        return int(self._syncobj.raftLastApplied)

    def force_snapshot(self) -> None:
        """Ask pysyncobj to write a full dump (and trim the journal) on its next tick."""
        self._syncobj.forceLogCompaction()

    def status(self) -> QuorumStatus:
        with self._status_lock:
            status = dict(self._status)
            caught_up = dict(self._caught_up_at)
        now = time.monotonic()
        is_leader = self.is_leader()
        # One consistent sample (taken on the tick thread) for indexes: live values
        # mixed with an older sample would show lag that never existed.
        commit_index = int(status.get("commit_idx", self.commit_index))
        last_applied = int(status.get("last_applied", self.last_applied))
        voters = [VoterStatus(self.self_address, True, True, commit_index if is_leader else -1,
                              0.0 if is_leader else None)]
        for address in self.partner_addresses:
            at = caught_up.get(address)
            voters.append(VoterStatus(
                address, False, status.get(f"partner_node_status_server_{address}", 0) == 2,
                status.get(f"match_idx_server_{address}", -1) if is_leader else -1,
                None if at is None or not is_leader else now - at))
        return QuorumStatus(is_leader, self.leader_address(), self.term, commit_index, last_applied, voters)

    def _on_tick(self) -> None:
        """Runs on pysyncobj's tick thread, where reading its state is race-free."""
        syncobj = self._syncobj
        self._leadership = (bool(syncobj._isLeader()), int(syncobj.raftCurrentTerm))
        self._time_tick(time.monotonic())
        if self._step_down_requested:
            self._step_down_requested = False
            if self._leadership[0]:
                syncobj.transferLeadership(self._step_down_to, callback=self._on_step_down_result)
        self._sample_status()

    def _time_tick(self, now: float) -> None:
        """The gap since the previous tick; a stall (half the shortest election timeout) is
        counted and logged (etcd's "failed to send out heartbeat on time"), rate-limited."""
        last, self._last_tick = self._last_tick, now
        if last is None:
            return
        gap = now - last
        self.tick_gaps.observe(gap)
        if gap < self._tick_stall_s:
            return
        self.tick_stalls_total += 1
        if now - self._last_stall_report < TICK_STALL_REPORT_EVERY_S:
            self._stall_reports_skipped += 1
            return
        more = f"; {self._stall_reports_skipped} more since the last report" if self._stall_reports_skipped else ""
        role = ("as the leader it sent no heartbeats meanwhile, and followers may have started an election"
                if self._leadership[0] else "it answered no Raft message meanwhile")
        log.warning("%s: the Raft tick thread ran %.0f ms after its previous tick (stall threshold %.0f ms, half "
                    "the shortest election timeout; %d stall(s) since start%s): %s. Look for CPU starvation, a "
                    "slow disk under the metadata log, or long GC pauses (brook_gc_pause_seconds)",
                    self.self_address, gap * 1000, self._tick_stall_s * 1000, self.tick_stalls_total, more, role)
        self._last_stall_report = now
        self._stall_reports_skipped = 0

    def _on_step_down_result(self, _result: Any, error: int) -> None:
        if error != FAIL_REASON.SUCCESS:
            # No follower fully caught up yet: the controller asks again on a later tick.
            log.warning("%s could not hand over leadership: %s", self.self_address, _FAIL_NAMES.get(error, error))
        else:
            log.warning("%s asked a follower to take over leadership", self.self_address)

    def _sample_status(self) -> None:
        now = time.monotonic()
        if now - self._last_sample < _STATUS_SAMPLE_INTERVAL_S:
            return
        self._last_sample = now
        status = self._syncobj.getStatus()
        commit = status.get("commit_idx", 0)
        with self._status_lock:
            self._status = status
            for address in self.partner_addresses:
                if status.get(f"match_idx_server_{address}", -1) >= commit:
                    self._caught_up_at[address] = now

    def _on_raft_state_changed(self, old: int, new: int) -> None:
        log.info("raft state of %s: %s -> %s (term %d)", self.self_address, old, new,
                 self._syncobj.raftCurrentTerm if hasattr(self, "_syncobj") else -1)
        if self._on_state_changed_cb is not None:
            self._on_state_changed_cb()
