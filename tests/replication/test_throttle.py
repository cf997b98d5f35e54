"""The follower copy throttle: a token bucket with one second of burst, on an injected clock."""

from __future__ import annotations

from replication.throttle import ReplicationThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_rate_never_holds_back() -> None:
    t = ReplicationThrottle(Clock())
    assert t.charge(10**9) == 0.0 and t.throttled_seconds_total == 0.0


def test_debt_is_paid_back_at_the_rate() -> None:
    clock = Clock()
    t = ReplicationThrottle(clock)
    t.set_rate(1000)
    assert t.charge(1000) == 0.0  # the first second's burst
    assert t.charge(500) == 0.5  # in debt: wait until it is paid back
    clock.now += 0.5
    assert t.charge(0) == 0.0
    assert t.charge(1000) == 1.0
    clock.now += 10  # refills to one second's worth, not more
    assert t.charge(1000) == 0.0 and t.charge(1) > 0
    assert t.throttled_seconds_total > 1.5


def test_the_rate_changes_at_runtime_and_can_be_lifted() -> None:
    t = ReplicationThrottle(Clock())
    t.set_rate(10)
    assert t.charge(100) == 9.0
    t.set_rate(None)
    assert t.rate is None and t.charge(10**6) == 0.0


def test_out_of_sync_partitions_wait_while_in_debt_and_a_lifted_rate_forgives_it() -> None:
    clock = Clock()
    t = ReplicationThrottle(clock)
    t.set_rate(100)
    t.charge(100_100)  # a whole fetch at once: 1000 s of debt
    assert t.wait_s() == 1000.0
    clock.now += 400
    assert t.wait_s() == 600.0
    t.set_rate(None)  # the operator deletes the throttle: the copy goes on at once
    assert t.wait_s() == 0.0
