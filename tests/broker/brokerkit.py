"""Test helpers for multi-process broker tests: talk to real brokers through the generated stubs.

Batches are built with storage.record_batch.RecordBatchBuilder (CODEC) and sent in
ProduceRequests exactly as a client would; partition state comes from the controller's
DescribeCluster; replica logs are read straight from each node's segment files.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from waiting import wait_for as wait_until

from client.security import make_channel
from deploy.local.cluster import LocalCluster
from metadata_quorum.client import ControllerClient
from proto import broker_pb2, broker_pb2_grpc, controller_pb2
from proto.errors import ErrorCode
from storage.record_batch import RecordBatchBuilder, decode_records, iter_batches

FAST_FAILURE_DETECTION = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "300",
    "replica.lag.time.max.ms": "2500",
    "replica.fetch.wait.max.ms": "300",
}


# Time for a paused follower's in-flight long-poll fetch to be answered (into its socket
# buffer): after this, nothing the leader appends reaches it until it resumes.
FETCH_DRAIN_S = 2 * int(FAST_FAILURE_DETECTION["replica.fetch.wait.max.ms"]) / 1000 + 0.2


def make_batch(*values: bytes, timestamp_ms: int | None = None) -> bytes:
    b = RecordBatchBuilder()
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    for v in values:
        b.append(ts, None, v)
    return b.build()


class Kit:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.cc = ControllerClient(cluster.controller_endpoints, timeout_s=15, security=cluster.security)
        self._channels: dict[int, grpc.Channel] = {}

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self.cc.close()

    def stub(self, node_id: int) -> broker_pb2_grpc.BrokerServiceStub:
        ch = self._channels.get(node_id)
        if ch is None:
            ch = self._channels[node_id] = make_channel(self.cluster.broker_address(node_id), self.cluster.security)
        return broker_pb2_grpc.BrokerServiceStub(ch)

    # ---- controller side ----
    def create_topic(self, name: str, *, partitions: int = 1, rf: int = 3, configs: dict[str, str] | None = None,
                     timeout_s: float = 20, assignments: list[list[int]] | None = None) -> None:
        topic = controller_pb2.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf,
                                              configs=configs or {})
        if assignments:
            topic.num_partitions, topic.replication_factor = -1, -1
            topic.assignments.extend(controller_pb2.ReplicaList(replicas=a) for a in assignments)
        resp = self.cc.call("CreateTopics", controller_pb2.CreateTopicsRequest(topics=[topic]))
        assert resp.results[0].error_code == ErrorCode.NONE, resp
        for p in range(partitions):
            wait_until(lambda p=p: self.isr_size(name, p) == rf and self.broker_knows_leader(name, p),
                       timeout_s, f"{name}-{p} fully in sync and led")

    def alter_topic_config(self, name: str, configs: dict[str, str]) -> None:
        resp = self.cc.call("AlterConfigs", controller_pb2.AlterConfigsRequest(
            resources=[controller_pb2.AlterConfigsResource(topic=name, set=configs)]))
        assert all(r.error_code == ErrorCode.NONE for r in resp.results), resp

    def state(self, topic: str, partition: int = 0) -> controller_pb2.PartitionRecord:
        resp = self.cc.call("DescribeCluster", controller_pb2.DescribeClusterRequest())
        for p in resp.partitions:
            if p.topic == topic and p.partition == partition:
                return p
        raise AssertionError(f"no partition {topic}-{partition} in {resp.partitions}")

    def leader(self, topic: str, partition: int = 0) -> int:
        return self.state(topic, partition).leader

    def isr_size(self, topic: str, partition: int = 0) -> int:
        return len(self.state(topic, partition).isr)

    def broker_knows_leader(self, topic: str, partition: int = 0) -> bool:
        """The controller's leader has taken over the partition at the current epoch (serves requests)."""
        st = self.state(topic, partition)
        if st.leader < 0:
            return False
        try:
            resp = self.stub(st.leader).ListOffsets(broker_pb2.ListOffsetsRequest(
                replica_id=-1, partitions=[broker_pb2.ListOffsetsPartition(
                    topic=topic, partition=partition, timestamp=-1, current_leader_epoch=st.leader_epoch)]),
                timeout=2)
        except grpc.RpcError:
            return False
        return resp.partitions[0].error_code == ErrorCode.NONE

    def isr_seen_by(self, node_id: int, topic: str, partition: int = 0) -> list[int]:
        """The ISR as broker ``node_id`` currently applies it (its Metadata answer)."""
        md = self.stub(node_id).Metadata(broker_pb2.MetadataRequest(topics=[topic]), timeout=2)
        for t in md.topics:
            for p in t.partitions:
                if p.partition == partition:
                    return list(p.isr)
        return []

    def heal(self) -> None:
        """Every node running and unpaused; the cluster ready again."""
        for node_id in self.cluster.node_ids:
            if node_id in getattr(self.cluster, "_paused", set()):
                self.cluster.resume_node(node_id)
            if not self.cluster.is_running(node_id):
                self.cluster.start_node(node_id)
        self.cluster.wait_ready(60)

    # ---- broker side ----
    def produce(self, topic: str, partition: int, batch: bytes, *, acks: int = -1, timeout_ms: int = 5000,
                node_id: int | None = None) -> broker_pb2.ProducePartitionResponse:
        target = self.leader(topic, partition) if node_id is None else node_id
        resp = self.stub(target).Produce(broker_pb2.ProduceRequest(
            acks=acks, timeout_ms=timeout_ms,
            partitions=[broker_pb2.ProducePartitionData(topic=topic, partition=partition, records=batch)]),
            timeout=timeout_ms / 1000 + 10)
        return resp.partitions[0]

    def fetch(self, node_id: int, topic: str, partition: int, offset: int, *, max_bytes: int = 4 << 20,
              max_wait_ms: int = 0, min_bytes: int = 0) -> broker_pb2.FetchPartitionResponse:
        resp = self.stub(node_id).Fetch(broker_pb2.FetchRequest(
            replica_id=-1, replica_epoch=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
            partitions=[broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset,
                                                  partition_max_bytes=max_bytes, current_leader_epoch=-1,
                                                  last_fetched_epoch=-1, log_start_offset=-1)]),
            timeout=max_wait_ms / 1000 + 10)
        return resp.partitions[0]

    def consume_all(self, topic: str, partition: int = 0) -> tuple[dict[int, bytes | None], bytes, int]:
        """Every committed record from the leader: ({offset: value}, raw batch bytes, high watermark)."""
        leader = self.leader(topic, partition)
        offset, raw, hw = 0, bytearray(), -1
        values: dict[int, bytes | None] = {}
        for _ in range(100_000):
            r = self.fetch(leader, topic, partition, offset)
            assert r.error_code == ErrorCode.NONE, r
            hw = r.high_watermark
            if not r.records:
                break
            raw += r.records
            for rec in decode_records(r.records):
                values[rec.offset] = rec.value
            offset = max(values) + 1
            if offset >= hw:
                break
        return values, bytes(raw), hw


def replica_log_bytes(cluster: LocalCluster, node_id: int, topic: str, partition: int, upto_offset: int) -> bytes:
    """Whole batches below ``upto_offset`` as stored on ``node_id``'s disk (read from its segment files)."""
    pdir = next(Path(cluster.node_dir(node_id)).glob(f"**/{topic}-{partition}"))
    out = bytearray()
    for seg in sorted(pdir.glob("*.log")):
        data = seg.read_bytes()
        for pos, h in iter_batches(data):
            if h.next_offset > upto_offset:
                return bytes(out)
            out += data[pos:pos + h.size]
    return bytes(out)


@contextlib.contextmanager
def running_kit(base: Path, *, nodes: int, mode: str = "combined",
                overrides: dict[str, str] | None = None) -> Iterator[Kit]:
    """A started LocalCluster wrapped in a Kit; closed and torn down on exit (for module fixtures)."""
    cluster = LocalCluster(base, nodes=nodes, mode=mode, overrides=overrides or {})
    try:
        cluster.start()
        cluster.wait_ready(90)
        k = Kit(cluster)
        try:
            yield k
        finally:
            k.close()
    finally:
        cluster.teardown()
