"""Chaos soak (``make soak``): random kill -9 / SIGSTOP of controllers while a writer creates topics.

Every acknowledged topic must exist, whole, at the end; an unacknowledged one may exist
only whole. Rounds: BROOK_QUORUM_CHAOS_ROUNDS (default 20).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from quorum_helpers import register_brokers
from waiting import wait_for

from metadata_quorum.local_quorum import LocalQuorum
from proto import controller_pb2 as pb
from proto import errors
from proto.errors import ErrorCode

pytestmark = pytest.mark.soak

PARTITIONS = 8


def test_acknowledged_topics_survive_random_controller_faults(tmp_path: Path) -> None:
    rounds = int(os.environ.get("BROOK_QUORUM_CHAOS_ROUNDS", "20"))
    rng = random.Random(int(os.environ.get("BROOK_QUORUM_CHAOS_SEED", "1")))
    quorum = LocalQuorum(tmp_path, extra_args=["--session-timeout-ms", "600000", "--snapshot-min-entries", "30"])
    quorum.start()
    acked: set[str] = set()
    attempted: set[str] = set()
    stop = threading.Event()
    try:
        with quorum.client(timeout_s=30) as admin, quorum.client(timeout_s=5) as writer:
            register_brokers(admin, [1, 2, 3], quorum.cluster_id)

            def write() -> None:
                i = 0
                while not stop.is_set() and i < 100_000:
                    name = f"chaos-{i}"
                    i += 1
                    attempted.add(name)
                    try:
                        r = writer.call("CreateTopics", pb.CreateTopicsRequest(timeout_ms=3000, topics=[
                            pb.CreatableTopic(name=name, num_partitions=PARTITIONS, replication_factor=2)]))
                    except errors.BrookError:
                        continue
                    if r.results[0].error_code == ErrorCode.NONE:
                        acked.add(name)

            thread = threading.Thread(target=write, daemon=True)
            thread.start()
            for _ in range(rounds):
                victim = rng.choice(list(quorum.voters))
                if rng.random() < 0.5:
                    quorum.kill(victim, signal.SIGKILL)
                    time.sleep(rng.uniform(0.5, 3))
                    quorum.start_node(victim)
                else:
                    quorum.pause(victim)
                    time.sleep(rng.uniform(0.5, 3))
                    quorum.resume(victim)
                time.sleep(rng.uniform(0.5, 2))
            stop.set()
            thread.join(timeout=30)

            def all_present() -> pb.DescribeClusterResponse | None:
                c = admin.call("DescribeCluster", pb.DescribeClusterRequest())
                return c if acked <= {t.name for t in c.topics} else None
            cluster = wait_for(all_present, 60, "every acknowledged topic")
            counts: dict[str, int] = {}
            for p in cluster.partitions:
                counts[p.topic] = counts.get(p.topic, 0) + 1
            for t in cluster.topics:
                assert t.name in attempted, t.name
                assert t.partition_count == PARTITIONS and counts.get(t.name) == PARTITIONS, (t.name, counts.get(t.name))
            print(f"\nchaos: {rounds} faults, {len(attempted)} creates attempted, {len(acked)} acknowledged, "
                  f"{len(cluster.topics)} present, none lost")
    finally:
        stop.set()
        quorum.stop()
