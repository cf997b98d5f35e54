"""One writer, readers, a flusher and retention on the same log at once: readers only ever
see whole valid batches, nothing deadlocks, and the final log is consistent."""

from __future__ import annotations

import random
import threading
from pathlib import Path

from storage_testlib import make_batch, read_all

from proto import errors
from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import validate_batches


def test_concurrent_append_read_flush_retention(tmp_path: Path) -> None:
    size = len(make_batch(5))
    cfg = LogConfig(segment_bytes=size * 10, retention_bytes=size * 40, retention_ms=-1, flush_ms=5,
                    index_interval_bytes=size)
    lg = Log.open(tmp_path / "t-0", cfg)
    stop = threading.Event()
    failures: list[str] = []
    reads = [0]

    def writer() -> None:
        try:
            for _ in range(300):
                lg.append_as_leader(make_batch(5), 1)
                lg.update_high_watermark(lg.log_end_offset)
        except Exception as exc:  # noqa: BLE001 - reported to the main thread
            failures.append(f"writer: {exc!r}")
        finally:
            stop.set()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            start, end = lg.log_start_offset, lg.high_watermark
            if end <= start:
                continue
            offset = rng.randrange(start, end)
            try:
                got = lg.read(offset, rng.choice([100, size * 3, 1 << 20]), max_offset=end)
            except errors.OffsetOutOfRangeError:
                continue  # retention moved the log start between the two reads above
            except Exception as exc:  # noqa: BLE001
                failures.append(f"reader at {offset}: {exc!r}")
                return
            if got.records:
                headers = validate_batches(got.records)
                if not headers[0].base_offset <= offset <= headers[0].last_offset:
                    failures.append(f"read at {offset} started at batch {headers[0].base_offset}")
                if headers[-1].last_offset >= end:
                    failures.append(f"read past the bound {end}: {headers[-1].last_offset}")
                reads[0] += 1

    def housekeeping() -> None:
        while not stop.is_set():
            try:
                lg.maybe_flush()
                lg.delete_old_segments()
            except Exception as exc:  # noqa: BLE001
                failures.append(f"housekeeping: {exc!r}")
                return

    threads = [threading.Thread(target=writer), threading.Thread(target=housekeeping)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread is stuck (deadlock?)"
    assert not failures, failures[:5]
    assert reads[0] > 0
    assert lg.log_end_offset == 1500 and lg.log_start_offset > 0
    data = read_all(lg)
    headers = validate_batches(data)
    assert headers[0].base_offset == lg.log_start_offset and headers[-1].next_offset == 1500
    lg.close()
