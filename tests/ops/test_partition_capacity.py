"""A real node with a small file-descriptor limit (README draft: notes/s45/readme_capacity.md).

Every partition replica holds at least one segment, 3 descriptors, for as long as it exists. Before, a
cluster took topics until its brokers ran out of descriptors: at a limit of 2,000 a node took 5,000
one-partition topics, every log past ~590 failed to open with EMFILE (the controller still answered
success), checkpoints and the Raft journal failed, and the node could not start again (EMFILE in
LogManager.startup, at every start). Now:

- the broker registers a partition capacity (its limit / 12: 100 at 1,200) and the controller refuses
  topics past it with POLICY_VIOLATION naming the broker, its capacity and its count; nothing of a refused
  topic is created, the node stays up and the partitions it has take writes and serve reads;
- started with a limit its logs do not fit in, the node refuses to start before opening anything, exit
  code 5, naming the limit and the figure needed; started again with the limit raised it serves every
  record it had.

The node runs under ``prlimit --nofile=N:N`` (LocalCluster's ``launch_prefixes``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from opskit import produce_acked, read_values
from waiting import wait_for

from client.admin import Admin, NewTopic
from deploy.local.cluster import LocalCluster
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow

LIMIT = 1_200  # capacity 1,200 // 12 = 100 partition replicas
CAPACITY = 100
LOWERED_LIMIT = 350  # 100 segments need 300 descriptors; at most 3/4 of 350 (262) may go to segments
EXIT_DESCRIPTORS = 5  # broker/node.py


def _prlimit(limit: int) -> list[str]:
    return [shutil.which("prlimit") or "prlimit", f"--nofile={limit}:{limit}", "--"]


def _fds(pid: int | None) -> int:
    return len(os.listdir(f"/proc/{pid}/fd")) if pid else -1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if shutil.which("prlimit") is None or not Path("/proc/self/fd").exists():
        pytest.skip("needs prlimit (util-linux) and /proc")
    cl = LocalCluster(tmp_path_factory.mktemp("capacity"), nodes=1, launch_prefixes={1: _prlimit(LIMIT)})
    try:
        cl.start()
        cl.wait_ready(90)
        yield cl
    finally:
        cl.teardown()


def test_topics_past_the_capacity_are_refused_and_the_node_stays_up(cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000) as admin:
        admin.create_topics([NewTopic("live", 1, 1)])
        produce_acked(cluster, "live", [b"before-%d" % i for i in range(5)])
        # Up to the capacity: 99 more one-partition topics, in batches.
        for start in range(0, CAPACITY - 1, 33):
            names = [f"fill-{i:03d}" for i in range(start, min(start + 33, CAPACITY - 1))]
            answer = admin.create_topics([NewTopic(n, 1, 1) for n in names], raise_on_error=False)
            assert all(e is None for e in answer.values()), answer
        # Past it: every topic refused, with the figures, and none of them exists.
        names = [f"over-{i:03d}" for i in range(20)]
        answer = admin.create_topics([NewTopic(n, 1, 1) for n in names], raise_on_error=False)
        for name, err in answer.items():
            assert err is not None and err.code == ErrorCode.POLICY_VIOLATION, (name, err)
        message = answer["over-000"].message
        assert "broker 1" in message and f"capacity of {CAPACITY}" in message and f"holds {CAPACITY}" in message, \
            message
        grown = admin.create_partitions({"live": 2}, raise_on_error=False)
        assert grown["live"] is not None and grown["live"].code == ErrorCode.POLICY_VIOLATION, grown
        topics = set(admin.list_topics())
        assert not topics & set(names), sorted(topics & set(names))
        assert len([t for t in topics if t.startswith("fill-")]) == CAPACITY - 1
    # The node is up, below its limit, and its partitions take writes and serve reads.
    assert cluster.is_running(1)
    assert _fds(cluster.pid(1)) < LIMIT
    produce_acked(cluster, "live", [b"after-%d" % i for i in range(5)])
    assert read_values(cluster, "live", 10) == [b"before-%d" % i for i in range(5)] + [b"after-%d" % i for i in range(5)]
    log_text = cluster.node_log(1).read_text(errors="replace")
    assert "Too many open files" not in log_text
    assert f"file-descriptor limit {LIMIT}: this broker takes at most {CAPACITY} partition replicas" in log_text


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    """What a node does first (broker/node.py main): a soft limit of 300 under a hard one of 900 becomes 900."""
    import subprocess
    import sys
    if shutil.which("prlimit") is None:
        pytest.skip("needs prlimit (util-linux)")
    code = ("import resource; from storage.fd_budget import raise_soft_limit_to_hard as r; "
            "print(r(), resource.getrlimit(resource.RLIMIT_NOFILE))")
    out = subprocess.run([*_prlimit(300)[:1], "--nofile=300:900", "--", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "(300, 900) (900, 900)", out


def test_a_lowered_limit_refuses_the_start_with_exit_code_5_then_a_raised_one_serves_everything(
        cluster: LocalCluster) -> None:
    cluster.stop_node(1)
    log_path = cluster.node_log(1)
    seen = log_path.stat().st_size
    cluster.launch_prefixes[1] = _prlimit(LOWERED_LIMIT)
    cluster.start_node(1)
    wait_for(lambda: cluster.returncode(1) is not None, 90, "node 1 to exit under the lowered limit")
    assert cluster.returncode(1) == EXIT_DESCRIPTORS, log_path.read_text(errors="replace")[seen:][-3000:]
    text = log_path.read_bytes()[seen:].decode(errors="replace")
    assert "refuses to start" in text and f"limit of {LOWERED_LIMIT}" in text, text[-3000:]
    assert "at least 400" in text, text[-3000:]  # 100 segments: 300 descriptors = 3/4 of 400
    assert "Traceback" not in text, text[-3000:]
    # The limit raised again: every record is there.
    cluster.launch_prefixes[1] = _prlimit(LIMIT)
    cluster.start_node(1)
    cluster.wait_ready(90)
    assert read_values(cluster, "live", 10)[:5] == [b"before-%d" % i for i in range(5)]
