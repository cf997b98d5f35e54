"""SecurityService (proto/security.proto): SASL/SCRAM, and the admin API of users, ACLs, quotas.

Brokers serve ``SaslAuthenticate`` only (their credentials come from the metadata
cache); the admin RPCs answer NOT_CONTROLLER there. Controllers serve everything; as
for ControllerService, only the active controller answers the admin RPCs and the
others redirect to it. Admin writes become quorum commands
(metadata_quorum/commands.py), so every node learns them through the Raft log and
brokers through WatchMetadata.

Authorization (Kafka's): changing users or ACLs needs ALTER on the cluster, reading
them DESCRIBE; quotas need ALTER_CONFIGS / DESCRIBE_CONFIGS on the cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import scramp

from broker.admission import peer_host
from broker.authorizer import ALTER, ALTER_CONFIGS, CLUSTER, DESCRIBE, DESCRIBE_CONFIGS, AclIndex, Authorizer
from broker.sasl import ScramAuthenticator, principal_of
from metadata_quorum import commands as c
from metadata_quorum import features
from metadata_quorum import security as sec
from metadata_quorum.state import MetadataDelta, MetadataState
from proto import errors
from proto import security_pb2 as spb
from proto import security_pb2_grpc as spb_grpc
from proto.errors import ErrorCode

log = logging.getLogger(__name__)

R = TypeVar("R")
MAX_ITEMS_PER_REQUEST = 1000
BOOTSTRAP_CHECK_S = 1.0


# ---- records <-> protobuf ----
def credential_record(cred: sec.ScramCredential) -> spb.ScramCredentialRecord:
    return spb.ScramCredentialRecord(user=cred.user, mechanism=cred.mechanism, salt=cred.salt,
                                     stored_key=cred.stored_key, server_key=cred.server_key,
                                     iterations=cred.iterations)


def acl_record(b: sec.AclBinding) -> spb.AclBinding:
    return spb.AclBinding(resource_type=b.resource_type, resource_name=b.resource_name, pattern_type=b.pattern_type,
                          principal=b.principal, host=b.host, operation=b.operation, permission=b.permission)


def binding_of(a: spb.AclBinding) -> sec.AclBinding:
    """A binding a client asks to create, validated (its host too: ``*`` or an IP address)."""
    return sec.new_acl_binding([a.resource_type, a.resource_name, a.pattern_type or "LITERAL", a.principal,
                            a.host or "*", a.operation, a.permission])


def security_delta(delta: MetadataDelta) -> spb.SecurityDelta | None:
    """The security part of a metadata update; None when the delta has none."""
    if not (delta.credentials or delta.deleted_credentials or delta.acls is not None or delta.quotas):
        return None
    out = spb.SecurityDelta(credentials=[credential_record(cr) for cr in delta.credentials],
                            acls_changed=delta.acls is not None,
                            acls=[acl_record(b) for b in delta.acls or ()],
                            quotas=[spb.QuotaRecord(entity=e, values=v) for e, v in delta.quotas])
    for user, mechanism in delta.deleted_credentials:
        out.deleted_credentials.add(user=user, mechanism=mechanism)
    return out


def salted_credential(user: str, mechanism: str, password: str, iterations: int = sec.MIN_ITERATIONS,
                      ) -> sec.ScramCredential:
    """Salt a password (random salt) into what the quorum stores. Used by clients and bootstrap."""
    if not password:
        raise errors.InvalidRequestError("the password is empty")
    if mechanism not in sec.MECHANISMS:  # before scramp, whose own error for it is no BrookError
        raise errors.error_for(ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                               f"unknown SCRAM mechanism {mechanism!r}: {' or '.join(sorted(sec.MECHANISMS))}")
    sec.check_iterations(iterations)  # before the PBKDF2, which runs at that count
    salt, stored_key, server_key, i = scramp.ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=iterations)
    return sec.validate_credential(sec.ScramCredential(user, mechanism, salt, stored_key, server_key, i),
                                   strict=True)


def acl_filter_key(f: spb.AclFilter) -> tuple[str, ...]:
    """What ``acl_matches_filter`` reads of a filter, normalised as it compares it: filters with equal keys
    match the same bindings."""
    return (f.resource_type.upper(), f.resource_name, f.pattern_type.upper(), f.principal, f.host,
            f.operation.upper(), f.permission.upper())


def acl_matches_filter(b: sec.AclBinding, f: spb.AclFilter) -> bool:
    if f.pattern_type.upper() == "MATCH":  # every binding that applies to the literal resource name
        applies = (b.resource_name in (f.resource_name, sec.WILDCARD) if b.pattern_type == "LITERAL"
                   else f.resource_name.startswith(b.resource_name))
        name_ok = not f.resource_name or applies
        pattern_ok = True
    else:
        name_ok = not f.resource_name or b.resource_name == f.resource_name
        pattern_ok = not f.pattern_type or b.pattern_type == f.pattern_type.upper()
    return (name_ok and pattern_ok
            and (not f.resource_type or b.resource_type == f.resource_type.upper())
            and (not f.principal or b.principal == f.principal)
            and (not f.operation or b.operation == f.operation.upper())
            and (not f.permission or b.permission == f.permission.upper())
            and (not f.host or b.host == f.host))


class SecurityService(spb_grpc.SecurityServiceServicer):
    """``admin`` is a QuorumSecurityAdmin on controllers, None on brokers."""

    def __init__(self, authenticator: ScramAuthenticator, authorizer: Authorizer,
                 admin: QuorumSecurityAdmin | None = None) -> None:
        self._auth = authenticator
        self._authz = authorizer
        self._admin = admin

    def SaslAuthenticate(self, request: spb.SaslAuthenticateRequest, context: Any) -> spb.SaslAuthenticateResponse:
        try:
            return self._auth.authenticate(request, _peer_of(context))
        except Exception as exc:  # a bug must not kill the server thread
            log.exception("SaslAuthenticate failed")
            return spb.SaslAuthenticateResponse(error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                                error_message=f"internal error: {type(exc).__name__}")

    def _serve(self, response_cls: type[R], context: Any, operation: str, fn: Callable[[QuorumSecurityAdmin], R]) -> R:
        response = response_cls()
        try:
            self._authz.check(principal_of(context), operation, CLUSTER)
            if self._admin is None:
                raise errors.NotControllerError("security admin requests go to the controllers")
            if not self._admin.is_active():
                response.redirect.CopyFrom(self._admin.redirect())  # type: ignore[attr-defined]
                raise errors.NotControllerError("this controller is not the active controller")
            return fn(self._admin)
        except errors.BrookError as exc:
            response.error_code, response.error_message = exc.code, exc.message  # type: ignore[attr-defined]
            return response
        except Exception as exc:
            log.exception("security admin request failed")
            response.error_code = ErrorCode.UNKNOWN_SERVER_ERROR  # type: ignore[attr-defined]
            response.error_message = f"internal error: {type(exc).__name__}: {exc}"  # type: ignore[attr-defined]
            return response

    def UpsertScramCredentials(self, request: spb.UpsertScramCredentialsRequest,
                               context: Any) -> spb.ScramCredentialsResponse:
        return self._serve(spb.ScramCredentialsResponse, context, ALTER,
                           lambda a: a.upsert_credentials(request.credentials, _timeout(context)))

    def DeleteScramCredentials(self, request: spb.DeleteScramCredentialsRequest,
                               context: Any) -> spb.ScramCredentialsResponse:
        return self._serve(spb.ScramCredentialsResponse, context, ALTER,
                           lambda a: a.delete_credentials(request.items, _timeout(context)))

    def AlterScramCredentials(self, request: spb.AlterScramCredentialsRequest,
                              context: Any) -> spb.ScramCredentialsResponse:
        return self._serve(spb.ScramCredentialsResponse, context, ALTER,
                           lambda a: a.alter_credentials(request.users, _timeout(context)))

    def DescribeUsers(self, request: spb.DescribeUsersRequest, context: Any) -> spb.DescribeUsersResponse:
        return self._serve(spb.DescribeUsersResponse, context, DESCRIBE, lambda a: a.describe_users(request.users))

    def CreateAcls(self, request: spb.CreateAclsRequest, context: Any) -> spb.AclsResponse:
        return self._serve(spb.AclsResponse, context, ALTER, lambda a: a.create_acls(request.acls, _timeout(context)))

    def DescribeAcls(self, request: spb.DescribeAclsRequest, context: Any) -> spb.AclsResponse:
        return self._serve(spb.AclsResponse, context, DESCRIBE, lambda a: a.describe_acls(request.filter))

    def DeleteAcls(self, request: spb.DeleteAclsRequest, context: Any) -> spb.AclsResponse:
        return self._serve(spb.AclsResponse, context, ALTER,
                           lambda a: a.delete_acls(request.filters, _timeout(context)))

    def AlterClientQuotas(self, request: spb.AlterClientQuotasRequest, context: Any) -> spb.ClientQuotasResponse:
        return self._serve(spb.ClientQuotasResponse, context, ALTER_CONFIGS,
                           lambda a: a.alter_quota(request, _timeout(context)))

    def DescribeClientQuotas(self, request: spb.DescribeClientQuotasRequest,
                             context: Any) -> spb.ClientQuotasResponse:
        return self._serve(spb.ClientQuotasResponse, context, DESCRIBE_CONFIGS,
                           lambda a: a.describe_quotas(request.entity))


def _timeout(context: Any, default_s: float = 30.0) -> float:
    remaining = context.time_remaining() if context is not None else None
    return default_s if remaining is None else max(0.1, min(default_s, remaining - 0.2))


class QuorumSecurityAdmin:
    """The active controller's side of the security admin API: reads MetadataState, proposes commands."""

    def __init__(self, controller: Any, raft: Any, redirect: Callable[[], Any],
                 bootstrap_users: Iterable[tuple[str, str]] = ()) -> None:
        self._controller = controller
        self._raft = raft
        self._redirect = redirect
        self._bootstrap = list(bootstrap_users)
        self._bootstrapped_term = -1
        self._lock = threading.Lock()

    def is_active(self) -> bool:
        return bool(self._controller.is_active())

    def redirect(self) -> spb.Redirect:
        r = self._redirect()
        return spb.Redirect(leader_id=r.leader_id, leader=r.leader)

    def _propose(self, cmd: c.Command, timeout_s: float) -> Any:
        result = self._controller._propose(cmd, timeout_s)  # stamped with the controller epoch
        result.raise_for_error()
        return result.value

    def _propose_each(self, response: R, commands: list[tuple[Any, Callable[[], c.Command]]], timeout_s: float) -> R:
        """Submit each item's command (``make`` raises an item's refusal), then wait for them all within one
        ``timeout_s``: waited one by one, each its own timeout, 1,000 items took 52 s and went on being proposed
        long after the caller's deadline (audit). An item not applied by then is REQUEST_TIMED_OUT (it may still
        be), as a request past its timeout is in Kafka."""
        submitted = []
        for result, make in commands:
            try:
                submitted.append((result, self._controller._submit(make())))  # stamped with the controller epoch
            except errors.BrookError as exc:
                result.error_code, result.error_message = exc.code, exc.message
        deadline = time.monotonic() + timeout_s
        for result, proposal in submitted:
            try:
                proposal.wait(max(0.0, deadline - time.monotonic())).raise_for_error()
            except errors.BrookError as exc:
                result.error_code, result.error_message = exc.code, exc.message
        return response

    # ---- users ----
    def upsert_credentials(self, records: Iterable[spb.ScramCredentialRecord],
                           timeout_s: float) -> spb.ScramCredentialsResponse:
        records = list(records)
        _bounded(records)
        response = spb.ScramCredentialsResponse()

        def upsert(r: spb.ScramCredentialRecord) -> c.Command:
            cred = sec.validate_credential(sec.ScramCredential(r.user, r.mechanism, r.salt, r.stored_key,
                                                               r.server_key, r.iterations), strict=True)
            return c.UpsertScramCredential(*cred.to_plain())  # type: ignore[arg-type]

        return self._propose_each(response, [(response.results.add(name=r.user), lambda r=r: upsert(r))
                                             for r in records], timeout_s)

    def delete_credentials(self, items: Iterable[spb.DeleteScramCredentialsRequest.Item],
                           timeout_s: float) -> spb.ScramCredentialsResponse:
        items = list(items)
        _bounded(items)
        response = spb.ScramCredentialsResponse()
        return self._propose_each(response, [(response.results.add(name=item.user),
                                              lambda item=item: c.DeleteScramCredential(item.user, item.mechanism))
                                             for item in items], timeout_s)

    def alter_credentials(self, users: Iterable[spb.AlterScramCredentialsRequest.UserAlteration],
                          timeout_s: float) -> spb.ScramCredentialsResponse:
        """Each user's upsertions and deletions as one AlterScramCredentials command: all of them or none, as Kafka
        writes a request's records in one batch. Below brook.metadata.version 4 the whole request is refused
        UNSUPPORTED_VERSION (the caller falls back to one command an item)."""
        users = list(users)
        _bounded([item for u in users for item in (*u.upsertions, *u.deletions)])
        level = self._raft.read(lambda s: s.metadata_level)
        if level < features.ATOMIC_SCRAM:
            raise errors.UnsupportedVersionError(features.needs_level(
                features.ATOMIC_SCRAM, level, "changing a user's SCRAM credentials in one command"))
        response = spb.ScramCredentialsResponse()

        def alter(u: spb.AlterScramCredentialsRequest.UserAlteration) -> c.Command:
            if any(r.user != u.user for r in u.upsertions) or any(d.user != u.user for d in u.deletions):
                raise errors.InvalidRequestError(f"an alteration of user {u.user!r} names another user")
            if any(not d.mechanism for d in u.deletions):
                raise errors.InvalidRequestError("a deletion names its mechanism")
            creds = [sec.validate_credential(sec.ScramCredential(r.user, r.mechanism, r.salt, r.stored_key,
                                                                 r.server_key, r.iterations), strict=True)
                     for r in u.upsertions]
            return c.AlterScramCredentials([cred.to_plain() for cred in creds],  # type: ignore[misc]
                                           [[d.user, d.mechanism] for d in u.deletions])

        return self._propose_each(response, [(response.results.add(name=u.user), lambda u=u: alter(u))
                                             for u in users], timeout_s)

    def describe_users(self, users: Iterable[str]) -> spb.DescribeUsersResponse:
        wanted = set(users)

        def read(s: MetadataState) -> spb.DescribeUsersResponse:
            out: dict[str, spb.UserDescription] = {}
            for (user, mechanism), cred in sorted(s.scram.items()):
                if wanted and user not in wanted:
                    continue
                desc = out.setdefault(user, spb.UserDescription(user=user))
                desc.mechanisms.add(mechanism=mechanism, iterations=cred.iterations)
            return spb.DescribeUsersResponse(users=list(out.values()))

        return self._raft.read(read)

    # ---- ACLs ----
    def create_acls(self, acls: Iterable[spb.AclBinding], timeout_s: float) -> spb.AclsResponse:
        bindings = [binding_of(a) for a in acls]
        _bounded(bindings)
        self._propose(c.CreateAcls([b.as_list() for b in bindings]), timeout_s)
        return spb.AclsResponse(acls=[acl_record(b) for b in bindings])

    def _acls(self) -> frozenset[sec.AclBinding]:
        """The ACL set as it is now: one consistent version, taken under the state lock in O(1) (the state
        replaces the set on each change, never changes it in place), to be matched outside the lock."""
        return self._raft.read(lambda s: s.acls)

    def describe_acls(self, f: spb.AclFilter) -> spb.AclsResponse:
        found = sorted(b for b in self._acls() if acl_matches_filter(b, f))
        return spb.AclsResponse(acls=[acl_record(b) for b in found])

    def delete_acls(self, filters: Iterable[spb.AclFilter], timeout_s: float) -> spb.AclsResponse:
        """Delete the bindings any filter matches. The filters are matched against one version of the ACL
        set, outside the state lock (10,000 ACLs x 1,000 filters inside it held the lock 3.5 s and stalled the
        Raft tick thread, audit), each distinct filter once; exactly the bindings matched are proposed, and
        the state deletes those still there (as before: a binding created after the match stays; the answer
        lists what this command deleted)."""
        filters = list(filters)
        _bounded(filters)
        distinct = list({acl_filter_key(f): f for f in filters}.values())
        if not distinct:
            return spb.AclsResponse()
        doomed = sorted(b for b in self._acls() if any(acl_matches_filter(b, f) for f in distinct))
        if not doomed:
            return spb.AclsResponse()
        gone = self._propose(c.DeleteAcls([b.as_list() for b in doomed]), timeout_s)
        return spb.AclsResponse(acls=[acl_record(b) for b in gone])

    # ---- quotas ----
    def alter_quota(self, req: spb.AlterClientQuotasRequest, timeout_s: float) -> spb.ClientQuotasResponse:
        if req.alterations:
            if req.entity or req.set or req.remove:
                raise errors.InvalidRequestError("a request with alterations names no entity of its own")
            return self._alter_quotas(list(req.alterations), timeout_s)
        entity = sec.validate_quota_entity(req.entity)
        sec.validate_quota_values(dict(req.set), strict=True)
        self._propose(c.AlterClientQuota(entity, dict(req.set), list(req.remove)), timeout_s)
        return self.describe_quotas(entity)

    def _alter_quotas(self, alterations: list[spb.QuotaAlteration], timeout_s: float) -> spb.ClientQuotasResponse:
        """A Kafka AlterClientQuotas request's entries: each checked, then all proposed together and waited for
        within one ``timeout_s``, each answered in ``results``. One call and one commit each, waited in turn, took
        30 s for 1,000 entries (audit), and the Raft thread fell 0.5 s behind its ticks meanwhile."""
        _bounded(alterations)
        response = spb.ClientQuotasResponse()

        def alter(a: spb.QuotaAlteration) -> c.Command:
            entity = sec.validate_quota_entity(a.entity)
            sec.validate_quota_values(dict(a.set), strict=True)
            unknown = [k for k in a.remove if k not in sec.QUOTA_KEYS]
            if unknown:
                raise errors.InvalidRequestError(f"cannot remove unknown quotas {unknown}")
            return c.AlterClientQuota(entity, dict(a.set), list(a.remove))

        return self._propose_each(response, [(response.results.add(entity=a.entity), lambda a=a: alter(a))
                                             for a in alterations], timeout_s)

    def describe_quotas(self, entity: str) -> spb.ClientQuotasResponse:
        found = self._raft.read(lambda s: [(e, dict(v)) for e, v in sorted(s.quotas.items())
                                           if not entity or e == entity])
        return spb.ClientQuotasResponse(quotas=[spb.QuotaRecord(entity=e, values=v) for e, v in found])

    # ---- bootstrap (Kafka: kafka-storage format --add-scram) ----
    def maybe_bootstrap(self, timeout_s: float = 10.0) -> None:
        """Once per controller term: create the configured bootstrap users that do not exist yet.

        Only missing credentials are added, so a password later changed with
        ``brook user create`` is never reset by a controller restart.
        """
        if not self._bootstrap or not self.is_active():
            return
        term = self._raft.term
        with self._lock:
            if self._bootstrapped_term == term:
                return
        existing = self._raft.read(lambda s: set(s.scram))
        for user, password in self._bootstrap:
            for mechanism in sec.MECHANISMS:
                if (user, mechanism) in existing:
                    continue
                cred = salted_credential(user, mechanism, password)
                self._propose(c.UpsertScramCredential(*cred.to_plain()), timeout_s)  # type: ignore[arg-type]
                log.info("bootstrap SCRAM user %s (%s) created", user, mechanism)
        with self._lock:
            self._bootstrapped_term = term


def parse_bootstrap_users(text: str) -> list[tuple[str, str]]:
    """``scram.bootstrap.users``: ``user:password,user2:password2`` (the password may contain ':')."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        user, sep, password = item.partition(":")
        if not sep or not password:
            raise errors.InvalidConfigError("scram.bootstrap.users entries are user:password")
        out.append((sec.validate_user(user), password))
    return out


def _bounded(items: list[Any]) -> None:
    if len(items) > MAX_ITEMS_PER_REQUEST:
        raise errors.InvalidRequestError(f"at most {MAX_ITEMS_PER_REQUEST} items per request")


class StateAclView:
    """A controller's AclIndex over its MetadataState, rebuilt only when the ACL set changed."""

    def __init__(self, raft: Any) -> None:
        self._raft = raft
        self._lock = threading.Lock()
        self._version = -1
        self._acls: frozenset[sec.AclBinding] = frozenset()
        self._index = AclIndex()

    def __call__(self) -> AclIndex:
        version = self._raft.version
        with self._lock:
            if version != self._version:
                acls = self._raft.read(lambda s: s.acls)  # replaced on change, never changed in place
                if acls != self._acls:
                    self._acls, self._index = acls, AclIndex(acls)
                self._version = version
            return self._index


class BootstrapThread:
    """Creates ``scram.bootstrap.users`` whenever this controller becomes active (bounded retries)."""

    def __init__(self, admin: QuorumSecurityAdmin, name: str) -> None:
        self._admin = admin
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # a node whose start failed before this started stops it too
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(BOOTSTRAP_CHECK_S):
            try:
                self._admin.maybe_bootstrap()
            except errors.BrookError as exc:  # leadership moved or the quorum is slow: next round retries
                log.info("bootstrap users not created yet: %s", exc)
            except Exception:
                log.exception("bootstrap users failed")


def _peer_of(context: Any) -> str:
    """The caller's address (the failed-login limit is per user and address); "" when there is none."""
    try:
        return peer_host(str(context.peer() or "")) if context is not None else ""
    except Exception:  # an in-process caller's context may have no peer
        return ""
