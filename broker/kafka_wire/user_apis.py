"""Kafka's user admin APIs on the Kafka listener: SCRAM credentials (KIP-554) and client quotas (KIP-546).

``kafka-configs --entity-type users --alter --add-config 'SCRAM-SHA-512=[password=...]'``, confluent-kafka's and
kafka-python's ``alter_user_scram_credentials``/``describe_user_scram_credentials``, and tools that manage users and
quotas through Kafka's Admin API (Strimzi's user operator, Terraform's provider) send these. As for the other admin
APIs (admin_apis.py), each request becomes the Brook RPC that already serves ``brook user`` and ``brook quota``
(metadata_quorum/security_service.py), sent to the active controller with the client's principal, which authorizes
it again and validates every item before it is proposed; nothing is decided here that the controller would not.

SCRAM credentials, as Kafka's controller answers them: one result per user named (the order of first mention); a
user with any refused item has none of its items applied. From brook.metadata.version 4 each user's items reach the
controller as one command (AlterScramCredentials), applied all or none as Kafka's record batch is; below it they are
one command an item (``_alter_item_by_item``), and a failure between them can leave some applied. The client salts the password (``salted_password`` is
PBKDF2's output, Hi() of RFC 5802): the broker derives the stored and server keys from it and never sees the
password. Refusals use Kafka's codes: UNSUPPORTED_SASL_MECHANISM (a mechanism other than SCRAM-SHA-256/512),
UNACCEPTABLE_CREDENTIAL (iterations outside 4,096..16,384, a salt or salted password of the wrong size, a user name
Brook does not accept), DUPLICATE_RESOURCE (a user and mechanism named twice), RESOURCE_NOT_FOUND (deleting or
describing what does not exist).

Client quotas: Brook keeps quotas per user and for the user default only, with the keys ``producer_byte_rate``,
``consumer_byte_rate``, ``request_rate`` (requests a second: Kafka's ``request_percentage`` is a share of thread time,
which Brook does not measure) and ``controller_mutation_rate``. DescribeClientQuotas filters those entries as Kafka
does (EXACT, DEFAULT and SPECIFIED components, ``strict``); an entity naming ``client-id`` or ``ip``, or another key,
is refused INVALID_REQUEST with what Brook keeps, never stored as something else.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from broker import authorizer as authz
from broker.kafka_wire import codec
from broker.kafka_wire.admin_apis import _ANSWER_ON_LOOP_MAX_ITEMS, AdminApis, _Failed
from broker.kafka_wire.codec import get as _get
from broker.kafka_wire.context import Handler, KafkaCallContext
from metadata_quorum import security as sec
from metadata_quorum.security_service import MAX_ITEMS_PER_REQUEST
from proto import errors, security_pb2
from proto.errors import ErrorCode

DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS = 48, 49
DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51

SUPPORTED: dict[int, tuple[int, int]] = {
    DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ALTER_CLIENT_QUOTAS: (0, 1),
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}

# Kafka's codes that Brook's own ErrorCode enum does not name.
DUPLICATE_RESOURCE, UNACCEPTABLE_CREDENTIAL = 92, 93

# Kafka's ScramMechanism codes <-> Brook's names, and each one's hash.
MECHANISM_NAMES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
MECHANISM_CODES = {name: code for code, name in MECHANISM_NAMES.items()}
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}

# Kafka's ClientQuotaEntity types and DescribeClientQuotas match types.
USER, CLIENT_ID, IP = "user", "client-id", "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
WHOLE_NUMBER_KEYS = ("producer_byte_rate", "consumer_byte_rate")  # Kafka's LONG quota keys
_USER_PREFIX = "User:"
USER_ONLY = (f"Brook keeps quotas per user and for the user default (entity type '{USER}' with a name, or with a "
             f"null name); '{CLIENT_ID}' and '{IP}' quotas are not supported")


class UserApis:
    """The SCRAM-credential and client-quota handlers of one Kafka listener, through its AdminApis."""

    def __init__(self, admin: AdminApis) -> None:
        self.admin = admin

    def handlers(self) -> dict[int, Handler]:
        return {
            DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe_user_scram_credentials,
            ALTER_USER_SCRAM_CREDENTIALS: self.alter_user_scram_credentials,
            DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas,
            ALTER_CLIENT_QUOTAS: self.alter_client_quotas,
        }

    async def _security(self, ctx: KafkaCallContext, method: str, request: Any) -> Any:
        """``method`` of the controllers' SecurityService, answered; its whole-request refusal raised as _Failed."""
        return await self.admin._controller(ctx, method, request, security=True)

    # ---- DescribeUserScramCredentials ----
    async def describe_user_scram_credentials(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        asked = _get(req.body, "users")
        names = [str(u.name) for u in asked] if asked else []  # null or empty: every user

        def refused(code: int, message: str | None) -> Any:
            return self.admin._resp(req, {"throttle_time": 0, "error_code": code, "error_message": message, "results": []})
        try:
            self.admin._authorize_cluster(ctx, authz.DESCRIBE)  # first, as Kafka: a refused caller learns nothing
            if len(names) > MAX_ITEMS_PER_REQUEST:
                raise _Failed(ErrorCode.INVALID_REQUEST, f"{len(names)} users in one request, at most "
                                                         f"{MAX_ITEMS_PER_REQUEST}: split the request")
            out = await self._security(ctx, "DescribeUsers", security_pb2.DescribeUsersRequest(users=set(names)))
        except _Failed as exc:
            return refused(exc.code, exc.message)

        def answer() -> Any:
            found = {d.user: d for d in out.users}
            results = []
            if not names:
                results = [_user_result(d) for _, d in sorted(found.items())]
            count = Counter(names)
            for name in count:  # each user once, in the order asked
                if count[name] > 1:
                    results.append(_user_error(name, DUPLICATE_RESOURCE, "Cannot describe SCRAM credentials for the "
                                                                         "same user twice in a single request"))
                elif name not in found:
                    results.append(_user_error(name, ErrorCode.RESOURCE_NOT_FOUND,
                                               "Attempt to describe a user credential that does not exist"))
                else:
                    results.append(_user_result(found[name]))
            return self.admin._resp(req, {"throttle_time": 0, "error_code": 0, "error_message": None,
                                          "results": results})

        # Null users lists every user: off the loop past a few (audit: 20,000 held it 400 ms)
        return await self.admin._answer(answer, heavy=len(out.users) + len(names) > _ANSWER_ON_LOOP_MAX_ITEMS)

    # ---- AlterUserScramCredentials ----
    async def alter_user_scram_credentials(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        deletions, upsertions = list(req.body.deletions), list(req.body.upsertions)
        users = list(dict.fromkeys([str(d.name) for d in deletions] + [str(u.name) for u in upsertions]))
        refusal: dict[str, tuple[int, str]] = {}

        def answer() -> Any:
            return self.admin._resp(req, {"throttle_time": 0, "results": [
                {"user": user, "error_code": refusal.get(user, (0, ""))[0],
                 "error_message": refusal.get(user, (0, ""))[1] or None} for user in users]})
        try:
            self.admin._authorize_cluster(ctx, authz.ALTER)
            if len(deletions) + len(upsertions) > MAX_ITEMS_PER_REQUEST:
                raise _Failed(ErrorCode.INVALID_REQUEST, f"{len(deletions) + len(upsertions)} credentials in one "
                                                         f"request, at most {MAX_ITEMS_PER_REQUEST}: split the request")
        except _Failed as exc:
            refusal = {user: (exc.code, exc.message or "") for user in users}
            return answer()

        def refuse(user: str, code: int, message: str) -> None:
            refusal.setdefault(user, (code, message))  # a user's first refusal is its answer

        # Kafka's checks, each user's items in the request's order (deletions, then upsertions).
        seen = Counter((str(item.name), int(item.mechanism)) for item in [*deletions, *upsertions])
        for (user, _mechanism), times in seen.items():
            if times > 1:
                refuse(user, DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
        for item in [*deletions, *upsertions]:
            if not str(item.name):
                refuse("", UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
            elif int(item.mechanism) not in MECHANISM_NAMES:
                refuse(str(item.name), ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                       f"Unknown SCRAM mechanism {int(item.mechanism)}: Brook has 1 (SCRAM-SHA-256) and 2 "
                       f"(SCRAM-SHA-512)")
        records: list[security_pb2.ScramCredentialRecord] = []
        for u in upsertions:
            user = str(u.name)
            if user in refusal:
                continue
            try:
                records.append(_credential(u))
            except errors.BrookError as exc:
                code = exc.code if exc.code == ErrorCode.UNSUPPORTED_SASL_MECHANISM else UNACCEPTABLE_CREDENTIAL
                refuse(user, code, exc.message)
        # Only users none of whose items was refused go to the controller.
        alterations: dict[str, security_pb2.AlterScramCredentialsRequest.UserAlteration] = {}
        for user in users:
            if user not in refusal:
                alterations[user] = security_pb2.AlterScramCredentialsRequest.UserAlteration(user=user)
        for r in records:
            if r.user in alterations:
                alterations[r.user].upsertions.append(r)
        for d in deletions:
            if str(d.name) in alterations:
                alterations[str(d.name)].deletions.add(user=str(d.name), mechanism=MECHANISM_NAMES[int(d.mechanism)])
        if not alterations:
            return answer()
        try:
            out = await self._security(ctx, "AlterScramCredentials", security_pb2.AlterScramCredentialsRequest(
                users=list(alterations.values())))
        except _Failed as exc:
            if exc.code != ErrorCode.UNSUPPORTED_VERSION:
                for user in alterations:
                    refuse(user, exc.code, exc.message or "")
                return answer()
            # Below brook.metadata.version 4 (or an older active controller): one command an item.
            await self._alter_item_by_item(ctx, list(alterations.values()), refuse)
            return answer()
        for user, result in zip(alterations, out.results, strict=False):
            if result.error_code:
                refuse(user, result.error_code, result.error_message)
        return answer()

    async def _alter_item_by_item(self, ctx: KafkaCallContext,
                                  alterations: list[security_pb2.AlterScramCredentialsRequest.UserAlteration],
                                  refuse: Callable[[str, int, str], None]) -> None:
        """A cluster below brook.metadata.version 4: the deletions (each checked to exist first), then the
        upsertions of the users whose deletions all went through. A failure between the two commands (a lost
        quorum, a concurrent change) can still leave a user's deletions done and its upsertions not, which level 4
        rules out."""
        failed: set[str] = set()

        def fail(user: str, code: int, message: str) -> None:
            failed.add(user)
            refuse(user, code, message)
        deleting = [a for a in alterations if a.deletions]
        if deleting:
            try:
                # As this broker: Kafka checks only ALTER here; forwarded as the caller, the read also needed
                # DESCRIBE on the cluster (audit).
                out = await self.admin._controller(ctx, "DescribeUsers", security_pb2.DescribeUsersRequest(
                    users={a.user for a in deleting}), security=True, as_broker=True)
            except _Failed as exc:
                for a in alterations:
                    fail(a.user, exc.code, exc.message or "")
                return
            have = {(d.user, m.mechanism) for d in out.users for m in d.mechanisms}
            for a in deleting:
                if any((a.user, d.mechanism) not in have for d in a.deletions):
                    fail(a.user, ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
        for method in ("DeleteScramCredentials", "UpsertScramCredentials"):
            items = [(a.user, item) for a in alterations if a.user not in failed
                     for item in (a.deletions if method == "DeleteScramCredentials" else a.upsertions)]
            if not items:
                continue
            request = security_pb2.DeleteScramCredentialsRequest(items=[i for _, i in items]) \
                if method == "DeleteScramCredentials" else \
                security_pb2.UpsertScramCredentialsRequest(credentials=[i for _, i in items])
            try:
                out = await self._security(ctx, method, request)
            except _Failed as exc:
                for user, _ in items:
                    fail(user, exc.code, exc.message or "")
                continue
            for (user, _), result in zip(items, out.results, strict=False):
                if result.error_code:
                    fail(user, result.error_code, result.error_message)

    # ---- DescribeClientQuotas ----
    async def describe_client_quotas(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        def refused(code: int, message: str | None) -> Any:
            return self.admin._resp(req, {"throttle_time": 0, "error_code": code, "error_message": message,
                                    "entries": None})
        try:
            self.admin._authorize_cluster(ctx, authz.DESCRIBE_CONFIGS)
            components = _quota_filter(list(req.body.components))
            out = await self._security(ctx, "DescribeClientQuotas", security_pb2.DescribeClientQuotasRequest())
        except _Failed as exc:
            return refused(exc.code, exc.message)
        strict = bool(_get(req.body, "strict", False))

        def answer() -> Any:
            entries = []
            for q in out.quotas:
                name = None if q.entity == sec.DEFAULT_ENTITY else q.entity.removeprefix(_USER_PREFIX)
                if not _matches(name, components, strict):
                    continue
                entries.append({"entity": [{"entity_type": USER, "entity_name": name}],
                                "values": [{"key": k, "value": v} for k, v in sorted(q.values.items())]})
            return self.admin._resp(req, {"throttle_time": 0, "error_code": 0, "error_message": None,
                                          "entries": entries})

        # Every quota of the cluster is read and filtered here: off the loop past a few (audit: 20,000 held it 355 ms)
        return await self.admin._answer(answer, heavy=len(out.quotas) > _ANSWER_ON_LOOP_MAX_ITEMS)

    # ---- AlterClientQuotas ----
    async def alter_client_quotas(self, req: codec.Request, ctx: KafkaCallContext) -> Any:
        entries = list(req.body.entries)
        validate_only = bool(_get(req.body, "validate_only", False))
        results: list[tuple[int, str | None]] = [(0, None)] * len(entries)
        try:
            self.admin._authorize_cluster(ctx, authz.ALTER_CONFIGS)
            if len(entries) > MAX_ITEMS_PER_REQUEST:
                raise _Failed(ErrorCode.INVALID_REQUEST, f"{len(entries)} entries in one request, at most "
                                                         f"{MAX_ITEMS_PER_REQUEST}: split the request")
        except _Failed as exc:
            results = [(exc.code, exc.message)] * len(entries)
        else:
            entities: list[str | _Failed] = []
            for e in entries:
                try:
                    entities.append(_quota_entity(list(e.entity)))
                except _Failed as exc:
                    entities.append(exc)
            counts = Counter(entity for entity in entities if isinstance(entity, str))
            changes: list[tuple[int, security_pb2.QuotaAlteration]] = []  # (entry, its change) to forward
            for i, (e, entity) in enumerate(zip(entries, entities, strict=True)):
                try:
                    if isinstance(entity, _Failed):
                        raise entity
                    if counts[entity] > 1:
                        raise _Failed(ErrorCode.INVALID_REQUEST, "Each entity must appear at most once in a request")
                    to_set, to_remove = _quota_ops(list(e.ops))
                    if validate_only or not (to_set or to_remove):
                        continue
                    changes.append((i, security_pb2.QuotaAlteration(entity=entity, set=to_set, remove=to_remove)))
                except _Failed as exc:
                    results[i] = (exc.code, exc.message)
            if changes:
                await self._alter_quotas(ctx, changes, results)
        return self.admin._resp(req, {"throttle_time": 0, "entries": [
            {"error_code": code, "error_message": message,
             "entity": [{"entity_type": str(c.entity_type), "entity_name": _get(c, "entity_name")} for c in e.entity]}
            for e, (code, message) in zip(entries, results, strict=True)]})

    async def _alter_quotas(self, ctx: KafkaCallContext, changes: list[tuple[int, security_pb2.QuotaAlteration]],
                            results: list[tuple[int, str | None]]) -> None:
        """Every entry's change in one controller call, which proposes them together and answers each (as Kafka's
        controller writes a request's records in one batch). One call an entry, each waiting for its commit, took
        30 s for 1,000 entries (audit). An active controller of an earlier release refuses the call, having no
        entity in it, and answers no results: then one call an entry, as before."""
        failure: _Failed | None = None
        try:
            out = await self._security(ctx, "AlterClientQuotas", security_pb2.AlterClientQuotasRequest(
                alterations=[change for _, change in changes]))
        except _Failed as exc:
            failure = exc
        if failure is None and len(out.results) == len(changes):
            for (i, _), result in zip(changes, out.results, strict=True):
                if result.error_code:
                    results[i] = (result.error_code, result.error_message)
            return
        if failure is not None and failure.code != ErrorCode.INVALID_REQUEST:
            for i, _ in changes:
                results[i] = (failure.code, failure.message)
            return
        for i, change in changes:
            try:
                await self._security(ctx, "AlterClientQuotas", security_pb2.AlterClientQuotasRequest(
                    entity=change.entity, set=change.set, remove=change.remove))
            except _Failed as exc:
                results[i] = (exc.code, exc.message)


def _user_result(d: security_pb2.UserDescription) -> dict[str, Any]:
    return {"user": d.user, "error_code": 0, "error_message": None,
            "credential_infos": [{"mechanism": MECHANISM_CODES[m.mechanism], "iterations": m.iterations}
                                 for m in d.mechanisms if m.mechanism in MECHANISM_CODES]}


def _user_error(user: str, code: int, message: str) -> dict[str, Any]:
    return {"user": user, "error_code": code, "error_message": message, "credential_infos": []}


def _credential(u: Any) -> security_pb2.ScramCredentialRecord:
    """The stored credential of an upsertion: StoredKey = H(HMAC(SaltedPassword, "Client Key")) and
    ServerKey = HMAC(SaltedPassword, "Server Key") (RFC 5802), validated as the controller will."""
    mechanism = MECHANISM_NAMES[int(u.mechanism)]
    digest = _HASHES[mechanism]
    salted, salt, iterations = bytes(u.salted_password), bytes(u.salt), int(u.iterations)
    if iterations < sec.MIN_ITERATIONS:
        raise errors.InvalidRequestError(f"Too few iterations: {iterations}, at least {sec.MIN_ITERATIONS}")
    if iterations > sec.MAX_ITERATIONS:
        raise errors.InvalidRequestError(f"Too many iterations: {iterations}, at most {sec.MAX_ITERATIONS}")
    if len(salted) != digest().digest_size:
        raise errors.InvalidRequestError(f"a {mechanism} salted password is {digest().digest_size} bytes (PBKDF2's "
                                         f"output), not {len(salted)}")
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    cred = sec.validate_credential(sec.ScramCredential(
        str(u.name), mechanism, salt, digest(client_key).digest(), hmac.new(salted, b"Server Key", digest).digest(),
        iterations), strict=True)
    return security_pb2.ScramCredentialRecord(user=cred.user, mechanism=cred.mechanism, salt=cred.salt,
                                              stored_key=cred.stored_key, server_key=cred.server_key,
                                              iterations=cred.iterations)


def _quota_filter(components: list[Any]) -> dict[str, tuple[int, str | None]]:
    """DescribeClientQuotas' components, checked as Kafka checks them: entity type -> (match type, name)."""
    out: dict[str, tuple[int, str | None]] = {}
    for c in components:
        kind, match_type, match = str(c.entity_type), int(c.match_type), _get(c, "match")
        if kind not in ENTITY_TYPES:
            raise _Failed(ErrorCode.UNSUPPORTED_VERSION, f"Custom entity type {kind[:64]!r} not supported")
        if kind in out:
            raise _Failed(ErrorCode.INVALID_REQUEST, f"Duplicate {kind} component entity type")
        if match_type == MATCH_EXACT and match is None:
            raise _Failed(ErrorCode.INVALID_REQUEST, f"the {kind} component of match type EXACT has no name")
        if match_type in (MATCH_DEFAULT, MATCH_SPECIFIED) and match is not None:
            raise _Failed(ErrorCode.INVALID_REQUEST, f"the {kind} component of match type "
                                                     f"{'DEFAULT' if match_type == MATCH_DEFAULT else 'SPECIFIED'} "
                                                     f"names an entity")
        if match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            raise _Failed(ErrorCode.INVALID_REQUEST, f"Unknown match type {match_type}")
        out[kind] = (match_type, match)
    if IP in out and len(out) > 1:
        raise _Failed(ErrorCode.INVALID_REQUEST, "IP filter component should not be used with user or clientId "
                                                 "filter component.")
    return out


def _matches(user: str | None, components: dict[str, tuple[int, str | None]], strict: bool) -> bool:
    """Whether the user entity (None: the user default) passes the filter: a component of another type needs the
    entity to have that type (a Brook entity has only a user), and ``strict`` wants no type beyond the filter's."""
    if any(kind != USER for kind in components):
        return False
    if USER not in components:
        return not strict
    match_type, name = components[USER]
    if match_type == MATCH_EXACT:
        return user == name
    if match_type == MATCH_DEFAULT:
        return user is None
    return True  # SPECIFIED: any entity of the type, the default included (Kafka's ClientQuotasImage)


def _quota_entity(entity: list[Any]) -> str:
    """Brook's quota entity ("User:alice", or "<default>") of a Kafka ClientQuotaEntity."""
    kinds = [str(c.entity_type) for c in entity]
    unknown = [k for k in kinds if k not in ENTITY_TYPES]
    if unknown:
        raise _Failed(ErrorCode.UNSUPPORTED_VERSION, f"Custom entity type {unknown[0][:64]!r} not supported")
    if len(set(kinds)) != len(kinds):
        raise _Failed(ErrorCode.INVALID_REQUEST, "Duplicate entity type in the entity")
    if kinds != [USER]:
        raise _Failed(ErrorCode.INVALID_REQUEST, USER_ONLY)
    name = _get(entity[0], "entity_name")
    if name is None:
        return sec.DEFAULT_ENTITY
    if not name:
        raise _Failed(ErrorCode.INVALID_REQUEST, "the user entity's name is empty (a null name is the default)")
    principal = _USER_PREFIX + str(name)
    try:
        return sec.validate_quota_entity(principal)
    except errors.BrookError as exc:
        raise _Failed(exc.code, exc.message) from None


def _quota_ops(ops: list[Any]) -> tuple[dict[str, float], list[str]]:
    """(keys to set, keys to remove) of an entry's ops, each key once and among Brook's."""
    to_set: dict[str, float] = {}
    to_remove: list[str] = []
    seen: set[str] = set()
    for op in ops:
        key = str(op.key)
        if key in seen:
            raise _Failed(ErrorCode.INVALID_REQUEST, f"Duplicate quota key {key[:64]!r}")
        seen.add(key)
        if key not in sec.QUOTA_KEYS:
            hint = " (Brook's request quota is request_rate, in requests a second)" \
                if key == "request_percentage" else ""
            raise _Failed(ErrorCode.INVALID_REQUEST, f"quota key {key[:64]!r} is not one of "
                                                     f"{', '.join(sec.QUOTA_KEYS)}{hint}")
        if bool(op.remove):
            to_remove.append(key)
            continue
        value = float(op.value)
        if key in WHOLE_NUMBER_KEYS and math.isfinite(value) and not value.is_integer():
            raise _Failed(ErrorCode.INVALID_REQUEST, f"quota {key} is a whole number of bytes a second (a Kafka "
                                                     f"Long), not {value!r}")
        to_set[key] = value
    try:
        sec.validate_quota_values(to_set, strict=True)
    except errors.BrookError as exc:
        raise _Failed(exc.code, exc.message) from None
    return to_set, to_remove
