"""LogManager: every partition log of a broker, across one or more data directories.

Per data directory it keeps Kafka's checkpoint files (``recovery-point-offset-checkpoint``,
``replication-offset-checkpoint`` = high watermarks, ``log-start-offset-checkpoint``,
``cleaner-offset-checkpoint``), the log scrubber's progress (``scrubber-checkpoint``) and a clean-shutdown marker (``.brook_clean_shutdown``):
present at startup, it means every log was flushed and closed, so no segment needs a
rescan; absent (crash), each log rescans from its checkpointed recovery point.

Background threads (each bounded by its interval, each stopped by ``shutdown``):
flusher (``flush.ms``), retention (``retention.ms``/``retention.bytes`` and delayed file
deletion), checkpointer, the log cleaner (compaction) and the log scrubber.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from proto import errors
from storage.checkpoints import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    SCRUBBER_CHECKPOINT,
    OffsetCheckpointFile,
    ScrubberCheckpointFile,
    fsync_dir,
    write_atomically,
)
from storage.cleaner import DEFAULT_IO_BYTES_PER_SEC, DEFAULT_MAX_MAP_ENTRIES, LogCleaner
from storage.disk_errors import disk_failure
from storage.fd_budget import check_startup_descriptors, descriptor_limit
from storage.log import Log, parse_partition_dir
from storage.log_config import LogConfig
from storage.producer_state import DEFAULT_PRODUCER_EXPIRATION_MS
from storage.scrubber import (
    DEFAULT_SCRUB_BYTES_PER_SEC,
    DEFAULT_SCRUB_INTERVAL_MS,
    LogScrubber,
    ScrubProgress,
)

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".brook_clean_shutdown"
PARTITION_METADATA_FILE = "partition.metadata"
DELETE_DIR_SUFFIX = "-delete"
# A log this broker found but was not given by the metadata it trusts least (a snapshot: at start, or after its
# watch fell behind), moved aside under this suffix and kept, never deleted: Kafka's "stray" logs (KAFKA-14616).
# A stale or wrong snapshot (a controller bug, a wiped or mistaken quorum) must not be able to delete data.
STRAY_DIR_SUFFIX = "-stray"
# Written into a log as it is set aside: its offsets then (log start, high watermark, log end), which live in
# the log directory's checkpoint files while it is served. Moved back, the log opens with them, as after a
# clean shutdown, without a rescan (it was closed with a flush).
STRAY_STATE_FILE = "stray-state.json"

TopicPartitionKey = tuple[str, int]


def read_partition_metadata(partition_dir: Path) -> str | None:
    """The topic id stored in ``partition.metadata`` (Kafka's format), or None."""
    try:
        text = (partition_dir / PARTITION_METADATA_FILE).read_text(encoding="utf-8")
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            return value.strip()
    return None


def _read_stray_state(partition_dir: Path) -> dict[str, int] | None:
    """The offsets a stray log was set aside with (``STRAY_STATE_FILE``), or None (absent, unreadable)."""
    try:
        state = json.loads((partition_dir / STRAY_STATE_FILE).read_text(encoding="utf-8"))
        return {k: int(state[k]) for k in ("log_start_offset", "high_watermark", "log_end_offset")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_partition_metadata(partition_dir: Path, topic_id: str) -> None:
    write_atomically(partition_dir / PARTITION_METADATA_FILE, f"version: 0\ntopic_id: {topic_id}\n".encode())


class LogManager:
    def __init__(self, log_dirs: list[Path], broker_defaults: Mapping[str, str] | None = None, *,
                 flush_check_ms: int = 1000, retention_check_ms: int = 300_000, cleaner_threads: int = 1,
                 checkpoint_interval_ms: int = 60_000, recovery_full_scan: bool = False,
                 cleaner_max_map_entries: int = DEFAULT_MAX_MAP_ENTRIES,
                 cleaner_io_bytes_per_sec: float = DEFAULT_IO_BYTES_PER_SEC,
                 cleaner_backoff_ms: int = 15_000, recovery_threads: int = 2,
                 scrubber_enabled: bool = True, scrubber_bytes_per_sec: float = DEFAULT_SCRUB_BYTES_PER_SEC,
                 scrubber_interval_ms: int = DEFAULT_SCRUB_INTERVAL_MS,
                 producer_expiration_ms: int = DEFAULT_PRODUCER_EXPIRATION_MS,
                 producer_expiration_check_ms: int = 600_000,
                 on_dir_failure: Callable[[Path, OSError], None] | None = None) -> None:
        if not log_dirs:
            raise ValueError("at least one log dir is needed")
        self.log_dirs = [Path(d) for d in log_dirs]
        self.broker_defaults = dict(broker_defaults or {})
        self._static_defaults = dict(self.broker_defaults)  # the node file's; dynamic ones go on top
        self.flush_check_ms = flush_check_ms
        self.retention_check_ms = retention_check_ms
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.producer_expiration_ms = producer_expiration_ms
        self.producer_expiration_check_ms = producer_expiration_check_ms
        self.recovery_full_scan = recovery_full_scan
        self.recovery_threads = recovery_threads
        self._lock = threading.RLock()
        # One checkpoint file write at a time: each reads the logs' state and replaces its file through the same
        # ``<file>.tmp``. The checkpointer thread and a DeleteRecords (which checkpoints log starts at once) wrote
        # log-start-offset-checkpoint together: one's rename found the other's tmp file gone (FileNotFoundError,
        # a DeleteRecords answered UNKNOWN_SERVER_ERROR: CI), and two writing one tmp file could rename a mix of
        # both. Under the lock the later write is also of the later state.
        self._checkpoint_lock = threading.Lock()
        self._logs: dict[TopicPartitionKey, Log] = {}
        self._log_dir_of: dict[TopicPartitionKey, Path] = {}
        self._topic_ids: dict[TopicPartitionKey, str] = {}
        self._overrides: dict[str, dict[str, str]] = {}
        self._hosted: Counter[str] = Counter()  # topic -> its logs here (its overrides go with the last)
        self._stray: set[Path] = set()  # stray logs moved aside (or found so at startup); the operator removes them
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._shut_down = False
        # A log directory whose disk failed, and what to do then (the broker stops: see dir_failed).
        self.on_dir_failure = on_dir_failure
        self.failed_dirs: set[Path] = set()
        self.cleaner = LogCleaner(self.all_logs, threads=cleaner_threads, max_map_entries=cleaner_max_map_entries,
                                  io_bytes_per_sec=cleaner_io_bytes_per_sec, backoff_ms=cleaner_backoff_ms)
        self.cleaner.on_error = self.dir_failed
        self.scrubber = LogScrubber(self.all_logs, bytes_per_sec=scrubber_bytes_per_sec,
                                    interval_ms=scrubber_interval_ms, enabled=scrubber_enabled)
        self.scrubber.on_error = self.dir_failed
        self._scrubber_written: dict[Path, tuple[int, int, dict[TopicPartitionKey, int]]] = {}

    # ------------------------------------------------------------------ startup
    def startup(self) -> None:
        """Open every partition directory of every log dir (recovering after unclean stops).

        First, before opening or changing anything: the segments found must fit the process's descriptor
        limit (storage/fd_budget.py), else ``DescriptorLimitError`` names the limit and the figure needed."""
        partitions, segments = self.count_segments()
        check_startup_descriptors(partitions, segments, descriptor_limit())
        cleaner_checkpoints: dict[TopicPartitionKey, int] = {}
        scrub_began = scrub_ended = 0
        scrub_positions: dict[TopicPartitionKey, int] = {}
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
            marker = d / CLEAN_SHUTDOWN_FILE
            clean = marker.exists() and not self.recovery_full_scan
            recovery = OffsetCheckpointFile(d / RECOVERY_POINT_CHECKPOINT).read_or_empty()
            hws = OffsetCheckpointFile(d / REPLICATION_OFFSET_CHECKPOINT).read_or_empty()
            starts = OffsetCheckpointFile(d / LOG_START_OFFSET_CHECKPOINT).read_or_empty()
            cleaner_checkpoints.update(OffsetCheckpointFile(d / CLEANER_OFFSET_CHECKPOINT).read_or_empty())
            scrub = ScrubberCheckpointFile(d / SCRUBBER_CHECKPOINT).read_or_none()
            if scrub is not None:  # every directory's file is written with the same pass times
                scrub_began, scrub_ended = max(scrub_began, scrub[0]), max(scrub_ended, scrub[1])
                scrub_positions.update(scrub[2])
            log.info("loading logs in %s (%s shutdown)", d, "clean" if clean else "unclean")
            jobs: list[tuple] = []
            for child in sorted(d.iterdir()):
                if not child.is_dir():
                    continue
                if child.name.endswith(DELETE_DIR_SUFFIX):
                    shutil.rmtree(child, ignore_errors=True)  # a deletion interrupted by a stop
                    continue
                if child.name.endswith(STRAY_DIR_SUFFIX):
                    self._stray.add(child)
                    log.warning("stray log %s kept: this broker was not given its partition when it was set aside. "
                                "Remove the directory once you know its records are not needed.", child)
                    continue
                try:
                    tp = parse_partition_dir(child.name)
                except ValueError:
                    continue
                jobs.append((d, child, tp, clean, recovery.get(tp, 0), hws.get(tp), starts.get(tp)))
            self._open_all(jobs)
            # From now on a crash is an unclean shutdown: the marker goes until the next clean stop.
            if marker.exists():
                marker.unlink()
                fsync_dir(d)
        self.cleaner.seed_checkpoints(cleaner_checkpoints)
        self.scrubber.seed(ScrubProgress(scrub_began, scrub_ended, scrub_positions))
        self._started = True

    def count_segments(self) -> tuple[int, int]:
        """(partition directories, segment files) in the log dirs: what startup would open."""
        partitions = segments = 0
        for d in self.log_dirs:
            if not d.is_dir():
                continue
            for child in d.iterdir():
                if not child.is_dir() or child.name.endswith((DELETE_DIR_SUFFIX, STRAY_DIR_SUFFIX)):
                    continue
                try:
                    parse_partition_dir(child.name)
                except ValueError:
                    continue
                partitions += 1
                with os.scandir(child) as entries:
                    found = sum(1 for e in entries if e.name.endswith(".log"))
                segments += max(1, found)  # a log without segments gets one when opened
        return partitions, segments

    def _open_all(self, jobs: list[tuple]) -> None:
        """Open (and recover) the logs of one data dir with ``recovery_threads`` threads."""
        if not jobs:
            return
        with ThreadPoolExecutor(max_workers=max(1, self.recovery_threads),
                                thread_name_prefix="log-recovery") as pool:
            futures = {pool.submit(self._open_existing, *job): job for job in jobs}
            for fut, job in futures.items():
                try:
                    fut.result()
                except (errors.BrookError, OSError, ValueError) as exc:
                    # One unreadable partition must not keep the broker down; it stays unloaded
                    # (get_or_create_log retries it with a full rescan).
                    log.error("could not load %s: %s", job[1], exc)

    def _open_existing(self, d: Path, child: Path, tp: TopicPartitionKey, clean: bool, recovery_point: int,
                       hw: int | None, start: int | None) -> None:
        with self._lock:
            if tp in self._logs:
                log.error("partition %s-%d found in both %s and %s; keeping the first", tp[0], tp[1],
                          self._log_dir_of[tp], d)
                return
        config = LogConfig.from_overrides({}, self.broker_defaults)
        lg = Log.open(child, config, recovery_point=recovery_point, log_start_offset=start,
                      high_watermark=hw, clean_shutdown=clean, full_recovery=self.recovery_full_scan)
        with self._lock:
            if tp in self._logs:  # the same partition in two dirs, opened concurrently
                log.error("partition %s-%d found twice; ignoring %s", tp[0], tp[1], child)
                lg.close_without_flush()
                return
            self._track(tp, lg, d, read_partition_metadata(child) or "")

    # ------------------------------------------------------------------ access
    def get_log(self, topic: str, partition: int) -> Log | None:
        with self._lock:
            return self._logs.get((topic, partition))

    def all_logs(self) -> dict[TopicPartitionKey, Log]:
        with self._lock:
            return dict(self._logs)

    def topic_id(self, topic: str, partition: int) -> str | None:
        with self._lock:
            return self._topic_ids.get((topic, partition))

    def log_dir_of(self, topic: str, partition: int) -> Path | None:
        with self._lock:
            return self._log_dir_of.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int, *, topic_id: str,
                          overrides: Mapping[str, str] | None = None) -> Log:
        """The log of ``topic-partition``, created on the least-used log dir if missing.

        A directory with the same name but another topic id is an old incarnation of a
        deleted topic: it is deleted and the log created fresh.
        """
        tp = (topic, partition)
        overrides = dict(overrides or {})
        config = LogConfig.from_overrides(overrides, self.broker_defaults)  # bad configs refused first
        with self._lock:
            self._overrides[topic] = overrides
            lg = self._logs.get(tp)
            if lg is not None:
                known = self._topic_ids.get(tp, "")
                if not known or known == topic_id:
                    if not known and topic_id:
                        write_partition_metadata(lg.dir, topic_id)
                        self._topic_ids[tp] = topic_id
                    if lg.config != config:
                        lg.update_config(config)
                    return lg
                self.set_aside_log(topic, partition, f"its topic id {known} is not the topic's now ({topic_id})")
            stray = self._find_unloaded_dir(topic, partition)
            if stray is not None:
                on_disk = read_partition_metadata(stray)
                if on_disk in (None, "", topic_id):
                    # On disk but not loaded (created before startup ran): open it, rescanning all.
                    lg = Log.open(stray, config, full_recovery=True)
                    write_partition_metadata(stray, topic_id)
                    self._track(tp, lg, stray.parent, topic_id)
                    return lg
                self._move_aside(stray, f"its topic id {on_disk} is not the topic's now ({topic_id})")
            restored = self._restore_stray(topic, partition, topic_id, config)
            if restored is not None:
                return restored
            d = self._least_used_dir()
            path = d / f"{topic}-{partition}"
            path.mkdir(parents=True)
            write_partition_metadata(path, topic_id)
            fsync_dir(d)
            lg = Log.open(path, config)
            self._track(tp, lg, d, topic_id)
            log.info("created log %s-%d in %s", topic, partition, d)
            return lg

    def _restore_stray(self, topic: str, partition: int, topic_id: str, config: LogConfig) -> Log | None:
        """The newest stray log of this partition with this topic id, moved back and opened (the caller holds
        the lock): a broker given a partition again, after a stale or wrong snapshot took it away, resumes
        with the records it had, and follows its leader from there as any replica back from a stop does."""
        if not topic_id:
            return None
        mine: list[tuple[str, Path]] = []
        for aside in self._stray:
            head, _, unique = aside.name[:-len(STRAY_DIR_SUFFIX)].rpartition(".")
            try:
                if parse_partition_dir(head) != (topic, partition):
                    continue
            except ValueError:
                continue
            if aside.is_dir() and read_partition_metadata(aside) == topic_id:
                mine.append((unique, aside))
        if not mine:
            return None
        _unique, aside = max(mine)  # the unique part starts with the time it was set aside
        state = _read_stray_state(aside)
        path = aside.with_name(f"{topic}-{partition}")
        os.replace(aside, path)
        fsync_dir(path.parent)
        self._stray.discard(aside)
        if state is not None:  # set aside by a clean close: its offsets, no rescan
            (path / STRAY_STATE_FILE).unlink(missing_ok=True)
            lg = Log.open(path, config, recovery_point=state["log_end_offset"],
                          log_start_offset=state["log_start_offset"], high_watermark=state["high_watermark"],
                          clean_shutdown=True)
        else:
            lg = Log.open(path, config, full_recovery=True)
        self._track((topic, partition), lg, path.parent, topic_id)
        log.warning("%s-%d: stray log %s has this partition's topic id %s: moved back, %d records up to offset %d "
                    "served again", topic, partition, aside.name, topic_id,
                    lg.log_end_offset - lg.log_start_offset, lg.log_end_offset)
        return lg

    def _find_unloaded_dir(self, topic: str, partition: int) -> Path | None:
        for d in self.log_dirs:
            path = d / f"{topic}-{partition}"
            if path.is_dir():
                return path
        return None

    def _least_used_dir(self) -> Path:
        """Fewest partitions first, then fewest bytes, then configuration order (Kafka's rule + size)."""
        counts = {d: 0 for d in self.log_dirs}
        sizes = {d: 0 for d in self.log_dirs}
        for tp, d in self._log_dir_of.items():
            counts[d] = counts.get(d, 0) + 1
            sizes[d] = sizes.get(d, 0) + self._logs[tp].size_bytes
        return min(self.log_dirs, key=lambda d: (counts[d], sizes[d], self.log_dirs.index(d)))

    def _track(self, tp: TopicPartitionKey, lg: Log, log_dir: Path, topic_id: str) -> None:
        """Start tracking ``tp``'s log (the caller holds the lock; ``tp`` is not tracked yet)."""
        self._logs[tp] = lg
        lg.on_truncate = functools.partial(self.cleaner.truncated, tp)
        self._log_dir_of[tp] = log_dir
        self._topic_ids[tp] = topic_id
        self._hosted[tp[0]] += 1

    def _release(self, tp: TopicPartitionKey) -> Log | None:
        """Stop tracking ``tp``'s log (the cleaner too); the log, for the caller to close, or None."""
        with self._lock:
            lg = self._logs.pop(tp, None)
            self._log_dir_of.pop(tp, None)
            self._topic_ids.pop(tp, None)
            if lg is not None:
                left = self._hosted[tp[0]] - 1
                if left:
                    self._hosted[tp[0]] = left
                else:
                    # Its last partition here: the topic's overrides go too (a log created for it again is given
                    # them). They stayed for every topic the broker ever hosted: 175 B each, for good (audit).
                    del self._hosted[tp[0]]
                    self._overrides.pop(tp[0], None)
        if lg is not None:
            self.cleaner.forget(tp)
        return lg

    def delete_log(self, topic: str, partition: int) -> None:
        lg = self._release((topic, partition))
        if lg is None:
            return
        lg.close_without_flush()
        # Rename first so a crash mid-delete leaves a '-delete' dir (removed at startup), not a log.
        doomed = lg.dir.with_name(f"{lg.dir.name}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}")
        try:
            os.replace(lg.dir, doomed)
            fsync_dir(doomed.parent)
        except OSError as exc:
            log.warning("could not rename %s for deletion: %s", lg.dir, exc)
            doomed = lg.dir
        shutil.rmtree(doomed, ignore_errors=True)
        log.info("deleted log %s-%d", topic, partition)

    def set_aside_log(self, topic: str, partition: int, why: str) -> None:
        """Stop serving ``topic-partition``'s log and keep its files, moved aside as a stray log.

        For a log the broker was not given by a snapshot of the metadata (at start, or after its watch fell
        behind), or whose topic id is an older incarnation's: with Kafka (KAFKA-14616), such a log is not
        deleted, because the snapshot might be stale or wrong. A deletion the broker saw happen (a topic
        deleted, a replica reassigned away, in a metadata delta) deletes with ``delete_log``."""
        lg = self._release((topic, partition))
        if lg is None:
            return
        state = {"log_start_offset": lg.log_start_offset, "high_watermark": lg.high_watermark}
        try:
            lg.close()  # flushed: what it holds is kept
            state["log_end_offset"] = lg.log_end_offset
            write_atomically(lg.dir / STRAY_STATE_FILE, json.dumps(state).encode())
        except OSError as exc:
            log.warning("closing %s before setting it aside: %s", lg.dir, exc)
            lg.close_without_flush()
        self._move_aside(lg.dir, why)

    def _move_aside(self, partition_dir: Path, why: str) -> None:
        # Unique, and ordered by when (_restore_stray takes the newest): the time, then random bits.
        aside = partition_dir.with_name(f"{partition_dir.name}.{time.time_ns():016x}{uuid.uuid4().hex[:8]}"
                                        f"{STRAY_DIR_SUFFIX}")
        os.replace(partition_dir, aside)
        fsync_dir(aside.parent)
        with self._lock:
            self._stray.add(aside)
        log.warning("log %s set aside as %s, not deleted: %s. Remove the directory once you know its records "
                    "are not needed.", partition_dir, aside.name, why)

    def stray_logs(self) -> list[Path]:
        """The stray logs set aside (see ``set_aside_log``) that are still on disk."""
        with self._lock:
            self._stray = {p for p in self._stray if p.is_dir()}
            return sorted(self._stray)

    def set_dynamic_defaults(self, dynamic: Mapping[str, str]) -> None:
        """Cluster-wide topic defaults changed at runtime (by topic config name): they take the place
        of the node file's for every log, and each log without its own override follows at once."""
        merged = {**self._static_defaults, **dynamic}
        with self._lock:
            if merged == self.broker_defaults:
                return
            self.broker_defaults = merged
            for (topic, _p), lg in self._logs.items():
                try:
                    lg.update_config(LogConfig.from_overrides(self._overrides.get(topic, {}), merged))
                except Exception:
                    log.exception("applying the new cluster defaults to %s failed", lg.dir)
        log.info("cluster topic defaults now %s", dict(sorted(dynamic.items())) or "the node's own")

    def update_topic_config(self, topic: str, overrides: Mapping[str, str]) -> None:
        config = LogConfig.from_overrides(overrides, self.broker_defaults)
        with self._lock:
            for (t, _p), lg in self._logs.items():
                if t == topic:
                    lg.update_config(config)
            if topic in self._hosted:  # a topic with no log here keeps nothing (its logs get them when created)
                self._overrides[topic] = dict(overrides)

    # ------------------------------------------------------------------ checkpoints
    def by_dir(self) -> dict[Path, dict[TopicPartitionKey, Log]]:
        with self._lock:
            out: dict[Path, dict[TopicPartitionKey, Log]] = {d: {} for d in self.log_dirs}
            for tp, lg in self._logs.items():
                out[self._log_dir_of[tp]][tp] = lg
            return out

    def _write_offsets(self, name: str, offset_of: Callable[[TopicPartitionKey, Log], int | None]) -> None:
        """Each directory's checkpoint file ``name``: ``offset_of`` each of its logs (None: left out)."""
        with self._checkpoint_lock:
            for d, logs in self.by_dir().items():
                OffsetCheckpointFile(d / name).write(
                    {tp: off for tp, lg in logs.items() if (off := offset_of(tp, lg)) is not None})

    def checkpoint_high_watermarks(self) -> None:
        self._write_offsets(REPLICATION_OFFSET_CHECKPOINT, lambda _tp, lg: lg.high_watermark)

    def checkpoint_recovery_points(self) -> None:
        self._write_offsets(RECOVERY_POINT_CHECKPOINT, lambda _tp, lg: lg.recovery_point)

    def checkpoint_log_start_offsets(self) -> None:
        self._write_offsets(LOG_START_OFFSET_CHECKPOINT, lambda _tp, lg: lg.log_start_offset)

    def checkpoint_cleaner_offsets(self) -> None:
        dirty = self.cleaner.checkpoints()
        self._write_offsets(CLEANER_OFFSET_CHECKPOINT, lambda tp, _lg: dirty.get(tp))

    def checkpoint_scrubber(self) -> None:
        """Each directory's logs' positions in the scrubber's pass; a file is written again only when its
        content changed (the scrubber moves a segment at a time: minutes at its default rate)."""
        progress = self.scrubber.progress()
        with self._checkpoint_lock:
            for d, logs in self.by_dir().items():
                content = (progress.began_ms, progress.ended_ms,
                           {tp: progress.positions[tp] for tp in logs if tp in progress.positions})
                if self._scrubber_written.get(d) != content:
                    ScrubberCheckpointFile(d / SCRUBBER_CHECKPOINT).write(*content)
                    self._scrubber_written[d] = content

    def checkpoint_all(self) -> None:
        self.checkpoint_recovery_points()
        self.checkpoint_high_watermarks()
        self.checkpoint_log_start_offsets()
        self.checkpoint_cleaner_offsets()
        self.checkpoint_scrubber()

    # ------------------------------------------------------------------ disk failures
    def dir_failed(self, path: Path | str | None, exc: BaseException) -> bool:
        """A read or write under ``path`` failed with ``exc``: when that is a disk failure
        (``disk_failure``), its log directory is failed and ``on_dir_failure`` is told (once per
        directory). Kafka takes such a directory offline and stops the broker when none is left;
        the broker's handler stops it (see broker/server.py). True when it was a disk failure."""
        cause = disk_failure(exc)
        if cause is None:
            return False
        d = self._dir_of(cause.filename) or self._dir_of(path) or self.log_dirs[0]
        with self._lock:
            first = d not in self.failed_dirs
            self.failed_dirs.add(d)
        if first:
            log.critical("log directory %s failed: %s", d, cause)
            if self.on_dir_failure is not None:
                self.on_dir_failure(d, cause)
        return True

    def _dir_of(self, path: Path | str | bytes | int | None) -> Path | None:
        if not isinstance(path, (str, Path)):
            return None
        p = Path(path).absolute()
        for d in self.log_dirs:
            if p == d.absolute() or d.absolute() in p.parents:
                return d
        return None

    # ------------------------------------------------------------------ background work
    def flush_due_logs(self, now_ms: int | None = None) -> None:
        for lg in self.all_logs().values():
            self._guard(lg, lambda lg=lg: lg.maybe_flush(now_ms))

    def run_retention(self, now_ms: int | None = None) -> int:
        deleted = 0
        for lg in self.all_logs().values():
            deleted += self._guard(lg, lambda lg=lg: lg.delete_old_segments(now_ms)) or 0
        return deleted

    def expire_producers(self, now_ms: int | None = None) -> int:
        """Forget, in every log, the idempotent producers quiet for ``producer.id.expiration.ms``."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        expired = 0
        for lg in self.all_logs().values():
            expired += self._guard(lg, lambda lg=lg: lg.remove_expired_producers(  # type: ignore[misc]
                now_ms, self.producer_expiration_ms)) or 0
        if expired:
            log.info("forgot %d idempotent producers quiet for %d ms or more (producer.id.expiration.ms)",
                     expired, self.producer_expiration_ms)
        return expired

    def _guard(self, lg: Log, fn: Callable[[], object]) -> object:
        """Run one log's housekeeping; a failure is logged and does not stop the others (a disk
        failure fails the log's directory)."""
        try:
            if not lg.closed:
                return fn()
        except (errors.BrookError, OSError, ValueError) as exc:
            if not lg.closed:  # a log deleted meanwhile is not an error
                log.error("housekeeping of %s failed: %s", lg.dir, exc)
                self.dir_failed(lg.dir, exc)
        return None

    def start_background(self) -> None:
        if self._threads:
            return
        self._stop.clear()
        jobs = [("log-flusher", self.flush_check_ms, self.flush_due_logs),
                ("log-retention", self.retention_check_ms, self.run_retention),
                ("log-checkpointer", self.checkpoint_interval_ms, self.checkpoint_all),
                ("producer-expiration", self.producer_expiration_check_ms, self.expire_producers)]
        for name, interval_ms, job in jobs:
            t = threading.Thread(target=self._loop, args=(name, interval_ms, job), name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.cleaner.start()
        self.scrubber.start()

    def _loop(self, name: str, interval_ms: int, job: Callable[[], object]) -> None:
        while not self._stop.wait(max(interval_ms, 1) / 1000):
            started = time.monotonic()
            try:
                job()
            except (errors.BrookError, OSError, ValueError) as exc:
                log.error("%s failed: %s", name, exc)
                self.dir_failed(None, exc)
            log.debug("%s took %.3f s", name, time.monotonic() - started)

    def shutdown(self) -> None:
        """Stop background work, flush and close every log, write checkpoints and the clean marker."""
        if self._shut_down:
            return
        self._shut_down = True
        self._stop.set()
        self.cleaner.shutdown()
        self.scrubber.shutdown()
        for t in self._threads:
            t.join(30)
        self._threads = []
        failed = False
        for lg in self.all_logs().values():
            try:
                lg.close()
            except (errors.BrookError, OSError) as exc:
                failed = True
                log.error("closing %s failed: %s", lg.dir, exc)
        self.checkpoint_all()
        if failed:
            return  # no clean marker: the next start rescans from the recovery points
        for d in self.log_dirs:
            write_atomically(d / CLEAN_SHUTDOWN_FILE, b"")
        log.info("log manager shut down cleanly")
