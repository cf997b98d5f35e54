"""Client quotas: per-principal produce/fetch byte rates and request rate, Kafka's algorithm.

Quotas live in the metadata quorum (``brook quota set``) as values per entity:
``User:alice`` or ``<default>`` (every principal without its own). Keys:
``producer_byte_rate`` and ``consumer_byte_rate`` in bytes/s, ``request_rate`` in
requests/s (Kafka's request quota is a share of I/O thread time; Brook counts requests,
which a client can reason about).

Each broker enforces them on its own, as Kafka does: a rate is measured over
``quota.window.num`` samples of ``quota.window.size.seconds`` each; when a request
takes the rate over the quota, the broker still answers it at once but with
``throttle_time_ms`` = (rate - quota) / quota x window, the time after which the
rate is back under the quota if the client sends nothing. The client waits that long
before its next request to this broker (Kafka >= 2.0, KIP-219).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from metadata_quorum.security import DEFAULT_ENTITY

PRODUCE, FETCH, REQUEST = "producer_byte_rate", "consumer_byte_rate", "request_rate"
DEFAULT_WINDOW_NUM = 11  # Kafka's quota.window.num
DEFAULT_WINDOW_SIZE_S = 1.0  # Kafka's quota.window.size.seconds
MAX_SENSORS = 10_000  # principals x quota kinds tracked; least recently used dropped first
MAX_THROTTLE_MS = 60_000


class Rate:
    """Sum of values over a ring of ``samples`` windows of ``window_s`` (Kafka's SampledStat Rate)."""

    def __init__(self, samples: int, window_s: float, now: float) -> None:
        self.samples = samples
        self.window_s = window_s
        self._starts: list[float | None] = [now] + [None] * (samples - 1)  # None: window never used
        self._values = [0.0] * samples
        self._current = 0

    def record(self, value: float, now: float) -> None:
        start = self._starts[self._current]
        if start is None or now - start >= self.window_s:
            self._current = (self._current + 1) % self.samples
            self._starts[self._current] = now
            self._values[self._current] = 0.0
        self._values[self._current] += value

    def elapsed_s(self, now: float) -> float:
        """The span the rate is measured over (Kafka: at least samples-1 full windows)."""
        live = [s for s in self._starts if s is not None and now - s < self.span_s]
        oldest = min(live) if live else now
        return max(now - oldest, (self.samples - 1) * self.window_s)

    @property
    def span_s(self) -> float:
        return self.samples * self.window_s

    def total(self, now: float) -> float:
        return sum(v for s, v in zip(self._starts, self._values, strict=True)
                   if s is not None and now - s < self.span_s)

    def measure(self, now: float) -> float:
        return self.total(now) / self.elapsed_s(now)


@dataclass(slots=True)
class QuotaStats:
    throttled_responses: int = 0
    throttle_ms_total: int = 0


class QuotaManager:
    """Per-broker quota enforcement. ``quotas(entity)`` reads the current values (metadata cache)."""

    def __init__(self, quotas: Callable[[str], dict[str, float] | None], *, window_num: int = DEFAULT_WINDOW_NUM,
                 window_size_s: float = DEFAULT_WINDOW_SIZE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._quotas = quotas
        self.window_num = max(2, window_num)
        self.window_size_s = window_size_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sensors: OrderedDict[tuple[str, str], Rate] = OrderedDict()
        self.stats: dict[str, QuotaStats] = {PRODUCE: QuotaStats(), FETCH: QuotaStats(), REQUEST: QuotaStats()}

    def quota_of(self, principal: str, kind: str) -> float | None:
        for entity in (principal, DEFAULT_ENTITY):
            values = self._quotas(entity)
            if values and kind in values:
                return values[kind]
            if values is not None and entity == principal:
                break  # the principal's own entry overrides the default, even without this key
        return None

    def record(self, principal: object, kind: str, value: float) -> int:
        """Count ``value`` (bytes or 1 request); the throttle time in ms (0 = within quota)."""
        who = str(principal)
        quota = self.quota_of(who, kind)
        if quota is None:
            return 0
        now = self._clock()
        with self._lock:
            key = (who, kind)
            rate = self._sensors.get(key)
            if rate is None:
                rate = self._sensors[key] = Rate(self.window_num, self.window_size_s, now)
                while len(self._sensors) > MAX_SENSORS:
                    self._sensors.popitem(last=False)
            else:
                self._sensors.move_to_end(key)
            rate.record(value, now)
            measured = rate.measure(now)
            if measured <= quota:
                return 0
            # Kafka's QuotaUtils.throttleTime: how long until the windowed rate is back at the quota.
            throttle_ms = int((measured - quota) / quota * rate.elapsed_s(now) * 1000)
            throttle_ms = max(1, min(MAX_THROTTLE_MS, throttle_ms))
            stats = self.stats[kind]
            stats.throttled_responses += 1
            stats.throttle_ms_total += throttle_ms
            return throttle_ms

    def produce(self, principal: object, nbytes: int) -> int:
        return max(self.record(principal, PRODUCE, nbytes), self.record(principal, REQUEST, 1))

    def fetch(self, principal: object, nbytes: int) -> int:
        return max(self.record(principal, FETCH, nbytes), self.record(principal, REQUEST, 1))

    def request(self, principal: object) -> int:
        return self.record(principal, REQUEST, 1)
