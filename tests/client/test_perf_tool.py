"""The perf tools' own bookkeeping (client/perf.py), without a cluster."""

from __future__ import annotations

import gc

from client import errors
from client.accumulator import BatchCompletion, RecordFuture
from client.perf import _settle, freeze_startup_objects


def test_settle_keeps_what_is_in_flight_and_counts_each_failure_once() -> None:
    ok, failed, pending = (BatchCompletion("t", p) for p in range(3))
    ok.complete(10, -1, None)
    failed.complete(-1, -1, errors.RequestTimedOutError("gone"))
    futures = [RecordFuture(c, i, 0, -1, 3) for i, c in enumerate((ok, failed, pending, failed))]
    assert _settle(futures) == 2
    assert [f._completion for f in futures] == [pending]
    assert _settle(futures) == 0 and len(futures) == 1  # nothing counted twice
    pending.complete(-1, -1, errors.RequestTimedOutError("late"))
    assert _settle(futures) == 1 and futures == []


def test_freeze_moves_what_exists_out_of_the_collectors_sight() -> None:
    try:
        before = gc.get_freeze_count()
        freeze_startup_objects()
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()  # the rest of the test run is collected as usual
