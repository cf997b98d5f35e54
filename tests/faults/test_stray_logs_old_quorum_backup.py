"""A quorum restored from an old backup does not make a broker delete the topics it does not know.

A real node (combined roles, one voter). The operator backs the quorum's metadata directory up, the
cluster goes on and a topic is created and written (RF 1), then the quorum is restored from the
backup. The restored snapshot does not name the new topic. Before, the restarted broker deleted that
topic's log ("log on disk for a partition not assigned here; deleting"): its records were gone. Now the
log is set aside as ``<topic>-<partition>.<id>-stray`` with every record, counted by
``brook_log_dir_stray_logs``, and the cluster takes writes as before (tests/broker/test_stray_logs.py
has the rules, in process).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from opskit import produce_acked, read_values

from client.admin import Admin, NewTopic
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cl = LocalCluster(tmp_path / "cluster", nodes=1)
    try:
        cl.start()
        cl.wait_ready(90)
        yield cl
    finally:
        cl.teardown()


def test_a_topic_the_restored_quorum_does_not_know_is_set_aside_with_its_records(cluster: LocalCluster,
                                                                                  tmp_path: Path) -> None:
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000) as admin:
        admin.create_topics([NewTopic("kept", 1, 1)])
    produce_acked(cluster, "kept", [b"k%d" % i for i in range(3)])
    meta = cluster.node_dir(1) / "meta"
    cluster.stop_node(1)
    shutil.copytree(meta, tmp_path / "backup")  # the operator's backup of the quorum

    cluster.start_node(1)
    cluster.wait_ready(90)
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000) as admin:
        admin.create_topics([NewTopic("later", 1, 1)])
    values = [b"later-%d" % i for i in range(20)]
    produce_acked(cluster, "later", values)
    cluster.stop_node(1)

    shutil.rmtree(meta)
    shutil.copytree(tmp_path / "backup", meta)  # the quorum restored from the old backup
    log_path = cluster.node_log(1)
    seen = log_path.stat().st_size
    cluster.start_node(1)
    cluster.wait_ready(90)

    data = cluster.node_dir(1) / "data"
    assert not (data / "later-0").exists()
    stray = [p for p in data.iterdir() if re.fullmatch(r"later-0\.[0-9a-f]+-stray", p.name)]
    assert len(stray) == 1, sorted(p.name for p in data.iterdir())
    segment_bytes = sum(f.stat().st_size for f in stray[0].glob("*.log"))
    assert all(v in (stray[0] / f.name).read_bytes() for f in stray[0].glob("*.log") for v in values[:1]), \
        "the stray log holds the records"
    assert segment_bytes > sum(len(v) for v in values)
    text = log_path.read_bytes()[seen:].decode(errors="replace")
    assert "set aside as later-0." in text and "deleting" not in text, text[-3000:]
    metrics = cluster.read_metrics(1)
    assert re.search(r'^brook_log_dir_stray_logs\{dir="[^"]+"\} 1\.0$', metrics, re.M), \
        [line for line in metrics.splitlines() if "stray" in line]
    # The cluster takes writes, and the topic the backup knows has its records.
    produce_acked(cluster, "kept", [b"k3"])
    assert read_values(cluster, "kept", 4) == [b"k0", b"k1", b"k2", b"k3"]
