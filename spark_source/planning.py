"""Pure planning logic: checkpoint offsets, offset ranges, the read limit, task splitting.

No I/O here; the driver-side readers in ``source.py`` feed in what the cluster said.

Offsets in the checkpoint use the JSON shape of Spark's Kafka source,
``{"topic": {"0": 23, "1": 7}}``, where each value is the offset of the *next* record to
read (exclusive end of what has been read). Topic ids are not in the checkpoint (it stays
readable by every version, and old checkpoints load unchanged): the planned ranges carry
them, and the stream reader remembers them for as long as it runs.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

TP = tuple[str, int]
PartitionOffsets = dict[TP, int]


def to_json_offsets(offsets: PartitionOffsets) -> dict[str, dict[str, int]]:
    """Per-partition offsets -> the checkpoint's nested dict (keys sorted for stable output)."""
    out: dict[str, dict[str, int]] = {}
    for topic, part in sorted(offsets):
        out.setdefault(topic, {})[str(part)] = int(offsets[(topic, part)])
    return out


def from_json_offsets(doc: dict) -> PartitionOffsets:
    """The checkpoint's nested dict -> per-partition offsets (raises ValueError when malformed)."""
    out: PartitionOffsets = {}
    if not isinstance(doc, dict):
        raise ValueError(f"offsets must be an object of topic -> {{partition: offset}}, got {doc!r}")
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise ValueError(f"offsets of topic {topic!r} must be an object, got {parts!r}")
        for part, off in parts.items():
            out[(str(topic), int(part))] = int(off)
    return out


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records [from_offset, until_offset) of one partition; one Spark task reads one range.

    ``topic_id`` is the id of the topic those offsets belong to when it was planned ("" when not
    known): a topic deleted and recreated under the same name has a new id, and its offsets
    mean other records.
    """

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    topic_id: str = ""

    @property
    def size(self) -> int:
        return max(0, self.until_offset - self.from_offset)


def rate_limit(start: PartitionOffsets, latest: PartitionOffsets, max_records: int) -> PartitionOffsets:
    """End offsets admitting at most ``max_records`` records in total across partitions.

    Shares the budget in proportion to each partition's backlog (as Spark's Kafka source
    does), then hands the rounding remainder to the largest fractional parts, so the total
    is exactly ``min(max_records, backlog)`` and no partition is starved forever.
    ``start`` must hold every partition of ``latest``.
    """
    assert max_records > 0, max_records
    assert set(latest) <= set(start), sorted(set(latest) - set(start))
    backlog = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(backlog.values())
    if total <= max_records:
        return dict(latest)
    shares: dict[TP, int] = {}
    remainders: list[tuple[float, TP]] = []
    for tp, lag in backlog.items():
        exact = max_records * lag / total
        shares[tp] = min(lag, int(exact))
        remainders.append((exact - int(exact), tp))
    left = max_records - sum(shares.values())
    # Largest remainder first; ties broken by partition name for determinism.
    for _, tp in sorted(remainders, key=lambda r: (-r[0], r[1])):
        if left <= 0:
            break
        if shares[tp] < backlog[tp]:
            shares[tp] += 1
            left -= 1
    end = {tp: start[tp] + shares[tp] for tp in latest}
    assert sum(end[tp] - start[tp] for tp in latest) <= max_records
    return end


def plan_ranges(
    start: PartitionOffsets,
    end: PartitionOffsets,
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
    topic_ids: Mapping[str, str] | None = None,
) -> list[OffsetRange]:
    """Ranges to read between two checkpoint offsets, split for parallelism.

    ``start`` must hold every partition of ``end`` (the caller resolves new partitions to
    their earliest offset first). Empty ranges are dropped. ``max_records_per_partition``
    caps the size of one task's range; ``min_partitions`` then splits the largest ranges
    further until there are that many tasks (when there are that many records). Each range
    carries its topic's id from ``topic_ids``.
    """
    ids = topic_ids or {}
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        frm, until = start[tp], end[tp]
        if until > frm:
            ranges.append(OffsetRange(tp[0], tp[1], frm, until, ids.get(tp[0], "")))
    parts = {r: 1 for r in ranges}
    if max_records_per_partition:
        for r in ranges:
            parts[r] = -(-r.size // max_records_per_partition)
    if min_partitions and sum(parts.values()) < min_partitions:
        _grow_parts(parts, min_partitions)
    out: list[OffsetRange] = []
    for r in ranges:
        out.extend(_split(r, parts[r]))
    return out


def _grow_parts(parts: dict[OffsetRange, int], target: int) -> None:
    """Add splits one at a time to the range whose pieces are currently largest."""
    heap = [(-(r.size / n), r.topic, r.partition, r) for r, n in parts.items() if r.size > n]
    heapq.heapify(heap)
    count = sum(parts.values())
    while count < target and heap:  # bounded: each step adds one part, stops at target
        _, _, _, r = heapq.heappop(heap)
        parts[r] += 1
        count += 1
        if r.size > parts[r]:
            heapq.heappush(heap, (-(r.size / parts[r]), r.topic, r.partition, r))


def _split(r: OffsetRange, n: int) -> list[OffsetRange]:
    n = max(1, min(n, r.size))
    step, extra = divmod(r.size, n)
    out: list[OffsetRange] = []
    frm = r.from_offset
    for i in range(n):
        until = frm + step + (1 if i < extra else 0)
        out.append(OffsetRange(r.topic, r.partition, frm, until, r.topic_id))
        frm = until
    assert frm == r.until_offset, (frm, r)
    return out


def recreated_topics(
    known: Mapping[str, str], current: Mapping[str, str], topics: set[str]
) -> dict[str, tuple[str, str]]:
    """{topic: (id known, id now)} for those of ``topics`` whose id changed: deleted and created again.

    A topic without a known id (a query restarted from its checkpoint, which holds no ids) or no
    longer in the metadata (deleted: reported as gone partitions) is not in the answer.
    """
    out: dict[str, tuple[str, str]] = {}
    for topic in sorted(topics):
        old, new = known.get(topic, ""), current.get(topic, "")
        if old and new and old != new:
            out[topic] = (old, new)
    return out
