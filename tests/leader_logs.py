"""Real partition logs of one broker that leads them all, for coordinator tests: what a coordinator appends with
``append_records`` (committed at once, as a leader alone in its ISR commits) it reads back through
``partition(topic, index).log``, and so does the next coordinator, which loads them."""

from __future__ import annotations

import concurrent.futures
import types
from pathlib import Path
from typing import Any

from storage.log_manager import LogManager


class LeaderLogs:
    def __init__(self, path: Path, *partitions: tuple[str, int], overrides: dict[str, str] | None = None) -> None:
        self.lm = LogManager([path], on_dir_failure=lambda d, e: None)
        self.logs = {(t, p): self.lm.get_or_create_log(t, p, topic_id=f"{t}-id", overrides=dict(overrides or {}))
                     for t, p in partitions}

    def log(self, topic: str, partition: int = 0) -> Any:
        return self.logs[(topic, partition)]

    def append_records(self, topic: str, partition: int, batch: bytes, acks: int, timeout_ms: int,
                       transactional: bool = False, verified: dict[int, int] | None = None) -> Any:
        lg = self.logs[(topic, partition)]
        fut: concurrent.futures.Future = concurrent.futures.Future()
        info = lg.append_as_leader(batch, 0, transactional=transactional, verified=verified)
        lg.update_high_watermark(lg.log_end_offset)
        fut.set_result(types.SimpleNamespace(base_offset=info.first_offset))
        return fut

    def partition(self, topic: str, partition: int) -> Any:
        lg = self.logs.get((topic, partition))
        return None if lg is None else types.SimpleNamespace(is_leader=True, log=lg)

    @property
    def log_manager(self) -> LogManager:
        return self.lm

    def add_leadership_listener(self, cb: Any) -> None:
        pass  # the tests hand leadership over themselves

    def close(self) -> None:
        self.lm.shutdown()
