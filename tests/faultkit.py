"""Helpers of the real-fault tests (tests/faults: disk faults, hung disks, wiped disks, corrupt segments)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from opskit import client_security
from waiting import wait_for

from client.consumer import Consumer
from client.types import TopicPartition


@contextlib.contextmanager
def ext4_mounts(images: dict[Path, Path], size_mb: int, options: str = "") -> Iterator[None]:
    """Each key a mount point of a fresh loop-mounted ext4 (its image the value), with mount ``options`` added to
    ``loop``; thawed and unmounted on exit."""
    mounted: list[Path] = []
    try:
        for path, image in images.items():
            path.mkdir(parents=True, exist_ok=True)
            with open(image, "wb") as f:
                f.truncate(size_mb * 1024 * 1024)
            made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True, timeout=60)
            assert made.returncode == 0, f"mkfs.ext4 {image}: {made.stderr.strip()}"
            done = subprocess.run(["mount", "-o", ",".join(filter(None, ["loop", options])), str(image), str(path)],
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"mount -o loop {image} {path} failed as root: {done.stderr.strip()}"
            mounted.append(path)
        yield
    finally:
        for path in mounted:
            subprocess.run(["fsfreeze", "--unfreeze", str(path)], capture_output=True, timeout=30)
            if subprocess.run(["umount", str(path)], capture_output=True, timeout=60).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def ext4_fail(path: Path) -> None:
    """Make the ext4 mounted at ``path`` (with ``errors=remount-ro``) report an error, as a failing disk does: the
    kernel remounts it read-only at once, and every later write to it fails with EROFS."""
    device = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(path)], capture_output=True, text=True,
                            timeout=30).stdout.strip()
    assert device.startswith("/dev/"), f"no device mounted at {path}: {device!r}"
    Path(f"/sys/fs/ext4/{Path(device).name}/trigger_fs_error").write_text("1")
    options = subprocess.run(["findmnt", "-n", "-o", "OPTIONS", str(path)], capture_output=True, text=True,
                             timeout=30).stdout.strip().split(",")
    # The kernel shows "ro", or keeps "rw" and adds "emergency_ro" (Linux 6.x): writes fail with EROFS either way.
    assert "ro" in options or "emergency_ro" in options, f"{path} still writable after its error: {options}"


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


def partition_consumer(cluster: Any, topic: str, partition: int = 0) -> Consumer:
    """A Brook consumer of one partition of ``topic`` from offset 0, its metadata loaded (it knows the leader);
    with the cluster's client security settings when it has them (a TLS cluster)."""
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest",
                        request_timeout_ms=5000, fetch_max_wait_ms=100, **client_security(cluster))
    consumer.assign([TopicPartition(topic, partition)])
    return consumer


def read_until(consumer: Consumer, topic: str, end: int | None = None, timeout_s: float = 45.0,
               on_records: Callable[[], None] | None = None,
               describe: Callable[[], object] = lambda: "?", partition: int = 0) -> list[tuple[int, bytes]]:
    """(offset, value) of the records ``consumer`` reads of ``partition`` from its position up to ``end`` (None:
    the end offset the cluster gives for it now); ``on_records`` is called when each batch of them arrives;
    ``describe`` says what the partition looks like, for the failure message."""
    tp = TopicPartition(topic, partition)
    if end is None:
        ends: list[object] = []

        def end_offset() -> int | None:
            try:
                ends.append(consumer.end_offsets([tp])[tp])
            except Exception as exc:  # noqa: BLE001 - a retriable error while the cluster settles: shown if it lasts
                ends.append(repr(exc))
            return ends[-1] if isinstance(ends[-1], int) and ends[-1] > 0 else None
        end = wait_for(end_offset, timeout_s,
                       lambda: f"a non-zero end offset of {topic}-{partition} (seen {ends[-3:]})")
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout_s
    # Progress from the records themselves: position() would raise while the partition has no leader.
    while (out[-1][0] + 1 if out else 0) < end:
        assert time.monotonic() < deadline, (
            f"read {len(out)} records of {topic}-{partition} in {timeout_s:.0f} s (last offset "
            f"{out[-1][0] if out else None}), end offset {end}; partition now {describe()}")
        for records in consumer.poll(timeout_ms=200).values():
            if records and on_records is not None:
                on_records()
            out.extend((r.offset, r.value) for r in records)
    return out


def replica_segments(cluster: Any, broker: int, topic: str, partition: int = 0) -> list[Path]:
    """The segment files of ``broker``'s replica of ``topic``-``partition``, in offset order."""
    return sorted((cluster.node_dir(broker) / "data" / f"{topic}-{partition}").glob("*.log"))


def replica_batches(cluster: Any, broker: int, topic: str, below: int) -> list[bytes]:
    """The bytes of each batch of ``broker``'s replica of ``topic``-0 whose last offset is below ``below``, in
    order: equal lists on every broker mean byte-identical replicas up to there."""
    from storage.record_batch import iter_batches

    out = []
    for path in replica_segments(cluster, broker, topic):
        data = path.read_bytes()
        out += [data[pos:pos + h.size] for pos, h in iter_batches(data) if h.base_offset + h.last_offset_delta < below]
    return out


def flip_in_records(path: Path, which: int) -> int:
    """Flip a byte in the records (not the header) of batch ``which`` of a segment file, in place (the broker may
    be running): the batch fails its CRC. Its base offset."""
    from storage.record_batch import BATCH_HEADER_SIZE, iter_batches

    data = path.read_bytes()
    pos, h = list(iter_batches(data))[which]
    at = pos + BATCH_HEADER_SIZE + (h.size - BATCH_HEADER_SIZE) // 2
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x5A]))
    return h.base_offset
