"""Times on the command line: epoch milliseconds, ISO 8601, or relative to now (-15m, -2h, -1d)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from admin_cli.common import CliError

_RELATIVE = re.compile(r"^-(\d+)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_timestamp_ms(text: str, flag: str, *, now_ms: int | None = None) -> int:
    """``1767225600000``, ``2026-01-01T00:00:00Z`` (no zone = UTC) or ``-15m`` -> epoch ms."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    m = _RELATIVE.match(text)
    if m:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return now - int(m.group(1)) * _UNIT_MS[m.group(2)]
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"{flag} {text!r} is not a time: use epoch ms, ISO 8601 (2026-01-31T12:00:00Z) "
                       "or a relative time like -15m", code=2) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)
