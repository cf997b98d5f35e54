"""A real 3-node Brook cluster (combined nodes, brook-server processes) shared by the client's
integration tests that do not inject faults."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from folder_scope import close_when_folder_done

from client.admin import Admin, NewTopic
from deploy.local.cluster import LocalCluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("client-cluster"), nodes=3) as c:
        close_when_folder_done(__file__, c.stop)
        yield c


@pytest.fixture(scope="session")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(cluster.bootstrap_servers, request_timeout_ms=20000) as a:
        close_when_folder_done(__file__, a.close)
        yield a


@pytest.fixture
def new_topic(admin: Admin, request: pytest.FixtureRequest) -> Callable[..., str]:
    counter = iter(range(1000))

    def make(partitions: int = 3, replication_factor: int = 3, configs: dict[str, str] | None = None) -> str:
        name = f"{request.node.name.replace('[', '-').replace(']', '')}-{next(counter)}"[:200]
        admin.create_topics([NewTopic(name, partitions, replication_factor, configs or {})])
        return name

    return make
