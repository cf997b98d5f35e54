"""Helpers of the real-fault tests in tests/ops (disk faults, hung disks, wiped disks)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def ext4_mounts(images: dict[Path, Path], size_mb: int) -> Iterator[None]:
    """Each key a mount point of a fresh loop-mounted ext4 (its image the value); thawed and unmounted on exit."""
    mounted: list[Path] = []
    try:
        for path, image in images.items():
            path.mkdir(parents=True, exist_ok=True)
            with open(image, "wb") as f:
                f.truncate(size_mb * 1024 * 1024)
            made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True, timeout=60)
            assert made.returncode == 0, f"mkfs.ext4 {image}: {made.stderr.strip()}"
            done = subprocess.run(["mount", "-o", "loop", str(image), str(path)], capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, f"mount -o loop {image} {path} failed as root: {done.stderr.strip()}"
            mounted.append(path)
        yield
    finally:
        for path in mounted:
            subprocess.run(["fsfreeze", "--unfreeze", str(path)], capture_output=True, timeout=30)
            if subprocess.run(["umount", str(path)], capture_output=True, timeout=60).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@contextlib.contextmanager
def thawed_on_exit(path: Path) -> Iterator[None]:
    """Thawed before the cluster stops: a process waiting on a frozen file system cannot even be killed."""
    try:
        yield
    finally:
        subprocess.run(["fsfreeze", "--unfreeze", str(path)], capture_output=True, timeout=30)


def assert_every_acknowledged_record_once_in_order(read: list[tuple[int, bytes]], acked: list[bytes],
                                                    where: str) -> None:
    values = [v for _, v in read]
    offsets = [o for o, _ in read]
    assert offsets == list(range(len(read))), f"{where}: offsets not 0..{len(read) - 1} in order: {offsets[:20]}..."
    dups = len(values) - len(set(values))
    wanted = set(acked)
    in_log = [v for v in values if v in wanted]
    if dups or in_log != acked:
        first = next((i for i, (a, b) in enumerate(zip(in_log, acked, strict=False)) if a != b),
                     min(len(in_log), len(acked)))
        raise AssertionError(
            f"{where}: read {len(values)} records ({dups} duplicates) holding {len(in_log)} of the {len(acked)} "
            f"acknowledged ones, the first difference at acknowledged record {first} "
            f"({acked[first][:24] if first < len(acked) else None!r} expected, "
            f"{in_log[first][:24] if first < len(in_log) else None!r} read)")
