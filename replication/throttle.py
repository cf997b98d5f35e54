"""A byte-rate limit on replication copy traffic (Kafka's ``follower.replication.throttled.rate``).

One token bucket per broker, shared by its fetchers. A follower charges it for the bytes it
appends to partitions where it is not in sync (a reassignment's new replica, a restarted broker
catching up); while the bucket is in debt those partitions sit out the fetches until the debt is
paid back at the configured rate, so the copy averages that rate. In-sync partitions are never
throttled: that would slow acks=all writes. The rate changes at runtime (a dynamic cluster config).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ReplicationThrottle:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rate: int | None = None  # bytes per second; None = no limit
        self._tokens = 0.0
        self._at = clock()
        self.throttled_seconds_total = 0.0  # time partitions were held back
        self.throttled_bytes_total = 0  # bytes charged while a limit was set

    @property
    def rate(self) -> int | None:
        return self._rate

    def set_rate(self, rate: int | None) -> None:
        with self._lock:
            if rate == self._rate:
                return
            self._rate = rate if rate is None or rate > 0 else None
            self._tokens = float(self._rate or 0)  # one second of burst
            self._at = self._clock()

    def wait_s(self) -> float:
        """How long an out-of-sync partition must still sit out (0: it may fetch). Lifting or changing
        the rate forgives the debt at once."""
        with self._lock:
            rate = self._rate
            if rate is None:
                return 0.0
            tokens = min(float(rate), self._tokens + (self._clock() - self._at) * rate)
            return 0.0 if tokens >= 0 else -tokens / rate

    def charge(self, nbytes: int) -> float:
        """Account ``nbytes`` copied; returns how long the partition must wait before its next fetch."""
        with self._lock:
            rate = self._rate
            if rate is None or nbytes <= 0:
                return 0.0
            now = self._clock()
            self._tokens = min(float(rate), self._tokens + (now - self._at) * rate) - nbytes
            self._at = now
            self.throttled_bytes_total += nbytes
            if self._tokens >= 0:
                return 0.0
            delay = -self._tokens / rate
            self.throttled_seconds_total += delay
            return delay
