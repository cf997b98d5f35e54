"""Authorizer decisions: Kafka's StandardAuthorizer semantics, one rule per test."""

from __future__ import annotations

import pytest

from broker import authorizer as authz
from broker.authorizer import AclIndex, Authorizer, AuthorizerConfig
from broker.sasl import Principal
from broker.security import is_node_principal
from metadata_quorum.security import acl_binding
from proto import errors
from proto.errors import ErrorCode

ALICE, BOB = Principal("User", "alice"), Principal("User", "bob")


def make(*acls: tuple[str, ...], supers: str = "", allow_if_none: bool = False) -> Authorizer:
    index = AclIndex(acl_binding(list(a)) for a in acls)
    config = AuthorizerConfig(True, frozenset(s for s in supers.split(";") if s), allow_if_none)
    return Authorizer(config, lambda: index, is_node_principal)


def allow(principal: str, op: str, rtype: str = "TOPIC", name: str = "orders", pattern: str = "LITERAL"):
    return (rtype, name, pattern, principal, "*", op, "ALLOW")


def deny(principal: str, op: str, rtype: str = "TOPIC", name: str = "orders", pattern: str = "LITERAL"):
    return (rtype, name, pattern, principal, "*", op, "DENY")


def test_literal_allow_is_for_that_principal_and_operation_only() -> None:
    a = make(allow("User:alice", "WRITE"))
    assert a.authorize(ALICE, "WRITE", "TOPIC", "orders")
    assert not a.authorize(BOB, "WRITE", "TOPIC", "orders")
    assert not a.authorize(ALICE, "READ", "TOPIC", "orders")
    assert not a.authorize(ALICE, "WRITE", "TOPIC", "orders2")


def test_deny_wins_over_allow_even_wildcard_allow() -> None:
    a = make(allow("User:*", "ALL", name="*"), deny("User:alice", "WRITE"))
    assert not a.authorize(ALICE, "WRITE", "TOPIC", "orders")
    assert a.authorize(ALICE, "READ", "TOPIC", "orders")
    assert a.authorize(BOB, "WRITE", "TOPIC", "orders")


def test_prefixed_pattern_matches_names_starting_with_it() -> None:
    a = make(allow("User:alice", "READ", name="logs-", pattern="PREFIXED"))
    assert a.authorize(ALICE, "READ", "TOPIC", "logs-app")
    assert a.authorize(ALICE, "READ", "TOPIC", "logs-")
    assert not a.authorize(ALICE, "READ", "TOPIC", "log")
    assert not a.authorize(ALICE, "READ", "GROUP", "logs-app")  # resource types never mix


def test_read_write_imply_describe_and_alter_configs_implies_describe_configs() -> None:
    a = make(allow("User:alice", "READ"), allow("User:alice", "ALTER_CONFIGS"))
    assert a.authorize(ALICE, "DESCRIBE", "TOPIC", "orders")
    assert a.authorize(ALICE, "DESCRIBE_CONFIGS", "TOPIC", "orders")
    assert not a.authorize(ALICE, "WRITE", "TOPIC", "orders")
    assert not make(allow("User:alice", "DESCRIBE")).authorize(ALICE, "READ", "TOPIC", "orders")


def test_super_users_and_node_principals_are_allowed_everything() -> None:
    a = make(deny("User:admin", "ALL"), supers="User:admin")
    assert a.authorize(Principal("User", "admin"), "DELETE", "TOPIC", "orders")
    assert a.authorize(Principal("User", "node-3"), "CLUSTER_ACTION", "CLUSTER", "kafka-cluster")
    assert not a.authorize(Principal("User", "node-x"), "CLUSTER_ACTION", "CLUSTER", "kafka-cluster")


def test_no_acl_on_resource_follows_allow_everyone_if_no_acl_found() -> None:
    assert not make().authorize(ALICE, "READ", "TOPIC", "orders")
    assert make(allow_if_none=True).authorize(ALICE, "READ", "TOPIC", "orders")
    # An ACL for someone else on the resource: "found", so the default no longer applies.
    assert not make(allow("User:bob", "READ"), allow_if_none=True).authorize(ALICE, "READ", "TOPIC", "orders")


def test_disabled_authorizer_allows_everything_and_counts_nothing() -> None:
    a = authz.ALLOW_ALL
    assert a.authorize(ALICE, "DELETE", "TOPIC", "orders")
    assert not a.denied_total()


def test_denials_are_counted_by_resource_type_and_operation() -> None:
    a = make()
    a.denied_topics(ALICE, "WRITE", ["a", "b", "a"])
    a.authorize_any(ALICE, "CREATE", [("CLUSTER", "kafka-cluster"), ("TOPIC", "x")])
    assert a.denied_total() == {("TOPIC", "WRITE"): 2, ("TOPIC", "CREATE"): 1}


def test_check_raises_the_resource_types_error_code() -> None:
    a = make()
    for rtype, code in (("TOPIC", ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                        ("GROUP", ErrorCode.GROUP_AUTHORIZATION_FAILED),
                        ("CLUSTER", ErrorCode.CLUSTER_AUTHORIZATION_FAILED)):
        with pytest.raises(errors.BrookError) as caught:
            a.check(ALICE, "DESCRIBE", rtype, "kafka-cluster" if rtype == "CLUSTER" else "x")
        assert caught.value.code == code
        assert not caught.value.retriable


def test_internal_topics_cannot_be_deleted_or_lose_compaction() -> None:
    with pytest.raises(errors.BrookError):
        authz.check_internal_topic_change("__consumer_offsets", delete=True)
    with pytest.raises(errors.BrookError):
        authz.check_internal_topic_change("__consumer_offsets", config_keys=["cleanup.policy"])
    authz.check_internal_topic_change("__consumer_offsets", config_keys=["retention.ms"])
    authz.check_internal_topic_change("orders", delete=True)


def test_may_write_some_topic_for_init_producer_id() -> None:
    a = make(allow("User:alice", "WRITE", name="x-", pattern="PREFIXED"))
    assert a.may_write_some_topic(ALICE)
    assert not a.may_write_some_topic(BOB)
    # Only a TOPIC ALLOW of WRITE or ALL counts, for the principal or User:*, from a host it names.
    assert not make(allow("User:bob", "READ"), allow("User:bob", "WRITE", rtype="GROUP"),
                    deny("User:bob", "WRITE")).may_write_some_topic(BOB)
    assert make(allow("User:*", "ALL")).may_write_some_topic(BOB)
    remote = ("TOPIC", "t", "LITERAL", "User:bob", "10.0.0.9", "WRITE", "ALLOW")
    assert not make(remote).may_write_some_topic(Principal("User", "bob", host="10.0.0.1"))
    assert make(remote).may_write_some_topic(Principal("User", "bob", host="10.0.0.9"))


@pytest.mark.parametrize("fields", [
    ("TOPIC", "*", "PREFIXED", "User:a", "*", "READ", "ALLOW"),   # prefixed wildcard
    ("CLUSTER", "other", "LITERAL", "User:a", "*", "ALTER", "ALLOW"),
    ("TOPIC", "t", "LITERAL", "alice", "*", "READ", "ALLOW"),      # not User:<name>
    ("TOPIC", "t", "LITERAL", "User:a", "*", "FLY", "ALLOW"),
    ("TOPIC", "t", "LITERAL", "User:a", "*", "READ", "MAYBE"),
    ("QUEUE", "t", "LITERAL", "User:a", "*", "READ", "ALLOW"),
])
def test_invalid_bindings_are_refused(fields: tuple[str, ...]) -> None:
    with pytest.raises(errors.InvalidRequestError):
        acl_binding(list(fields))


def test_only_real_internal_topics_are_protected() -> None:
    """Any "__" name counted as internal: a client could create "__junk" (with 50,000 partitions) that nobody,
    super users included, could delete (audit). Only __consumer_offsets is internal."""
    from broker import authorizer as authz_module

    with pytest.raises(errors.BrookError):
        authz_module.check_internal_topic_change("__consumer_offsets", delete=True)
    authz_module.check_internal_topic_change("__junk", delete=True)
    authz_module.check_internal_topic_change("__junk", config_keys=["cleanup.policy"])
    assert not authz_module.is_internal_topic("__junk") and authz_module.is_internal_topic("__consumer_offsets")


def test_prefixed_lookup_matches_a_scan_of_every_binding() -> None:
    """The index finds prefixed bindings by (type, prefix) per prefix length in use; on random
    bindings and names it returns exactly what testing every binding's pattern would."""
    import random

    rng = random.Random(7)
    alphabet = "ab-"
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(60)]
    bindings = [acl_binding([rng.choice(["TOPIC", "GROUP"]), w, rng.choice(["LITERAL", "PREFIXED"]),
                             rng.choice(["User:alice", "User:*"]), "*", "READ", rng.choice(["ALLOW", "DENY"])])
                for w in words]
    bindings += [acl_binding([rtype, "*", "LITERAL", "User:*", "*", "READ", "ALLOW"]) for rtype in ("TOPIC", "GROUP")]
    index = AclIndex(bindings)

    def scan(rtype: str, name: str) -> list:
        return [b for b in index.bindings if b.resource_type == rtype and (
            b.resource_name == name or (b.pattern_type == "LITERAL" and b.resource_name == "*" != name)
            or (b.pattern_type == "PREFIXED" and name.startswith(b.resource_name)))]

    names = words + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9))) for _ in range(300)]
    for rtype in ("TOPIC", "GROUP"):
        for name in names:
            assert sorted(index.matching(rtype, name)) == sorted(scan(rtype, name)), (rtype, name)


def test_an_overlong_principal_is_refused_for_its_length() -> None:
    """It was refused as if it were not 'User:<name>' at all (audit)."""
    from metadata_quorum.security import MAX_USER_CHARS, validate_principal

    assert validate_principal("User:" + "a" * MAX_USER_CHARS)
    with pytest.raises(errors.InvalidRequestError) as refused:
        validate_principal("User:" + "a" * (MAX_USER_CHARS + 1))
    assert f"{MAX_USER_CHARS + 1} characters, more than {MAX_USER_CHARS}" in refused.value.message
    assert len(refused.value.message) < 200, "the whole name was echoed"
