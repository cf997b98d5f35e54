"""Which OS errors mean a log directory's disk has failed (Kafka takes such a directory offline)."""

from __future__ import annotations

import errno
import logging
import os

# What a log directory's disk says when it can no longer take (or give back) data: full, over quota,
# failing, remounted read-only, or past the process's file size limit. Not the errors a race with a
# log's own deletion can give (ENOENT, EBADF): those must never stop a healthy broker.
DISK_FAILURE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})

# The exit code of a node halted by a failed disk: a broker's log directory, or a controller's quorum journal.
EXIT_DISK_FAILURE = 4


def halt_for_disk_failure() -> None:
    """Exit at once with EXIT_DISK_FAILURE, the log's handlers flushed first (the CRITICAL line saying why must be
    read). ``os._exit``: no clean shutdown, which would write to the failed disk, and nothing else of the node may run."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - halting anyway
            pass
    os._exit(EXIT_DISK_FAILURE)


def disk_failure(exc: BaseException | None) -> OSError | None:
    """The disk error (``DISK_FAILURE_ERRNOS``) behind ``exc`` or one of its causes, else None."""
    for _ in range(8):  # a cause chain is short; bounded anyway
        if exc is None:
            return None
        if isinstance(exc, OSError) and exc.errno in DISK_FAILURE_ERRNOS:
            return exc
        exc = exc.__cause__
    return None
