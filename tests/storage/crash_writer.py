"""Child process of test_crash_recovery: appends batches forever with flush.messages=1.

After each append returns (the data is fsynced by then) it prints one line to stdout:
``<base_offset> <next_offset> <sha256 of the batch bytes as stored>``. The parent kills
it with SIGKILL at a random moment and checks that every reported batch survived.

Usage: python crash_writer.py <partition dir> <seed> <segment bytes>
"""

from __future__ import annotations

import hashlib
import random
import sys
import time
from pathlib import Path

from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import RecordBatchBuilder

MAX_APPENDS = 1_000_000  # bound: the parent kills us long before


def main(argv: list[str]) -> int:
    directory, seed, segment_bytes = Path(argv[0]), int(argv[1]), int(argv[2])
    rng = random.Random(seed)
    cfg = LogConfig(segment_bytes=segment_bytes, flush_messages=1, index_interval_bytes=512)
    lg = Log.open(directory, cfg)  # recovery point 0: a full rescan after the previous kill
    out = sys.stdout
    out.write(f"ready {lg.log_end_offset}\n")
    out.flush()
    epoch = 1 + seed % 5
    for i in range(MAX_APPENDS):
        b = RecordBatchBuilder(base_offset=lg.log_end_offset, partition_leader_epoch=epoch)
        ts = int(time.time() * 1000)
        for j in range(rng.randint(1, 30)):
            b.append(ts, f"key-{seed}-{i}-{j}".encode(), rng.randbytes(rng.randint(0, 300)))
        batch = b.build()
        info = lg.append_as_leader(batch, epoch)  # fsynced before it returns (flush.messages=1)
        out.write(f"{info.first_offset} {info.last_offset + 1} {hashlib.sha256(batch).hexdigest()}\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
