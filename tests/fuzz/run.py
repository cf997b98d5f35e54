"""``make fuzz``: run each atheris fuzz target for a bounded time and report executions and crashes.

    python tests/fuzz/run.py [--targets batch_header,records,rpc,controller] [--seconds 20] [--runs N]

Environment overrides for longer runs: ``FUZZ_SECONDS`` (per target), ``FUZZ_RUNS``
(executions per target, 0 = no bound), ``FUZZ_TARGETS``. Each target runs in its own
process (libFuzzer owns the process); the seed corpus is tests/fuzz/corpus/<target>/ and
is only read: new inputs go to a temporary directory, crash inputs to
``tests/fuzz/crashes/`` (kept for replay: ``python tests/fuzz/run.py --replay FILE``).
Exit status is 1 if any target crashed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET_NAMES = ("batch_header", "records", "rpc", "controller", "kafka", "quorum")
SCRATCH_ENV = "BROOK_FUZZ_SCRATCH"  # a directory for the worker's files, removed by the runner
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_STAT = re.compile(r"^#(\d+)\s", re.MULTILINE)


def _worker(target: str, libfuzzer_args: list[str]) -> None:
    """Inside the per-target process: instrument Brook's modules, then hand over to libFuzzer."""
    import atheris

    sys.path.insert(0, str(HERE))
    with atheris.instrument_imports(include=["storage", "broker", "replication", "proto", "metadata_quorum",
                                             "targets"]):
        import targets

        if target in ("rpc", "controller", "kafka"):
            targets.import_broker_modules()  # inside the context, so the broker's code is instrumented
    fn = targets.TARGETS[target]
    atheris.Setup([sys.argv[0], *libfuzzer_args], fn)
    atheris.Fuzz()


def _run_target(target: str, seconds: int, runs: int, crash_dir: Path) -> tuple[int, bool, str]:
    """(executions, crashed?, tail of the output) of one bounded libFuzzer run."""
    # The worker's files (the rpc target's logs) go under ``scratch``, removed here: libFuzzer ends the worker
    # without running its exit handlers, which left a directory in /tmp per run.
    with tempfile.TemporaryDirectory(prefix=f"brook-fuzz-{target}-") as work, \
            tempfile.TemporaryDirectory(prefix=f"brook-fuzz-{target}-scratch-") as scratch:
        args = [f"-max_total_time={seconds}", f"-artifact_prefix={crash_dir}/{target}-",
                "-rss_limit_mb=2048", "-timeout=30", "-print_final_stats=1", work, str(HERE / "corpus" / target)]
        if runs > 0:
            args.insert(0, f"-runs={runs}")
        proc = subprocess.run([sys.executable, str(Path(__file__)), "--worker", target, "--", *args],
                              capture_output=True, text=True, errors="replace", timeout=seconds + 300,
                              env={**os.environ, SCRATCH_ENV: scratch})
    out = proc.stdout + proc.stderr
    done = _DONE.search(out)
    if done:
        execs = int(done.group(1))
    else:
        stats = _STAT.findall(out)
        execs = int(stats[-1]) if stats else 0
    crashed = proc.returncode != 0
    return execs, crashed, "\n".join(out.strip().splitlines()[-40:])


def _replay(path: Path) -> int:
    sys.path.insert(0, str(HERE))
    import targets

    target = next((t for t in TARGET_NAMES if path.name.startswith(t + "-")), None)
    if target is None:
        print(f"cannot tell the target of {path} (its name starts with the target's)", file=sys.stderr)
        return 2
    targets.TARGETS[target](path.read_bytes())
    print(f"{path}: no crash")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="tests/fuzz/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=os.environ.get("FUZZ_TARGETS", ",".join(TARGET_NAMES)))
    parser.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", "20")))
    parser.add_argument("--runs", type=int, default=int(os.environ.get("FUZZ_RUNS", "0")))
    parser.add_argument("--replay", type=Path, help="run one saved input through its target and exit")
    args = parser.parse_args(argv)
    if args.replay is not None:
        return _replay(args.replay)
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("atheris is not installed (a dev dependency with wheels for Linux x86_64 only): "
              "the bounded fuzz replay in tests/fuzz/test_fuzz_smoke.py still runs without it", file=sys.stderr)
        return 2
    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(names) - set(TARGET_NAMES))
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(TARGET_NAMES)}")
    crash_dir = HERE / "crashes"
    crash_dir.mkdir(exist_ok=True)
    total_execs, failed = 0, []
    print(f"fuzzing {', '.join(names)}: {args.seconds}s each" + (f", at most {args.runs} runs" if args.runs else ""),
          flush=True)
    for name in names:
        execs, crashed, tail = _run_target(name, args.seconds, args.runs, crash_dir)
        total_execs += execs
        print(f"{name:<14}{execs:>12,} executions  {'CRASH' if crashed else '0 crashes'}", flush=True)
        if crashed:
            failed.append(name)
            print(tail, flush=True)
    print(f"total: {total_execs:,} executions, {len(failed)} crashed target(s)"
          + (f": {', '.join(failed)}; inputs in {crash_dir}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
