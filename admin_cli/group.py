"""``brook group``: list, describe, seek (reset offsets), remove static members, delete consumer groups."""

from __future__ import annotations

from typing import Annotated

import typer

from admin_cli.common import (
    INT32_MAX,
    INT64_MAX,
    BootstrapOpt,
    CliError,
    OutputOpt,
    err,
    ok,
    show,
    state,
    table,
)
from admin_cli.timeparse import parse_timestamp_ms

# What ListGroups filters on. The broker matches states exactly, so a misspelt one listed nothing
# (as if no group were in it): it is refused here, and the spelling's case does not matter.
# Classic groups' states, then those only groups of Kafka's consumer protocol (KIP-848) pass through.
GROUP_STATES = ("Empty", "Stable", "PreparingRebalance", "CompletingRebalance", "Dead", "Assigning", "Reconciling")


def _group_states(values: list[str] | None) -> list[str] | None:
    """Option callback: each --state as the broker spells it; an unknown one is a usage error naming the valid."""
    if values is None:
        return None
    by_folded = {s.casefold(): s for s in GROUP_STATES}
    out = []
    for v in values:
        if v.strip().casefold() not in by_folded:
            raise typer.BadParameter(f"{v!r} is not a group state: use {', '.join(GROUP_STATES)}")
        out.append(by_folded[v.strip().casefold()])
    return out


app = typer.Typer(help="Inspect consumer groups and move their committed offsets.", no_args_is_help=True)


@app.command("list", epilog="Examples:\n\nbrook group list\n\nbrook group list --state Stable -o json")
def list_(
    ctx: typer.Context,
    state_: Annotated[list[str] | None, typer.Option(
        "--state", callback=_group_states,
        help=f"Only groups in this state (repeatable): {', '.join(GROUP_STATES)}.")] = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """List consumer groups with their state and coordinator."""
    st = state(ctx, bootstrap, output)
    groups = st.backend.list_groups(state_ or [])
    rows = [{"group": g.group_id, "type": g.group_type, "state": g.state, "protocol_type": g.protocol_type,
             "coordinator": g.coordinator_id} for g in groups]
    show(st, rows, table(None, ["GROUP", "TYPE", "STATE", "PROTOCOL", "COORDINATOR"],
                         [[r["group"], r["type"], r["state"], r["protocol_type"], r["coordinator"]] for r in rows]),
         note=None if rows else "no groups")


@app.command(epilog="Examples:\n\nbrook group describe billing\n\nbrook group describe billing -o json")
def describe(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Group id.")],
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Members, assignments, committed offsets and lag of a group."""
    st = state(ctx, bootstrap, output)
    g = st.backend.describe_group(group)
    members = [{"member_id": m.member_id, "instance_id": m.group_instance_id or None, "client_id": m.client_id,
                "host": m.client_host,
                "topics": m.subscribed_topics, "topic_regex": m.subscribed_topic_regex or None,
                "assigned": [f"{tp.topic}-{tp.partition}" for tp in m.assignment]}
               for m in g.members]
    offsets = [{"topic": tp.topic, "partition": tp.partition, "committed_offset": o.committed_offset,
                "log_end_offset": o.log_end_offset, "lag": o.lag, "member_id": o.member_id}
               for tp, o in sorted(g.offsets.items())]
    total_lag = sum(o["lag"] for o in offsets if o["lag"] >= 0)
    data = {"group": g.group_id, "type": g.group_type, "state": g.state, "protocol_type": g.protocol_type,
            "protocol": g.protocol_name,
            "generation": g.generation_id, "leader": g.leader, "coordinator": g.coordinator_id,
            "members": members, "offsets": offsets, "total_lag": total_lag}
    # A consumer-protocol group (KIP-848): its protocol is the coordinator's assignor, its generation the group epoch.
    summary = table(f"Group {g.group_id}", ["TYPE", "STATE", "PROTOCOL", "GENERATION", "MEMBERS", "COORDINATOR",
                                            "TOTAL LAG"],
                    [[g.group_type, g.state, g.protocol_name or "-", g.generation_id, len(members), g.coordinator_id,
                      total_lag]])
    mtable = table("Members", ["MEMBER", "INSTANCE", "CLIENT", "HOST", "PARTITIONS"],
                   [[m["member_id"], m["instance_id"] or "-", m["client_id"], m["host"], m["assigned"] or "-"]
                    for m in members])
    otable = table("Offsets", ["TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "MEMBER"],
                   [[o["topic"], o["partition"], o["committed_offset"], _unknown(o["log_end_offset"]),
                     _unknown(o["lag"]), o["member_id"] or "-"] for o in offsets])
    show(st, data, summary, mtable, otable)


def _unknown(v: int) -> str:
    return "?" if v < 0 else str(v)


@app.command(epilog="Examples:\n\nbrook group seek billing --topic orders --to-earliest\n\n"
                    "brook group seek billing --topic orders --partition 0 --to-offset 42 --dry-run\n\n"
                    "brook group seek billing --topic orders --to-timestamp 2026-01-31T12:00:00Z\n\n"
                    "brook group seek billing --topic orders --shift-by -100")
def seek(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Group id (must have no active members).")],
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic whose offsets move.")],
    partition: Annotated[int | None, typer.Option("--partition", "-p", help="Only this partition (default: all).",
                                                               min=0, max=INT32_MAX)]
    = None,
    to_earliest: Annotated[bool, typer.Option(help="To the log start offset.")] = False,
    to_latest: Annotated[bool, typer.Option(help="To the high watermark (skip everything).")] = False,
    to_offset: Annotated[int | None, typer.Option(help="To this offset.", min=0, max=INT64_MAX)] = None,
    to_timestamp: Annotated[str | None, typer.Option(
        help="To the first offset at/after this time: ms since epoch or ISO 8601.")] = None,
    shift_by: Annotated[int | None, typer.Option(help="Move by N (negative: back).", min=-INT64_MAX,
                                                 max=INT64_MAX)] = None,
    dry_run: Annotated[bool, typer.Option(help="Show the result; change nothing.")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Reset a group's committed offsets (like kafka-consumer-groups --reset-offsets)."""
    st = state(ctx, bootstrap, output)
    chosen = [(n, v) for n, v in (("--to-earliest", to_earliest or None), ("--to-latest", to_latest or None),
                                  ("--to-offset", to_offset), ("--to-timestamp", to_timestamp),
                                  ("--shift-by", shift_by)) if v is not None]
    if len(chosen) != 1:
        raise CliError("give exactly one of --to-earliest, --to-latest, --to-offset, --to-timestamp, --shift-by",
                       code=2)
    if partition is not None and partition < 0:
        raise CliError(f"--partition must be >= 0, got {partition}", code=2)
    if to_offset is not None and to_offset < 0:
        raise CliError(f"--to-offset must be >= 0, got {to_offset}", code=2)
    if to_earliest:
        kind, value = "earliest", 0
    elif to_latest:
        kind, value = "latest", 0
    elif to_offset is not None:
        kind, value = "offset", to_offset
    elif to_timestamp is not None:
        kind, value = "timestamp", parse_timestamp_ms(to_timestamp, "--to-timestamp")
    else:
        kind, value = "shift", int(shift_by or 0)
    topic_meta = st.backend.topic(topic)
    if partition is not None and partition not in topic_meta.partitions:
        raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic '{topic}' has no partition {partition}")
    resolved = st.backend.reset_group_offsets(group, topic, -1 if partition is None else partition, kind, value,
                                              dry_run=dry_run)
    rows = [{"topic": tp.topic, "partition": tp.partition, "previous_offset": prev, "offset": new}
            for tp, (prev, new) in sorted(resolved.items())]
    verb = "would move" if dry_run else "moved"
    show(st, {"group": group, "dry_run": dry_run, "offsets": rows},
         table(f"Group {group}: {verb} offsets", ["TOPIC", "PARTITION", "FROM", "TO"],
               [[r["topic"], r["partition"], _unknown(r["previous_offset"]), r["offset"]] for r in rows]))
    if rows and all(r["previous_offset"] < 0 for r in rows):
        # As Kafka's --reset-offsets, a group with none is given these (and so made); a misspelt group id read
        # as a success with no hint (docs audit).
        err.print(f"note: group {group} had no committed offsets for {topic}: "
                  f"{'these would be' if dry_run else 'these are'} its first (is the group id right?)",
                  highlight=False, markup=False)


@app.command("remove-member", epilog="Examples:\n\nbrook group remove-member billing --instance worker-3")
def remove_member(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Group id.")],
    instances: Annotated[list[str], typer.Option("--instance", "-i",
                                                 help="group.instance.id of a static member (repeatable).")],
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Remove static members now instead of after their session timeout; the group rebalances without them."""
    st = state(ctx, bootstrap, output)
    g = st.backend.describe_group(group)
    present = {m.group_instance_id for m in g.members if m.group_instance_id}
    missing = [i for i in instances if i not in present]
    if missing:  # before anything is removed
        raise CliError(f"group {group} has no static member {', '.join(missing)} (its static members: "
                       f"{', '.join(sorted(present)) or 'none'}); nothing removed")
    st.backend.remove_group_members(group, instances)
    ok(st, f"removed {', '.join(instances)} from group {group}", {"group": group, "removed": instances})


@app.command(epilog="Examples:\n\nbrook group delete billing\n\nbrook group delete old-1 old-2")
def delete(
    ctx: typer.Context,
    groups: Annotated[list[str], typer.Argument(help="Group id(s); each must have no active members.")],
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Delete consumer groups and their committed offsets. Every group must exist and have no members, or none is
    deleted."""
    st = state(ctx, bootstrap, output)
    groups = list(dict.fromkeys(groups))  # a group named twice is deleted once
    active = []
    for g in groups:  # all must exist, and be empty, before any is deleted
        description = st.backend.describe_group(g)
        if description.members:
            active.append(f"{g} has {len(description.members)} members ({description.state})")
    if active:
        raise CliError(f"NON_EMPTY_GROUP: {'; '.join(active)}: stop its consumers first; nothing deleted")
    # A member may still join meanwhile: each group's own outcome is reported.
    outcome = st.backend.delete_groups(groups)
    failed = {g: e for g, e in outcome.items() if e is not None}
    deleted = [g for g in groups if g not in failed]
    if failed:
        raise CliError(("deleted " + ", ".join(deleted) + "; " if deleted else "")
                       + "; ".join(f"not deleted {g}: {e}" for g, e in failed.items()))
    ok(st, f"deleted group{'s' if len(groups) != 1 else ''} {', '.join(groups)}", {"deleted": groups})
