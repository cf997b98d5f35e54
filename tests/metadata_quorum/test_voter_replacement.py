"""Replacing a controller voter whose machine (and metadata disk) is gone: the README's procedure,
step by step, on real processes.

The quorum's membership is static (``controller.quorum.voters``), so a voter is replaced by a new
node with the same id at a new address and an empty metadata directory, then a rolling restart
of the others with the new voter list. The test checks that the remaining voters commit while
the old one is gone, that the new voter catches up from the leader, that no metadata is lost and
that the cluster takes writes at every step.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster, free_port

pytestmark = pytest.mark.slow

OLD = 1003  # the controller whose machine is lost


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("voter-replacement"), nodes=2, mode="split", controllers=3,
                     overrides={"broker.session.timeout.ms": "6000"})
    try:
        c.start()
        c.wait_ready(90)
        yield c
    finally:
        c.teardown()


def quorum_whole(admin: Admin, raft_address: str) -> bool:
    """Three voters, the replaced one at its new address, every voter caught up."""
    try:
        q = admin.describe_quorum()
    except Exception:
        return False
    addresses = {v.raft_address for v in q.voters}
    return (q.leader_id >= 0 and len(q.voters) == 3 and raft_address in addresses
            and all(v.lag == 0 for v in q.voters))


def caught_up(admin: Admin, raft_address: str) -> bool:
    """A leader, and the voter at ``raft_address`` among its voters with lag 0."""
    try:
        q = admin.describe_quorum()
    except Exception:
        return False
    return q.leader_id >= 0 and any(v.raft_address == raft_address and v.lag == 0 for v in q.voters)


def serving(admin: Admin, node_id: int) -> bool:
    """The restarted broker answers with current metadata and is unfenced ("unfenced" alone may
    still be the stopped process's registration)."""
    from proto import broker_pb2

    try:
        r = admin.cluster.broker_stub(node_id).Metadata(broker_pb2.MetadataRequest(all_topics=True), timeout=2)
    except Exception:
        return False
    return {"before", "during"} <= {t.name for t in r.topics} and node_id not in admin.describe_cluster().fenced_brokers


def write(bootstrap: str, topic: str, values: list[bytes]) -> None:
    with Producer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=5000, delivery_timeout_ms=60000) as p:
        futures = [p.send(topic, v, partition=0) for v in values]
        p.flush()
        for f in futures:
            f.get(timeout=30)


def read(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    got: list[bytes] = []
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 60
        while len(got) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(r.value for r in records)
    return got


def test_a_lost_voter_is_replaced_with_an_empty_one_and_nothing_is_lost(cluster: LocalCluster) -> None:
    admin = Admin(cluster.bootstrap_servers, request_timeout_ms=30000)
    try:
        admin.create_topics([NewTopic("before", 1, 2, configs={"retention.ms": "123456789"})])
        sent = [b"before-%d" % i for i in range(50)]
        write(cluster.bootstrap_servers, "before", sent)

        # 1. The machine of voter 1003 is gone: process and metadata directory.
        cluster.kill_node(OLD)
        shutil.rmtree(cluster.node_dir(OLD) / "meta")
        # 2. The two others commit without it (a metadata write needs both of them now), so each has
        #    every committed entry before the empty voter may vote.
        admin.create_topics([NewTopic("during", 1, 2)])
        write(cluster.bootstrap_servers, "during", [b"during"])

        # 3. The new machine: same node id, new address, empty metadata directory, the new voter list.
        spec = cluster.spec(OLD)
        spec.controller_port, spec.raft_port = free_port(), free_port()
        cluster.save_state()
        new_raft = f"127.0.0.1:{spec.raft_port}"
        cluster.start_node(OLD)
        # 4. Rolling restart of the other voters, then the brokers, with the new voter list: each restarted voter
        #    caught up before the next one goes down. The new voter copies the log only once a voter with the new
        #    list leads, at the latest when the last old-list voter restarts: until then the leader does not know
        #    its address, and with pre-vote it cannot depose that leader (metadata_quorum/prevote.py).
        for node_id in (1001, 1002):
            cluster.restart_node(node_id)
            raft = f"127.0.0.1:{cluster.spec(node_id).raft_port}"
            wait_for(lambda r=raft: caught_up(admin, r), 90, f"voter {node_id} caught up after its restart")
        wait_for(lambda: quorum_whole(admin, new_raft), 90, "a whole quorum with the new voter")
        for node_id in cluster.broker_ids:
            cluster.restart_node(node_id)
            wait_for(lambda n=node_id: serving(admin, n), 90, f"broker {node_id} serving again")
        admin.close()
        admin = Admin(cluster.bootstrap_servers, request_timeout_ms=30000)

        # 5. Nothing lost: topics, their configs and their records; the cluster takes writes.
        assert {"before", "during"} <= set(admin.list_topics())
        assert admin.describe_configs(["before"])["before"]["retention.ms"].value == "123456789"
        admin.create_topics([NewTopic("after", 1, 2)])
        write(cluster.bootstrap_servers, "before", [b"after"])
        assert read(cluster.bootstrap_servers, "before", len(sent) + 1) == [*sent, b"after"]
        # The new voter is a full member: with either old voter stopped, it and the other one commit.
        for stopped in (1001, 1002):
            cluster.stop_node(stopped)
            admin.create_topics([NewTopic(f"without-{stopped}", 1, 2)])
            assert {"before", "during", "after"} <= set(admin.list_topics())
            cluster.start_node(stopped)
            wait_for(lambda: quorum_whole(admin, new_raft), 90, f"a whole quorum after {stopped} returned")
    finally:
        admin.close()
