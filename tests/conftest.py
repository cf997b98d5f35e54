"""Suite-wide test setup.

Test folders are not packages; pytest's default (prepend) import mode puts each
conftest's folder on sys.path, so this file makes the shared helpers in tests/ (such as
``waiting.wait_for``) importable from every folder.
"""

import os

import pytest
from folder_scope import folder_of, leaving

# `make test` runs the suite on three pytest-xdist workers, each folder whole on one of them (its
# session fixtures, a shared cluster or the one SparkSession, are made once), longest folders first
# so the workers finish together. Spark comes first: the first worker starts with it, so its JVM starts
# before that process has used gRPC (tests/spark/conftest.py). The order holds without xdist too.
FOLDERS_LONGEST_FIRST = ("spark", "ops", "faults", "metadata_quorum", "broker", "groups", "client", "kafka_compat",
                         "security", "kafka_wire", "sim", "storage", "chaos", "replication", "kafka_admin", "fuzz", "txn")
# While this folder runs, one other worker runs beside it and the rest wait (see FolderScheduling).
RUNS_WITH_ONE_OTHER = "spark"

# Each worker starts its clusters on ports of its own: two processes picking "free" ports from one
# range could pick the same one before either binds it (deploy/local/cluster.py free_port).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit():
    _n, _count = int(_WORKER[2:]), max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    _span = (32000 - 15000) // _count
    os.environ["BROOK_LOCAL_PORT_RANGE"] = f"{15000 + _n * _span}-{15000 + (_n + 1) * _span - 1}"


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scheduling by scope, the scope a test's folder under tests/ (one unit of work,
    run whole on one worker, in the collection order below).

    Most of a cluster test's time is waiting for a fault to be noticed, so three workers fit on 2
    cores, but not beside the Spark folder: its driver starts a Python process for each streaming
    query (about 1.8 s of CPU importing pyspark), and Spark gives it 10 s, a limit no option changes,
    to connect back. With three workers' clusters on the cores, one did not, and its query died.
    So while the Spark folder has tests to run, only one other worker takes work; the others start
    when it is over."""
    from xdist.scheduler import LoadScopeScheduling

    class FolderScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("::", 1)[0].split("/")
            return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[-1]

        def _unfinished(self, scope: str) -> bool:
            if scope in self.workqueue:
                return True
            return any(not all(work[scope].values()) for work in self.assigned_work.values() if scope in work)

        def _busy(self) -> list[object]:
            return [node for node, work in self.assigned_work.items() if self._pending_of(work)]

        def _assign_work_unit(self, node: object) -> None:
            if self._unfinished(RUNS_WITH_ONE_OTHER):
                busy = self._busy()
                if node not in busy and len(busy) >= 2:
                    return  # waits: given work once that folder is over (mark_test_complete)
            super()._assign_work_unit(node)

        def mark_test_complete(self, node: object, item_index: int, duration: float = 0) -> None:
            super().mark_test_complete(node, item_index, duration)
            if not self._unfinished(RUNS_WITH_ONE_OTHER):
                for waiting in [n for n in self.nodes if n not in self._busy()]:
                    self._reschedule(waiting)

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
