"""InitProducerId's rule (IDEMPOTENT_WRITE on the cluster, or WRITE on some topic) weighs DENYs as Kafka's
``Authorizer.authorizeByResourceType`` does. Before, any ALLOW of WRITE on some topic sufficed: a principal
an operator had denied WRITE on every topic (``DENY ... --topic '*'``) still got producer ids."""

from __future__ import annotations

from broker.authorizer import AclIndex, Authorizer, AuthorizerConfig
from broker.sasl import Principal
from broker.security import is_node_principal
from metadata_quorum.security import acl_binding

MALLORY = Principal("User", "mallory")


def make(*acls: tuple[str, ...], allow_if_none: bool = False) -> Authorizer:
    index = AclIndex(acl_binding(list(a)) for a in acls)
    return Authorizer(AuthorizerConfig(True, frozenset({"User:admin"}), allow_if_none), lambda: index,
                      is_node_principal)


def acl(permission: str, name: str, pattern: str = "LITERAL", op: str = "WRITE", who: str = "User:mallory",
        host: str = "*") -> tuple[str, ...]:
    return ("TOPIC", name, pattern, who, host, op, permission)


def test_a_deny_on_every_topic_refuses_producer_ids() -> None:
    assert not make(acl("ALLOW", "public", who="User:*"), acl("DENY", "*", op="ALL")).may_write_some_topic(MALLORY)
    assert not make(acl("ALLOW", "logs-", "PREFIXED"), acl("DENY", "*")).may_write_some_topic(MALLORY)
    # A wildcard ALLOW does not outweigh a wildcard DENY either.
    assert not make(acl("ALLOW", "*"), acl("DENY", "*", who="User:*")).may_write_some_topic(MALLORY)


def test_an_allow_dominated_by_a_deny_does_not_count() -> None:
    assert not make(acl("ALLOW", "orders"), acl("DENY", "orders")).may_write_some_topic(MALLORY)
    assert not make(acl("ALLOW", "orders"), acl("DENY", "ord", "PREFIXED")).may_write_some_topic(MALLORY)
    assert not make(acl("ALLOW", "logs-eu", "PREFIXED"), acl("DENY", "logs-", "PREFIXED")).may_write_some_topic(MALLORY)
    assert not make(acl("ALLOW", "logs-", "PREFIXED"), acl("DENY", "logs-", "PREFIXED")).may_write_some_topic(MALLORY)


def test_an_allow_not_dominated_still_counts() -> None:
    # A DENY elsewhere leaves the other ALLOW: WRITE on some topic remains (Kafka's answer too).
    assert make(acl("ALLOW", "orders"), acl("ALLOW", "audit"), acl("DENY", "orders")).may_write_some_topic(MALLORY)
    # A literal DENY does not dominate a prefixed ALLOW; a longer prefixed DENY does not dominate a shorter one.
    assert make(acl("ALLOW", "logs-", "PREFIXED"), acl("DENY", "logs-")).may_write_some_topic(MALLORY)
    assert make(acl("ALLOW", "logs-", "PREFIXED"), acl("DENY", "logs-eu", "PREFIXED")).may_write_some_topic(MALLORY)
    # A prefixed DENY dominates nothing but names it prefixes; a wildcard ALLOW is not dominated by prefixes.
    assert make(acl("ALLOW", "*"), acl("DENY", "a", "PREFIXED")).may_write_some_topic(MALLORY)
    # A DENY from another host does not apply to this caller.
    assert make(acl("ALLOW", "orders"), acl("DENY", "*", host="10.0.0.9")).may_write_some_topic(
        Principal("User", "mallory", host="10.0.0.1"))


def test_super_users_and_allow_everyone_if_no_acl_found() -> None:
    assert make(acl("DENY", "*", who="User:admin")).may_write_some_topic(Principal("User", "admin"))
    assert make(allow_if_none=True).may_write_some_topic(MALLORY)
    assert not make().may_write_some_topic(MALLORY)
