"""Long simulator runs: ``python -m tests.sim.run --seeds 100000`` (or ``make sim``).

Runs seeds start..start+seeds-1, prints every failing seed with its reason, and a summary
(seeds/s, acknowledged writes, faults). ``--seed S --trace`` replays one seed and prints
its whole step trace: a failing seed replays exactly, step for step.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brooksim.cluster import SimConfig, SimFailure, run_seed  # noqa: E402


def _config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(steps=args.steps, brokers=args.brokers, stale_term_read=args.stale_term_read,
                     lose_alter_responses=args.lose_alter_responses, reassignments=args.reassignments)


def _one(job: tuple[int, argparse.Namespace]) -> tuple[int, str, dict[str, int]]:
    seed, args = job
    try:
        sim = run_seed(seed, _config(args))
    except SimFailure as exc:
        return seed, exc.reason, {}
    return seed, "", sim.stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--seed", type=int, help="run this one seed only")
    ap.add_argument("--trace", action="store_true", help="with --seed: print the whole step trace")
    ap.add_argument("--trace-hash", action="store_true", help="with --seed: print a hash of the trace")
    ap.add_argument("--steps", type=int, default=SimConfig.steps, help="random steps per seed")
    ap.add_argument("--brokers", type=int, default=SimConfig.brokers)
    ap.add_argument("--stale-term-read", action="store_true",
                    help="also inject the stale-activation interleaving (an election between the "
                         "controller's is_leader() and its read of the term)")
    ap.add_argument("--reassignments", action="store_true",
                    help="operators move partitions while faults happen (use with --brokers 4 or more)")
    ap.add_argument("--lose-alter-responses", action="store_true",
                    help="also lose AlterPartition responses the controller committed (unknown outcome)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--max-failures", type=int, default=20, help="stop after this many failing seeds")
    args = ap.parse_args(argv)

    if args.seed is not None:
        try:
            sim = run_seed(args.seed, _config(args))
            trace, verdict, code = sim.trace, f"seed {args.seed}: ok {sim.stats}", 0
        except SimFailure as exc:
            trace, verdict, code = exc.trace, f"seed {args.seed}: FAILED: {exc.reason}", 1
        if args.trace:
            print("\n".join(trace))
        if args.trace_hash:
            print(hashlib.sha256("\n".join(trace).encode()).hexdigest())
        print(verdict)
        return code

    started = time.monotonic()
    failures: list[tuple[int, str]] = []
    totals: dict[str, int] = {}
    jobs = [(s, args) for s in range(args.start, args.start + args.seeds)]
    done = 0
    with multiprocessing.Pool(args.jobs) if args.jobs > 1 else _Serial() as pool:
        for seed, reason, stats in pool.imap(_one, jobs, chunksize=16):
            done += 1
            for k, v in stats.items():
                totals[k] = totals.get(k, 0) + v
            if reason:
                failures.append((seed, reason))
                print(f"seed {seed} FAILED: {reason}\n  replay: python -m tests.sim.run --seed {seed} --trace"
                      f"{' --stale-term-read' if args.stale_term_read else ''}"
                      f"{' --lose-alter-responses' if args.lose_alter_responses else ''}", flush=True)
                if len(failures) >= args.max_failures:
                    break
            if done % 1000 == 0:
                print(f"{done} seeds, {len(failures)} failed, {done / (time.monotonic() - started):.0f} seeds/s",
                      flush=True)
    elapsed = time.monotonic() - started
    print(f"{done} seeds in {elapsed:.1f}s ({done / max(elapsed, 1e-9):.0f} seeds/s), {len(failures)} failed; "
          f"totals {dict(sorted(totals.items()))}")
    return 1 if failures else 0


class _Serial:
    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @staticmethod
    def imap(fn, jobs, chunksize=1):  # type: ignore[no-untyped-def]
        return map(fn, jobs)


if __name__ == "__main__":
    sys.exit(main())
