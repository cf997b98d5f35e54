"""Step a node's wall clock (a real process's, as NTP or ``date -s`` would) without touching the machine's.

``launch_prefix(path)`` starts a node (LocalCluster ``launch_prefixes``) with tests/wall_clock_shim on its
PYTHONPATH, whose sitecustomize offsets the node's ``time.time`` by the seconds in ``path``; ``step(path, s)``
moves it, within 50 ms.
"""

from __future__ import annotations

import os
from pathlib import Path

SHIM = Path(__file__).with_name("wall_clock_shim")


def launch_prefix(path: Path) -> list[str]:
    path.write_text("0")
    pythonpath = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH", "")) if p)
    return ["env", f"PYTHONPATH={pythonpath}", f"FAKE_WALL_CLOCK_FILE={path}"]


def step(path: Path, seconds: float) -> None:
    """The node's wall clock runs ``seconds`` off the real one from now on (replacing any earlier step)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(repr(float(seconds)))
    os.replace(tmp, path)
