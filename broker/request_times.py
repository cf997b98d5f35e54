"""Where a produce request's time goes on its leader, split as Kafka's RequestMetrics split it.

- *local* (Kafka's ``LocalTimeMs``): the leader's own work on the request, from the handler's
  start to every partition appended: validation, the writes, waking the parked follower fetches,
  and any wait for the I/O executor or a partition's lock.
- *remote* (``RemoteTimeMs``), acks=all only: from the appends to the high watermark passing
  every partition's records, i.e. the in-sync followers fetching them and fetching again.

What a client measures beyond local + remote is the transport, both ways. The role counts here
(no Prometheus code); ``broker.metrics.BrokerCollector`` exports the two histograms.
"""

from __future__ import annotations

import bisect
import threading

# Upper bounds, in seconds: a small append on the event loop takes a fraction of a millisecond.
PRODUCE_TIME_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                          0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LatencyHistogram:
    """Counts of observations per bucket (fixed bounds), their sum and number. Thread-safe."""

    __slots__ = ("bounds", "_counts", "_sum", "_lock")

    def __init__(self, bounds: tuple[float, ...] = PRODUCE_TIME_BUCKETS_S) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"bucket bounds must be increasing and unique: {bounds}")
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        i = bisect.bisect_left(self.bounds, seconds)  # a value on a bound belongs to that bucket (le)
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    def snapshot(self) -> tuple[list[tuple[float, int]], float, int]:
        """(cumulative counts per upper bound, +Inf last), sum, count: one consistent view."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            cumulative.append((bound, running))
        return cumulative, total, running


class ProduceTimes:
    """The leader's produce request times: ``local`` for every request, ``remote`` for acks=all."""

    __slots__ = ("local", "remote")

    def __init__(self) -> None:
        self.local = LatencyHistogram()
        self.remote = LatencyHistogram()
