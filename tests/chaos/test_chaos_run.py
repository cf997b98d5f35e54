"""A short chaos run (about 25 s of faults): the product survives it. `make soak` runs it (it
took 37-53 s of the suite's 20 minutes); `make chaos` is the long run.

The full harness runs in a subprocess exactly as `make chaos` runs it; the test passes
only on exit code 0 with a PASS summary line, and checks that the run left no network
namespace or node process behind. Longer runs: `make chaos` (see README, "Chaos testing").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.netns import PREFIX, namespaces_unavailable_reason

pytestmark = [pytest.mark.soak, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SHORT_SEED = int(os.environ.get("BROOK_CHAOS_TEST_SEED", "1"))


def _namespaces() -> set[str]:
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)}


def test_short_chaos_run_loses_nothing_and_recovers(tmp_path: Path) -> None:
    before = _namespaces()
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "tests.chaos.run", "--duration", "25", "--seed", str(SHORT_SEED),
           "--dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=840)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("chaos: seed=")]
    assert len(summary) == 1, f"no summary line; stdout:\n{proc.stdout}\nstderr tail:\n{proc.stderr[-4000:]}"
    line = summary[0]
    assert proc.returncode == 0 and "VERDICT=PASS" in line, (
        f"{line}\nexit {proc.returncode}; stderr tail:\n{proc.stderr[-6000:]}\nrun directory: {run_dir}")
    assert " acked=0 " not in line and "faults=0 " not in line, line
    reason = namespaces_unavailable_reason()
    assert ("network=netns" in line) == (reason is None), (line, reason)
    assert _namespaces() <= before, f"namespaces left behind: {_namespaces() - before}"
    assert (run_dir / "history.jsonl").stat().st_size > 0
