"""``brook cluster health``'s judgement (admin_cli.cluster.assess_health) on built responses."""

from __future__ import annotations

from admin_cli.cluster import assess_health
from proto import controller_pb2 as pb


def cluster(*, default_min_isr: int, topics: dict[str, dict[str, str]],
            partitions: list[tuple[str, int, list[int], list[int], int]]) -> pb.DescribeClusterResponse:
    return pb.DescribeClusterResponse(
        cluster_id="c", active_controller_id=1, default_min_insync_replicas=default_min_isr,
        brokers=[pb.BrokerRecord(node_id=b) for b in (1, 2, 3)],
        topics=[pb.TopicRecord(name=n, configs=cfg) for n, cfg in topics.items()],
        partitions=[pb.PartitionRecord(topic=t, partition=i, replicas=r, isr=isr, leader=ld)
                    for t, i, r, isr, ld in partitions])


def active_quorum() -> pb.DescribeQuorumResponse:
    return pb.DescribeQuorumResponse(
        leader_id=1, term=3, responder_id=1, responder_is_active=True, active_controller_id=1, controller_epoch=3,
        voters=[pb.QuorumVoter(node_id=1, is_leader=True, connected=True),
                pb.QuorumVoter(node_id=2, connected=True, lag=0, last_contact_ms_ago=10),
                pb.QuorumVoter(node_id=3, connected=True, lag=0, last_contact_ms_ago=10)])


def checks(report) -> dict[str, tuple[bool, str]]:  # type: ignore[no-untyped-def]
    return {c.name: (c.ok, c.detail) for c in report.checks}


def test_under_min_isr_partitions_make_the_cluster_unhealthy() -> None:
    desc = cluster(default_min_isr=2, topics={"strict": {"min.insync.replicas": "3"}, "default": {},
                                              "lenient": {"min.insync.replicas": "1"}},
                   partitions=[("strict", 0, [1, 2, 3], [1, 2], 1),  # 2 < 3: under min ISR
                               ("default", 0, [1, 2, 3], [1, 2], 1),  # 2 >= default 2: only under-replicated
                               ("default", 1, [1, 2, 3], [3], 3),  # 1 < default 2
                               ("lenient", 0, [1, 2], [2], 2)])
    report = assess_health(desc, active_quorum())
    ok, detail = checks(report)["under-min-ISR partitions"]
    assert not ok and not report.healthy
    assert "strict-0 (isr 2 < 3)" in detail and "default-1 (isr 1 < 2)" in detail
    assert "default-0" not in detail and "lenient" not in detail
    assert not checks(report)["under-replicated partitions"][0]


def test_a_healthy_cluster_has_no_under_min_isr_partitions() -> None:
    desc = cluster(default_min_isr=2, topics={"t": {}}, partitions=[("t", 0, [1, 2, 3], [1, 2, 3], 1)])
    report = assess_health(desc, active_quorum())
    assert report.healthy, report
    assert checks(report)["under-min-ISR partitions"] == (True, "none")


def test_a_follower_view_reports_no_active_controller() -> None:
    follower_view = pb.DescribeQuorumResponse(leader_id=2, term=29, responder_id=3, responder_is_active=False,
                                              active_controller_id=1, controller_epoch=28)
    report = assess_health(None, follower_view, cluster_error="NOT_CONTROLLER: no active controller")
    ok, detail = checks(report)["quorum"]
    assert not ok and not report.healthy
    assert "voter 3 reports: Raft leader 2, term 29" in detail and "controller 1 is active (epoch 28)" in detail


def test_voters_withheld_from_a_caller_without_describe_are_not_reported_as_zero_voters() -> None:
    # The controller leaves the voters out for a caller not allowed DESCRIBE on the cluster.
    withheld = active_quorum()
    del withheld.voters[:]
    desc = cluster(default_min_isr=1, topics={"t": {}}, partitions=[("t", 0, [1, 2, 3], [1, 2, 3], 1)])
    ok, detail = checks(assess_health(desc, withheld))["quorum"]
    assert ok, detail
    assert "0 voters" not in detail and "DESCRIBE on the cluster" in detail and "leader 1, term 3" in detail
