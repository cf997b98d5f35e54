"""The security records the quorum stores: SCRAM credentials, ACL bindings, client quotas.

Pure validation and normalisation shared by the state machine (which refuses bad
records), the controller (which builds commands) and the brokers' authorizer and quota
manager (which read them). No clocks, sockets or randomness here.

Kafka's model throughout: an ACL binding is (resource type, resource name, pattern
type, principal, host, operation, permission); SCRAM credentials are (salt, StoredKey,
ServerKey, iterations) per user and mechanism, never the password; quotas are
per-principal (or ``<default>``) byte, request and controller mutation rates.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from proto import errors

MECHANISMS = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}  # mechanism -> key length in bytes
MIN_ITERATIONS = 4096  # RFC 7677's minimum
# The most a new credential may have: Kafka's (ScramMechanism.maxIterations). The server runs PBKDF2 at the
# stored count for each SASL PLAIN attempt, unauthenticated: at 1,000,000 that was 0.9 CPU-s an attempt (audit).
MAX_ITERATIONS = 16_384
# The most the metadata state accepts, what every version before the cap allowed: credentials stored before
# it still load and replay (a stricter state would drop them), and still authenticate.
MAX_STORED_ITERATIONS = 1_000_000
SALT_BYTES_MIN, SALT_BYTES_MAX = 8, 128
MAX_USER_CHARS = 128
MAX_CREDENTIALS = 10_000
MAX_ACLS = 10_000
MAX_QUOTA_ENTITIES = 10_000
_USER_RE = re.compile(r"^[A-Za-z0-9._@+=-]+$")
# Brokers' own principals (mTLS, see broker/principal.py) are super users: no SCRAM user may take such a name.
_NODE_NAME_RE = re.compile(r"^node-[0-9]+$")

# Resource types and operations Brook authorizes, then those it stores and lists as Kafka does but has nothing to
# enforce them on (no transactions, no delegation tokens): bindings on those need brook.metadata.version 2
# (features.EXTENDED_ACLS), since releases before it refuse them when they apply the command.
ENFORCED_RESOURCE_TYPES = ("TOPIC", "GROUP", "CLUSTER")
EXTENDED_RESOURCE_TYPES = ("TRANSACTIONAL_ID", "DELEGATION_TOKEN", "USER")
RESOURCE_TYPES = ENFORCED_RESOURCE_TYPES + EXTENDED_RESOURCE_TYPES
PATTERN_TYPES = ("LITERAL", "PREFIXED")
EXTENDED_OPERATIONS = ("CREATE_TOKENS", "DESCRIBE_TOKENS")
OPERATIONS = ("ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "CLUSTER_ACTION",
              "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE") + EXTENDED_OPERATIONS
PERMISSIONS = ("ALLOW", "DENY")
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
MAX_RESOURCE_NAME_CHARS = 255

# Byte and request rates are enforced by each broker; controller_mutation_rate (partitions created or
# deleted per second, KIP-599) by the active controller.
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_rate", "controller_mutation_rate")
DEFAULT_ENTITY = "<default>"
MAX_QUOTA_VALUE = 1e15
# The least a client may set (a thousandth of a byte, request or partition a second): a positive 5e-324 was
# accepted and made every throttle time overflow (audit). Applied to requests, not to the journal's replay.
MIN_QUOTA_VALUE = 1e-3


def validate_user(user: str) -> str:
    if not user or len(user) > MAX_USER_CHARS or not _USER_RE.match(user):
        raise errors.InvalidRequestError(
            f"user name {user!r} is invalid: 1-{MAX_USER_CHARS} characters of letters, digits and ._@+=-")
    if _NODE_NAME_RE.match(user) or user == "ANONYMOUS":
        raise errors.InvalidRequestError(f"user name {user!r} is reserved for brokers and unauthenticated callers")
    return user


@dataclass(frozen=True, slots=True)
class ScramCredential:
    user: str
    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_plain(self) -> list[object]:
        return [self.user, self.mechanism, self.salt.hex(), self.stored_key.hex(), self.server_key.hex(),
                self.iterations]

    @staticmethod
    def from_plain(data: list[object]) -> ScramCredential:
        """A stored credential (a command or snapshot of the metadata state): validated leniently."""
        user, mechanism, salt, stored, server, iterations = data
        return validate_credential(ScramCredential(str(user), str(mechanism), bytes.fromhex(str(salt)),
                                                   bytes.fromhex(str(stored)), bytes.fromhex(str(server)),
                                                   int(iterations)),  # type: ignore[call-overload]
                                   strict=False)


def check_iterations(iterations: int) -> int:
    """The iterations of a new credential: MIN_ITERATIONS..MAX_ITERATIONS (Kafka's bounds)."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise errors.InvalidRequestError(
            f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS} (Kafka's SCRAM bounds), got {iterations}")
    return iterations


def validate_credential(cred: ScramCredential, *, strict: bool) -> ScramCredential:
    """``strict``: a credential a client asks to create (the controller, and the client library that salts
    it): at most MAX_ITERATIONS. Otherwise a stored one (the metadata state applying a command or loading a
    snapshot, which must accept what it accepted before): at most MAX_STORED_ITERATIONS."""
    validate_user(cred.user)
    key_bytes = MECHANISMS.get(cred.mechanism)
    if key_bytes is None:
        raise errors.error_class(errors.ErrorCode.UNSUPPORTED_SASL_MECHANISM)(
            f"mechanism {cred.mechanism!r} is not one of {sorted(MECHANISMS)}")
    if strict:
        check_iterations(cred.iterations)
    elif not MIN_ITERATIONS <= cred.iterations <= MAX_STORED_ITERATIONS:
        raise errors.InvalidRequestError(
            f"iterations must be {MIN_ITERATIONS}..{MAX_STORED_ITERATIONS}, got {cred.iterations}")
    if not SALT_BYTES_MIN <= len(cred.salt) <= SALT_BYTES_MAX:
        raise errors.InvalidRequestError(f"salt must be {SALT_BYTES_MIN}..{SALT_BYTES_MAX} bytes")
    if len(cred.stored_key) != key_bytes or len(cred.server_key) != key_bytes:
        raise errors.InvalidRequestError(f"{cred.mechanism} keys must be {key_bytes} bytes")
    return cred


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str

    def as_list(self) -> list[str]:
        return [self.resource_type, self.resource_name, self.pattern_type, self.principal, self.host,
                self.operation, self.permission]

    def __str__(self) -> str:
        return (f"{self.permission} {self.principal} {self.operation} on {self.resource_type}:"
                f"{self.pattern_type}:{self.resource_name}")


def validate_principal(principal: str) -> str:
    kind, sep, name = principal.partition(":")
    if not sep or kind != "User" or not name:
        raise errors.InvalidRequestError(f"principal {principal[:80]!r} must be 'User:<name>' or 'User:*'")
    if len(name) > MAX_USER_CHARS:
        raise errors.InvalidRequestError(f"principal User:{name[:40]!r}... has a name of {len(name)} characters, more "
                                         f"than {MAX_USER_CHARS}")
    return principal


def acl_host(text: str) -> str:
    """An address as ACLs name it: the canonical IP (``10.0.0.5``, ``2001:db8::1``; an IPv4-mapped IPv6
    address as its IPv4), ``*`` and "" (unknown) as they are; ValueError for anything else (a host
    name: Kafka's ACLs match the client's IP address, never a name)."""
    if text in ("", WILDCARD):
        return text
    ip = ipaddress.ip_address(text.strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def new_acl_binding(values: list[str] | tuple[str, ...]) -> AclBinding:
    """``acl_binding`` for a binding a client asks to create: its host must also be ``*`` or an IP
    address, stored in canonical form (older records are read as they were stored)."""
    b = acl_binding(values)
    try:
        host = acl_host(b.host)
    except ValueError:
        raise errors.InvalidRequestError(
            f"ACL host {b.host!r} must be '*' or an IP address (ACLs match the client's address, not a name)"
        ) from None
    return b if host == b.host else AclBinding(b.resource_type, b.resource_name, b.pattern_type, b.principal, host,
                                                b.operation, b.permission)


def is_extended(binding: AclBinding) -> bool:
    """A binding only brook.metadata.version 2 may store (see EXTENDED_RESOURCE_TYPES)."""
    return binding.resource_type in EXTENDED_RESOURCE_TYPES or binding.operation in EXTENDED_OPERATIONS


def acl_binding(values: list[str] | tuple[str, ...]) -> AclBinding:
    """A validated, upper-cased binding from its 7 fields; InvalidRequestError if it is not one."""
    if len(values) != 7:
        raise errors.InvalidRequestError(f"an ACL binding has 7 fields, got {len(values)}")
    rtype, name, pattern, principal, host, op, perm = (str(v) for v in values)
    binding = AclBinding(rtype.upper(), name, pattern.upper() or "LITERAL", principal, host or WILDCARD,
                         op.upper(), perm.upper())
    if binding.resource_type not in RESOURCE_TYPES:
        raise errors.InvalidRequestError(f"resource type {rtype!r} is not one of {RESOURCE_TYPES}")
    if binding.pattern_type not in PATTERN_TYPES:
        raise errors.InvalidRequestError(f"pattern type {pattern!r} is not one of {PATTERN_TYPES}")
    if binding.operation not in OPERATIONS:
        raise errors.InvalidRequestError(f"operation {op!r} is not one of {OPERATIONS}")
    if binding.permission not in PERMISSIONS:
        raise errors.InvalidRequestError(f"permission {perm!r} is not one of {PERMISSIONS}")
    if not name or len(name) > MAX_RESOURCE_NAME_CHARS:
        raise errors.InvalidRequestError(f"resource name must be 1..{MAX_RESOURCE_NAME_CHARS} characters")
    if binding.pattern_type == "PREFIXED" and name == WILDCARD:
        raise errors.InvalidRequestError("a PREFIXED pattern cannot be the wildcard '*'")
    if binding.resource_type == "CLUSTER" and (name != CLUSTER_NAME or binding.pattern_type != "LITERAL"):
        raise errors.InvalidRequestError(f"the CLUSTER resource is LITERAL '{CLUSTER_NAME}'")
    if len(binding.host) > MAX_RESOURCE_NAME_CHARS:
        raise errors.InvalidRequestError("host is too long")
    validate_principal(principal)
    return binding


def validate_quota_entity(entity: str) -> str:
    if entity != DEFAULT_ENTITY:
        validate_principal(entity)
        if entity.endswith(":*"):
            raise errors.InvalidRequestError(f"quota entity {entity!r}: use '{DEFAULT_ENTITY}' for every principal")
    return entity


def validate_quota_values(values: dict[str, float], *, strict: bool = False) -> dict[str, float]:
    """Known keys with values in (0, MAX_QUOTA_VALUE]; ``strict`` (a client's request, before it is proposed): at
    least MIN_QUOTA_VALUE. The state machine applies without it, so a journal written before replays the same."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if key not in QUOTA_KEYS:
            raise errors.InvalidRequestError(f"quota {key!r} is not one of {QUOTA_KEYS}")
        number = float(value)
        if not 0 < number <= MAX_QUOTA_VALUE:  # also refuses NaN
            raise errors.InvalidRequestError(f"quota {key} must be > 0 and <= {MAX_QUOTA_VALUE:g}, got {value!r}")
        if strict and number < MIN_QUOTA_VALUE:
            raise errors.InvalidRequestError(f"quota {key} must be at least {MIN_QUOTA_VALUE:g}, got {value!r}")
        out[key] = number
    return out
