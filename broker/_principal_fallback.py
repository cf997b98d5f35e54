"""The principal contract of broker/principal.py (owned by the tls branch), without mTLS.

Used only while broker/principal.py is absent: the same names and behaviour for SASL
sessions (``set_session_resolver``) and ANONYMOUS callers, so authorization works the
same with and without the TLS work merged. Delete once broker/principal.py exists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Principal:
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


ANONYMOUS = Principal("User", "ANONYMOUS")

_resolver: Callable[[Sequence[tuple[str, Any]] | None], Principal | None] | None = None


def set_session_resolver(fn: Callable[[Sequence[tuple[str, Any]] | None], Principal | None]) -> None:
    global _resolver
    _resolver = fn


def node_principal(node_id: int) -> Principal:
    return Principal("User", f"node-{node_id}")


def principal_of(context: Any) -> Principal:
    """The caller of an RPC: its SASL session's user, else ANONYMOUS."""
    metadata = getattr(context, "invocation_metadata", None)
    if metadata is None:  # no RPC context (direct calls in tools and tests)
        return ANONYMOUS
    resolver = _resolver
    if resolver is not None:
        found = resolver(metadata())
        if found is not None:
            return found
    return ANONYMOUS
