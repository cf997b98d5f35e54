"""Client-side view of Brook's errors.

The error table lives in ``proto/errors.py`` (one exception class per Kafka error
code); this module re-exports it so application code can write
``from client.errors import NotLeaderOrFollowerError`` without reaching into
``proto``. Nothing is redefined here, so a server error and a client error are the
same class.
"""

from __future__ import annotations

from typing import Any

from client.types import OffsetAndMetadata
from proto import errors as _errors
from proto.errors import *  # noqa: F403 - the whole table, on purpose
from proto.errors import (
    RETRIABLE,
    BrookError,
    ErrorCode,
    code_name,
    error_class,
    error_for,
    raise_for,
)

__all__ = [name for name in dir(_errors) if not name.startswith("_") and name != "annotations"]
__all__ += ["RETRIABLE", "BrookError", "ErrorCode", "code_name", "error_class", "error_for", "raise_for"]
__all__ = sorted(set(__all__))


def __getattr__(name: str) -> object:
    # The per-code classes are created dynamically in proto.errors; resolve any that
    # the star import could not name statically.
    return getattr(_errors, name)


class WakeupError(Exception):
    """``Consumer.wakeup()`` ended a blocked ``poll()`` (or the next blocking call) from another thread:
    Kafka's WakeupException. Not a BrookError, so a handler that retries Brook's errors does not
    swallow it."""


class BufferExhaustedError(_errors.RequestTimedOutError):
    """send() waited ``max.block.ms`` for ``buffer.memory`` to free up (Kafka's BufferExhaustedException)."""


class ProducerClosedError(_errors.InvalidRequestError):
    """send() on a producer that is closing or closed."""


class ConsumerClosedError(_errors.InvalidRequestError):
    """A call on a consumer that is closed."""


class NoOffsetForPartitionError(_errors.OffsetOutOfRangeError):
    """No committed offset and ``auto.offset.reset=none`` (or the position fell out of range)."""


class LogTruncationError(_errors.OffsetOutOfRangeError):
    """The log of a partition was truncated below the consumer's position (KIP-320; Kafka's
    LogTruncationException): records the consumer already read, or the offsets it was about to read,
    were replaced, e.g. by an unclean leader election. Raised by ``poll()`` with
    ``auto.offset.reset=none`` (with ``earliest``/``latest`` the consumer moves to the divergent
    offset and logs a WARNING instead).

    ``positions``: {partition: the consumer's position that failed the check}.
    ``divergent_offsets``: {partition: OffsetAndMetadata(first offset at which the leader's log differs
    from what the consumer read, leader_epoch=the last epoch they share)} for the partitions where the
    leader answered one; a partition whose position's epoch the leader does not know at all is in
    ``positions`` only. The partitions stay unfetched until ``seek()`` moves them (e.g. to the divergent
    offset, or to an offset the application has checked); the next ``poll()`` raises again otherwise."""

    def __init__(self, message: str, positions: dict[Any, int],
                 divergent_offsets: dict[Any, OffsetAndMetadata]) -> None:
        super().__init__(message)
        self.positions = dict(positions)
        self.divergent_offsets = dict(divergent_offsets)


__all__ += ["BufferExhaustedError", "ProducerClosedError", "ConsumerClosedError", "NoOffsetForPartitionError",
            "LogTruncationError"]
