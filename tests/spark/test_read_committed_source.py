"""The Spark source reads only committed data: its plans' "latest" and timestamp lookups are read_committed
ListOffsets (the last stable offset), its tasks' fetches read_committed, and the aborted transactions an answer
names are dropped (the decoding itself: test_columns.py). Fake clients, no cluster."""

from __future__ import annotations

from typing import Any

from client.types import FetchResult, TopicPartition
from spark_source import fetcher
from spark_source.fetcher import RangeTask, read_range
from spark_source.offsets import OffsetReader
from spark_source.options import FetchSettings, parse_read_options
from storage.record_batch import RecordBatchBuilder, build_control_batch


class _Client:
    def __init__(self, answers: list[FetchResult]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def list_offsets(self, timestamps: Any, **kw: Any) -> dict[TopicPartition, tuple[int, int]]:
        self.asked.append(("list_offsets", kw))
        return {tp: (42, -1) for tp in timestamps}

    def leader_for(self, tp: TopicPartition) -> int:
        return 1

    def fetch_from(self, leader: int, tp: TopicPartition, offset: int, max_bytes: int, **kw: Any) -> FetchResult:
        self.asked.append(("fetch_from", kw))
        return self.answers.pop(0)

    def metadata_snapshot(self) -> Any:
        return None


def test_plans_ask_for_the_last_stable_offset() -> None:
    reader = OffsetReader.__new__(OffsetReader)
    reader.options = parse_read_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, streaming=False)
    reader.client = _Client([])  # type: ignore[assignment]
    assert reader.latest({("t", 0)}) == {("t", 0): 42}
    assert reader.client.asked == [("list_offsets", {"isolation_level": 1})]  # type: ignore[attr-defined]


def test_tasks_fetch_read_committed_and_drop_aborted_records(monkeypatch: Any) -> None:
    def txn(base: int, pid: int) -> bytes:
        b = RecordBatchBuilder(base_offset=base, producer_id=pid, producer_epoch=0, base_sequence=base,
                               is_transactional=True)
        b.append(1_700_000_000_000, None, b"v%d" % base)
        return b.build()

    records = (txn(0, 1) + txn(1, 2) + build_control_batch(False, producer_id=1, producer_epoch=0, timestamp_ms=1,
                                                           base_offset=2)
               + build_control_batch(True, producer_id=2, producer_epoch=0, timestamp_ms=1, base_offset=3))
    client = _Client([FetchResult(records, 4, 0, None, 4, 4, ((1, 0),))])
    monkeypatch.setattr(fetcher, "_client", lambda settings: client)
    batches = list(read_range(RangeTask("t", 0, 0, 4, FetchSettings("127.0.0.1:1"))))
    assert [b.column("offset").to_pylist() for b in batches] == [[1]]
    assert [kw.get("isolation_level") for what, kw in client.asked if what == "fetch_from"] == [1]
