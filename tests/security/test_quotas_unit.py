"""Quota arithmetic (Kafka's windowed rate and throttle time, KIP-599's token bucket) with a fake clock."""

from __future__ import annotations

import pytest

from broker.quotas import (
    CONTROLLER_MUTATION,
    FETCH,
    PRODUCE,
    UNLIMITED,
    ControllerMutationQuotas,
    QuotaManager,
    TokenBucket,
)
from proto import errors


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


def test_a_throttled_principal_is_held_for_the_throttle_time_it_was_given() -> None:
    """What the broker waits out before a request of a client that ignores throttle_time_ms (Kafka mutes the
    connection that long)."""
    clock = Clock()
    m = manager({"User:alice": {PRODUCE: 1000.0}}, clock)
    assert m.produce_held_s("User:alice") == 0
    throttle_ms = m.produce("User:alice", 5000)
    assert throttle_ms > 0
    assert m.produce_held_s("User:alice") == pytest.approx(throttle_ms / 1000)
    assert m.fetch_held_s("User:alice") == 0  # a produce throttle does not hold the principal's fetches
    assert m.produce_held_s("User:bob") == 0
    clock.now += throttle_ms / 2000
    assert m.produce_held_s("User:alice") == pytest.approx(throttle_ms / 2000)
    # Another throttled answer meanwhile: the hold ends with the later of the two throttle times.
    again = m.produce("User:alice", 5000)
    assert m.produce_held_s("User:alice") == pytest.approx(max(again / 1000, throttle_ms / 2000))
    clock.now += 60.0
    assert m.produce_held_s("User:alice") == 0 and not m._holds  # over: forgotten


def test_a_throttle_time_handed_out_elsewhere_is_held_too() -> None:
    """The controller's throttle time for an older Kafka client's mutation (permissive quota)."""
    clock = Clock()
    m = manager({}, clock)
    m.hold("User:alice", CONTROLLER_MUTATION, 0)
    assert m.held_s("User:alice", (CONTROLLER_MUTATION,)) == 0
    m.hold("User:alice", CONTROLLER_MUTATION, 4000)
    m.hold("User:alice", CONTROLLER_MUTATION, 1000)  # a shorter one later does not shorten it
    assert m.held_s("User:alice", (CONTROLLER_MUTATION,)) == pytest.approx(4.0)
    assert m.produce_held_s("User:alice") == 0
    clock.now += 4.0
    assert m.held_s("User:alice", (CONTROLLER_MUTATION,)) == 0


def test_a_request_rate_throttle_holds_produce_and_fetch() -> None:
    clock = Clock()
    m = manager({"User:alice": {"request_rate": 1.0}}, clock)
    throttled = max(m.fetch("User:alice", 0) for _ in range(10))
    assert throttled > 0
    assert m.produce_held_s("User:alice") > 0 and m.fetch_held_s("User:alice") > 0


def test_principal_quota_overrides_default_and_unquoted_principals_pass() -> None:
    clock = Clock()
    m = manager({"<default>": {FETCH: 100.0}, "User:big": {FETCH: 1e9}}, clock)
    assert m.fetch("User:small", 1000) > 0
    assert m.fetch("User:big", 1000) == 0
    assert manager({}, clock).fetch("User:anyone", 10**9) == 0


def test_each_quota_key_falls_back_to_the_default_on_its_own() -> None:
    """Kafka's rule: an entry that sets only some keys (here a mutation rate) still gets the
    default's other quotas; it does not make its principal unlimited for them."""
    clock = Clock()
    m = manager({"<default>": {PRODUCE: 100.0}, "User:etl": {CONTROLLER_MUTATION: 10.0}}, clock)
    assert m.produce("User:etl", 1000) > 0
    assert m.produce("User:etl2", 1000) > 0


def test_request_rate_quota_counts_requests() -> None:
    clock = Clock()
    m = manager({"User:alice": {"request_rate": 5.0}}, clock)
    throttles = [m.request("User:alice") for _ in range(20)]
    assert throttles[0] == 0 and throttles[-1] > 0


# ---- controller mutation quota (KIP-599): token bucket, strict and permissive ----

def mutation_quotas(rate: float | None, clock: Clock, *, default: float | None = None) -> ControllerMutationQuotas:
    """alice has ``rate`` partition mutations/s (and <default> ``default``); burst = rate x 2 windows x 1 s."""
    quotas: dict[str, dict[str, float]] = {}
    if rate is not None:
        quotas["User:alice"] = {CONTROLLER_MUTATION: rate}
    if default is not None:
        quotas["<default>"] = {CONTROLLER_MUTATION: default}
    return ControllerMutationQuotas(quotas.get, window_num=2, window_size_s=1.0, clock=clock)


def test_token_bucket_refills_at_the_rate_up_to_the_burst_and_may_go_negative() -> None:
    bucket = TokenBucket(burst=10.0, now=0.0)
    assert bucket.refill(rate=5.0, burst=10.0, now=100.0) == 10.0  # never above the burst
    bucket.spend(13, rate=5.0, burst=10.0, now=100.0)
    assert bucket.tokens == -3.0  # spending may take it below zero
    assert bucket.refill(rate=5.0, burst=10.0, now=100.5) == -0.5
    assert bucket.refill(rate=5.0, burst=2.0, now=110.0) == 2.0  # a lowered quota caps what is left


def test_strict_quota_accepts_while_not_negative_then_refuses_until_refilled() -> None:
    clock = Clock()
    q = mutation_quotas(2.0, clock)  # burst 2 x 2 x 1 = 4 mutations
    first = q.for_request("User:alice", strict=True)
    first.record(3)  # 4 -> 1
    first.record(3)  # 1 >= 0: accepted, although it leaves -2
    with pytest.raises(errors.BrookError) as refused:
        first.record(1)  # below zero: refused, nothing spent
    assert refused.value.code == errors.ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert refused.value.message == "throttled: controller mutation quota of 2/s exceeded, retry after 1000 ms"
    assert first.throttle_time_ms() == 1000  # -(-2) / 2 per s
    clock.now += 0.4
    assert first.throttle_time_ms() == 600  # the time already waited is deducted (Kafka's)
    with pytest.raises(errors.BrookError, match="retry after 600 ms"):
        q.for_request("User:alice", strict=True).record(1)  # a later request: refused too
    clock.now += 0.6
    later = q.for_request("User:alice", strict=True)
    later.record(5)  # back at zero: accepted (any size)
    assert later.throttle_time_ms() == 0  # a strict quota throttles only what it refuses
    assert q.stats.refused == 2 and q.stats.accepted_over_quota == 0


def test_permissive_quota_accepts_everything_and_sets_the_throttle_time() -> None:
    clock = Clock()
    q = mutation_quotas(2.0, clock)
    old_client = q.for_request("User:alice", strict=False)
    old_client.record(4)  # the burst: within the quota
    assert old_client.throttle_time_ms() == 0
    old_client.record(3)  # -3: accepted, throttled
    old_client.record(1)  # -4: still accepted
    assert old_client.throttle_time_ms() == 2000
    assert q.stats.accepted_over_quota == 4 and q.stats.refused == 0
    with pytest.raises(errors.BrookError, match="retry after 2000 ms"):
        q.for_request("User:alice", strict=True).record(1)  # one bucket per principal, whatever the mode


def test_mutation_quota_applies_per_principal_with_the_default_and_only_where_set() -> None:
    clock = Clock()
    q = mutation_quotas(None, clock, default=1.0)  # burst 2
    q.for_request("User:bob", strict=True).record(5)
    with pytest.raises(errors.BrookError):
        q.for_request("User:bob", strict=True).record(1)
    q.for_request("User:carol", strict=True).record(2)  # a bucket of her own
    unlimited = mutation_quotas(None, clock)
    for _ in range(100):
        unlimited.for_request("User:alice", strict=True).record(1000)
    UNLIMITED.record(10**6)
    assert UNLIMITED.throttle_time_ms() == 0


def test_mutation_quota_buckets_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import broker.quotas as quotas

    monkeypatch.setattr(quotas, "MAX_SENSORS", 3)
    clock = Clock()
    q = mutation_quotas(None, clock, default=1.0)
    for i in range(10):
        q.for_request(f"User:u{i}", strict=True).record(3)
    assert len(q._buckets) == 3 and list(q._buckets) == ["User:u7", "User:u8", "User:u9"]


def test_a_tiny_quota_throttles_for_the_longest_time_and_never_fails() -> None:
    """A quota of 5e-324 (accepted before the security service refused anything under MIN_QUOTA_VALUE, and still in
    journals written then) made the throttle time inf: int(inf) failed the produce after its append, the fetch, and
    the controller's CreateTopics with an internal error (audit)."""
    from broker.quotas import MAX_THROTTLE_MS

    clock = Clock()
    m = manager({"User:alice": {PRODUCE: 5e-324, FETCH: 5e-324}}, clock)
    m.produce("User:alice", 1)
    clock.now += 0.5
    assert m.produce("User:alice", 100) == MAX_THROTTLE_MS
    q = mutation_quotas(5e-324, clock)
    first = q.for_request("User:alice", strict=False)
    first.record(5)
    assert first.throttle_time_ms() == 2**31 - 1


def test_a_client_may_not_set_a_quota_under_the_least() -> None:
    from metadata_quorum.security import MIN_QUOTA_VALUE, validate_quota_values

    for value in (5e-324, MIN_QUOTA_VALUE / 2):
        with pytest.raises(errors.InvalidRequestError, match="must be at least"):
            validate_quota_values({PRODUCE: value}, strict=True)
        assert validate_quota_values({PRODUCE: value}) == {PRODUCE: value}  # replaying a journal written before
    assert validate_quota_values({CONTROLLER_MUTATION: MIN_QUOTA_VALUE}, strict=True)
