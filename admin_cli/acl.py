"""``brook acl``: Kafka-model ACLs stored in the metadata quorum."""

from __future__ import annotations

from typing import Annotated

import typer

from admin_cli.common import BootstrapOpt, CliError, OutputOpt, ok, show, state, table
from broker.authorizer import SUPPORTED_OPERATIONS
from metadata_quorum.security import (
    CLUSTER_NAME,
    OPERATIONS,
    PATTERN_TYPES,
    AclBinding,
    acl_binding,
    acl_host,
    new_acl_binding,
    validate_principal,
)
from proto import errors

app = typer.Typer(help="Create, list and delete ACLs (TOPIC, GROUP, CLUSTER resources; TRANSACTIONAL_ID, "
                       "DELEGATION_TOKEN and USER ones are stored for Kafka tools, not enforced).",
                  no_args_is_help=True)

TopicOpt = Annotated[str | None, typer.Option("--topic", help="Topic name, prefix, or * for every topic.")]
GroupOpt = Annotated[str | None, typer.Option("--group", help="Group id, prefix, or * for every group.")]
ClusterOpt = Annotated[bool, typer.Option("--cluster", help="The cluster resource.")]
_STORED = " Stored and listed as Kafka's, not enforced: Brook has no delegation tokens; needs " \
          "brook.metadata.version 2 (brook features upgrade)."
TxnOpt = Annotated[str | None, typer.Option("--transactional-id", help="Transactional id, prefix, or * (DESCRIBE, "
                                                                       "WRITE: what a transactional producer needs); "
                                                                       "needs brook.metadata.version 2.")]
TokenOpt = Annotated[str | None, typer.Option("--delegation-token", help="Delegation token id or *." + _STORED)]
UserOpt = Annotated[str | None, typer.Option("--user-principal", help="User:<name> whose tokens." + _STORED)]
PatternOpt = Annotated[str, typer.Option("--resource-pattern-type", help="literal or prefixed.")]
FilterPatternOpt = Annotated[str, typer.Option(
    "--resource-pattern-type", help="literal, prefixed, match (every binding that applies to the name) or any.")]
HostOpt = Annotated[str | None, typer.Option("--host", help="Only bindings on this host (* or an IP address).")]
_COLUMNS = ["PRINCIPAL", "HOST", "PERMISSION", "OPERATION", "RESOURCE", "PATTERN", "NAME"]


def _resource(topic: str | None, group: str | None, cluster: bool, txn: str | None = None,
              token: str | None = None, user: str | None = None) -> tuple[str, str]:
    chosen = [(t, n) for t, n in (("TOPIC", topic), ("GROUP", group), ("CLUSTER", CLUSTER_NAME if cluster else None),
                                  ("TRANSACTIONAL_ID", txn), ("DELEGATION_TOKEN", token), ("USER", user))
              if n is not None]
    if len(chosen) != 1:
        raise CliError("name exactly one resource: --topic NAME, --group NAME, --cluster, --transactional-id ID, "
                       "--delegation-token ID or --user-principal User:NAME", code=2)
    return chosen[0]


def _any_resource(topic: str | None, group: str | None, cluster: bool, txn: str | None, token: str | None,
                  user: str | None) -> bool:
    return any(v is not None for v in (topic, group, txn, token, user)) or cluster


def _host(text: str) -> str:
    """A --host filter as bindings store it (canonical IP); a usage error for anything else."""
    try:
        return acl_host(text)
    except ValueError:
        raise CliError(f"--host {text!r} must be * or an IP address", code=2) from None


def _check_operation(rtype: str, operation: str) -> None:
    """A usage error for an operation the resource type cannot be granted (Kafka's kafka-acls.sh refuses those:
    AclEntry.supportedOperations), e.g. ALTER_CONFIGS on a group or READ on the cluster."""
    supported = (*SUPPORTED_OPERATIONS[rtype], "ALL")
    if operation not in supported:
        raise CliError(f"resource type {rtype} only supports operations {', '.join(supported)}, "
                       f"not {operation}", code=2)


def _principal(text: str) -> str:
    try:
        return validate_principal(text)
    except errors.BrookError as exc:
        raise CliError(f"--principal: {exc.message}", code=2) from None


def _filter_pattern(text: str, rtype: str | None, name: str | None) -> str:
    """A --resource-pattern-type filter as the server matches it ("" for ANY); a usage error for anything
    else, and for a resource no binding can have (checked as ``acl create`` checks it)."""
    pattern = text.upper()
    if pattern not in (*PATTERN_TYPES, "MATCH", "ANY"):
        raise CliError(f"--resource-pattern-type {text!r} must be literal, prefixed, match or any", code=2)
    if rtype is not None and name is not None:
        try:
            acl_binding([rtype, name, pattern if pattern in PATTERN_TYPES else "LITERAL", "User:*", "*", "ALL",
                         "ALLOW"])
        except errors.BrookError as exc:
            raise CliError(exc.message, code=2) from None
    return "" if pattern == "ANY" else pattern


def _filter_operation(text: str, rtype: str) -> str:
    """An --operation filter ("" for ANY); a usage error for an unknown one or one ``rtype`` cannot have."""
    operation = text.upper()
    if operation == "ANY":
        return ""
    if operation not in OPERATIONS:
        raise CliError(f"--operation {text!r} is not one of {', '.join(OPERATIONS)} (or ANY)", code=2)
    _check_operation(rtype, operation)
    return operation


def _row(b: AclBinding) -> dict[str, str]:
    return {"principal": b.principal, "host": b.host, "permission": b.permission, "operation": b.operation,
            "resource_type": b.resource_type, "pattern_type": b.pattern_type, "resource_name": b.resource_name}


def _show(st: object, bindings: list[AclBinding], note: str) -> None:
    rows = [_row(b) for b in bindings]
    show(st, rows, table(None, _COLUMNS, [[r["principal"], r["host"], r["permission"], r["operation"],
                                           r["resource_type"], r["pattern_type"], r["resource_name"]]
                                          for r in rows]),  # type: ignore[arg-type]
         note=None if rows else note)


@app.command(epilog="Examples:  brook acl create --allow-principal User:alice --operation WRITE --topic orders  |  "
                    "brook acl create --allow-principal User:etl --operation READ --topic logs- "
                    "--resource-pattern-type prefixed  |  brook acl create --allow-principal User:alice "
                    "--operation READ --group billing")
def create(
    ctx: typer.Context,
    allow_principal: Annotated[list[str] | None, typer.Option(help="User:<name> or User:* (repeatable).")] = None,
    deny_principal: Annotated[list[str] | None, typer.Option(help="User:<name> or User:* (repeatable).")] = None,
    allow_host: Annotated[list[str] | None, typer.Option(
        help="Client IP address the ALLOWs apply to (repeatable; default * : any).")] = None,
    deny_host: Annotated[list[str] | None, typer.Option(
        help="Client IP address the DENYs apply to (repeatable; default * : any).")] = None,
    operation: Annotated[list[str] | None, typer.Option(
        help=f"One of {', '.join(OPERATIONS)} (repeatable).")] = None,
    topic: TopicOpt = None,
    group: GroupOpt = None,
    cluster: ClusterOpt = False,
    transactional_id: TxnOpt = None,
    delegation_token: TokenOpt = None,
    user_principal: UserOpt = None,
    resource_pattern_type: PatternOpt = "literal",
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Add ALLOW and/or DENY bindings; DENY always wins over ALLOW."""
    st = state(ctx, bootstrap, output)
    rtype, name = _resource(topic, group, cluster, transactional_id, delegation_token, user_principal)
    if not operation or not (allow_principal or deny_principal):
        raise CliError("give at least one --operation and one --allow-principal or --deny-principal", code=2)
    if (allow_host and not allow_principal) or (deny_host and not deny_principal):
        raise CliError("--allow-host goes with --allow-principal and --deny-host with --deny-principal", code=2)
    try:
        bindings = [new_acl_binding([rtype, name, resource_pattern_type, p, host, op, perm])
                    for perm, principals, hosts in (("ALLOW", allow_principal or [], allow_host or ["*"]),
                                                    ("DENY", deny_principal or [], deny_host or ["*"]))
                    for p in principals for host in hosts for op in operation]
    except errors.BrookError as exc:
        raise CliError(exc.message, code=2) from None
    for b in bindings:
        _check_operation(b.resource_type, b.operation)
    st.backend.admin.create_acls(bindings)
    if st.json:
        show(st, [_row(b) for b in bindings])
    else:
        ok(st, f"{len(bindings)} ACL binding(s) created")
        _show(st, bindings, "")


@app.command("list", epilog="Examples:  brook acl list  |  brook acl list --topic orders  |  "
                            "brook acl list --principal User:alice -o json")
def list_(
    ctx: typer.Context,
    topic: TopicOpt = None,
    group: GroupOpt = None,
    cluster: ClusterOpt = False,
    transactional_id: TxnOpt = None,
    delegation_token: TokenOpt = None,
    user_principal: UserOpt = None,
    principal: Annotated[str | None, typer.Option(help="Only bindings of this principal.")] = None,
    host: HostOpt = None,
    resource_pattern_type: FilterPatternOpt = "match",
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """List ACL bindings (all, or those of a resource and/or principal)."""
    st = state(ctx, bootstrap, output)
    fields: dict[str, str] = {}
    rtype = name = None
    if _any_resource(topic, group, cluster, transactional_id, delegation_token, user_principal):
        rtype, name = _resource(topic, group, cluster, transactional_id, delegation_token, user_principal)
        fields.update(resource_type=rtype, resource_name=name)
    fields["pattern_type"] = _filter_pattern(resource_pattern_type, rtype, name)
    if principal:
        fields["principal"] = _principal(principal)
    if host:
        fields["host"] = _host(host)
    _show(st, st.backend.admin.describe_acls(**fields), "no ACLs")


@app.command(epilog="Examples:  brook acl delete --topic orders --principal User:alice  |  "
                    "brook acl delete --group billing --operation READ")
def delete(
    ctx: typer.Context,
    topic: TopicOpt = None,
    group: GroupOpt = None,
    cluster: ClusterOpt = False,
    transactional_id: TxnOpt = None,
    delegation_token: TokenOpt = None,
    user_principal: UserOpt = None,
    principal: Annotated[str | None, typer.Option(help="Only bindings of this principal.")] = None,
    operation: Annotated[str | None, typer.Option(help="Only bindings of this operation (or ANY).")] = None,
    host: HostOpt = None,
    resource_pattern_type: FilterPatternOpt = "literal",
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Delete the bindings of one resource (optionally only a principal's / an operation's)."""
    st = state(ctx, bootstrap, output)
    rtype, name = _resource(topic, group, cluster, transactional_id, delegation_token, user_principal)
    fields = {"resource_type": rtype, "resource_name": name,
              "pattern_type": _filter_pattern(resource_pattern_type, rtype, name)}
    if principal:
        fields["principal"] = _principal(principal)
    if operation:
        fields["operation"] = _filter_operation(operation, rtype)
    if host:
        fields["host"] = _host(host)
    deleted = st.backend.admin.delete_acls([fields])
    if st.json:
        show(st, [_row(b) for b in deleted])
        return
    ok(st, f"{len(deleted)} ACL binding(s) deleted")
    if deleted:
        _show(st, deleted, "")
