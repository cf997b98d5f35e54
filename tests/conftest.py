"""Suite-wide test setup.

Test folders are not packages; pytest's default (prepend) import mode puts each
conftest's folder on sys.path, so this file makes the shared helpers in tests/ (such as
``waiting.wait_for``) importable from every folder.
"""

import os

import pytest
from folder_scope import folder_of, leaving

# `make test` runs the suite on two pytest-xdist workers, each folder whole on one of them (its
# session fixtures, a shared cluster or the one SparkSession, are made once), longest folders first
# so the two finish together. Spark comes first: the first worker starts with it, so its JVM starts
# before that process has used gRPC (tests/spark/conftest.py). The order holds without xdist too.
FOLDERS_LONGEST_FIRST = ("spark", "ops", "metadata_quorum", "broker", "groups", "client", "kafka_compat",
                         "security", "kafka_wire", "sim", "storage", "chaos", "replication", "kafka_admin", "fuzz")

# Each worker starts its clusters on ports of its own: two processes picking "free" ports from one
# range could pick the same one before either binds it (deploy/local/cluster.py free_port).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    _n, _count = int(_WORKER[2:]), max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    _span = (32000 - 15000) // _count
    os.environ["BROOK_LOCAL_PORT_RANGE"] = f"{15000 + _n * _span}-{15000 + (_n + 1) * _span - 1}"


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scheduling by scope, the scope a test's folder under tests/ (one unit of work,
    run whole on one worker, in the collection order below)."""
    from xdist.scheduler import LoadScopeScheduling

    class FolderScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("::", 1)[0].split("/")
            return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[-1]

    return FolderScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {f: i for i, f in enumerate(FOLDERS_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(folder_of(item.path) or "", len(rank)))  # stable within a folder


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a folder (its fixtures torn down), close that folder's session fixtures
    registered with ``folder_scope.close_when_folder_done``."""
    here = folder_of(item.path)
    if nextitem is None or folder_of(nextitem.path) != here:
        leaving(here)
