"""How many file descriptors one kind of long-lived object holds in this process, against a share of
the process's limit (RLIMIT_NOFILE): segments may hold half of it (storage/segment.py), slices waiting
to be sent a quarter (storage/file_records.py). What is past a budget waits or takes another path."""

from __future__ import annotations

import resource
import threading

UNLIMITED = 1 << 30


class DescriptorBudget:
    """A count of objects each holding ``per_item`` descriptors, and the number that fit in 1/``share``
    of the descriptor limit."""

    def __init__(self, share: int, per_item: int = 1) -> None:
        self.share, self.per_item = share, per_item
        self._held = 0
        self._lock = threading.Lock()

    def held(self) -> int:
        return self._held

    def budget(self) -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return UNLIMITED
        return max(1, soft // self.share // self.per_item)

    def add(self, delta: int, limit: int | None = None) -> bool:
        """Count ``delta`` objects more (or fewer); False, counting nothing, when ``limit`` is already held."""
        with self._lock:
            if limit is not None and self._held >= limit:
                return False
            self._held += delta
            return True
