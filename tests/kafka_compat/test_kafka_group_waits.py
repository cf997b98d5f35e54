"""A consumer group's join and sync phases on the Kafka listener are held as long as the group needs, as Kafka
holds them, not cut at the listener's request timeout (``kafka.request.timeout.ms``).

An audit with Quix Streams (confluent-kafka): an application instance killed with kill -9 leaves its member in
the group until its session expires (45 s by default); a new instance's JoinGroup waits for that, and Brook
answered it REBALANCE_IN_PROGRESS after 29.5 s, which librdkafka hands the application as a consumer error
("JoinGroup failed: Broker: Group rebalance in progress"). Kafka answers it when the join phase ends.

Here the request timeout is 3 s and the dead member's session 8 s, so the join must outlive the timeout."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafkakit import unique

from client.admin import Admin
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT_MS = 3000
SESSION_MS = 8000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("group-waits"), nodes=1)
    c.state.overrides["kafka.request.timeout.ms"] = str(REQUEST_TIMEOUT_MS)
    with c:
        c.wait_ready(60)
        yield c


def _member_script(conf: dict[str, Any], topic: str) -> str:
    """A consumer in its own process that says when it has its partitions, then polls until killed."""
    return (
        "from confluent_kafka import Consumer\n"
        f"c = Consumer({conf!r})\n"
        "done = []\n"
        f"c.subscribe([{topic!r}], on_assign=lambda c, p: done.append(len(p)))\n"
        "while not done:\n"
        "    c.poll(0.2)\n"
        "print('assigned', done[0], flush=True)\n"
        "while True:\n"
        "    c.poll(0.2)\n")


def test_a_join_waiting_for_a_dead_members_session_outlives_the_request_timeout(cluster: LocalCluster,
                                                                                 tmp_path: Path) -> None:
    from confluent_kafka import Consumer

    topic, group = unique("gw"), unique("gw-group")
    with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
        admin.create_topic(topic, 2, 1)
    conf = {**cluster.kafka_client_config(), "group.id": group, "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 1000}
    first = subprocess.Popen([sys.executable, "-c", _member_script(conf, topic)], stdout=subprocess.PIPE, text=True)
    try:
        line = first.stdout.readline() if first.stdout is not None else ""
        assert line.startswith("assigned 2"), f"the first member never got its partitions: {line!r}"
        first.send_signal(signal.SIGKILL)  # no LeaveGroup: the member stays until its session expires
        first.wait(10)
        killed = time.monotonic()
        second = Consumer(conf)
        assigned: list[float] = []
        errors: list[str] = []
        second.subscribe([topic], on_assign=lambda c, p: assigned.append(time.monotonic() - killed))
        try:
            deadline = killed + SESSION_MS / 1000 + 30
            while not assigned and time.monotonic() < deadline:
                m = second.poll(0.2)
                if m is not None and m.error():
                    errors.append(f"{time.monotonic() - killed:.1f} s: {m.error()}")
        finally:
            second.close()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    assert assigned, f"the second member was never assigned; errors: {errors}"
    assert errors == [], f"the join was answered with an error (assigned after {assigned[0]:.1f} s): {errors}"
    # It waited for the dead member's session (heartbeats every second: at least SESSION_MS - 1 s after the kill),
    # well past the listener's request timeout.
    assert assigned[0] > REQUEST_TIMEOUT_MS / 1000 + 2, f"assigned after {assigned[0]:.1f} s"


def test_the_reasons_clients_give_for_joining_and_leaving_are_in_the_coordinators_log(cluster: LocalCluster) -> None:
    """JoinGroup v8 and LeaveGroup v5 (KIP-800) carry why the client joins or leaves; Kafka's Java consumer sends
    them ("rebalance failed due to ...") and the coordinator logs them with the rebalance, which is how an operator
    finds what keeps a group rebalancing. Each is logged cut to 200 characters, on one line."""
    import uuid

    from kafka_raw import kafka_ask
    from waiting import wait_for

    tag = uuid.uuid4().hex[:8]
    group, node = unique("reasons"), cluster.node_ids[0]
    join = {"group_id": group, "session_timeout": 30000, "rebalance_timeout": 30000, "member_id": "",
            "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}], "reason": f"joining {tag}\nFAKE LINE"}
    # As a client does first: the coordinator is found (on a fresh cluster that makes __consumer_offsets).
    wait_for(lambda: int(kafka_ask(cluster, node, 10, 4, {"key_type": 0, "coordinator_keys": [group]})
                         .coordinators[0].error_code) == 0, 60, "the group's coordinator")
    first = kafka_ask(cluster, node, 11, 8, join)
    assert int(first.error_code) == 79 and first.member_id, first  # MEMBER_ID_REQUIRED, with its id
    joined = kafka_ask(cluster, node, 11, 8, {**join, "member_id": first.member_id})
    assert (int(joined.error_code), joined.member_id, joined.leader) == (0, first.member_id, first.member_id), joined
    left = kafka_ask(cluster, node, 13, 5, {"group_id": group, "members": [
        {"member_id": first.member_id, "group_instance_id": None, "reason": f"leaving {tag} " + "x" * 500}]})
    assert (int(left.error_code), [int(m.error_code) for m in left.members]) == (0, [0]), left
    log = cluster.node_log(node)

    def logged() -> bool:
        text = log.read_text(errors="replace")
        return f"client reason: joining {tag}\\nFAKE LINE" in text and \
            f"client reason: leaving {tag} {'x' * 183}..." in text
    wait_for(logged, 30, lambda: "the join and leave reasons in the coordinator's log; its lines of the group: "
             + repr([line for line in log.read_text(errors="replace").splitlines() if group in line]))
    assert not any(line.startswith("FAKE LINE") for line in log.read_text(errors="replace").splitlines())
