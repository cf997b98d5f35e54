"""A log that only a snapshot of the metadata takes away from a broker is set aside, never deleted.

A broker applies a snapshot when it starts and when its watch fell too far behind for deltas. A
snapshot may be stale or wrong: a controller bug (one shared stale snapshots once, and restarted brokers
deleted the logs of topics created since: data loss at RF 1), a quorum restored from an old backup, a
broker pointed at the wrong quorum. So, as Kafka does with its stray replicas (KAFKA-14616), a log a
snapshot does not place on this broker is renamed ``<topic>-<partition>.<id>-stray`` and kept; a
deletion the broker sees in a delta (a topic deleted, a replica moved away) deletes. When the
metadata places the partition here again with the same topic id, the newest stray log of it is moved
back and served, with its records.

Real ReplicaManager and LogManager on real files (tests/broker/inprocess.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from inprocess import InProcessBroker

from broker.metrics import BrokerCollector
from proto import common_pb2, controller_pb2
from storage.log_manager import STRAY_DIR_SUFFIX, LogManager
from storage.record_batch import RecordBatchBuilder

TOPIC_ID = "t" * 32


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {"t": {}}) as b:  # broker 1 leads t-0 (topic id "t" * 32), RF 1
        yield b


def batch(value: bytes) -> bytes:
    b = RecordBatchBuilder()
    b.append(1_700_000_000_000, None, value)
    return b.build()


def produce(b: InProcessBroker, n: int) -> None:
    for i in range(n):
        b.rm.append_records("t", 0, batch(b"v%d" % i), acks=-1, timeout_ms=5000).result(5)


def apply(b: InProcessBroker, update: controller_pb2.MetadataUpdate) -> None:
    b.rm.apply_metadata_delta(b.rm.metadata_cache.apply(update))


def snapshot(version: int, topics: dict[str, str], replicas: Sequence[int] = (1,)) -> controller_pb2.MetadataUpdate:
    """A snapshot naming ``topics`` (name -> topic id), one partition each on ``replicas``, led by the first."""
    update = controller_pb2.MetadataUpdate(version=version, is_snapshot=True, cluster_id="c", active_controller_id=-1)
    for node in sorted({1, *replicas}):
        update.brokers.add(node_id=node, incarnation_id=f"i{node}", broker_epoch=1,
                           endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=node)])
    for name, topic_id in topics.items():
        update.topics.add(name=name, topic_id=topic_id, partition_count=1)
        update.partitions.add(topic=name, topic_id=topic_id, partition=0, replicas=list(replicas),
                              isr=list(replicas), leader=replicas[0], leader_epoch=version, partition_epoch=version)
    return update


def stray_gauge(b: InProcessBroker, log_dir: Path) -> float:
    [family] = [f for f in BrokerCollector(lambda: b.rm, [log_dir]).collect() if f.name == "brook_log_dir_stray_logs"]
    [sample] = family.samples
    assert sample.labels == {"dir": str(log_dir)}
    return sample.value


def strays(tmp_path: Path) -> list[Path]:
    return sorted(p for p in tmp_path.iterdir() if p.name.endswith(STRAY_DIR_SUFFIX))


def test_a_snapshot_without_the_topic_sets_its_log_aside_and_one_with_it_again_restores_it(
        broker: InProcessBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    produce(broker, 3)
    with caplog.at_level(logging.WARNING, logger="storage.log_manager"):
        apply(broker, snapshot(2, {}))
    assert broker.rm.partition("t", 0) is None and not (tmp_path / "t-0").exists()
    [aside] = strays(tmp_path)
    assert aside.name.startswith("t-0.") and any(aside.glob("*.log")), aside
    assert broker.logs.stray_logs() == [aside]
    assert stray_gauge(broker, tmp_path) == 1
    assert any("set aside" in r.getMessage() and "not deleted" in r.getMessage() for r in caplog.records)

    apply(broker, snapshot(3, {"t": TOPIC_ID}))
    p = broker.rm.leader_partition("t", 0)
    assert (p.log.log_start_offset, p.log.log_end_offset) == (0, 3), "the restored log has its records"
    assert strays(tmp_path) == [] and broker.logs.stray_logs() == [] and stray_gauge(broker, tmp_path) == 0
    produce(broker, 1)
    assert p.log.log_end_offset == 4 and p.log.high_watermark == 4


def test_a_snapshot_placing_the_partition_elsewhere_sets_it_aside(broker: InProcessBroker, tmp_path: Path) -> None:
    produce(broker, 2)
    apply(broker, snapshot(2, {"t": TOPIC_ID}, replicas=(2,)))
    assert broker.rm.partition("t", 0) is None and not (tmp_path / "t-0").exists()
    assert len(strays(tmp_path)) == 1


def test_a_new_topic_id_in_a_snapshot_sets_the_old_incarnation_aside_and_never_restores_it(
        broker: InProcessBroker, tmp_path: Path) -> None:
    produce(broker, 2)
    apply(broker, snapshot(2, {"t": "n" * 32}))
    p = broker.rm.leader_partition("t", 0)
    assert p.topic_id == "n" * 32 and p.log.log_end_offset == 0, "the new incarnation starts empty"
    [aside] = strays(tmp_path)
    assert (aside / "partition.metadata").read_text().strip().endswith(TOPIC_ID)


def test_a_delta_deleting_the_topic_deletes_its_log(broker: InProcessBroker, tmp_path: Path) -> None:
    produce(broker, 2)
    apply(broker, controller_pb2.MetadataUpdate(version=2, deleted_topic_ids=[TOPIC_ID]))
    assert broker.rm.partition("t", 0) is None
    assert not (tmp_path / "t-0").exists() and strays(tmp_path) == [], list(tmp_path.iterdir())


def test_a_delta_moving_the_replica_away_deletes_its_log(broker: InProcessBroker, tmp_path: Path) -> None:
    produce(broker, 2)
    delta = snapshot(2, {"t": TOPIC_ID}, replicas=(2,))
    delta.is_snapshot = False
    del delta.topics[:]
    apply(broker, delta)
    assert broker.rm.partition("t", 0) is None
    assert not (tmp_path / "t-0").exists() and strays(tmp_path) == [], list(tmp_path.iterdir())


def test_a_restarted_broker_keeps_stray_logs_aside_and_restores_the_newest(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    lm = LogManager([tmp_path], cleaner_threads=0)
    lm.startup()
    hidden = tmp_path / "hidden"
    for records in (2, 5):  # two logs of the same topic id set aside one after the other
        lg = lm.get_or_create_log("t", 0, topic_id=TOPIC_ID)
        for _ in range(records):
            lg.append_as_leader(batch(b"x"), 0)
        lm.set_aside_log("t", 0, "test")
        if records == 2:  # out of the way, or the next get_or_create_log would take it back
            [first] = strays(tmp_path)
            first.rename(hidden)
    hidden.rename(first)
    other = lm.get_or_create_log("a-1.b", 0, topic_id="o" * 32)  # its stray name starts "a-1.b-0.": not a-1
    other.append_as_leader(batch(b"y"), 0)
    lm.set_aside_log("a-1.b", 0, "test")
    lm.shutdown()
    assert len(strays(tmp_path)) == 3

    lm = LogManager([tmp_path], cleaner_threads=0)
    assert lm.count_segments() == (0, 0), "stray logs are not opened"
    with caplog.at_level(logging.WARNING, logger="storage.log_manager"):
        lm.startup()
    assert lm.all_logs() == {} and len(lm.stray_logs()) == 3
    assert sum("stray log" in r.getMessage() and "kept" in r.getMessage() for r in caplog.records) == 3
    assert lm.get_or_create_log("a", 1, topic_id="o" * 32).log_end_offset == 0, "not a-1.b's stray log"
    assert lm.get_or_create_log("t", 0, topic_id="x" * 32).log_end_offset == 0, "another topic id: a new log"
    lm.set_aside_log("t", 0, "test")
    assert lm.get_or_create_log("t", 0, topic_id=TOPIC_ID).log_end_offset == 5, "the newest of this topic id"
    lm.set_aside_log("t", 0, "test")
    assert lm.get_or_create_log("t", 0, topic_id=TOPIC_ID).log_end_offset == 5, "the one just set aside"
    lm.shutdown()


def test_a_restored_stray_log_keeps_its_log_start_and_high_watermark(tmp_path: Path) -> None:
    """A log's log start offset (DeleteRecords, retention) and high watermark live in the directory's
    checkpoint files while it is served: a log set aside keeps them in the log itself (its close flushed it),
    so that moved back it opens with them and without a rescan. Before, records DeleteRecords had removed
    were served again, and the high watermark fell back to the log start."""
    lm = LogManager([tmp_path], cleaner_threads=0)
    lm.startup()
    lg = lm.get_or_create_log("t", 0, topic_id=TOPIC_ID)
    for _ in range(5):
        lg.append_as_leader(batch(b"x"), 0)
    lg.update_high_watermark(4)
    lg.set_log_start_offset(2)
    lm.set_aside_log("t", 0, "test")
    back = lm.get_or_create_log("t", 0, topic_id=TOPIC_ID)
    assert (back.log_start_offset, back.high_watermark, back.log_end_offset) == (2, 4, 5)
    lm.shutdown()
