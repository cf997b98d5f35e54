"""A split cluster of real brook-server processes (3 controllers + 3 brokers, deploy.local.LocalCluster):
kill -9 of the active controller keeps every broker unfenced (leases are reset fairly on
failover), and metadata written through the new controller reaches the brokers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from client.cluster import ClusterClient
from deploy.local.cluster import LocalCluster
from metadata_quorum.client import ControllerClient
from proto import controller_pb2 as pb
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path, nodes=3, mode="split")
    try:
        c.start()
        c.wait_ready(90)
        yield c
    finally:
        c.stop()


def test_brokers_ride_through_a_controller_failover(cluster: LocalCluster) -> None:
    with ControllerClient(cluster.controller_endpoints, timeout_s=30) as controllers, \
            ClusterClient(cluster.bootstrap_servers) as brokers:
        before = controllers.call("CreateTopics", pb.CreateTopicsRequest(topics=[
            pb.CreatableTopic(name="before", num_partitions=3, replication_factor=3)]))
        assert before.results[0].error_code == ErrorCode.NONE, before
        old = controllers.call("DescribeQuorum", pb.DescribeQuorumRequest()).leader_id
        cluster.kill_node(old)
        killed_at = time.monotonic()
        after = controllers.call("CreateTopics", pb.CreateTopicsRequest(topics=[
            pb.CreatableTopic(name="after", num_partitions=3, replication_factor=3)]))
        assert after.results[0].error_code == ErrorCode.NONE, after
        print(f"\nsplit cluster: controller {old} killed, first write committed after "
              f"{time.monotonic() - killed_at:.2f}s")

        def brokers_see_after() -> bool:
            meta = brokers.metadata(["after"], refresh=True)
            topic = meta.topics.get("after")
            return topic is not None and len(topic.partitions) == 3 and \
                all(p.leader in (1, 2, 3) for p in topic.partitions.values())
        wait_for(brokers_see_after, 30, "brokers to serve metadata of the topic created after failover")
        # For a full session timeout (6 s in LocalCluster), no broker may be fenced by the failover.
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            state = controllers.call("DescribeCluster", pb.DescribeClusterRequest())
            fenced = [b.node_id for b in state.brokers if b.fenced]
            assert not fenced, f"brokers {fenced} were fenced by the failover"
            time.sleep(0.5)
        partitions = [p for p in state.partitions if p.topic in ("before", "after")]
        assert len(partitions) == 6 and all(len(p.isr) == 3 for p in partitions), partitions
