"""Checkpoint files: small text files rewritten atomically.

Formats follow Kafka's so an operator recognises them:

* offset checkpoints (``recovery-point-offset-checkpoint``, ``replication-offset-checkpoint``,
  ``log-start-offset-checkpoint``, ``cleaner-offset-checkpoint``, one each per data
  directory)::

      0            <- version
      2            <- entry count
      orders 0 1234
      orders 1 977

* ``leader-epoch-checkpoint`` (per partition): version, count, then ``epoch start_offset``.

* ``scrubber-checkpoint`` (one per data directory; Brook's own): the log scrubber's progress, so
  that a broker restarted more often than a pass takes still scrubs every segment::

      0                          <- version
      1732890000000 1732200000000  <- when the pass in progress began, when the last one ended (ms since
                                    the epoch; 0: none)
      1                          <- entry count
      orders 0 1234              <- the pass checks this log's closed segments from base offset 1234 on

Every write goes to ``<name>.tmp``, is fsynced, renamed over the old file and the
directory is fsynced, so a crash leaves either the old or the new content, never a mix.
A file that does not parse is reported as ``CorruptCheckpointError`` and the caller
falls back to the safe default (e.g. recovery point 0 = rescan everything).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

VERSION = 0
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"  # high watermarks
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
SCRUBBER_CHECKPOINT = "scrubber-checkpoint"

# A checkpoint lists every partition of a data directory; bound what we are willing to parse.
MAX_CHECKPOINT_ENTRIES = 1_000_000


class CorruptCheckpointError(ValueError):
    """A checkpoint file exists but does not parse."""


def fsync_file(path: Path | str) -> None:
    """Make ``path``'s contents and size durable (a file written through mmap or by another's descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink inside ``path`` durable."""
    fsync_file(path)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: tmp file + fsync + rename + directory fsync."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _read_lines(path: Path, header_lines: int = 0) -> list[str] | None:
    """The entry lines of a checkpoint file, after its version line, ``header_lines`` more lines (the
    first ones returned) and its count line; None when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise CorruptCheckpointError(f"{path}: not text ({exc})") from None
    lines = text.splitlines()
    entries_at = 2 + header_lines
    if len(lines) < entries_at:
        raise CorruptCheckpointError(f"{path}: missing version/count lines")
    try:
        version, count = int(lines[0]), int(lines[entries_at - 1])
    except ValueError:
        raise CorruptCheckpointError(f"{path}: bad version/count lines") from None
    if version != VERSION:
        raise CorruptCheckpointError(f"{path}: unknown version {version}")
    if not 0 <= count <= MAX_CHECKPOINT_ENTRIES or len(lines) - entries_at != count:
        raise CorruptCheckpointError(f"{path}: count {count} does not match {len(lines) - entries_at} entry lines")
    return lines[1:entries_at - 1] + lines[entries_at:]


def _offset_lines(offsets: dict[tuple[str, int], int]) -> list[str]:
    lines = [str(len(offsets))]
    for (topic, partition), offset in sorted(offsets.items()):
        if " " in topic or "\n" in topic:
            raise ValueError(f"topic name {topic!r} cannot be checkpointed")
        lines.append(f"{topic} {partition} {offset}")
    return lines


def _parse_offsets(path: Path, lines: list[str]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 3:
            raise CorruptCheckpointError(f"{path}: bad entry {line!r}")
        try:
            out[(parts[0], int(parts[1]))] = int(parts[2])
        except ValueError:
            raise CorruptCheckpointError(f"{path}: bad entry {line!r}") from None
    return out


def _ignoring_corruption(read: Callable[[], T], absent: T) -> T:
    """``read()``, or ``absent`` (logged) when the file does not parse."""
    try:
        return read()
    except CorruptCheckpointError as exc:
        log.warning("ignoring corrupt checkpoint: %s", exc)
        return absent


class OffsetCheckpointFile:
    """``(topic, partition) -> offset`` map for one data directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, offsets: dict[tuple[str, int], int]) -> None:
        lines = [str(VERSION), *_offset_lines(offsets)]
        write_atomically(self.path, ("\n".join(lines) + "\n").encode())

    def read(self) -> dict[tuple[str, int], int]:
        """Entries of the file; {} if it does not exist. Raises CorruptCheckpointError."""
        lines = _read_lines(self.path)
        return {} if lines is None else _parse_offsets(self.path, lines)

    def read_or_empty(self) -> dict[tuple[str, int], int]:
        """Like read(), but a corrupt file is logged and treated as absent (the safe default)."""
        return _ignoring_corruption(self.read, {})


class ScrubberCheckpointFile:
    """``scrubber-checkpoint``: (when the pass in progress began, when the last pass ended, the pass's
    position in each log) for one data directory; see the module doc."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, began_ms: int, ended_ms: int, positions: dict[tuple[str, int], int]) -> None:
        lines = [str(VERSION), f"{began_ms} {ended_ms}", *_offset_lines(positions)]
        write_atomically(self.path, ("\n".join(lines) + "\n").encode())

    def read(self) -> tuple[int, int, dict[tuple[str, int], int]] | None:
        """None when the file does not exist. Raises CorruptCheckpointError."""
        lines = _read_lines(self.path, header_lines=1)
        if lines is None:
            return None
        times = lines[0].split(" ")
        try:
            began_ms, ended_ms = (int(t) for t in times)
        except ValueError:
            raise CorruptCheckpointError(f"{self.path}: bad pass times {lines[0]!r}") from None
        if began_ms < 0 or ended_ms < 0:
            raise CorruptCheckpointError(f"{self.path}: bad pass times {lines[0]!r}")
        return began_ms, ended_ms, _parse_offsets(self.path, lines[1:])

    def read_or_none(self) -> tuple[int, int, dict[tuple[str, int], int]] | None:
        """Like read(), but a corrupt file is logged and treated as absent (the next pass starts afresh)."""
        return _ignoring_corruption(self.read, None)


class EpochCheckpointFile:
    """``leader-epoch-checkpoint``: ordered ``(epoch, start_offset)`` pairs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, entries: list[tuple[int, int]]) -> None:
        lines = [str(VERSION), str(len(entries))] + [f"{e} {o}" for e, o in entries]
        write_atomically(self.path, ("\n".join(lines) + "\n").encode())

    def read(self) -> list[tuple[int, int]]:
        lines = _read_lines(self.path)
        if lines is None:
            return []
        out: list[tuple[int, int]] = []
        for line in lines:
            parts = line.split(" ")
            if len(parts) != 2:
                raise CorruptCheckpointError(f"{self.path}: bad entry {line!r}")
            try:
                out.append((int(parts[0]), int(parts[1])))
            except ValueError:
                raise CorruptCheckpointError(f"{self.path}: bad entry {line!r}") from None
        return out
