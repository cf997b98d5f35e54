"""The controller mutation quota (KIP-599) on a real secured cluster: a user with a quota of 1 partition
mutation/s is refused, clearly, once over it, by the Admin client and the ``brook`` CLI; a super user and
a user without a quota are not; the active controller counts what it refused.

The cluster measures quotas over 2 samples of 1 s (conftest): the user's burst is 2 partitions. Her first
topic (12 partitions) is accepted and leaves the bucket 10 below zero, so the next ones are refused for
about 10 s, far longer than the few calls that follow need even on a loaded machine.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from opskit_security import ADMIN_PASSWORD, _channel, metric_total, sasl, scrape_anonymously
from waiting import wait_for

from admin_cli.main import main as brook_main
from client import errors
from client.admin import Admin, NewTopic
from deploy.local.cluster import LocalCluster
from proto import broker_pb2, broker_pb2_grpc
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow

THROTTLED = re.compile(r"THROTTLING_QUOTA_EXCEEDED: throttled: controller mutation quota of 1/s exceeded, "
                       r"retry after (\d+) ms")


def test_a_user_over_her_controller_mutation_quota_is_refused(
        secure_cluster: LocalCluster, admin: Admin, grant: Callable[..., None], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for user in ("mona", "otto"):
        admin.create_user(user, f"{user}-pw")
        for operation in ("CREATE", "DESCRIBE"):
            grant(f"User:{user}", operation, "TOPIC", f"cmq-{user}-", "PREFIXED")
    monkeypatch.setenv("BROOK_BOOTSTRAP", secure_cluster.bootstrap_servers)
    monkeypatch.setenv("BROOK_SASL_USERNAME", "admin")
    monkeypatch.setenv("BROOK_SASL_PASSWORD", ADMIN_PASSWORD)
    assert brook_main(["quota", "set", "--user", "mona", "--controller-mutation-rate", "1"]) == 0
    assert brook_main(["-o", "json", "quota", "describe", "--user", "mona"]) == 0
    assert '"controller_mutation_rate": 1.0' in capsys.readouterr().out
    try:
        with Admin(secure_cluster.bootstrap_servers, request_timeout_ms=30_000,
                   controller_endpoints=secure_cluster.controller_endpoints, **sasl("mona", "mona-pw")) as mona:
            mona.create_topics([NewTopic("cmq-mona-big", 12, 1)], wait_for_leaders=False)  # burst 2: 2 -> -10
            with pytest.raises(errors.ThrottlingQuotaExceededError) as refused:
                mona.create_topic("cmq-mona-next", 1, 1)
            match = THROTTLED.fullmatch(str(refused.value))
            assert match is not None and 0 < int(match[1]) <= 10_000, refused.value

            monkeypatch.setenv("BROOK_SASL_USERNAME", "mona")
            monkeypatch.setenv("BROOK_SASL_PASSWORD", "mona-pw")
            assert brook_main(["topic", "create", "cmq-mona-cli", "-p", "1", "-r", "1"]) == 1
            assert THROTTLED.search(capsys.readouterr().err), "the CLI names the quota and when to retry"

            # Nobody else is limited by her quota: a super user and a user without one create as many.
            admin.create_topics([NewTopic("cmq-admin", 12, 1)])
            with Admin(secure_cluster.bootstrap_servers, request_timeout_ms=30_000,
                       controller_endpoints=secure_cluster.controller_endpoints, **sasl("otto", "otto-pw")) as otto:
                otto.create_topics([NewTopic("cmq-otto-big", 12, 1), NewTopic("cmq-otto-next", 1, 1)])

            controller = admin.describe_cluster().controller_id
            throttled = metric_total(scrape_anonymously(secure_cluster, controller, admin),
                                     "brook_controller_mutations_throttled_total", mode="strict")
            assert throttled >= 2, "the active controller counts the refused partitions"

            # Refused attempts spend nothing: once the bucket is back at zero (~10 s), she may go on.
            def created() -> bool:
                try:
                    mona.create_topic("cmq-mona-next", 1, 1)
                    return True
                except errors.ThrottlingQuotaExceededError:
                    return False
            wait_for(created, 60, "mona's quota to let her create a topic again", poll_s=0.5)
    finally:
        admin.alter_client_quotas("User:mona", remove=["controller_mutation_rate"])


def test_topics_she_auto_creates_count_against_her_quota(
        secure_cluster: LocalCluster, admin: Admin, grant: Callable[..., None], sync: Callable[[], None]) -> None:
    """A Metadata request's auto-creation is hers, not the broker's: the controller counts its partitions
    against her quota and refuses the next ones, as Kafka's controller does with the client's principal in the
    envelope. Asked as the broker, a user held to 1 partition a second auto-created 1,000 topics in 2.4 s."""
    admin.create_user("ada", "ada-pw")
    for operation in ("CREATE", "DESCRIBE"):
        grant("User:ada", operation, "TOPIC", "cmq-ada-", "PREFIXED")
    admin.alter_client_quotas("User:ada", set={"controller_mutation_rate": 1})
    sync()
    try:
        with _channel(secure_cluster.broker_address(secure_cluster.broker_ids[0]), ("ada", "ada-pw")) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            # 12 topics of 1 partition: accepted while her bucket (a burst of 2) is not below zero, as Kafka's
            # strict quota, so the first three are created and the rest refused.
            names = [f"cmq-ada-auto-{i}" for i in range(12)]
            answer = stub.Metadata(broker_pb2.MetadataRequest(topics=names, allow_auto_topic_creation=True),
                                   timeout=30)
            created = [t.name for t in answer.topics if t.error_code == ErrorCode.NONE]
            refused = [t for t in answer.topics if t.error_code != ErrorCode.NONE]
            assert created and len(created) <= 4, answer
            for topic in refused:
                assert topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, topic
                assert THROTTLED.search(topic.error_message), topic.error_message
            answer = stub.Metadata(broker_pb2.MetadataRequest(topics=["cmq-ada-auto-more"],
                                                              allow_auto_topic_creation=True), timeout=30)
            assert [(t.error_code, bool(THROTTLED.search(t.error_message))) for t in answer.topics] == \
                [(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, True)], answer
        listed = set(admin.list_topics())
        assert set(created) <= listed and not listed & ({t.name for t in refused} | {"cmq-ada-auto-more"})
        with Admin(secure_cluster.bootstrap_servers, request_timeout_ms=30_000,
                   controller_endpoints=secure_cluster.controller_endpoints, **sasl("ada", "ada-pw")) as ada, \
                pytest.raises(errors.ThrottlingQuotaExceededError):
            ada.create_topic("cmq-ada-created", 1, 1)  # the bucket her auto-creation emptied
    finally:
        admin.alter_client_quotas("User:ada", remove=["controller_mutation_rate"])
