"""The delayed-operation purgatory: completion on key checks, expiry on deadlines, exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from replication.purgatory import DelayedOperation, DelayedOperationPurgatory
from tests.waiting import wait_for


class Waiter(DelayedOperation):
    def __init__(self, state: dict[str, int], need: int, deadline_s: float | None) -> None:
        super().__init__(deadline_s)
        self.state, self.need = state, need
        self.outcome: list[str] = []
        self.finished = threading.Event()

    def _try_complete(self) -> bool:
        if self.state["hw"] >= self.need:
            self.outcome.append("completed")
            self.finished.set()
            return True
        return False

    def _on_expire(self) -> None:
        self.outcome.append("expired")
        self.finished.set()


@pytest.fixture
def purgatory() -> Iterator[DelayedOperationPurgatory]:
    p = DelayedOperationPurgatory("test")
    yield p
    p.shutdown()


def test_completes_immediately_when_condition_already_holds(purgatory: DelayedOperationPurgatory) -> None:
    op = Waiter({"hw": 5}, 3, time.monotonic() + 10)
    assert purgatory.watch(op, ["p0"])
    assert op.outcome == ["completed"]
    assert purgatory.watched("p0") == 0


def test_completes_on_check_of_its_key_only(purgatory: DelayedOperationPurgatory) -> None:
    state = {"hw": 0}
    op = Waiter(state, 3, time.monotonic() + 10)
    assert not purgatory.watch(op, ["p0"])
    state["hw"] = 3
    assert purgatory.check_and_complete("p1") == 0
    assert op.outcome == []
    assert purgatory.check_and_complete("p0") == 1
    assert op.outcome == ["completed"]
    assert purgatory.check_and_complete("p0") == 0  # exactly once


def test_not_yet_satisfied_stays_watched(purgatory: DelayedOperationPurgatory) -> None:
    state = {"hw": 0}
    op = Waiter(state, 3, None)
    purgatory.watch(op, ["p0"])
    state["hw"] = 2
    assert purgatory.check_and_complete("p0") == 0
    assert purgatory.watched("p0") == 1
    state["hw"] = 3
    assert purgatory.check_and_complete("p0") == 1


def test_expires_at_deadline_without_polling(purgatory: DelayedOperationPurgatory) -> None:
    op = Waiter({"hw": 0}, 3, time.monotonic() + 0.2)
    purgatory.watch(op, ["p0"])
    assert op.finished.wait(5), "operation never expired"
    assert op.outcome == ["expired"]
    assert purgatory.check_and_complete("p0") == 0


def test_expired_then_completed_races_resolve_once(purgatory: DelayedOperationPurgatory) -> None:
    state = {"hw": 0}
    ops = [Waiter(state, 1, time.monotonic() + 0.05) for _ in range(200)]
    for op in ops:
        purgatory.watch(op, ["p0"])
    time.sleep(0.04)
    state["hw"] = 1
    purgatory.check_and_complete("p0")
    for op in ops:
        assert op.finished.wait(5)
    time.sleep(0.1)
    assert all(len(op.outcome) == 1 for op in ops), [op.outcome for op in ops if len(op.outcome) != 1]


def test_complete_all_forces_an_outcome(purgatory: DelayedOperationPurgatory) -> None:
    op = Waiter({"hw": 0}, 3, time.monotonic() + 10)
    purgatory.watch(op, ["p0"])
    seen: list[DelayedOperation] = []
    assert purgatory.complete_all("p0", seen.append) == 1
    assert seen == [op] and op.is_done
    assert not op.expire()


def test_one_operation_watching_many_keys(purgatory: DelayedOperationPurgatory) -> None:
    state = {"hw": 0}
    op = Waiter(state, 1, None)
    purgatory.watch(op, ["p0", "p1", "p2"])
    state["hw"] = 1
    assert purgatory.check_and_complete("p2") == 1
    assert purgatory.check_and_complete("p0") == 0
    assert op.outcome == ["completed"]


def test_delayed_operations_counts_each_waiting_operation_once_by_kind(purgatory: DelayedOperationPurgatory) -> None:
    state = {"hw": 0}
    produce = Waiter(state, 1, time.monotonic() + 10)
    produce.kind = "produce"
    spanning = Waiter(state, 2, time.monotonic() + 10)  # watches three partitions: one operation
    spanning.kind = "consumer_fetch"
    plain = Waiter(state, 1, None)  # the base class's kind
    purgatory.watch(produce, ["p0"])
    purgatory.watch(spanning, ["p0", "p1", "p2"])
    purgatory.watch(plain, ["p1"])
    assert purgatory.delayed_operations() == {"produce": 1, "consumer_fetch": 1, "operation": 1}

    state["hw"] = 1
    purgatory.check_and_complete("p0")  # completes the produce; the fetch still needs 2
    purgatory.check_and_complete("p1")
    assert purgatory.delayed_operations() == {"consumer_fetch": 1}
    spanning.cancel()  # the fetch's caller gave up (its RPC was cancelled)
    assert purgatory.delayed_operations() == {}


def _count_reaper_wakes(purgatory: DelayedOperationPurgatory) -> list[int]:
    """Counts the watch() calls that wake the reaper thread (each one a thread switch)."""
    wakes = [0]
    notify = purgatory._wake.notify

    def counted(n: int = 1) -> None:
        wakes[0] += 1
        notify(n)
    purgatory._wake.notify = counted  # type: ignore[method-assign]
    return wakes


def test_one_at_a_time_operations_do_not_wake_the_reaper_each(purgatory: DelayedOperationPurgatory) -> None:
    """acks=all produces one after another: each is the earliest deadline (its predecessor done), but
    the reaper, asleep until the first one's deadline, wakes by then anyway: no thread switch each."""
    wakes = _count_reaper_wakes(purgatory)
    state = {"hw": 0}
    first = Waiter(state, 1, time.monotonic() + 30)
    purgatory.watch(first, ["p0"])
    wait_for(lambda: purgatory._reaper_wakes_at == first.deadline_s, 5, "the reaper asleep until the deadline")
    for need in range(1, 201):
        state["hw"] = need
        purgatory.check_and_complete("p0")
        op = Waiter(state, need + 1, time.monotonic() + 30)
        assert not purgatory.watch(op, ["p0"])
    assert wakes[0] <= 1, f"the reaper was woken {wakes[0]} times for 201 operations"


def test_an_operation_after_a_done_one_still_expires_at_its_deadline(purgatory: DelayedOperationPurgatory) -> None:
    """The reaper sleeps until a done operation's deadline, then on to the next live one's."""
    state = {"hw": 0}
    done = Waiter(state, 1, time.monotonic() + 0.3)
    purgatory.watch(done, ["p0"])
    wait_for(lambda: purgatory._reaper_wakes_at == done.deadline_s, 5, "the reaper asleep until the deadline")
    state["hw"] = 1
    purgatory.check_and_complete("p0")
    started = time.monotonic()
    late = Waiter(state, 2, started + 0.6)
    assert not purgatory.watch(late, ["p0"])
    assert late.finished.wait(5), "the operation never expired"
    assert late.outcome == ["expired"] and done.outcome == ["completed"]


def test_an_earlier_deadline_wakes_the_sleeping_reaper(purgatory: DelayedOperationPurgatory) -> None:
    state = {"hw": 0}
    far = Waiter(state, 1, time.monotonic() + 60)
    purgatory.watch(far, ["p0"])
    wait_for(lambda: purgatory._reaper_wakes_at == far.deadline_s, 5, "the reaper asleep until the deadline")
    near = Waiter(state, 1, time.monotonic() + 0.1)
    purgatory.watch(near, ["p1"])
    assert near.finished.wait(5), "the earlier deadline waited for the later one"
    assert near.outcome == ["expired"] and far.outcome == []
