"""The chaos checker's rules, each shown to catch its violation, and the seeded schedule."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from storage.record_batch import RecordBatchBuilder
from tests.chaos.checker import Verdict, check
from tests.chaos.nemesis import STEP_FAULTS_MAX, Fault, Nemesis, schedule, steps
from tests.chaos.run import compare_replicas, parse_args, replica_batches

BOUND_S = 30.0


def _verdict() -> Verdict:
    return Verdict(seed=1, duration_s=10, network="netns", faults={"kill": 1})


def _history(*acks: tuple[str, int, int], sends: tuple[tuple[str, int], ...] = ()) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for record_id, p, offset in acks:
        events.append({"e": "send", "id": record_id, "p": p})
        events.append({"e": "ack", "id": record_id, "p": p, "o": offset})
    for record_id, p in sends:
        events.append({"e": "send", "id": record_id, "p": p})
        events.append({"e": "fail", "id": record_id, "p": p, "err": "timed out"})
    events.append({"e": "recovered", "i": 0, "s": 1.5})
    return events


def test_a_clean_history_passes_and_unacknowledged_records_may_be_missing_or_present() -> None:
    events = _history(("w0.1:0", 0, 0), ("w0.1:1", 0, 1), sends=(("w0.1:2", 0), ("w0.1:3", 0)))
    v = check(_verdict(), events, {0: [(0, "w0.1:0"), (1, "w0.1:1"), (2, "w0.1:2")]}, [], BOUND_S)
    assert v.ok, v.examples
    assert v.acked == 2 and v.max_recovery_s == 1.5
    timed = _history(("w0.1:0", 0, 0), ("w0.1:1", 0, 1), ("w0.1:2", 0, 2))
    for ev, ts in zip([e for e in timed if e["e"] == "ack"], (10.0, 10.5, 14.0), strict=True):
        ev["ts"] = ts
    assert check(_verdict(), timed, {0: [(0, "w0.1:0"), (1, "w0.1:1"), (2, "w0.1:2")]}, [],
                 BOUND_S).max_write_gap_s == 3.5
    assert "VERDICT=PASS" in v.summary() and "lost=0" in v.summary()


def test_lost_misplaced_duplicated_unexpected_are_each_counted() -> None:
    events = _history(("w0.1:0", 0, 0), ("w0.1:1", 0, 1), ("w0.1:2", 0, 2))
    final = {0: [(0, "w0.1:0"), (1, "w0.1:2"), (2, "w0.1:2"), (3, "never-sent")]}
    v = check(_verdict(), events, final, [], BOUND_S)
    assert (v.lost, v.duplicated, v.unexpected) == (1, 1, 1), v.examples
    assert v.misplaced == 0  # w0.1:2 is at its acked offset 2 (and also, duplicated, at 1)
    assert not v.ok and "VERDICT=FAIL" in v.summary()
    moved = check(_verdict(), _history(("w0.1:0", 0, 5)), {0: [(0, "w0.1:0")]}, [], BOUND_S)
    assert moved.misplaced == 1 and not moved.ok


def test_a_record_in_the_wrong_partition_is_unexpected() -> None:
    v = check(_verdict(), _history(sends=(("w0.1:0", 1),)), {0: [(0, "w0.1:0")], 1: []}, [], BOUND_S)
    assert v.unexpected == 1 and not v.ok


def test_per_producer_order_is_checked_per_partition_and_incarnation() -> None:
    events = _history(("w0.1:0", 0, 1), ("w0.1:1", 0, 0), ("w0.2:0", 0, 2))
    v = check(_verdict(), events, {0: [(0, "w0.1:1"), (1, "w0.1:0"), (2, "w0.2:0")]}, [], BOUND_S)
    assert v.reordered == 1, v.examples  # a new incarnation (new producer id) restarts its sequence freely


def test_a_consumer_that_saw_data_the_final_log_lacks_is_a_phantom_read() -> None:
    events = _history(("w0.1:0", 0, 0), sends=(("w0.1:1", 0),))
    events.append({"e": "consume", "p": 0, "recs": [[0, "w0.1:0"], [1, "w0.1:1"]]})
    v = check(_verdict(), events, {0: [(0, "w0.1:0")]}, [], BOUND_S)
    assert v.phantom == 1 and not v.ok


def test_liveness_fails_on_a_missed_recovery_and_on_a_slow_final_recovery() -> None:
    events = _history(("w0.1:0", 0, 0))
    events.append({"e": "recovered", "i": 1, "s": None})
    v = check(_verdict(), events, {0: [(0, "w0.1:0")]}, [], BOUND_S)
    assert v.liveness_failures == 1 and v.max_recovery_s is None and not v.ok
    slow = _verdict()
    slow.final_recovery_s = BOUND_S + 1
    assert check(slow, _history(), {}, [], BOUND_S).liveness_failures == 1
    stuck = _verdict()
    stuck.healthy_s = None  # replicas never back in sync after the final heal
    assert check(stuck, _history(), {}, [], BOUND_S).liveness_failures == 1


def test_the_schedule_is_a_function_of_the_seed() -> None:
    kinds = ("kill", "pause", "isolate", "cut")
    assert schedule(7, 120, kinds) == schedule(7, 120, kinds)
    assert schedule(7, 120, kinds) != schedule(8, 120, kinds)
    faults = schedule(7, 120, kinds)
    assert sum(f.hold_s + f.gap_s for f in faults[:-1]) < 120 <= sum(f.hold_s + f.gap_s for f in faults)
    assert {f.kind for f in schedule(3, 60, ("kill",))} == {"kill"}
    assert all(len(step) == 1 for step in steps(faults))  # no overlap unless asked


def test_overlapping_faults_share_a_step_of_at_most_three() -> None:
    faults = schedule(11, 600, ("kill", "pause"), overlap=0.6)
    assert faults == schedule(11, 600, ("kill", "pause"), overlap=0.6)
    sizes = [len(step) for step in steps(faults)]
    assert max(sizes) == STEP_FAULTS_MAX and min(sizes) == 1 and sum(sizes) == len(faults)


def test_a_strand_cuts_a_controller_only_voter_from_every_broker_and_only_in_split_mode() -> None:
    faults = schedule(5, 300, ("strand",))
    assert {f.target for f in faults} == {"controller", "random"}, faults

    class Cluster:  # the nodes of a split-mode run: brokers 1-3, controller-only voters 4-6
        broker_ids, controller_ids, node_ids = [1, 2, 3], [4, 5, 6], [1, 2, 3, 4, 5, 6]

    cuts: list[tuple[int, int]] = []
    network = types.SimpleNamespace(cut=lambda a, b: cuts.append((a, b)))
    nemesis = Nemesis(Cluster(), network, "t", 1, None, None, 30, lambda: False)  # type: ignore[arg-type]
    fault = Fault("strand", "random", pick=4, hold_s=1, gap_s=1)
    nodes = nemesis._resolve(fault)
    assert nodes == [5, 1, 2, 3], nodes
    nemesis._inject(fault, nodes)
    assert cuts == [(5, 1), (5, 2), (5, 3)], cuts  # the voters still reach each other

    assert parse_args(["--controllers", "3"]).faults == ("kill", "pause", "isolate", "cut", "strand")
    assert parse_args([]).faults == ("kill", "pause", "isolate", "cut")
    with pytest.raises(SystemExit):
        parse_args(["--faults", "kill,strand"])  # combined nodes: every voter is a broker


def _batch(base_offset: int, values: list[bytes], epoch: int = 0) -> bytes:
    b = RecordBatchBuilder(base_offset=base_offset, partition_leader_epoch=epoch)
    for v in values:
        b.append(1_700_000_000_000, None, v)
    return b.build()


def _replica(root: Path, node: int, batches: list[bytes]) -> Path:
    d = root / f"node-{node}" / "chaos-0"
    d.mkdir(parents=True)
    (d / "00000000000000000000.log").write_bytes(b"".join(batches))
    return d.parent


def test_replicas_are_compared_byte_for_byte_below_the_high_watermark(tmp_path: Path) -> None:
    common = [_batch(0, [b"a", b"b"]), _batch(2, [b"c"])]
    dirs = {1: _replica(tmp_path, 1, [*common, _batch(3, [b"x"])]),  # differs above the hw: fine
            2: _replica(tmp_path, 2, [*common, _batch(3, [b"y"])]),
            3: _replica(tmp_path, 3, [common[0], _batch(2, [b"c"], epoch=1)])}  # differs below the hw
    assert len(replica_batches(dirs[1], 0, 3)) == 2
    assert compare_replicas({1: dirs[1], 2: dirs[2]}, {0: 3}) == []
    diverged = compare_replicas(dirs, {0: 3})
    assert len(diverged) == 1 and "node 3" in diverged[0] and "batch 1" in diverged[0]
    assert compare_replicas({1: dirs[1], 2: _replica(tmp_path, 4, common[:1])}, {0: 3})  # a short replica
