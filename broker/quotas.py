"""Client quotas: per-principal byte, request and controller mutation rates, Kafka's algorithms.

Quotas live in the metadata quorum (``brook quota set``) as values per entity:
``User:alice`` or ``<default>`` (every principal without its own). Keys:
``producer_byte_rate`` and ``consumer_byte_rate`` in bytes/s, ``request_rate`` in
requests/s (Kafka's request quota is a share of I/O thread time; Brook counts requests,
which a client can reason about), and ``controller_mutation_rate`` in partition mutations/s
(KIP-599, see ``ControllerMutationQuotas``: enforced by the active controller, not the brokers).

Each broker enforces the byte and request rates on its own, as Kafka does: a rate is measured over
``quota.window.num`` samples of ``quota.window.size.seconds`` each; when a request
takes the rate over the quota, the broker still answers it at once but with
``throttle_time_ms`` = (rate - quota) / quota x window, the time after which the
rate is back under the quota if the client sends nothing. The client waits that long
before its next request to this broker (Kafka >= 2.0, KIP-219).

A client that does not wait is held all the same, as Kafka's broker mutes the connection for the
throttle time: ``produce_held_s`` / ``fetch_held_s`` say how much of its principal's throttle time is
left, and the broker's Produce and Fetch wait it out (or refuse a unary gRPC call) before they start
(broker/service.py). Before, the throttle time was advice only: a client that ignored it produced at
whatever rate it liked.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from metadata_quorum.security import DEFAULT_ENTITY
from proto import errors

PRODUCE, FETCH, REQUEST = "producer_byte_rate", "consumer_byte_rate", "request_rate"
CONTROLLER_MUTATION = "controller_mutation_rate"
DEFAULT_WINDOW_NUM = 11  # Kafka's quota.window.num
DEFAULT_WINDOW_SIZE_S = 1.0  # Kafka's quota.window.size.seconds
MAX_SENSORS = 10_000  # rates (principal x quota kind) and mutation buckets (principal) kept; LRU dropped first
MAX_THROTTLE_MS = 60_000
_MAX_INT32 = 2**31 - 1  # throttle_time_ms fields are int32


def quota_for(quotas: Callable[[str], dict[str, float] | None], principal: str, kind: str) -> float | None:
    """The ``kind`` quota of ``principal``: its own entity's value for that key, else ``<default>``'s;
    None = unlimited. Each key is looked up on its own, as Kafka's quota managers do: a user's entry
    that sets only some keys still gets the default's other ones."""
    for entity in (principal, DEFAULT_ENTITY):
        values = quotas(entity)
        if values and kind in values:
            return values[kind]
    return None


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
        # (principal, kind) -> when its last throttle time ends (monotonic); past entries are dropped when read.
        self._holds: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.stats: dict[str, QuotaStats] = {PRODUCE: QuotaStats(), FETCH: QuotaStats(), REQUEST: QuotaStats()}
        self.held_total = 0  # requests that waited out their principal's throttle time before they started
        self.refused_total = 0  # unary gRPC calls refused for it

    def record(self, principal: object, kind: str, value: float) -> int:
        """Count ``value`` (bytes or 1 request); the throttle time in ms (0 = within quota)."""
        who = str(principal)
        quota = quota_for(self._quotas, who, kind)
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
            # Kafka's QuotaUtils.throttleTime: how long until the windowed rate is back at the quota. Bounded as a
            # float: a quota of 5e-324 (accepted before) made it inf, and int(inf) failed the request after its append.
            throttle_ms = max(1, int(min(float(MAX_THROTTLE_MS), (measured - quota) / quota * rate.elapsed_s(now) * 1000)))
            self._hold(key, now + throttle_ms / 1000)
            stats = self.stats[kind]
            stats.throttled_responses += 1
            stats.throttle_ms_total += throttle_ms
            return throttle_ms

    def _hold(self, key: tuple[str, str], until: float) -> None:
        """Under the lock: ``key``'s throttle time ends at ``until`` at the earliest."""
        self._holds[key] = max(self._holds.pop(key, 0.0), until)
        while len(self._holds) > MAX_SENSORS:
            self._holds.popitem(last=False)

    def hold(self, principal: object, kind: str, throttle_ms: int) -> None:
        """A throttle time handed out elsewhere (the controller's, for a mutation forwarded with the permissive
        quota): ``held_s`` counts it too."""
        if throttle_ms > 0:
            with self._lock:
                self._hold((str(principal), kind), self._clock() + min(MAX_THROTTLE_MS, throttle_ms) / 1000)

    def held_s(self, principal: object, kinds: tuple[str, ...]) -> float:
        """How much of ``principal``'s throttle time for any of ``kinds`` is left (0: none)."""
        if not self._holds:
            return 0.0
        who, now, left = str(principal), self._clock(), 0.0
        with self._lock:
            for kind in kinds:
                until = self._holds.get((who, kind))
                if until is None:
                    continue
                if until <= now:
                    del self._holds[(who, kind)]
                else:
                    left = max(left, until - now)
        return left

    def produce_held_s(self, principal: object) -> float:
        return self.held_s(principal, (PRODUCE, REQUEST))

    def fetch_held_s(self, principal: object) -> float:
        return self.held_s(principal, (FETCH, REQUEST))

    def produce(self, principal: object, nbytes: int) -> int:
        return max(self.record(principal, PRODUCE, nbytes), self.record(principal, REQUEST, 1))

    def fetch(self, principal: object, nbytes: int) -> int:
        return max(self.record(principal, FETCH, nbytes), self.record(principal, REQUEST, 1))

    def request(self, principal: object) -> int:
        return self.record(principal, REQUEST, 1)


# ---- controller mutation quota (KIP-599) ----

class TokenBucket:
    """Kafka's TokenBucket: credits refill at ``rate``/s up to ``burst``; spending may take them below
    zero, and the quota is exhausted while they are. The rate and burst are passed on each call (as Kafka
    reads its quota config each time), so a changed quota applies at once to the credits left."""

    def __init__(self, burst: float, now: float) -> None:
        self.tokens = burst  # a new bucket starts full (Kafka's first refill fills it)
        self._last = now

    def refill(self, rate: float, burst: float, now: float) -> float:
        self.tokens = min(burst, self.tokens + rate * max(0.0, now - self._last))
        self._last = max(self._last, now)
        return self.tokens

    def spend(self, amount: float, rate: float, burst: float, now: float) -> None:
        self.refill(rate, burst, now)
        self.tokens = min(burst, self.tokens - amount)


def _ms_until_refilled(tokens: float, rate: float) -> int:
    """Time until a bucket at ``tokens`` < 0 is back at zero: -tokens / rate (Kafka's), at least 1 ms."""
    return max(1, round(min(float(_MAX_INT32), -tokens / rate * 1000)))  # bounded as a float: a tiny rate gave inf


@dataclass(slots=True)
class MutationQuotaStats:
    refused: int = 0  # partition mutations refused with THROTTLING_QUOTA_EXCEEDED (strict)
    accepted_over_quota: int = 0  # partition mutations accepted with the bucket below zero (permissive)


class ControllerMutationQuotas:
    """``controller_mutation_rate`` (KIP-599): partitions created or deleted per second, per principal.

    Enforced only by the active controller, before it proposes a change, for the whole cluster (as
    KRaft does). Each principal with a quota has a token bucket of burst rate x ``quota.window.num`` x
    ``quota.window.size.seconds``. The buckets are this controller's memory, not replicated state: a
    new active controller starts every bucket full. At most ``MAX_SENSORS`` buckets are kept, the least
    recently used dropped first (it then starts full again).
    """

    def __init__(self, quotas: Callable[[str], dict[str, float] | None], *, window_num: int = DEFAULT_WINDOW_NUM,
                 window_size_s: float = DEFAULT_WINDOW_SIZE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._quotas = quotas
        self._window_s = max(2, window_num) * window_size_s
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self.stats = MutationQuotaStats()

    def for_request(self, principal: str, *, strict: bool) -> MutationQuota:
        """The quota of one request of ``principal`` (unlimited when it has none)."""
        return MutationQuota(self, principal, quota_for(self._quotas, principal, CONTROLLER_MUTATION), strict)

    def spend(self, principal: str, rate: float, mutations: int, *, strict: bool) -> tuple[bool, int]:
        """(accepted, throttle time in ms; 0 = within the quota). Strict: not accepted, nothing spent,
        when the bucket is already below zero."""
        burst = rate * self._window_s
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(principal)
            if bucket is None:
                bucket = self._buckets[principal] = TokenBucket(burst, now)
                while len(self._buckets) > MAX_SENSORS:
                    self._buckets.popitem(last=False)
            else:
                self._buckets.move_to_end(principal)
            if strict and bucket.refill(rate, burst, now) < 0:
                self.stats.refused += mutations
                return False, _ms_until_refilled(bucket.tokens, rate)
            bucket.spend(mutations, rate, burst, now)
            if bucket.tokens >= 0:
                return True, 0
            if not strict:
                self.stats.accepted_over_quota += mutations
            return True, _ms_until_refilled(bucket.tokens, rate)


class MutationQuota:
    """One request's controller mutation quota: ``record`` each topic's partitions before proposing it.

    Strict (Kafka's StrictControllerMutationQuota: gRPC clients, CreateTopics v6+, DeleteTopics v5+,
    CreatePartitions v3+): a topic is accepted while the bucket is not below zero, even if it takes it
    below; after that ``record`` raises THROTTLING_QUOTA_EXCEEDED. Permissive (older Kafka clients, which
    do not know that error): every topic is accepted and the answer only carries the throttle time.
    """

    def __init__(self, quotas: ControllerMutationQuotas | None, principal: str, rate: float | None,
                 strict: bool) -> None:
        self._quotas = quotas
        self._principal = principal
        self._rate = rate
        self._strict = strict
        self._throttle_ms = 0
        self._throttled_at = 0.0

    def record(self, mutations: int) -> None:
        if self._quotas is None or self._rate is None:
            return
        accepted, throttle_ms = self._quotas.spend(self._principal, self._rate, mutations, strict=self._strict)
        if accepted and self._strict:
            return  # a strict quota throttles only what it refuses (Kafka's)
        if throttle_ms:
            self._throttle_ms, self._throttled_at = throttle_ms, self._quotas.clock()
        if not accepted:
            raise errors.error_class(errors.ErrorCode.THROTTLING_QUOTA_EXCEEDED)(
                f"throttled: controller mutation quota of {self._rate:g}/s exceeded, retry after {throttle_ms} ms")

    def throttle_time_ms(self) -> int:
        """The answer's throttle_time_ms: the last throttle, less the time since (Kafka's)."""
        if not self._throttle_ms or self._quotas is None:
            return 0
        return max(0, self._throttle_ms - round((self._quotas.clock() - self._throttled_at) * 1000))


UNLIMITED = MutationQuota(None, "", None, strict=True)  # nodes, super users, in-process callers
