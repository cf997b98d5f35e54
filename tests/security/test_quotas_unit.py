"""Quota arithmetic (Kafka's windowed rate and throttle time) with a fake clock."""

from __future__ import annotations

from broker.quotas import FETCH, PRODUCE, QuotaManager


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def manager(quotas: dict[str, dict[str, float]], clock: Clock) -> QuotaManager:
    return QuotaManager(quotas.get, window_num=2, window_size_s=1.0, clock=clock)


def test_within_quota_is_never_throttled() -> None:
    clock = Clock()
    m = manager({"User:alice": {PRODUCE: 1000.0}}, clock)
    for _ in range(20):
        assert m.produce("User:alice", 500) == 0  # 500 B per second: half the quota
        clock.now += 1.0


def test_over_quota_throttle_brings_the_rate_back_to_the_quota() -> None:
    clock = Clock()
    m = manager({"User:alice": {PRODUCE: 1000.0}}, clock)
    throttle_ms = m.produce("User:alice", 4000)  # 4 KB at once against 1 KB/s, over a >= 1 s window
    assert throttle_ms == 3000  # (4000/1 - 1000) / 1000 * 1 s
    clock.now += throttle_ms / 1000
    # After waiting the throttle time, the measured rate is back under the quota.
    assert m.produce("User:alice", 1) == 0
    assert m.stats[PRODUCE].throttled_responses == 1 and m.stats[PRODUCE].throttle_ms_total == 3000


def test_principal_quota_overrides_default_and_unquoted_principals_pass() -> None:
    clock = Clock()
    m = manager({"<default>": {FETCH: 100.0}, "User:big": {FETCH: 1e9}}, clock)
    assert m.fetch("User:small", 1000) > 0
    assert m.fetch("User:big", 1000) == 0
    assert manager({}, clock).fetch("User:anyone", 10**9) == 0


def test_request_rate_quota_counts_requests() -> None:
    clock = Clock()
    m = manager({"User:alice": {"request_rate": 5.0}}, clock)
    throttles = [m.request("User:alice") for _ in range(20)]
    assert throttles[0] == 0 and throttles[-1] > 0
