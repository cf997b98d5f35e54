"""Authorizer: may this principal do this operation on this resource? Kafka's StandardAuthorizer.

ACL bindings come from the metadata quorum (brokers: their metadata cache; controllers:
MetadataState). The decision, for a principal P, operation O and resource R:

1. P is a super user (``super.users``, or a broker's own node principal): allowed.
2. The bindings that apply to R: LITERAL with R's name, LITERAL ``*``, and PREFIXED
   whose prefix starts R's name; of those, the ones for P (or ``User:*``).
3. A DENY for O (or ALL) among them: denied. DENY always wins.
4. An ALLOW for O, for ALL, or for an operation that implies O (READ, WRITE, DELETE
   and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS): allowed.
5. No binding at all applies to R, for anyone: ``allow.everyone.if.no.acl.found``
   (default false). Otherwise denied.

Enabled by ``authorizer.class.name = "StandardAuthorizer"``; empty (the default for a
bare node config) allows everything, as Kafka without an authorizer. Whatever the
authorizer, the internal topic ``__consumer_offsets`` can never be deleted or have
``cleanup.policy`` changed by a client (``check_internal_topic_change``).

Every denial is counted (``stats``) and logged at debug level; the services answer
TOPIC_/GROUP_/CLUSTER_AUTHORIZATION_FAILED.

``authorized_operations`` answers KIP-430's question (which operations may P do on R?) with the
same decision, once per operation Kafka supports on R's type, as the bit set the Kafka protocol
carries; those decisions are not denials of a request and are not counted.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from metadata_quorum.security import CLUSTER_NAME, WILDCARD, AclBinding
from proto import errors
from proto.errors import ErrorCode

log = logging.getLogger(__name__)

TOPIC, GROUP, CLUSTER = "TOPIC", "GROUP", "CLUSTER"
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE"
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS = "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"
IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"
AUTHORIZER_NAMES = ("", "StandardAuthorizer", "org.apache.kafka.metadata.authorizer.StandardAuthorizer")
_IMPLIED_BY = {  # operation -> operations whose ALLOW also allows it
    DESCRIBE: {DESCRIBE, READ, WRITE, DELETE, ALTER},
    DESCRIBE_CONFIGS: {DESCRIBE_CONFIGS, ALTER_CONFIGS},
}
# Kafka's AclOperation codes, and the operations Kafka supports on each resource type (AclEntry.supportedOperations):
# a KIP-430 authorized-operations bit set holds bit ``1 << code`` of each of those the caller is allowed.
OPERATION_CODES = {READ: 3, WRITE: 4, CREATE: 5, DELETE: 6, ALTER: 7, DESCRIBE: 8, CLUSTER_ACTION: 9,
                   DESCRIBE_CONFIGS: 10, ALTER_CONFIGS: 11, IDEMPOTENT_WRITE: 12, "CREATE_TOKENS": 13,
                   "DESCRIBE_TOKENS": 14}
SUPPORTED_OPERATIONS = {
    TOPIC: (READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    GROUP: (READ, DESCRIBE, DELETE),
    CLUSTER: (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE),
    # Stored and listed, never consulted (metadata_quorum/security.py EXTENDED_RESOURCE_TYPES).
    "TRANSACTIONAL_ID": (DESCRIBE, WRITE),
    "DELEGATION_TOKEN": (DESCRIBE,),
    "USER": ("CREATE_TOKENS", "DESCRIBE_TOKENS"),
}
_DENIED_CODE = {TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED, GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
                CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED}


def operations_bits(operations: Iterable[str]) -> int:
    """The KIP-430 bit set of ``operations`` (names of ``OPERATION_CODES``)."""
    bits = 0
    for op in operations:
        bits |= 1 << OPERATION_CODES[op]
    return bits


_ALL_SUPPORTED_BITS = {rtype: operations_bits(ops) for rtype, ops in SUPPORTED_OPERATIONS.items()}


def denied_code(resource_type: str) -> int:
    return _DENIED_CODE[resource_type]


def denied_error(principal: object, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> errors.BrookError:
    what = "the cluster" if resource_type == CLUSTER else f"{resource_type.lower()} '{name}'"
    return errors.error_class(_DENIED_CODE[resource_type])(f"{principal} is not authorized to {operation} {what}")


# Kafka's internal topics (Brook has no transactions, so only the group coordinator's). Any "__" name used to
# count: a client could create "__junk" with 50,000 partitions that nobody, super users included, could
# delete (found by an audit).
INTERNAL_TOPICS = frozenset({"__consumer_offsets"})


def is_internal_topic(name: str) -> bool:
    return name in INTERNAL_TOPICS


def check_internal_topic_change(topic: str, *, delete: bool = False, config_keys: Iterable[str] = (),
                                create: bool = False, add_partitions: bool = False) -> None:
    """Internal topics (``__consumer_offsets``) lose committed offsets if deleted or no longer compacted. Only
    the group coordinator creates one (compacted, ``offsets.topic.num.partitions`` partitions, over which it
    places groups): one a client made first, with other partitions or another policy, left most groups
    without a coordinator and the rest with offsets retention deleted (audit). Partitions added to it would
    be placed no group."""
    if not is_internal_topic(topic):
        return
    if create:
        raise errors.InvalidRequestError(
            f"Creation of internal topic {topic} is prohibited: the group coordinator creates it")
    if add_partitions:
        raise errors.InvalidRequestError(
            f"internal topic '{topic}' keeps its partitions: groups are placed over offsets.topic.num.partitions")
    if delete:
        raise errors.error_class(ErrorCode.TOPIC_AUTHORIZATION_FAILED)(
            f"internal topic '{topic}' cannot be deleted")
    if "cleanup.policy" in set(config_keys):
        raise errors.error_class(ErrorCode.TOPIC_AUTHORIZATION_FAILED)(
            f"cleanup.policy of internal topic '{topic}' cannot be changed")


@dataclass(frozen=True)
class AuthorizerConfig:
    enabled: bool = False
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False

    @staticmethod
    def from_defaults(defaults: dict[str, str]) -> AuthorizerConfig:
        name = defaults.get("authorizer.class.name", "").strip()
        if name not in AUTHORIZER_NAMES:
            raise errors.InvalidConfigError(f"authorizer.class.name {name!r} is not one of {AUTHORIZER_NAMES}")
        supers = frozenset(s.strip() for s in defaults.get("super.users", "").split(";") if s.strip())
        allow = defaults.get("allow.everyone.if.no.acl.found", "false").strip().lower() == "true"
        return AuthorizerConfig(bool(name), supers, allow)


class AclIndex:
    """ACL bindings by resource type, split by pattern for lookups proportional to the matches.

    PREFIXED bindings are kept by (type, prefix), with the prefix lengths in use per type: a
    lookup tries each of those lengths on the name, one dict probe each, so its cost is at most
    the name's length, not the number of prefixed bindings (10,000 of them made each decision a
    scan, and a Metadata request for 10,000 topics a 5.6 s stall).
    """

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        self.bindings = tuple(sorted(set(bindings)))
        self._literal: dict[tuple[str, str], list[AclBinding]] = {}
        self._prefixed: dict[tuple[str, str], list[AclBinding]] = {}
        lengths: dict[str, set[int]] = {}
        for b in self.bindings:
            if b.pattern_type == "LITERAL":
                self._literal.setdefault((b.resource_type, b.resource_name), []).append(b)
            else:
                self._prefixed.setdefault((b.resource_type, b.resource_name), []).append(b)
                lengths.setdefault(b.resource_type, set()).add(len(b.resource_name))
        self._prefix_lengths = {rtype: sorted(ls) for rtype, ls in lengths.items()}
        # ALLOWs and DENYs of WRITE (or ALL) on any topic, by principal: Kafka's InitProducerId rule
        # (Authorizer.authorizeByResourceType), which weighs both.
        self.topic_writers: dict[str, list[AclBinding]] = {}
        self.topic_write_denials: dict[str, list[AclBinding]] = {}
        for b in self.bindings:
            if b.resource_type == TOPIC and b.operation in (WRITE, "ALL"):
                held = self.topic_writers if b.permission == "ALLOW" else self.topic_write_denials
                held.setdefault(b.principal, []).append(b)

    def matching(self, resource_type: str, name: str) -> list[AclBinding]:
        out = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            out += self._literal.get((resource_type, WILDCARD), ())
        for n in self._prefix_lengths.get(resource_type, ()):
            if n > len(name):
                break
            out += self._prefixed.get((resource_type, name[:n]), ())
        return out

    def __len__(self) -> int:
        return len(self.bindings)


EMPTY_INDEX = AclIndex()


class Authorizer:
    """Decides; thread-safe. ``acls()`` returns the current AclIndex (cheap: prebuilt)."""

    def __init__(self, config: AuthorizerConfig, acls: Callable[[], AclIndex],
                 is_node_principal: Callable[[object], bool] = lambda p: False) -> None:
        self.config = config
        self._acls = acls
        self._is_node_principal = is_node_principal
        self._lock = threading.Lock()
        self.denied: Counter[tuple[str, str]] = Counter()  # (resource type, operation) -> denials

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def authorize(self, principal: object, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> bool:
        allowed = self._decide(str(principal), principal, operation, resource_type, name)
        if not allowed:
            with self._lock:
                self.denied[(resource_type, operation)] += 1
            log.debug("denied %s %s on %s '%s'", principal, operation, resource_type, name)
        return allowed

    def _decide(self, who: str, principal: object, operation: str, resource_type: str, name: str) -> bool:
        if self._unchecked(who, principal):
            return True
        return self._decide_among(self._applicable(who, principal, resource_type, name), operation)

    def _unchecked(self, who: str, principal: object) -> bool:
        """Allowed everything: no authorizer, a super user or a broker's own node principal."""
        return not self.config.enabled or who in self.config.super_users or self._is_node_principal(principal)

    def _applicable(self, who: str, principal: object, resource_type: str, name: str) -> list[AclBinding] | None:
        """The bindings for this principal (at its host) that apply to the resource; None when no binding
        applies to the resource at all, for anyone."""
        applicable = self._acls().matching(resource_type, name)
        if not applicable:
            return None
        host = getattr(principal, "host", "")
        return [b for b in applicable if b.principal in (who, "User:*") and _host_applies(b, host)]

    def _decide_among(self, mine: list[AclBinding] | None, operation: str) -> bool:
        if mine is None:
            return self.config.allow_everyone_if_no_acl_found
        if any(b.permission == "DENY" and b.operation in (operation, "ALL") for b in mine):
            return False
        allowing = _IMPLIED_BY.get(operation, {operation})
        return any(b.permission == "ALLOW" and (b.operation == "ALL" or b.operation in allowing) for b in mine)

    def authorized_operations(self, principal: object, resource_type: str, name: str = CLUSTER_NAME) -> int:
        """KIP-430: the bit set (``1 << OPERATION_CODES[op]``) of the operations of
        ``SUPPORTED_OPERATIONS[resource_type]`` this principal is allowed on the resource, each decided as
        ``authorize`` decides it (every one when no authorizer is configured, as Kafka answers). At most one
        decision per supported operation, over one lookup of the resource's bindings; not counted as denials
        (Kafka neither logs them)."""
        who = str(principal)
        if self._unchecked(who, principal):
            return _ALL_SUPPORTED_BITS[resource_type]
        mine = self._applicable(who, principal, resource_type, name)
        return operations_bits(op for op in SUPPORTED_OPERATIONS[resource_type] if self._decide_among(mine, op))

    def authorize_any(self, principal: object, operation: str, resources: Iterable[tuple[str, str]]) -> bool:
        """Allowed on at least one of (resource type, name) (e.g. CREATE on the cluster or on the topic)."""
        resources = list(resources)
        who = str(principal)
        if any(self._decide(who, principal, operation, rtype, name) for rtype, name in resources):
            return True
        rtype, name = resources[-1]
        return self.authorize(principal, operation, rtype, name)  # counted (and logged) once

    # ---- helpers for the services: one short call per handler ----
    def check(self, principal: object, operation: str, resource_type: str, name: str = CLUSTER_NAME) -> None:
        """Raise the *_AUTHORIZATION_FAILED error when denied."""
        if not self.authorize(principal, operation, resource_type, name):
            raise denied_error(principal, operation, resource_type, name)

    def denied_topics(self, principal: object, operation: str, topics: Iterable[str]) -> set[str]:
        """The topics of ``topics`` the principal may not ``operation`` (each decided once)."""
        return {t for t in set(topics) if not self.authorize(principal, operation, TOPIC, t)}

    def may_describe_topic(self, principal: object, topic: str) -> bool:
        return self._decide(str(principal), principal, DESCRIBE, TOPIC, topic)

    def may_write_some_topic(self, principal: object) -> bool:
        """Kafka's InitProducerId rule, ``authorizeByResourceType(WRITE, TOPIC)`` of its Authorizer interface:
        allowed WRITE on a made-up topic name (super users; ``allow.everyone.if.no.acl.found`` when no binding
        applies to it), else an ALLOW of WRITE (or ALL) on some topic that no DENY of the principal dominates:
        a DENY on the literal ``*`` denies outright; a literal ALLOW is dominated by a DENY of the same literal
        name or of a prefix of it, a prefixed ALLOW by a prefixed DENY of a prefix of it (itself included).
        Before, any ALLOW sufficed: a principal denied WRITE on every topic still got producer ids."""
        who = str(principal)
        if self._decide(who, principal, WRITE, TOPIC, "hardcode"):  # Kafka's own probe name
            return True
        host = getattr(principal, "host", "")
        index = self._acls()
        mine = list(dict.fromkeys((who, "User:*")))
        denials = [b for p in mine for b in index.topic_write_denials.get(p, ()) if _host_applies(b, host)]
        if any(b.pattern_type == "LITERAL" and b.resource_name == WILDCARD for b in denials):
            return False
        denied_literals = {b.resource_name for b in denials if b.pattern_type == "LITERAL"}
        denied_prefixes = {b.resource_name for b in denials if b.pattern_type != "LITERAL"}
        for b in (b for p in mine for b in index.topic_writers.get(p, ()) if _host_applies(b, host)):
            if b.pattern_type == "LITERAL" and b.resource_name == WILDCARD:
                return True
            if b.pattern_type == "LITERAL" and b.resource_name in denied_literals:
                continue
            if not any(b.resource_name[:n] in denied_prefixes for n in range(1, len(b.resource_name) + 1)):
                return True
        return False

    def denied_total(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.denied)


def _host_applies(b: AclBinding, host: str) -> bool:
    """Does ``b`` apply to a caller at ``host`` (Kafka's rule: its host is ``*`` or the caller's address)?
    When the caller's address is unknown (""), only DENYs naming a host still apply: a host-specific
    ALLOW needs the address it names."""
    return b.host == WILDCARD or b.host == host or (not host and b.permission == "DENY")


ALLOW_ALL = Authorizer(AuthorizerConfig(enabled=False), lambda: EMPTY_INDEX)
