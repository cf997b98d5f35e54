"""Runs every tests/sim/testdata/*.txt scenario and diffs its output (BROOK_SIM_REWRITE=1 rewrites)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from brooksim.scenario import run_file

TESTDATA = Path(__file__).parent / "testdata"

# Scenarios that show bugs in code this branch does not own; each names the fix.
KNOWN_BUGS: dict[str, str] = {
}


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("*.txt")), ids=lambda p: p.name)
def test_scenario(path: Path) -> None:
    expected, actual = run_file(path)
    if path.name in KNOWN_BUGS:
        # The expected output is the correct behaviour, written by hand: never rewritten.
        # Strict: once the fix lands the scenario passes and this entry must go.
        if actual != expected:
            pytest.xfail(KNOWN_BUGS[path.name])
        pytest.fail(f"{path.name} passes now: remove it from KNOWN_BUGS")
    if os.environ.get("BROOK_SIM_REWRITE") == "1":
        path.write_text(actual)
        return
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            "expected", "actual"))
        pytest.fail(f"{path.name}: output differs (BROOK_SIM_REWRITE=1 rewrites it):\n{diff}")

