"""File systems the real-fault tests mount for themselves (as root): a small tmpfs that fills up."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: "8m") mounted at ``path`` for the block; unmounted after it."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30)
    assert mounted.returncode == 0, f"mount -t tmpfs {path} failed as root: {mounted.stderr.strip()}"
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)  # still busy: detach
