"""kafka-python's admin command line (``python -m kafka.admin``), a Kafka tool nobody here wrote, run as an operator
runs it against a real 3-node cluster: each command must succeed and show what Brook holds."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kafkakit import unique
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.producer import Producer
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

T = 60


@pytest.fixture(scope="module")
def cli_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-python-cli"), nodes=3) as cluster:
        yield cluster


def _run(cluster: LocalCluster, args: tuple[str, ...], output: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafka.admin", "-b", cluster.kafka_bootstrap_servers.split(",")[0],
                           "--format", output, *args], capture_output=True, text=True, timeout=T)


def _kafka_admin(cluster: LocalCluster, *args: str, output: str = "json") -> Any:
    """The command's output, JSON read (it fails the test on a non-zero exit)."""
    proc = _run(cluster, args, output)
    assert proc.returncode == 0, f"kafka.admin {' '.join(args)}: exit {proc.returncode}\n{proc.stdout[-2000:]}"
    return json.loads(proc.stdout) if output == "json" else proc.stdout


def test_operator_commands(cli_cluster: LocalCluster) -> None:
    topic = unique("cli")
    with Admin(cli_cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 2, 3)])
        with Producer(bootstrap_servers=cli_cluster.bootstrap_servers, acks="all") as producer:
            for i in range(10):
                producer.send(topic, f"v{i}".encode(), partition=0).get(timeout=T)
        quorum = admin.describe_quorum()

    described = _kafka_admin(cli_cluster, "cluster", "describe-quorum")
    [partition] = described["topics"][0]["partitions"]
    assert partition["leader_id"] == quorum.leader_id and len(partition["current_voters"]) == 3, described

    producers = _kafka_admin(cli_cluster, "transactions", "describe-producers", "-t", topic, "-p", "0")
    [state] = producers[f"{topic}:0"]["active_producers"]
    assert state["last_sequence"] == 9 and state["coordinator_epoch"] == -1, producers
    assert _kafka_admin(cli_cluster, "transactions", "list") == {str(b): [] for b in cli_cluster.broker_ids}

    user = unique("cli-user").replace("_", "-")
    assert _kafka_admin(cli_cluster, "users", "alter-scram-credentials", "--upsert",
                        f"{user}:SCRAM-SHA-512:secret") == {user: None}
    users = _kafka_admin(cli_cluster, "users", "describe-scram-credentials", "--user", user)
    assert [(i["iterations"]) for i in users[user]["credential_infos"]] == [4096], users
    assert _kafka_admin(cli_cluster, "users", "alter-scram-credentials", "--delete",
                        f"{user}:SCRAM-SHA-512") == {user: None}

    # Its JSON output cannot hold this answer's keys (kafka-python's own limit): the printed dict instead.
    deleted = _kafka_admin(cli_cluster, "partitions", "delete-records", "-r", f"{topic}:0:4", output="raw")
    assert "'error_code': 0" in deleted and "'low_watermark': 4" in deleted, deleted
    offsets = _kafka_admin(cli_cluster, "partitions", "list-offsets", "-t", topic, "-s", "earliest")
    assert offsets[topic]["0"]["offset"] == 4, offsets

    group = unique("cli-group")
    # The command does not retry COORDINATOR_NOT_AVAILABLE, which a new cluster answers while it creates
    # __consumer_offsets: run it again until it is done.
    alter = ("groups", "alter-offsets", "-g", group, "-o", f"{topic}:0:7")
    done = wait_for(lambda: (p := _run(cli_cluster, alter, "json")).returncode == 0 and json.loads(p.stdout), T,
                    f"{group}'s offsets altered")
    assert done == {f"{topic}:0": "NoError"}
    wait_for(lambda: _kafka_admin(cli_cluster, "groups", "list-offsets", "-g", group)[topic]["0"]["offset"] == 7, T,
             f"{group}'s committed offset")
