"""What the ``brook`` commands ask of a cluster, in one place.

Built on the client library: ``client.cluster.ClusterClient`` (broker metadata, leader
routing), ``metadata_quorum.client.ControllerClient`` (topic and config administration,
cluster and quorum descriptions; found through the brokers' metadata, like Kafka's admin
client) and ``client.coordinator.GroupCoordinatorClient`` (consumer groups). Every call
has the command's deadline; failures surface as ``BrookError`` subclasses, or as
``Unreachable`` when no broker answers at all.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from client.cluster import ClusterClient
from client.types import ClusterMetadata, TopicMetadata
from proto import controller_pb2, errors, group_pb2, group_pb2_grpc

POLL_INTERVAL_S = 0.2


class Unreachable(Exception):
    """No broker of the bootstrap list answered."""


class Backend:
    def __init__(self, bootstrap: str, timeout_s: float) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._cluster: ClusterClient | None = None
        self._controller: Any = None

    # ------------------------------------------------------------------ connections

    @property
    def cluster(self) -> ClusterClient:
        if self._cluster is None:
            self._cluster = ClusterClient(self.bootstrap, request_timeout_ms=int(self.timeout_s * 1000))
        return self._cluster

    def metadata(self, topics: list[str] | None = None) -> ClusterMetadata:
        try:
            return self.cluster.metadata(topics, refresh=True)
        except errors.BrookError as e:
            if e.code in (errors.ErrorCode.REQUEST_TIMED_OUT, errors.ErrorCode.NETWORK_EXCEPTION,
                          errors.ErrorCode.BROKER_NOT_AVAILABLE, errors.ErrorCode.UNKNOWN_SERVER_ERROR):
                raise Unreachable(f"cannot reach the cluster at {self.bootstrap} ({e.message})") from None
            raise

    @property
    def controller(self) -> Any:
        if self._controller is None:
            from metadata_quorum.client import ControllerClient

            endpoints = self.metadata().controllers
            if not endpoints:
                raise errors.BrokerNotAvailableError("the brokers did not name any controller")
            self._controller = ControllerClient(list(endpoints), timeout_s=self.timeout_s)
        return self._controller

    def controller_call(self, method: str, request: Any) -> Any:
        return self.controller.call(method, request, timeout_s=self.timeout_s)

    def close(self) -> None:
        if self._controller is not None:
            self._controller.close()
        if self._cluster is not None:
            self._cluster.close()

    # ------------------------------------------------------------------ cluster

    def describe_cluster(self) -> controller_pb2.DescribeClusterResponse:
        return self.controller_call("DescribeCluster", controller_pb2.DescribeClusterRequest())

    def describe_quorum(self) -> controller_pb2.DescribeQuorumResponse:
        return self.controller_call("DescribeQuorum", controller_pb2.DescribeQuorumRequest())

    # ------------------------------------------------------------------ topics

    def topic(self, name: str) -> TopicMetadata:
        meta = self.metadata([name])
        info = meta.topics.get(name)
        if info is None or info.error_code == errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise errors.UnknownTopicOrPartitionError(f"topic '{name}' does not exist")
        if info.error_code:
            raise errors.error_for(info.error_code, info.error_message or f"topic '{name}'")
        return info

    def create_topic(self, name: str, partitions: int, replication_factor: int, configs: Mapping[str, str],
                     *, validate_only: bool = False) -> controller_pb2.TopicResult:
        req = controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=name, num_partitions=partitions,
                                                  replication_factor=replication_factor, configs=dict(configs))],
            validate_only=validate_only, timeout_ms=int(self.timeout_s * 1000))
        return _first_ok(self.controller_call("CreateTopics", req).results)

    def wait_for_leaders(self, name: str, partitions: int | None = None) -> bool:
        """Poll broker metadata until every partition of ``name`` has a leader (bounded)."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            info = self.metadata([name]).topics.get(name)
            if info is not None and info.error_code == 0 and info.partitions and \
                    (partitions is None or len(info.partitions) >= partitions) and \
                    all(p.leader >= 0 for p in info.partitions.values()):
                return True
            time.sleep(POLL_INTERVAL_S)
        return False

    def delete_topics(self, names: Sequence[str]) -> list[controller_pb2.TopicResult]:
        req = controller_pb2.DeleteTopicsRequest(names=list(names), timeout_ms=int(self.timeout_s * 1000))
        results = list(self.controller_call("DeleteTopics", req).results)
        for r in results:
            errors.raise_for(r.error_code, r.error_message or f"topic '{r.name}'")
        return results

    def wait_for_deletion(self, names: Sequence[str]) -> bool:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            topics = self.metadata().topics
            if not any(n in topics and topics[n].error_code == 0 for n in names):
                return True
            time.sleep(POLL_INTERVAL_S)
        return False

    def create_partitions(self, name: str, count: int, *, validate_only: bool = False) -> controller_pb2.TopicResult:
        req = controller_pb2.CreatePartitionsRequest(
            topics=[controller_pb2.CreatePartitionsTopic(name=name, count=count)], validate_only=validate_only,
            timeout_ms=int(self.timeout_s * 1000))
        return _first_ok(self.controller_call("CreatePartitions", req).results)

    def describe_configs(self, name: str) -> list[controller_pb2.ConfigEntry]:
        resp = self.controller_call("DescribeConfigs", controller_pb2.DescribeConfigsRequest(topics=[name]))
        for r in resp.results:
            errors.raise_for(r.error_code, r.error_message or f"topic '{name}'")
            return list(r.entries)
        raise errors.UnknownTopicOrPartitionError(f"topic '{name}' does not exist")

    def alter_configs(self, name: str, set_: Mapping[str, str], delete: Sequence[str],
                      *, validate_only: bool = False) -> controller_pb2.TopicResult:
        req = controller_pb2.AlterConfigsRequest(
            resources=[controller_pb2.AlterConfigsResource(topic=name, set=dict(set_), delete=list(delete))],
            validate_only=validate_only)
        return _first_ok(self.controller_call("AlterConfigs", req).results)

    # ------------------------------------------------------------------ groups

    def _group_client(self, group_id: str) -> Any:
        from client.coordinator import GroupCoordinatorClient

        return GroupCoordinatorClient(self.cluster, group_id, request_timeout_ms=int(self.timeout_s * 1000))

    def list_groups(self, states: Sequence[str] = ()) -> list[group_pb2.ListedGroup]:
        """Every broker coordinates some groups: ask them all (like Kafka's ListGroups fan-out)."""
        meta = self.metadata()
        out: list[group_pb2.ListedGroup] = []
        for node_id, broker in sorted(meta.brokers.items()):
            if broker.fenced:
                continue
            stub = group_pb2_grpc.GroupCoordinatorServiceStub(self.cluster.broker_channel(node_id))
            try:
                resp = stub.ListGroups(group_pb2.ListGroupsRequest(states=list(states)), timeout=self.timeout_s)
            except grpc.RpcError as e:
                raise errors.BrokerNotAvailableError(f"broker {node_id} ({broker.address}): {e.code().name}") \
                    from None
            errors.raise_for(resp.error_code, resp.error_message)
            out.extend(resp.groups)
        return sorted(out, key=lambda g: g.group_id)

    def describe_group(self, group_id: str) -> group_pb2.DescribedGroup:
        client = self._group_client(group_id)
        resp = client.call("DescribeGroups", group_pb2.DescribeGroupsRequest(group_ids=[group_id],
                                                                             include_offsets=True), check=False)
        for g in resp.groups:
            errors.raise_for(g.error_code, g.error_message or f"group '{group_id}'")
            if g.state in ("Dead", "") and not g.members and not g.offsets:
                break  # Kafka answers an unknown group with state Dead: report it as missing
            return g
        raise errors.GroupIdNotFoundError(f"group '{group_id}' does not exist")

    def delete_groups(self, group_ids: Sequence[str]) -> None:
        for gid in group_ids:
            resp = self._group_client(gid).call("DeleteGroups", group_pb2.DeleteGroupsRequest(group_ids=[gid]),
                                                check=False)
            for r in resp.results:
                errors.raise_for(r.error_code, r.error_message or f"group '{gid}'")

    def alter_group_offsets(self, group_id: str, specs: list[group_pb2.OffsetResetSpec],
                            *, dry_run: bool) -> list[group_pb2.ResolvedOffset]:
        req = group_pb2.AlterGroupOffsetsRequest(group_id=group_id, specs=specs, dry_run=dry_run)
        resp = self._group_client(group_id).call("AlterGroupOffsets", req)
        errors.raise_for(resp.error_code, resp.error_message or f"group '{group_id}'")
        for p in resp.partitions:
            errors.raise_for(p.error_code, p.error_message or f"{p.topic}-{p.partition}")
        return list(resp.partitions)


def _first_ok(results: Sequence[Any]) -> Any:
    for r in results:
        errors.raise_for(r.error_code, r.error_message or f"topic '{r.name}'")
        return r
    raise errors.UnknownServerError("the controller returned no result")
