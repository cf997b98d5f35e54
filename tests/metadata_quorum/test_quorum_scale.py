"""Scale: 10,000 partitions (100 topics x 100, RF 3, 3 brokers) created, followed, snapshotted, restarted.

Prints the figures the issue asks for: time to create, snapshot size, restart time.
"""

from __future__ import annotations

import pickle
import signal
import threading
import time
from pathlib import Path

import pytest
from quorum_helpers import register_brokers
from waiting import wait_for

from metadata_quorum.client import ControllerClient
from metadata_quorum.local_quorum import LocalQuorum
from metadata_quorum.raft import DUMP_FILE, load_snapshot_file
from proto import controller_pb2 as pb
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow

TOPICS = 100
PARTITIONS = 100


class MetadataFollower:
    """What a broker's metadata cache does with the WatchMetadata stream."""

    def __init__(self, client: ControllerClient) -> None:
        self.client = client
        self.version = 0
        self.snapshots = 0
        self.updates = 0
        self.partitions: dict[tuple[str, int], pb.PartitionRecord] = {}
        self.topics: dict[str, pb.TopicRecord] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            for update in self.client.watch(0, broker_id=1):
                if update.is_snapshot:
                    self.snapshots += 1
                    self.partitions.clear()
                    self.topics.clear()
                for t in update.topics:
                    self.topics[t.topic_id] = t
                for p in update.partitions:
                    self.partitions[(p.topic_id, p.partition)] = p
                for topic_id in update.deleted_topic_ids:
                    self.topics.pop(topic_id, None)
                self.updates += 1
                self.version = update.version
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_ten_thousand_partitions(tmp_path: Path) -> None:
    quorum = LocalQuorum(tmp_path, extra_args=["--session-timeout-ms", "120000", "--snapshot-min-entries", "50",
                                               "--snapshot-min-interval-s", "1"])
    quorum.start()
    try:
        with quorum.client(timeout_s=60) as client, quorum.client(timeout_s=60) as watch_client:
            register_brokers(client, [1, 2, 3], quorum.cluster_id)
            # One voter is down during the creates: it must catch up from the leader's snapshot.
            lagging = next(n for n in quorum.voters if n != quorum.active_id())
            quorum.kill(lagging, signal.SIGKILL)
            follower = MetadataFollower(watch_client)
            follower.thread.start()
            started = time.monotonic()
            response = client.call("CreateTopics", pb.CreateTopicsRequest(timeout_ms=60000, topics=[
                pb.CreatableTopic(name=f"scale-{i:03d}", num_partitions=PARTITIONS, replication_factor=3)
                for i in range(TOPICS)]), timeout_s=90)
            create_s = time.monotonic() - started
            assert all(r.error_code == ErrorCode.NONE for r in response.results), \
                [r for r in response.results if r.error_code][:3]
            cluster = client.call("DescribeCluster", pb.DescribeClusterRequest())
            assert len(cluster.partitions) == TOPICS * PARTITIONS
            leaders: dict[int, int] = {}
            for p in cluster.partitions:
                leaders[p.leader] = leaders.get(p.leader, 0) + 1
            assert set(leaders) == {1, 2, 3} and max(leaders.values()) - min(leaders.values()) <= 2, leaders

            wait_for(lambda: follower.error is not None or follower.version >= cluster.metadata_version, 60,
                     "the watcher to reach the created version")
            assert follower.error is None, follower.error
            followed_s = time.monotonic() - started
            assert len(follower.partitions) == TOPICS * PARTITIONS and len(follower.topics) == TOPICS
            by_key = {(p.topic_id, p.partition): p for p in cluster.partitions}
            assert all(follower.partitions[k] == by_key[k] for k in by_key)

            leader = quorum.active_id()
            dump = quorum.data_dir(leader) / DUMP_FILE
            quorum.start_node(lagging)

            def has_everything(path: Path) -> bool:
                if not path.exists():
                    return False
                try:
                    return load_snapshot_file(path).partition_count() == TOPICS * PARTITIONS
                except (OSError, EOFError, ValueError, KeyError, pickle.UnpicklingError):  # being replaced
                    return False
            # Compaction runs at least every second here.
            wait_for(lambda: has_everything(dump), 30, f"a snapshot with every partition in {dump}")
            lagging_dump = quorum.data_dir(lagging) / DUMP_FILE
            wait_for(lambda: has_everything(lagging_dump), 30, f"voter {lagging} to catch up from the snapshot")
            snapshot_bytes = dump.stat().st_size
            version = cluster.metadata_version

            for n in quorum.voters:
                quorum.kill(n, signal.SIGKILL)
            restart_started = time.monotonic()
            quorum.start()
            restarted = client.call("DescribeCluster", pb.DescribeClusterRequest())
            restart_s = time.monotonic() - restart_started
            assert len(restarted.partitions) == TOPICS * PARTITIONS and restarted.metadata_version >= version
            print(f"\n{TOPICS * PARTITIONS} partitions ({TOPICS} topics x {PARTITIONS}, RF 3, 3 brokers): "
                  f"created in {create_s:.2f}s, followed through WatchMetadata after {followed_s:.2f}s "
                  f"({follower.updates} updates, {follower.snapshots} snapshot); snapshot {snapshot_bytes / 1024:.0f} KiB; "
                  f"full restart (SIGKILL all 3) serving again in {restart_s:.2f}s")
    finally:
        quorum.stop()
