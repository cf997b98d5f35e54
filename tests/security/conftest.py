"""A real secured cluster (3 combined nodes, separate processes) shared by the security tests.

StandardAuthorizer on, ``admin`` and ``broker`` bootstrap SCRAM users (super users), the
nodes authenticating to each other as ``broker``. Every other principal starts with no
ACL at all, so it may do nothing until a test grants it something.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from folder_scope import close_when_folder_done
from opskit_security import ADMIN_PASSWORD, SECURE_OVERRIDES, sasl

from client.admin import Admin
from deploy.local.cluster import ClusterError, LocalCluster
from metadata_quorum.security import acl_binding


def not_ready(cluster: LocalCluster, admin: Admin) -> str | None:
    for node_id in cluster.node_ids:
        if not cluster.is_running(node_id):
            return f"node {node_id} exited ({cluster.returncode(node_id)})"
    try:
        desc = admin.describe_cluster()
    except Exception as exc:  # noqa: BLE001 - any failure means "not yet"; the last one is reported
        return f"describe_cluster as admin: {exc}"
    registered = {b.node_id: b for b in desc.brokers}
    missing = [b for b in cluster.broker_ids if b not in registered or registered[b].fenced]
    return f"brokers not registered/unfenced: {missing}" if missing else None


@pytest.fixture(scope="session")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base: Path = tmp_path_factory.mktemp("secure-cluster")
    # At level 1 (a new cluster starts at the highest): the feature tests here raise it step by step.
    cluster = LocalCluster(base, nodes=3, mode="combined", overrides={**SECURE_OVERRIDES, "initial.metadata.version": "1"})
    teardown = close_when_folder_done(__file__, cluster.teardown)
    try:
        cluster.start()
        with Admin(cluster.bootstrap_servers, request_timeout_ms=10_000,
                   controller_endpoints=cluster.controller_endpoints, **sasl("admin", ADMIN_PASSWORD)) as admin:
            deadline = time.monotonic() + 120
            reason = not_ready(cluster, admin)
            while reason is not None and time.monotonic() < deadline:
                time.sleep(0.5)
                reason = not_ready(cluster, admin)
            if reason is not None:
                raise ClusterError(f"secure cluster not ready: {reason}\n{cluster.log_tail(cluster.node_ids[0], 60)}")
        yield cluster
    finally:
        teardown()


@pytest.fixture(scope="session")
def admin(secure_cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(secure_cluster.bootstrap_servers, request_timeout_ms=30_000,
               controller_endpoints=secure_cluster.controller_endpoints, **sasl("admin", ADMIN_PASSWORD)) as a:
        close_when_folder_done(__file__, a.close)
        yield a


def metadata_version_of(address: str) -> int:
    from client.sasl import ScramCredentials, scram_channel
    from proto import broker_pb2, broker_pb2_grpc

    with scram_channel(address, ScramCredentials("admin", ADMIN_PASSWORD)) as ch:
        return broker_pb2_grpc.BrokerServiceStub(ch).Metadata(broker_pb2.MetadataRequest(), timeout=10).metadata_version


@pytest.fixture(scope="session")
def sync(secure_cluster: LocalCluster, admin: Admin) -> Callable[[], None]:
    """Wait until every broker has applied the quorum's current metadata (users, ACLs, quotas).

    Brokers learn security changes through the metadata stream like everything else, so
    a user created a moment ago may not be known to every broker yet (as in Kafka).
    """
    from waiting import wait_for

    def _sync() -> None:
        target = admin.describe_cluster().metadata_version  # read through the quorum: the committed version
        addresses = [secure_cluster.broker_address(b) for b in secure_cluster.broker_ids]
        wait_for(lambda: all(metadata_version_of(a) >= target for a in addresses), 30,
                 f"every broker to reach metadata version {target}")

    return _sync


@pytest.fixture
def grant(admin: Admin, sync: Callable[[], None]) -> Iterator[Callable[..., None]]:
    """grant(principal, operation, resource_type, name, pattern="LITERAL", permission="ALLOW", host="*");
    undone after."""
    made = []

    def _grant(principal: str, operation: str, resource_type: str, name: str, pattern: str = "LITERAL",
               permission: str = "ALLOW", host: str = "*") -> None:
        binding = acl_binding([resource_type, name, pattern, principal, host, operation, permission])
        admin.create_acls([binding])
        made.append(binding)
        sync()

    yield _grant
    if made:
        admin.delete_acls([{"resource_type": b.resource_type, "resource_name": b.resource_name,
                            "pattern_type": b.pattern_type, "principal": b.principal, "operation": b.operation,
                            "permission": b.permission, "host": b.host} for b in made])
