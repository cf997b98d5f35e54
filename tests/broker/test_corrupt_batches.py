"""A batch that fails its CRC, found by the broker's own readers: the log cleaner's report reaches the replica
manager, which judges it as it judges one a fetch found (``ReplicaManager.corrupt_batch_found``).

Before, the cleaner's pass failed on such a batch as a plain CORRUPT_MESSAGE every backoff, for good: the
broker was never told, and the batch stayed on disk until a leader's fetch stumbled on it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessBroker

from broker.metadata_cache import MetadataDelta, TopicInfo
from broker.metrics import BrokerCollector
from storage.log import RESCAN_FROM_FILE
from storage.record_batch import RecordBatchBuilder, iter_batches
from storage.segment import CorruptBatchError

COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "1024"}


def _fill_and_flip(b: InProcessBroker) -> tuple[object, int]:
    """Keyed records over several segments, then a flipped value byte in the last batch of the second
    segment; (the log, that batch's base offset)."""
    for i in range(40):
        batch = RecordBatchBuilder()
        batch.append(1_700_000_000_000, b"key-%d" % (i % 5), b"value-%04d" % i)
        b.rm.append_records("c", 0, batch.build(), acks=1, timeout_ms=5000).result(5)
    lg = b.rm.partition("c", 0).log
    lg.update_high_watermark(lg.log_end_offset)  # as the followers' fetches would: all of it is cleanable
    seg = lg.segments()[1]
    pos, h = list(iter_batches(seg.log_path.read_bytes()))[-1]
    with open(seg.log_path, "r+b") as f:
        f.seek(pos + h.size - 1)
        byte = f.read(1)
        f.seek(pos + h.size - 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    return lg, h.base_offset


def _clean_and_report(b: InProcessBroker, lg: object) -> None:
    """One cleaner pass, its failure told to the broker as the cleaner's thread tells it."""
    cleaner = b.logs.cleaner
    with pytest.raises(CorruptBatchError) as caught:
        cleaner.clean_log(lg)  # type: ignore[arg-type]
    assert cleaner.on_corrupt is not None, "the replica manager does not hear of the cleaner's corrupt batches"
    cleaner.on_corrupt(lg, caught.value)  # type: ignore[arg-type]


def _uncleanable_gauge(b: InProcessBroker, log_dir: Path) -> float:
    [family] = [f for f in BrokerCollector(lambda: b.rm, [log_dir]).collect()
                if f.name == "brook_log_cleaner_uncleanable_partitions"]
    return family.samples[0].value


@pytest.fixture
def with_follower_in_sync(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {"c": COMPACTED}, replicas=(1, 2)) as b:  # broker 1 leads, 2 in sync
        yield b


@pytest.fixture
def alone(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {"c": COMPACTED}) as b:  # RF 1
        yield b


def test_a_leader_with_others_in_sync_marks_the_batch_and_fails_its_directory(
        with_follower_in_sync: InProcessBroker, tmp_path: Path) -> None:
    b = with_follower_in_sync
    lg, bad = _fill_and_flip(b)
    _clean_and_report(b, lg)
    assert (lg.dir / RESCAN_FROM_FILE).read_text().strip() == str(bad), "the batch is not marked to be cut"
    assert b.logs.failed_dirs == {tmp_path}, "the leader did not stop for its in-sync follower to take over"
    assert _uncleanable_gauge(b, tmp_path) == 1.0


def test_the_only_replica_in_sync_keeps_its_log_and_says_so_once(alone: InProcessBroker, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    b = alone
    lg, bad = _fill_and_flip(b)
    with caplog.at_level(logging.ERROR, logger="broker.replica_manager"):
        _clean_and_report(b, lg)
        b.logs.cleaner.on_corrupt(lg, CorruptBatchError(lg.segments()[1].log_path, 0, bad, "again"))
    assert not (lg.dir / RESCAN_FROM_FILE).exists(), "a log on no other replica was marked to be cut"
    assert b.logs.failed_dirs == set(), "the only in-sync replica stopped"
    said = [r.getMessage() for r in caplog.records if "found by the log cleaner" in r.getMessage()]
    assert len(said) == 1 and "no other replica is in sync" in said[0], said
    assert b.logs.cleaner.grab_filthiest() is None, "an uncleanable log was picked again"
    assert _uncleanable_gauge(b, tmp_path) == 1.0


def test_a_deleted_topic_takes_its_reported_batches_with_it(alone: InProcessBroker) -> None:
    """What was said once about a corrupt batch goes with its partition's log: it stayed for every topic ever
    deleted (churn audit), and a topic created again under the name would not have had its batch reported."""
    b = alone
    lg, _ = _fill_and_flip(b)
    _clean_and_report(b, lg)
    assert b.rm._corrupt_reported, "the report was not remembered: this test checks nothing"
    b.rm.apply_metadata_delta(MetadataDelta(2, False, deleted_topics=[TopicInfo("c", "c" * 32, {}, 1)]))
    assert b.rm.partition("c", 0) is None and b.logs.get_log("c", 0) is None
    assert b.rm._corrupt_reported == set()
