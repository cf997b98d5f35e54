"""The history checker: what the cluster acknowledged against what its logs hold after healing.

Pure functions over the recorded history, the final logs (read with a fresh consumer) and
the replica comparison; no cluster needed, so the rules have fast tests of their own.

Rules (each a count in the verdict; any non-zero count is a violation):
- lost:        an acknowledged record is not in its partition's log;
- misplaced:   an acknowledged record is in the log but not at the offset the ack reported;
- duplicated:  a record id appears more than once in the logs (idempotent producers);
- unexpected:  a record in the logs that no writer ever sent, or in another partition;
- reordered:   one producer incarnation's records in one partition are not in send order;
- phantom:     a consumer was handed a record that the final log does not hold at that
               offset (it read uncommitted data that was later truncated);
- diverged:    replicas of a partition differ byte for byte below the high watermark;
- liveness:    a fault whose healing was not followed by writable partitions within the bound,
               or a cluster that was not healthy again at the end.
A send that failed or timed out may or may not be in the log: both are fine.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

EXAMPLES_MAX = 5


@dataclass
class Verdict:
    seed: int
    duration_s: float
    network: str
    faults: dict[str, int]
    acked: int = 0
    failed: int = 0  # sends that failed or timed out: allowed, but they exercise the idempotent producer
    lost: int = 0
    misplaced: int = 0
    duplicated: int = 0
    unexpected: int = 0
    reordered: int = 0
    phantom: int = 0
    diverged: int = 0
    max_recovery_s: float | None = 0.0
    final_recovery_s: float | None = 0.0
    healthy_s: float | None = 0.0  # from the final heal until every replica was back in the ISR; None: never
    max_write_gap_s: float = 0.0  # longest time with no acknowledged write: unavailability during faults
    liveness_failures: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.misplaced or self.duplicated or self.unexpected or self.reordered
                    or self.phantom or self.diverged or self.liveness_failures)

    def note(self, text: str) -> None:
        if len(self.examples) < EXAMPLES_MAX * 8:
            self.examples.append(text)

    def summary(self) -> str:
        faults = " ".join(f"{k}={v}" for k, v in sorted(self.faults.items()))
        total = sum(v for k, v in self.faults.items() if k != "overlapping")  # that one counts steps

        def secs(v: float | None) -> str:
            return "none" if v is None else f"{v:.1f}s"

        return (f"chaos: seed={self.seed} duration={self.duration_s:.0f}s network={self.network} "
                f"faults={total} ({faults}) acked={self.acked} failed={self.failed} lost={self.lost} duplicated={self.duplicated} "
                f"unexpected={self.unexpected} misplaced={self.misplaced} reordered={self.reordered} "
                f"phantom={self.phantom} diverged={self.diverged} max_recovery={secs(self.max_recovery_s)} "
                f"final_recovery={secs(self.final_recovery_s)} max_write_gap={secs(self.max_write_gap_s)} in_sync={secs(self.healthy_s)} VERDICT={'PASS' if self.ok else 'FAIL'}")


def _writer_seq(record_id: str) -> tuple[str, int] | None:
    incarnation, sep, seq = record_id.rpartition(":")
    if not sep or not seq.isdigit():
        return None
    return incarnation, int(seq)


def check(verdict: Verdict, events: list[dict[str, Any]], final_log: dict[int, list[tuple[int, str]]],
          divergences: list[str], recovery_bound_s: float) -> Verdict:
    """Fill ``verdict``'s counts from the history, the final logs and the replica comparison."""
    sent: dict[str, int] = {}
    acked: dict[str, tuple[int, int]] = {}
    consumed: list[tuple[int, int, str]] = []
    recoveries: list[float | None] = []
    ack_times: list[float] = []
    for ev in events:
        kind = ev["e"]
        if kind == "send":
            sent[ev["id"]] = ev["p"]
        elif kind == "ack":
            acked[ev["id"]] = (ev["p"], ev["o"])
            if "ts" in ev:
                ack_times.append(ev["ts"])
        elif kind == "fail":
            verdict.failed += 1
        elif kind == "consume":
            consumed.extend((ev["p"], o, v) for o, v in ev["recs"])
        elif kind == "recovered":
            recoveries.append(ev["s"])
    verdict.acked = len(acked)
    ack_times.sort()
    verdict.max_write_gap_s = max((b - a for a, b in zip(ack_times, ack_times[1:], strict=False)), default=0.0)

    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    at: dict[tuple[int, int], str] = {}
    for p, records in final_log.items():
        for offset, value in records:
            where[value].append((p, offset))
            at[(p, offset)] = value

    for record_id, (p, offset) in acked.items():
        places = where.get(record_id)
        if not places:
            verdict.lost += 1
            verdict.note(f"lost: {record_id} acked at {p}/{offset}, holds {at.get((p, offset))!r}")
        elif (p, offset) not in places:
            verdict.misplaced += 1
            verdict.note(f"misplaced: {record_id} acked at {p}/{offset}, found at {places}")
    for value, places in where.items():
        if len(places) > 1:
            verdict.duplicated += len(places) - 1
            verdict.note(f"duplicated: {value} at {places}")
        if sent.get(value) is None or any(p != sent[value] for p, _ in places):
            verdict.unexpected += len(places)
            verdict.note(f"unexpected: {value!r} at {places} (sent to {sent.get(value)})")

    for p, records in final_log.items():
        last: dict[str, tuple[int, int]] = {}
        for offset, value in records:
            ws = _writer_seq(value)
            if ws is None:
                continue
            writer, seq = ws
            prev = last.get(writer)
            if prev is not None and seq <= prev[0]:
                verdict.reordered += 1
                verdict.note(f"reordered: {value} at {p}/{offset} after seq {prev[0]} at offset {prev[1]}")
            last[writer] = (seq, offset)

    for p, offset, value in consumed:
        if at.get((p, offset)) != value:
            verdict.phantom += 1
            verdict.note(f"phantom: consumed {value!r} at {p}/{offset}, the log holds {at.get((p, offset))!r}")

    verdict.diverged = len(divergences)
    for d in divergences[:EXAMPLES_MAX]:
        verdict.note(f"diverged: {d}")

    measured = [r for r in recoveries if r is not None]
    verdict.max_recovery_s = max(measured, default=0.0) if len(measured) == len(recoveries) else None
    failed = len(recoveries) - len(measured) + sum(1 for r in measured if r > recovery_bound_s)
    if verdict.final_recovery_s is None or verdict.final_recovery_s > recovery_bound_s:
        failed += 1
        verdict.note(f"liveness: not writable on every partition within {recovery_bound_s:.0f} s after the final heal")
    if verdict.healthy_s is None:
        failed += 1
    if failed:
        verdict.note(f"liveness: {failed} recoveries missed the {recovery_bound_s:.0f} s bound")
    verdict.liveness_failures = failed
    return verdict
