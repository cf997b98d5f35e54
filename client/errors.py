"""Client-side view of Brook's errors.

The error table lives in ``proto/errors.py`` (one exception class per Kafka error
code); this module re-exports it so application code can write
``from client.errors import NotLeaderOrFollowerError`` without reaching into
``proto``. Nothing is redefined here, so a server error and a client error are the
same class.
"""

from __future__ import annotations

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


__all__ += ["BufferExhaustedError", "ProducerClosedError", "ConsumerClosedError", "NoOffsetForPartitionError"]
