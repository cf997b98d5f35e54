"""Bytes of Kafka's protocol written by hand, for frames no client would send."""

from __future__ import annotations

import io

from kio.serial.writers import write_unsigned_varint


def uvarint(n: int) -> bytes:
    """An unsigned varint (compact lengths and counts, tags) as kio writes it."""
    buf = io.BytesIO()
    write_unsigned_varint(buf, n)  # type: ignore[arg-type]
    return buf.getvalue()
