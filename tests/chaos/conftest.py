"""The chaos harness is the package ``tests.chaos`` (run as ``python -m tests.chaos.run``): make the
repository root importable however pytest was started."""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
