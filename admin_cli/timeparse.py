"""Times on the command line: epoch milliseconds, ISO 8601, or relative to now (-15m, -2h, -1d)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from admin_cli.common import CliError
from client.security import excerpt
from storage.log_config import MAX_TIMESTAMP_MS

# ASCII digits only: str.isdigit() and a Unicode \d also accept "²" or "٣", which int() then refuses
# (a ValueError traceback) or reads as a number nobody typed.
_EPOCH_MS = re.compile(r"[0-9]+", re.ASCII)
_RELATIVE = re.compile(r"-([0-9]+)(ms|s|m|h|d)", re.ASCII)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# The range a time may name: from the epoch (a negative ListOffsets timestamp means "latest"/"earliest"
# to the broker, and no record is older than 1970) to the end of year 9999 (what ISO 8601 can write,
# far inside int64 ms). Outside it the answer is a clear usage error, not an overflow in the client.
TIMESTAMP_MS_MIN = 0
TIMESTAMP_MS_MAX = MAX_TIMESTAMP_MS  # 9999-12-31T23:59:59.999Z, what leaders store
_DIGITS_MAX = 20  # more digits than int64 has: out of range without asking int() (it refuses > 4300 digits)


def parse_timestamp_ms(text: str, flag: str, *, now_ms: int | None = None) -> int:
    """``1767225600000``, ``2026-01-01T00:00:00Z`` (no zone = UTC) or ``-15m`` -> epoch ms
    in [TIMESTAMP_MS_MIN, TIMESTAMP_MS_MAX]; anything else is a CliError (exit 2)."""
    text = text.strip()
    if _EPOCH_MS.fullmatch(text):
        ms = _bounded_int(text, text, flag)
    elif m := _RELATIVE.fullmatch(text):
        now = int(time.time() * 1000) if now_ms is None else now_ms
        ms = now - _bounded_int(m.group(1), text, flag) * _UNIT_MS[m.group(2)]
    else:
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise CliError(f"{flag} {excerpt(text)} is not a time: use epoch ms, ISO 8601 (2026-01-31T12:00:00Z) "
                           "or a relative time like -15m", code=2) from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        ms = int(dt.timestamp() * 1000)
    if not TIMESTAMP_MS_MIN <= ms <= TIMESTAMP_MS_MAX:
        raise _out_of_range(text, flag)
    return ms


def _bounded_int(digits: str, text: str, flag: str) -> int:
    if len(digits.lstrip("0")) > _DIGITS_MAX:
        raise _out_of_range(text, flag)
    return int(digits)


def _out_of_range(text: str, flag: str) -> CliError:
    return CliError(f"{flag} {excerpt(text)} is out of range: give a time between 1970-01-01T00:00:00Z (epoch ms 0) "
                    f"and 9999-12-31T23:59:59.999Z (epoch ms {TIMESTAMP_MS_MAX})", code=2)
