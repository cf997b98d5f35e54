"""What the ``brook`` commands ask of a cluster, in one place.

Built on the client library: ``client.admin.Admin`` for topics, configs and consumer
groups, its ``ClusterClient`` for broker metadata, and its ``ControllerClient`` for the
raw cluster and quorum descriptions the health report needs (per-partition ISR, voter
connectivity). Every call has the command's deadline; failures surface as ``BrookError``
subclasses, or as ``Unreachable`` when no broker answers at all.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from client.admin import Admin, GroupDescription, GroupListing, NewTopic
from client.cluster import ClusterClient, as_timeout_ms, parse_bootstrap
from client.security import SecurityConfig
from client.types import ClusterMetadata, TopicMetadata, TopicPartition
from proto import controller_pb2, errors

_UNREACHABLE_CODES = (errors.ErrorCode.REQUEST_TIMED_OUT, errors.ErrorCode.NETWORK_EXCEPTION,
                      errors.ErrorCode.BROKER_NOT_AVAILABLE, errors.ErrorCode.UNKNOWN_SERVER_ERROR)


PROBE_ADDRESSES_MAX = 4  # resolved addresses tried per bootstrap server (a name may map to many)


class Unreachable(Exception):
    """No broker of the bootstrap list answered."""


def _dial(address: str, timeout_s: float) -> str | None:
    """None if something accepts TCP connections at ``address``, else why not ("refused", "unresolvable").

    Only definite answers count as failures: a timeout or an unreachable network may be
    transient, so it returns None and the normal retrying path decides within the deadline.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"cannot resolve host '{host}' ({e.strerror})"
    refused = ""
    for family, kind, proto, _, sockaddr in infos[:PROBE_ADDRESSES_MAX]:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout_s)
                sock.connect(sockaddr)
            return None
        except ConnectionRefusedError:
            refused = f"connection refused by {address}"
        except OSError:
            return None
    return refused or None


def probe_bootstrap(bootstrap: str, timeout_s: float) -> None:
    """Fail at once, like kcat's "all brokers down", when no bootstrap server can even be dialled.

    gRPC reports a refused connection and an unknown host as UNAVAILABLE, which the client
    retries (correctly: a broker may be restarting) until the deadline; for a one-shot
    command whose every bootstrap server refuses or does not resolve, waiting out --timeout
    only delays the answer. Once any server accepts a connection, a broker that restarts
    during the command is retried within --timeout as before.
    """
    reasons = []
    for address in parse_bootstrap(bootstrap):
        reason = _dial(address, timeout_s)
        if reason is None:
            return
        reasons.append(reason)
    raise Unreachable(f"cannot reach the cluster at {bootstrap}: {'; '.join(reasons)}")


@dataclass(frozen=True)
class ConfigValue:
    name: str
    value: str
    is_default: bool


class Backend:
    def __init__(self, bootstrap: str, timeout_s: float, security: SecurityConfig | None = None) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.security = security
        self._admin: Admin | None = None
        self._probed = False

    # ------------------------------------------------------------------ connections

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.bootstrap, request_timeout_ms=int(self.timeout_s * 1000),
                                security=self.security)
        return self._admin

    @property
    def cluster(self) -> ClusterClient:
        return self.admin.cluster

    def metadata(self, topics: list[str] | None = None) -> ClusterMetadata:
        if not self._probed:
            probe_bootstrap(self.bootstrap, min(self.timeout_s, 5.0))
            self._probed = True
        try:
            return self.cluster.metadata(topics, refresh=True)
        except errors.BrookError as e:
            if e.code in _UNREACHABLE_CODES:
                raise Unreachable(f"cannot reach the cluster at {self.bootstrap} ({e.message})") from None
            raise

    def controller_call(self, method: str, request: Any) -> Any:
        self.metadata()  # an unreachable cluster is reported as such, not as a controller error
        return self.admin.controller.call(method, request, timeout_s=self.timeout_s)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    # ------------------------------------------------------------------ cluster

    def describe_cluster(self) -> controller_pb2.DescribeClusterResponse:
        return self.controller_call("DescribeCluster", controller_pb2.DescribeClusterRequest())

    def describe_quorum(self) -> controller_pb2.DescribeQuorumResponse:
        """From the active controller, or from any voter when none is active (responder_id says which)."""
        self.metadata()
        return self.admin.controller.describe_quorum(timeout_s=self.timeout_s)

    # ------------------------------------------------------------------ topics

    def topic(self, name: str) -> TopicMetadata:
        self.metadata()
        try:
            return self.admin.describe_topics([name])[name]
        except errors.BrookError as e:
            if e.code == errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise errors.UnknownTopicOrPartitionError(f"topic '{name}' does not exist") from None
            raise

    def create_topic(self, name: str, partitions: int, replication_factor: int, configs: Mapping[str, str],
                     *, validate_only: bool = False) -> TopicMetadata | None:
        """Create (waiting until every partition has a leader); the new topic's metadata, None if validate_only."""
        self.metadata()
        self.admin.create_topics([NewTopic(name, partitions, replication_factor, dict(configs))],
                                 validate_only=validate_only)
        return None if validate_only else self.topic(name)

    def delete_topics(self, names: Sequence[str]) -> None:
        self.admin.delete_topics(names)

    def wait_for_deletion(self, names: Sequence[str]) -> bool:
        """Until a broker shows none of ``names``, then until every live broker has applied as much, so
        that the next command (ours or anyone's) finds them gone whichever broker it asks."""
        import time

        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            topics = self.metadata().topics
            if not any(n in topics and topics[n].error_code == 0 for n in names):
                self.admin.wait_for_brokers(self.cluster.metadata_snapshot().version,
                                            timeout_ms=as_timeout_ms(deadline - time.monotonic()))
                return True
            time.sleep(0.05)
        return False

    def create_partitions(self, name: str, count: int, *, validate_only: bool = False) -> None:
        self.admin.create_partitions({name: count}, validate_only=validate_only,
                                     timeout_ms=int(self.timeout_s * 1000))

    def describe_configs(self, name: str) -> list[ConfigValue]:
        entries = self.admin.describe_configs([name]).get(name)
        if entries is None:
            raise errors.UnknownTopicOrPartitionError(f"topic '{name}' does not exist")
        return [ConfigValue(e.name, e.value, e.is_default) for e in sorted(entries.values(), key=lambda e: e.name)]

    def alter_configs(self, name: str, set_: Mapping[str, str], delete: Sequence[str],
                      *, validate_only: bool = False) -> None:
        self.admin.alter_configs(name, set=dict(set_), delete=list(delete), validate_only=validate_only)

    # ------------------------------------------------------------------ groups

    def list_groups(self, states: Sequence[str] = ()) -> list[GroupListing]:
        self.metadata()
        return self.admin.list_groups(states)

    def describe_group(self, group_id: str) -> GroupDescription:
        self.metadata()
        g = self.admin.describe_groups([group_id]).get(group_id)
        if g is None or (g.state in ("Dead", "") and not g.members and not g.offsets):
            # Kafka answers an unknown group with state Dead: report it as missing.
            raise errors.GroupIdNotFoundError(f"group '{group_id}' does not exist")
        return g

    def delete_groups(self, group_ids: Sequence[str]) -> dict[str, errors.BrookError | None]:
        """Each group's outcome: None (deleted) or its error."""
        return self.admin.delete_groups(group_ids, raise_on_error=False)

    def remove_group_members(self, group_id: str, instance_ids: Sequence[str]) -> None:
        self.admin.remove_group_members(group_id, instance_ids)

    def reset_group_offsets(self, group_id: str, topic: str, partition: int, kind: str, value: int,
                            *, dry_run: bool) -> dict[TopicPartition, tuple[int, int]]:
        return self.admin.reset_group_offsets(group_id, [(topic, partition, kind, value)], dry_run=dry_run)
