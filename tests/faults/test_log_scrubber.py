"""The log scrubber (storage/scrubber.py) on a real 3-broker cluster, RF 3: bytes that changed on disk in a
closed segment are found by the scrubber alone (nobody reads them: no consumer, no follower needs them, no
restart rescans them), and handled as any reader's find is (ReplicaManager.corrupt_batch_found):

- on a follower: an ERROR, the log marked to be cut there at its next start, and it keeps following; started
  again, it cuts its log at the batch and fetches the rest back, byte-identical to the others;
- on the leader: it fails its log directory and stops (exit code 4, CRITICAL), the others take over and every
  acknowledged record stays readable.

Without the scrubber the bad batch waits, unseen, for the day a consumer reads from there or this replica
becomes the leader; by then the intact copies may be gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from faultkit import (
    assert_every_acknowledged_record_once_in_order,
    flip_in_records,
    partition_consumer,
    read_until,
    replica_batches,
    replica_segments,
)
from opskit import produce_acked, sample_values
from waiting import wait_for

from client.admin import Admin, NewTopic
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

BOUND_S = 60.0
TOPIC_CONFIGS = {"min.insync.replicas": "2", "segment.bytes": "16384"}
RECORDS = 240
EXIT_LOG_DIR_FAILURE = 4  # broker/server.py


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("scrubber") / "c", nodes=3, overrides={
            "log.scrubber.interval.ms": "1000", "log.scrubber.bytes.per.second": str(100 << 20)}) as c:
        yield c


def _create(cluster: LocalCluster, topic: str, replicas: list[int]) -> list[bytes]:
    with Admin(cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 3, dict(TOPIC_CONFIGS), replica_assignments=[replicas])])
    wait_for(lambda: _leader_isr(cluster, topic) == (replicas[0], 3), BOUND_S,
             lambda: f"{topic}-0 led by {replicas[0]} with 3 in-sync replicas: {_leader_isr(cluster, topic)}")
    values = [b"%s-%05d-" % (topic.encode(), i) + b"v" * 200 for i in range(RECORDS)]
    produce_acked(cluster, topic, values)
    return values


def _leader_isr(cluster: LocalCluster, topic: str) -> tuple[int, int] | None:
    try:
        with Admin(cluster.bootstrap_servers, request_timeout_ms=5000) as admin:
            p = admin.describe_topics([topic])[topic].partitions[0]
    except Exception:  # noqa: BLE001 - a broker stopping: asked again
        return None
    return p.leader, len(p.isr)



def _found(cluster: LocalCluster, broker: int) -> float:
    try:
        values = sample_values(cluster.read_metrics(broker), "brook_log_scrubber_corrupt_batches_total")
    except Exception:  # noqa: BLE001 - stopped
        return -1.0
    return values[0] if values else 0.0



def _read_all(cluster: LocalCluster, topic: str, acked: list[bytes], where: str) -> None:
    with partition_consumer(cluster, topic) as consumer:
        read = read_until(consumer, topic, len(acked), timeout_s=BOUND_S, describe=lambda: where)
    assert_every_acknowledged_record_once_in_order(read, acked, where)


def test_a_followers_corrupt_batch_is_found_by_the_scrubber_and_fetched_back_at_its_restart(
        cluster: LocalCluster) -> None:
    topic = "scrubbed-follower"
    follower = 2
    acked = _create(cluster, topic, [1, follower, 3])
    segments = replica_segments(cluster, follower, topic)
    assert len(segments) >= 3, segments
    bad = flip_in_records(segments[0], 1)
    wait_for(lambda: _found(cluster, follower) >= 1, BOUND_S,
             lambda: f"broker {follower}'s scrubber to find the batch at offset {bad}: {cluster.log_tail(follower)}")
    # The counter moves before the scrubber hands the batch to the replica manager, which marks it for a rescan (a
    # checkpoint written and synced) and only then logs what it decided: wait for that line, do not race it.
    wait_for(lambda: all(s in cluster.node_log(follower).read_text(errors="replace")
                         for s in (f"(base offset {bad})", "found by the log scrubber")), BOUND_S,
             lambda: f"broker {follower}'s log to say what it does with the batch: {cluster.log_tail(follower)}")
    assert cluster.is_running(follower), "a follower that found a corrupt batch stopped"
    acked += [b"after-the-find-%03d" % i for i in range(20)]
    produce_acked(cluster, topic, acked[-20:])

    cluster.stop_node(follower)
    cluster.start_node(follower)
    wait_for(lambda: _leader_isr(cluster, topic) == (1, 3), BOUND_S, f"broker {follower} back in the ISR")
    end = len(acked)
    sizes: dict[int, int] = {}

    def identical() -> bool:
        per = {b: replica_batches(cluster, b, topic, end) for b in (1, 2, 3)}
        sizes.update({b: len(v) for b, v in per.items()})
        return per[1] == per[2] == per[3]
    wait_for(identical, BOUND_S, lambda: f"the replicas byte-identical below {end}: batches {sizes}", poll_s=0.5)
    assert f"a read found a corrupt batch at offset {bad}" in cluster.node_log(follower).read_text(errors="replace")
    _read_all(cluster, topic, acked, "after the follower was repaired")


def test_a_leaders_corrupt_batch_found_by_the_scrubber_stops_it_and_the_others_serve_everything(
        cluster: LocalCluster) -> None:
    topic = "scrubbed-leader"
    leader = 3
    acked = _create(cluster, topic, [leader, 1, 2])
    segments = replica_segments(cluster, leader, topic)
    assert len(segments) >= 3, segments
    bad = flip_in_records(segments[1], 0)
    wait_for(lambda: not cluster.is_running(leader), BOUND_S,
             lambda: f"broker {leader} to stop once its scrubber found the batch at offset {bad}")
    assert cluster.returncode(leader) == EXIT_LOG_DIR_FAILURE, cluster.log_tail(leader)
    assert "found by the log scrubber" in cluster.node_log(leader).read_text(errors="replace"), \
        cluster.log_tail(leader)
    wait_for(lambda: (_leader_isr(cluster, topic) or (-1, 0))[0] in (1, 2), BOUND_S, f"a new leader of {topic}-0")
    _read_all(cluster, topic, acked, f"with broker {leader} stopped")
    cluster.start_node(leader)
    wait_for(lambda: (_leader_isr(cluster, topic) or (-1, 0))[1] == 3, BOUND_S, f"broker {leader} back in the ISR")


def test_a_broker_killed_in_the_middle_of_a_pass_resumes_it_after_its_restart(tmp_path: Path) -> None:
    """A pass over a large disk takes days; brokers restart more often. Killed with -9 in the middle of a pass,
    a broker resumes it where its last checkpoint says: the resumed pass reads exactly the segments (the active
    one too) from the checkpointed position on, not the log again from its start."""
    from storage.checkpoints import SCRUBBER_CHECKPOINT, ScrubberCheckpointFile

    topic = "scrubbed-resumed"
    with LocalCluster(tmp_path / "c", nodes=1, overrides={
            "log.scrubber.interval.ms": "3000", "log.scrubber.bytes.per.second": "16384",
            "replica.high.watermark.checkpoint.interval.ms": "100"}) as single:
        with Admin(single.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(topic, 1, 1, {"segment.bytes": "16384"})])
        produce_acked(single, topic, [b"%05d-" % i + b"v" * 200 for i in range(480)])
        segments = replica_segments(single, 1, topic)
        assert len(segments) >= 6, segments
        checkpoint = ScrubberCheckpointFile(single.node_dir(1) / "data" / SCRUBBER_CHECKPOINT)
        third = int(segments[2].stem)

        def position() -> int:
            progress = checkpoint.read_or_none()
            return progress[2].get((topic, 0), -1) if progress is not None and progress[0] else -1
        # At 16 KiB/s a segment takes the scrubber about a second.
        wait_for(lambda: position() >= third, BOUND_S, lambda: f"the pass checkpointed past two segments: {position()}",
                 poll_s=0.05)
        single.kill_node(1)
        resumed_at = position()  # what the killed broker last wrote
        every = replica_segments(single, 1, topic)  # nothing is written after the kill: the sizes stay
        assert resumed_at >= third, f"the killed broker's last checkpoint: {checkpoint.read_or_none()}"
        expected = sum(p.stat().st_size for p in every if int(p.stem) >= resumed_at)
        single.start_node(1)

        # One scrape for both figures, as soon as the resumed pass ended: the next pass starts an interval
        # (3 s) later, and its reads would count too.
        scraped: dict[str, float] = {}

        def resumed_pass_ended() -> bool:
            try:
                text = single.read_metrics(1)
            except Exception:  # noqa: BLE001 - still starting
                return False
            figures = {name: (sample_values(text, f"brook_log_scrubber_{name}_total") or [0.0])[0]
                       for name in ("passes", "bytes")}
            scraped.update(figures)
            return figures["passes"] >= 1
        wait_for(resumed_pass_ended, BOUND_S, "the resumed pass to end", poll_s=0.05)
        total = sum(p.stat().st_size for p in every)
        assert scraped == {"passes": 1, "bytes": expected}, (
            f"the resumed pass: {scraped}; expected {expected} bytes (the segments from offset "
            f"{resumed_at} on), {total} for the whole log")
        wait_for(lambda: position() == -1 and (checkpoint.read_or_none() or (0, 0))[1] > 0, BOUND_S,
                 lambda: f"the ended pass checkpointed: {checkpoint.read_or_none()}")
