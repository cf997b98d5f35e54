"""Child process of test_crash_recovery: appends batches forever with flush.messages=1.

After each append returns (the data is fsynced by then) it prints one line to stdout:
``<base_offset> <next_offset> <sha256 of the batch bytes as stored>``. The parent kills
it with SIGKILL at a random moment and checks that every reported batch survived.

Usage: python crash_writer.py <partition dir> <seed> <segment bytes> [log|manager]

``manager`` runs the log under a LogManager with its background threads (checkpointer,
flusher, retention by size) at short intervals, so kills also land in checkpoint writes
and segment deletions; the partition dir is then ``<data dir>/crash-0``.
"""

from __future__ import annotations

import hashlib
import random
import sys
import time
from pathlib import Path

from storage.log import Log
from storage.log_config import LogConfig
from storage.log_manager import LogManager
from storage.record_batch import RecordBatchBuilder

MAX_APPENDS = 1_000_000  # bound: the parent kills us long before


def main(argv: list[str]) -> int:
    directory, seed, segment_bytes = Path(argv[0]), int(argv[1]), int(argv[2])
    mode = argv[3] if len(argv) > 3 else "log"
    rng = random.Random(seed)
    if mode == "manager":
        lm = LogManager([directory.parent], {"segment.bytes": str(segment_bytes), "flush.messages": "1",
                                             "index.interval.bytes": "512", "retention.bytes": str(segment_bytes * 2),
                                             "file.delete.delay.ms": "0"},
                        flush_check_ms=5, retention_check_ms=20, checkpoint_interval_ms=5)
        lm.startup()  # recovery from the checkpointed recovery point
        lg = lm.get_or_create_log(directory.name.rsplit("-", 1)[0], 0, topic_id="crash", overrides={})
        lm.start_background()
    else:
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
        lg.update_high_watermark(lg.log_end_offset)  # lets retention delete old segments meanwhile
        out.write(f"{info.first_offset} {info.last_offset + 1} {hashlib.sha256(batch).hexdigest()}\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
