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

Every write goes to ``<name>.tmp``, is fsynced, renamed over the old file and the
directory is fsynced, so a crash leaves either the old or the new content, never a mix.
A file that does not parse is reported as ``CorruptCheckpointError`` and the caller
falls back to the safe default (e.g. recovery point 0 = rescan everything).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

VERSION = 0
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"  # high watermarks
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"

# A checkpoint lists every partition of a data directory; bound what we are willing to parse.
MAX_CHECKPOINT_ENTRIES = 1_000_000


class CorruptCheckpointError(ValueError):
    """A checkpoint file exists but does not parse."""


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _read_lines(path: Path) -> list[str] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise CorruptCheckpointError(f"{path}: not text ({exc})") from None
    lines = text.splitlines()
    if len(lines) < 2:
        raise CorruptCheckpointError(f"{path}: missing version/count lines")
    try:
        version, count = int(lines[0]), int(lines[1])
    except ValueError:
        raise CorruptCheckpointError(f"{path}: bad version/count lines") from None
    if version != VERSION:
        raise CorruptCheckpointError(f"{path}: unknown version {version}")
    if not 0 <= count <= MAX_CHECKPOINT_ENTRIES or len(lines) - 2 != count:
        raise CorruptCheckpointError(f"{path}: count {count} does not match {len(lines) - 2} entry lines")
    return lines[2:]


class OffsetCheckpointFile:
    """``(topic, partition) -> offset`` map for one data directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, offsets: dict[tuple[str, int], int]) -> None:
        lines = [str(VERSION), str(len(offsets))]
        for (topic, partition), offset in sorted(offsets.items()):
            if " " in topic or "\n" in topic:
                raise ValueError(f"topic name {topic!r} cannot be checkpointed")
            lines.append(f"{topic} {partition} {offset}")
        write_atomically(self.path, ("\n".join(lines) + "\n").encode())

    def read(self) -> dict[tuple[str, int], int]:
        """Entries of the file; {} if it does not exist. Raises CorruptCheckpointError."""
        lines = _read_lines(self.path)
        if lines is None:
            return {}
        out: dict[tuple[str, int], int] = {}
        for line in lines:
            parts = line.split(" ")
            if len(parts) != 3:
                raise CorruptCheckpointError(f"{self.path}: bad entry {line!r}")
            try:
                out[(parts[0], int(parts[1]))] = int(parts[2])
            except ValueError:
                raise CorruptCheckpointError(f"{self.path}: bad entry {line!r}") from None
        return out

    def read_or_empty(self) -> dict[tuple[str, int], int]:
        """Like read(), but a corrupt file is logged and treated as absent (the safe default)."""
        try:
            return self.read()
        except CorruptCheckpointError as exc:
            log.warning("ignoring corrupt checkpoint: %s", exc)
            return {}


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
