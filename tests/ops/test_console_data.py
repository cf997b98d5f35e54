"""The console's data, in process (real authorizer, the admin client's answers stubbed): per-viewer filtering
of group offsets, and a row budget over all groups (found by an audit: a viewer of a group saw the offsets
of topics it may not describe, and 20,000 group-partition rows went out in one answer)."""

from __future__ import annotations

import time
import types

from broker import console
from broker.authorizer import AclIndex, Authorizer, AuthorizerConfig
from broker.console import ConsoleData
from broker.sasl import Principal
from broker.security import is_node_principal
from client.types import TopicPartition
from metadata_quorum.security import acl_binding


def _admin(groups: dict[str, dict[TopicPartition, int]]) -> types.SimpleNamespace:
    def describe_groups(ids: list[str]) -> dict[str, types.SimpleNamespace]:
        return {gid: types.SimpleNamespace(state="Empty", members=[], offsets={
            tp: types.SimpleNamespace(committed_offset=1, log_end_offset=1 + lag, lag=lag)
            for tp, lag in groups[gid].items()}) for gid in ids}
    return types.SimpleNamespace(list_groups=lambda: [types.SimpleNamespace(group_id=g) for g in groups],
                                 describe_groups=describe_groups)


def test_a_viewer_sees_a_groups_offsets_only_on_topics_it_may_describe() -> None:
    acls = AclIndex(acl_binding(list(a)) for a in (
        ("CLUSTER", "kafka-cluster", "LITERAL", "User:alice", "*", "DESCRIBE", "ALLOW"),
        ("GROUP", "watched", "LITERAL", "User:alice", "*", "DESCRIBE", "ALLOW"),
        ("TOPIC", "public", "LITERAL", "User:alice", "*", "DESCRIBE", "ALLOW")))
    data = ConsoleData(None, lambda: None, Authorizer(AuthorizerConfig(True, frozenset(), False), lambda: acls,
                                                     is_node_principal))
    notes: list[str] = []
    groups = ConsoleData._groups(_admin({"watched": {TopicPartition("public", 0): 3,
                                                     TopicPartition("secret-payroll", 0): 40}}), notes)
    data._cached = (time.monotonic(), {"topics": [], "groups": groups, "notes": notes})
    view = data.overview(Principal("User", "alice"))
    [watched] = view["groups"]
    assert [r["topic"] for r in watched["partitions"]] == ["public"] and watched["lag"] == 3, watched
    assert "lag_by_topic" not in watched


def test_group_partition_rows_share_one_budget() -> None:
    many = {f"g{i}": {TopicPartition("t", p): 1 for p in range(500)} for i in range(10)}
    notes: list[str] = []
    groups = ConsoleData._groups(_admin(many), notes)
    rows = sum(len(g["partitions"]) for g in groups)
    assert rows == console.MAX_PARTITIONS, rows
    assert all(g["lag"] == 500 for g in groups)  # the lag counts every partition, shown or not
    assert len(notes) == 1 and "not shown" in notes[0], notes
