"""Storage benchmark: partition-log append and read throughput next to a raw sequential write.

    python -m storage.perf [--dir DIR] [--total-mb 256] [--batch-kb 16,256,1024] [--record-bytes 100]
                           [--repeat 3]

For each batch size, one batch of 100-byte records is built once up front (CODEC's
RecordBatchBuilder), then appended again and again to a fresh log until ``--total-mb``
is written, and the log is fsynced: that is the append figure. In the same run, the
same number of bytes is written with plain sequential ``os.write`` calls of the same
size to a file in the same directory and fsynced: that is the raw figure. The ratio
append/raw shows what the log costs over the disk. Then the whole log is read back
with 1 MiB fetches (whole batches, as a consumer or follower would). Each figure is the
median of ``--repeat`` runs, raw and log interleaved.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import RecordBatchBuilder, iter_batches

MIB = 1024 * 1024


@dataclass
class Result:
    target_bytes: int
    batch_bytes: int
    records_per_batch: int
    batches: int
    append_s: float
    raw_s: float
    read_s: float
    read_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.batch_bytes * self.batches

    @property
    def records(self) -> int:
        return self.records_per_batch * self.batches


def build_batch(target_bytes: int, record_bytes: int) -> tuple[bytes, int]:
    """One uncompressed batch of ``record_bytes``-byte values, as close to ``target_bytes`` as fits."""
    builder = RecordBatchBuilder()
    value = os.urandom(record_bytes)
    ts = int(time.time() * 1000)
    while builder.size_estimate + record_bytes + 16 <= target_bytes:
        builder.append(ts, None, value)
    return builder.build(), builder.record_count


def raw_write(path: Path, chunk: bytes, count: int) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(count):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def log_append(directory: Path, batch: bytes, count: int) -> tuple[float, Log]:
    config = LogConfig(max_message_bytes=len(batch) + 1024)
    lg = Log.open(directory, config)
    start = time.perf_counter()
    for _ in range(count):
        lg.append_as_leader(batch, 0)
    lg.flush()
    return time.perf_counter() - start, lg


def log_read(lg: Log, fetch_bytes: int = MIB) -> tuple[float, int]:
    start = time.perf_counter()
    offset, total = 0, 0
    end = lg.log_end_offset
    while offset < end:
        got = lg.read(offset, fetch_bytes)
        if not got.records:
            break
        total += len(got.records)
        offset = _next_offset(got.records)  # after the last whole batch returned
    return time.perf_counter() - start, total


def _next_offset(records: bytes) -> int:
    nxt = -1
    for _pos, h in iter_batches(records):
        nxt = h.next_offset
    return nxt


def run(base_dir: Path, total_bytes: int, batch_sizes: list[int], record_bytes: int,
        repeat: int = 1) -> list[Result]:
    """Each measurement ``repeat`` times, raw and log alternating, keeping the median of each
    (a shared machine is noisy; the median of interleaved runs compares like with like)."""
    results = []
    for size in batch_sizes:
        batch, per_batch = build_batch(size, record_bytes)
        count = max(1, total_bytes // len(batch))
        raw_runs, append_runs, read_runs = [], [], []
        read_bytes = 0
        for i in range(repeat):
            raw_path = base_dir / f"raw-{size}.bin"
            log_dir = base_dir / f"perf-{size}-0"
            if i % 2:  # alternate the order so neither side always runs on a warmer machine
                append_s, lg = log_append(log_dir, batch, count)
                raw_s = raw_write(raw_path, batch, count)
            else:
                raw_s = raw_write(raw_path, batch, count)
                append_s, lg = log_append(log_dir, batch, count)
            raw_path.unlink()
            read_s, read_bytes = log_read(lg)
            lg.close()
            shutil.rmtree(log_dir)
            raw_runs.append(raw_s)
            append_runs.append(append_s)
            read_runs.append(read_s)
        results.append(Result(size, len(batch), per_batch, count, statistics.median(append_runs),
                              statistics.median(raw_runs), statistics.median(read_runs), read_bytes))
    return results


def format_results(results: list[Result]) -> str:
    head = (f"{'batch':>8} {'recs/batch':>10} {'MiB':>6} | {'append MB/s':>11} {'append rec/s':>13} | "
            f"{'raw MB/s':>9} {'append/raw':>10} | {'read MB/s':>9} {'read rec/s':>12}")
    lines = [head, "-" * len(head)]
    for r in results:
        mb = r.total_bytes / 1e6
        lines.append(
            f"{r.target_bytes // 1024:>6}Ki {r.records_per_batch:>10} {r.total_bytes / MIB:>6.0f} | "
            f"{mb / r.append_s:>11.1f} {r.records / r.append_s:>13,.0f} | "
            f"{mb / r.raw_s:>9.1f} {r.raw_s / r.append_s:>9.0%} | "
            f"{r.read_bytes / 1e6 / r.read_s:>9.1f} {r.records / r.read_s:>12,.0f}")
    return "\n".join(lines)


class PerfArgumentParser(argparse.ArgumentParser):
    """The parser of a ``brook perf`` benchmark (here and client/perf.py): a usage error is one ``error:`` line
    naming ``--help``, as every other ``brook`` command's (argparse printed its whole usage block first), and
    ``--help`` ends with examples (``examples``: one command a line)."""

    def __init__(self, *, prog: str, description: str, examples: Sequence[str]) -> None:
        super().__init__(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="Examples:\n" + "".join(f"  {e}\n" for e in examples))

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see: {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    p = PerfArgumentParser(prog="brook perf storage", description=__doc__.split("\n\n")[0], examples=(
        "brook perf storage", "brook perf storage --dir /var/lib/brook --total-mb 1024 --batch-kb 16,1024"))
    p.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure (default: a temp dir)")
    p.add_argument("--total-mb", type=int, default=256, help="bytes written per batch size, MiB")
    p.add_argument("--batch-kb", default="16,256,1024", help="batch sizes in KiB, comma-separated")
    p.add_argument("--record-bytes", type=int, default=100, help="value size of each record")
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement (median reported)")
    args = p.parse_args(argv)
    sizes = [int(s) * 1024 for s in args.batch_kb.split(",") if s.strip()]
    if not sizes or min(sizes + [args.total_mb, args.record_bytes, args.repeat]) <= 0:
        p.error("batch sizes, --total-mb, --record-bytes and --repeat must be positive")
    base = Path(tempfile.mkdtemp(prefix="brook-perf-", dir=args.dir))
    try:
        print(f"storage benchmark in {base}: {args.total_mb} MiB per batch size, "
              f"{args.record_bytes}-byte records, fsync at the end of each run, "
              f"median of {args.repeat} interleaved runs")
        results = run(base, args.total_mb * MIB, sizes, args.record_bytes, args.repeat)
        print(format_results(results))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
