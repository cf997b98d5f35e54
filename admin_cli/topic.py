"""``brook topic``: create, list, describe, producers, trim-prefix, alter-config, add-partitions,
set-replication-factor, delete."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

import typer

from admin_cli import partition as partition_cli
from admin_cli import planning
from admin_cli.common import (
    INT32_MAX,
    INT64_MAX,
    BootstrapOpt,
    CliError,
    OutputOpt,
    State,
    ok,
    parse_pairs,
    rows_failed,
    show,
    state,
    table,
)
from client.types import TopicPartition
from metadata_quorum import features
from proto import errors
from storage import log_config

app = typer.Typer(help="Create, inspect, change and delete topics.", no_args_is_help=True)

PartitionsOpt = Annotated[list[int] | None, typer.Option(
    "--partition", "-p", help="Only this partition (repeatable; default: every partition).", min=0, max=INT32_MAX)]
ConfigOpt = Annotated[list[str] | None, typer.Option(
    "--config", "-c", help="Topic config key=value (repeatable), e.g. retention.ms=86400000.")]


def _validate_topic_configs(configs: dict[str, str]) -> None:
    """Check keys and values locally first: the message names the key and nothing is sent."""
    try:
        log_config.validate(configs, strict=True)  # as the controller checks what a client asks
    except errors.BrookError as e:
        raise CliError(e.message, code=2) from None


@app.command(epilog="Examples:\n\nbrook topic create orders -p 6 -r 3 -c retention.ms=86400000 -c cleanup.policy=compact")
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    partitions: Annotated[int, typer.Option("--partitions", "-p", help="Partition count (-1: num.partitions).",
                                             min=-1, max=INT32_MAX)]
    = -1,
    replication_factor: Annotated[int, typer.Option(
        "--replication-factor", "-r", help="Replicas per partition (-1: default.replication.factor).",
        min=-1, max=INT32_MAX)] = -1,
    config: ConfigOpt = None,
    if_not_exists: Annotated[bool, typer.Option(help="Succeed if the topic already exists.")] = False,
    validate_only: Annotated[bool, typer.Option(help="Check the request; create nothing.")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Create a topic."""
    st = state(ctx, bootstrap, output)
    if partitions == 0 or partitions < -1:
        raise CliError(f"--partitions must be at least 1, got {partitions}", code=2)
    if replication_factor == 0 or replication_factor < -1:
        raise CliError(f"--replication-factor must be at least 1, got {replication_factor}", code=2)
    configs = parse_pairs(config or [], "--config")
    _validate_topic_configs(configs)
    try:
        created = st.backend.create_topic(name, partitions, replication_factor, configs, validate_only=validate_only)
    except errors.BrookError as e:
        if if_not_exists and e.code == errors.ErrorCode.TOPIC_ALREADY_EXISTS:
            ok(st, f"topic '{name}' already exists", {"topic": name, "created": False})
            return
        raise
    if created is None:
        ok(st, f"topic '{name}' is valid and would be created", {"topic": name, "created": False})
        return
    rf = max((len(p.replicas) for p in created.partitions.values()), default=0)
    ok(st, f"created topic '{name}' with {len(created.partitions)} partitions, replication factor {rf}",
       {"topic": name, "topic_id": created.topic_id, "partitions": len(created.partitions),
        "replication_factor": rf, "created": True})


def replica_counts(counts: Iterable[int]) -> str:
    """A topic's replica count for a table: "3", or "1-3" when its partitions differ (brook.metadata.version 5 lets a
    move change one partition's; a partition being grown lists its joining replicas too)."""
    found = sorted(set(counts))
    if not found:
        return "0"
    return str(found[0]) if len(found) == 1 else f"{found[0]}-{found[-1]}"


@app.command("list", epilog="Examples:\n\nbrook topic list\n\nbrook topic list --internal -o json")
def list_(
    ctx: typer.Context,
    internal: Annotated[bool, typer.Option(help="Include internal topics (__consumer_offsets).")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """List topics with partition counts and replication factors."""
    st = state(ctx, bootstrap, output)
    meta = st.backend.metadata()
    rows = []
    for name, t in sorted(meta.topics.items()):
        if t.error_code or (t.is_internal and not internal):
            continue
        parts = list(t.partitions.values())
        rf = max((len(p.replicas) for p in parts), default=0)
        counts = replica_counts(len(p.replicas) for p in parts)
        offline = sum(1 for p in parts if p.leader < 0)
        under = sum(1 for p in parts if len(p.isr) < len(p.replicas))
        rows.append({"name": name, "topic_id": t.topic_id, "partitions": len(parts), "replication_factor": rf,
                     "replica_counts": counts,
                     "internal": t.is_internal, "offline_partitions": offline, "under_replicated_partitions": under})
    show(st, rows, table(None, ["NAME", "PARTITIONS", "REPLICAS", "OFFLINE", "UNDER-REPLICATED"],
                         [[r["name"], r["partitions"], r["replica_counts"], r["offline_partitions"],
                           r["under_replicated_partitions"]] for r in rows]),
         note=None if rows else "no topics")


@app.command(epilog="Examples:\n\nbrook topic describe orders\n\nbrook topic describe orders --all-configs -o json")
def describe(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    all_configs: Annotated[bool, typer.Option(help="Show every config, not only the overrides.")] = False,
    offsets: Annotated[bool, typer.Option(
        "--offsets", help="Also each partition's log start offset, high watermark and log end offset.")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Describe a topic: partitions (leader, epoch, replicas, ISR) and configs."""
    st = state(ctx, bootstrap, output)
    t = st.backend.topic(name)
    entries = st.backend.describe_configs(name)
    configs = [{"name": e.name, "value": e.value, "is_default": e.is_default} for e in entries
               if all_configs or not e.is_default]
    parts = [{"partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
              "replicas": list(p.replicas), "isr": list(p.isr), "offline_replicas": list(p.offline_replicas)}
             for _, p in sorted(t.partitions.items())]
    data = {"name": name, "topic_id": t.topic_id, "internal": t.is_internal, "partitions": parts,
            "configs": configs}
    summary = table(f"Topic {name}", ["ID", "PARTITIONS", "REPLICAS", "INTERNAL"],
                    [[t.topic_id, len(parts), replica_counts(len(p["replicas"]) for p in parts), t.is_internal]])
    ptable = table("Partitions", ["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "OFFLINE"],
                   [[p["partition"], p["leader"] if p["leader"] >= 0 else "none", p["leader_epoch"],
                     p["replicas"], p["isr"], p["offline_replicas"] or "-"] for p in parts])
    ctable = table("Configs" + ("" if all_configs else " (overrides; --all-configs for every key)"),
                   ["KEY", "VALUE", "SOURCE"],
                   [[c["name"], c["value"], "default" if c["is_default"] else "topic"] for c in configs])
    tables = [summary, ptable]
    if offsets:
        rows = partition_offsets(st, name, [p["partition"] for p in parts], {p["partition"]: p["leader"]
                                                                             for p in parts})
        for p in parts:
            p.update(rows[p["partition"]])
        tables.append(table("Offsets", ["PARTITION", "LOG START", "HIGH WATERMARK", "LOG END", "RECORDS"],
                            [[p["partition"], _offset(p["log_start_offset"]), _offset(p["high_watermark"]),
                              _offset(p["log_end_offset"]),
                              _offset(p["high_watermark"] - p["log_start_offset"]
                                      if min(p["high_watermark"], p["log_start_offset"]) >= 0 else -1)]
                             for p in parts]))
    show(st, data, *tables, ctable)


def _offset(value: int) -> str | int:
    return value if value >= 0 else "-"


def partition_offsets(st: State, name: str, partitions: list[int],
                      leaders: dict[int, int]) -> dict[int, dict[str, int]]:
    """{partition: log_start_offset, high_watermark, log_end_offset} (-1 where unknown): the first two from
    the leaders (ListOffsets earliest/latest), the log end from the leaders' log dirs when the caller may
    describe the cluster."""
    admin = st.backend.admin
    tps = [TopicPartition(name, p) for p in partitions]
    out = {p: {"log_start_offset": -1, "high_watermark": -1, "log_end_offset": -1} for p in partitions}
    for field, spec in (("log_start_offset", "earliest"), ("high_watermark", "latest")):
        try:
            found = admin.list_offsets(dict.fromkeys(tps, spec))
        except errors.BrookError:  # one partition refused (offline, no access): ask each on its own
            found = {}
            for tp in tps:
                try:
                    found.update(admin.list_offsets({tp: spec}))
                except errors.BrookError:
                    pass  # shown as "-"
        for tp, (offset, _) in found.items():
            out[tp.partition][field] = offset
    live_leaders = sorted({b for b in leaders.values() if b >= 0})
    for dirs in admin.describe_log_dirs(live_leaders, [name]).values():
        if isinstance(dirs, errors.BrookError):
            continue
        for d in dirs:
            for r in d.replicas:
                if r.topic == name and r.is_leader and leaders.get(r.partition) is not None:
                    out[r.partition]["log_end_offset"] = r.log_end_offset
    return out


def _named_partitions(st: State, name: str, partition: list[int] | None, refused: str = "") -> list[int]:
    """The --partition values (every partition of the topic without one), each an existing partition."""
    t = st.backend.topic(name)
    wanted = sorted(set(partition)) if partition else sorted(t.partitions)
    unknown = [p for p in wanted if p not in t.partitions]
    if unknown:
        raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic '{name}' has no partition {unknown[0]}{refused}")
    return wanted


@app.command("trim-prefix", epilog="Examples:\n\nbrook topic trim-prefix orders --partition 0 --offset 1000\n\n"
                                   "brook topic trim-prefix orders --offset end")
def trim_prefix(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    offset: Annotated[str, typer.Option(
        "--offset", help="Delete every record before this offset; 'end' = up to the high watermark.")],
    partition: PartitionsOpt = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Delete the records before an offset (Kafka's DeleteRecords): the partitions' log start moves up
    on every replica; consumers positioned before it restart at the new start.

    An --offset past any named partition's high watermark trims none. Exit code 0 when every partition was
    trimmed, 1 otherwise (nothing changes on refused partitions).
    """
    if offset.strip().lower() == "end":
        before = -1
    else:
        try:
            before = int(offset)
        except ValueError:
            raise CliError(f"--offset must be an offset or 'end', not {offset!r}", code=2) from None
        if not 0 <= before <= INT64_MAX:
            raise CliError(f"--offset must be between 0 and {INT64_MAX}, not {before}", code=2)
    st = state(ctx, bootstrap, output)
    wanted = _named_partitions(st, name, partition, "; nothing trimmed")
    if before >= 0:
        # Every partition is checked first: the brokers refuse an offset past a partition's high watermark one
        # partition at a time, so the others were trimmed, for good (audit). A high watermark only grows.
        ends = st.backend.admin.list_offsets({TopicPartition(name, p): "latest" for p in wanted})
        short = [(p, ends[TopicPartition(name, p)][0]) for p in wanted if ends[TopicPartition(name, p)][0] < before]
        if short:
            raise CliError(f"OFFSET_OUT_OF_RANGE: --offset {before} is past the high watermark of "
                           + ", ".join(f"partition {p} ({end})" for p, end in short[:5])
                           + "; nothing trimmed (name the other partitions with --partition)")
    results = st.backend.admin.delete_records({TopicPartition(name, p): before for p in wanted},
                                              timeout_ms=int(st.backend.timeout_s * 1000))
    rows = []
    for p in wanted:
        low, error = results[TopicPartition(name, p)]
        rows.append({"partition": p, "log_start_offset": low, "error": None if error is None else error.name,
                     "detail": "" if error is None else error.message})
    failed = [r for r in rows if r["error"]]
    show(st, {"topic": name, "partitions": rows},
         table(f"Trimmed {name}", ["PARTITION", "NEW LOG START", "RESULT"],
               [[r["partition"], _offset(r["log_start_offset"]), r["error"] or "ok"] for r in rows]),
         note="\n".join(r["detail"] for r in failed) or None)
    if failed:
        rows_failed("partitions not trimmed", [f"partition {r['partition']} {r['error']} ({r['detail']})"
                                               for r in failed], len(rows))


@app.command("producers", epilog="Examples:\n\nbrook topic producers orders\n\nbrook topic producers orders -p 0 -o json")
def producers(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    partition: PartitionsOpt = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """The idempotent producers each partition's leader tracks (Kafka's kafka-transactions describe-producers):
    producer id, epoch, last sequence, last timestamp, the coordinator epoch of its last transaction marker and
    where its ongoing transaction began (-1: none). Needs READ on the topic. Exit code 1 when a partition could not
    be described."""
    st = state(ctx, bootstrap, output)
    wanted = _named_partitions(st, name, partition)
    found = st.backend.admin.describe_producers([(name, p) for p in wanted],
                                                timeout_ms=int(st.backend.timeout_s * 1000))
    rows, failed = [], []
    for p in wanted:
        got = found[TopicPartition(name, p)]
        if isinstance(got, errors.BrookError):
            failed.append(f"partition {p} {got.name} ({got.message})")
            rows.append({"partition": p, "error": got.name, "detail": got.message, "producers": []})
            continue
        rows.append({"partition": p, "error": None, "producers": [
            {"producer_id": s.producer_id, "producer_epoch": s.producer_epoch, "last_sequence": s.last_sequence,
             "last_timestamp": s.last_timestamp, "coordinator_epoch": s.coordinator_epoch,
             "current_txn_start_offset": s.current_txn_start_offset} for s in got]})
    show(st, {"topic": name, "partitions": rows},
         # Headers short enough for 80 columns (a wider table folded the producer ids): COORD EP is the coordinator
         # epoch of the producer's last marker, TXN START where its ongoing transaction began.
         table(f"Producers of {name}", ["PART", "PRODUCER", "EPOCH", "LAST SEQ", "LAST TIMESTAMP", "COORD EP",
                                        "TXN START"],
               [[r["partition"], s["producer_id"], s["producer_epoch"], s["last_sequence"], s["last_timestamp"],
                 s["coordinator_epoch"], s["current_txn_start_offset"]] for r in rows for s in r["producers"]]
               + [[r["partition"], r["error"], "", "", "", "", ""] for r in rows if r["error"]]),
         note=None if any(r["producers"] for r in rows) or failed else "no idempotent producer is tracked")
    if failed:
        rows_failed("partitions not described", failed, len(rows))


@app.command("alter-config", epilog="Examples:\n\nbrook topic alter-config orders --set retention.ms=3600000 "
                                    "--delete cleanup.policy")
def alter_config(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="key=value to set (repeatable).")] = None,
    delete: Annotated[list[str] | None, typer.Option("--delete", "-d", help="Key to reset to its default.")]
    = None,
    validate_only: Annotated[bool, typer.Option(help="Check the change; apply nothing.")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Set or reset topic configs (dynamic: brokers apply them without a restart)."""
    st = state(ctx, bootstrap, output)
    changes = parse_pairs(set_ or [], "--set")
    deletes = list(delete or [])
    if not changes and not deletes:
        raise CliError("nothing to change: give --set key=value and/or --delete key", code=2)
    _validate_topic_configs(changes)
    for key in deletes:
        if key not in log_config.TOPIC_CONFIGS:
            raise CliError(f"unknown topic config '{key}'", code=2)
    both = set(changes) & set(deletes)
    if both:
        raise CliError(f"config '{sorted(both)[0]}' is both set and deleted", code=2)
    st.backend.topic(name)  # a clear UNKNOWN_TOPIC error before anything is sent
    st.backend.alter_configs(name, changes, deletes, validate_only=validate_only)
    verb = "would change" if validate_only else "changed"
    ok(st, f"{verb} configs of topic '{name}'" + (f": set {', '.join(f'{k}={v}' for k, v in changes.items())}"
                                                  if changes else "")
       + (f"; reset {', '.join(deletes)}" if deletes else ""), {"topic": name, "set": changes, "deleted": deletes})


@app.command("add-partitions", epilog="Examples:\n\nbrook topic add-partitions orders --count 12")
def add_partitions(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    count: Annotated[int, typer.Option("--count", "-n", help="The new total partition count.",
                                             min=1, max=INT32_MAX)],
    validate_only: Annotated[bool, typer.Option(help="Check the change; apply nothing.")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Grow a topic to --count partitions (partitions can only be added)."""
    st = state(ctx, bootstrap, output)
    current = len(st.backend.topic(name).partitions)
    if count <= current:
        raise CliError(f"--count {count} must be larger than the current partition count ({current})", code=2)
    st.backend.create_partitions(name, count, validate_only=validate_only)
    if validate_only:
        ok(st, f"topic '{name}' would grow from {current} to {count} partitions", {"topic": name})
        return
    ok(st, f"topic '{name}' now has {count} partitions (was {current})",
       {"topic": name, "partitions": count, "previous": current})


@app.command("set-replication-factor", epilog="Examples:\n\nbrook topic set-replication-factor orders 3 --wait\n\n"
             "brook topic set-replication-factor orders 2 --dry-run")
def set_replication_factor(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    replication_factor: Annotated[int, typer.Argument(help="The new replica count of every partition.",
                                                      min=1, max=INT32_MAX)],
    dry_run: partition_cli.DryRunOpt = False,
    wait: partition_cli.WaitOpt = False,
    wait_timeout: partition_cli.WaitTimeoutOpt = partition_cli.DEFAULT_WAIT_S,
    throttle: partition_cli.ThrottleOpt = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Change a topic's replication factor by moving its partitions (as kafka-reassign-partitions does with
    longer or shorter replica lists). New replicas go to the least loaded live brokers (other racks first) and
    copy the log as followers; the partition counts them for acks=all once they are in sync. Shrinking keeps
    the leader and the in-sync replicas. Needs brook.metadata.version 5."""
    st = state(ctx, bootstrap, output)
    assignment, live, desc = partition_cli.current_assignment(st)
    topic = next((t for t in desc.topics if t.name == name), None)
    if topic is None:
        raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic '{name}' does not exist; nothing moved")
    mine = [p for p in desc.partitions if p.topic == name]
    min_insync = int(topic.configs.get("min.insync.replicas", desc.default_min_insync_replicas or 1))
    if replication_factor < min_insync:
        # Kafka would take it, and every acks=all write to the topic would then fail NOT_ENOUGH_REPLICAS.
        raise CliError(f"INVALID_REPLICATION_FACTOR: {replication_factor} is below the topic's min.insync.replicas "
                       f"({min_insync}): acks=all writes would all be refused; lower it first (brook topic "
                       f"alter-config {name} --set min.insync.replicas=N); nothing moved")
    try:
        plan = planning.plan_replication_factor(
            assignment, live, name, replication_factor, {(p.topic, p.partition): list(p.isr) for p in mine},
            {(p.topic, p.partition): p.leader for p in mine})
    except planning.PlanError as e:
        raise CliError(f"INVALID_REPLICATION_FACTOR: cannot give '{name}' {replication_factor} replicas: {e}; "
                       "nothing moved") from None
    if not plan.empty:
        # Refused whole below level 5: a dry run says so too instead of showing moves that cannot run (audit).
        level = st.backend.admin.describe_features().finalized_level
        if level < features.REPLICATION_FACTOR_CHANGE:
            raise CliError("INVALID_REPLICATION_FACTOR: " + features.needs_level(
                features.REPLICATION_FACTOR_CHANGE, level, f"changing the replication factor of '{name}'")
                + "; nothing moved")
    data = {"topic": name, "replication_factor": replication_factor, "dry_run": dry_run,
            "moves": partition_cli.moves_json(assignment, plan.moves)}
    if plan.empty:
        show(st, data, table(None, ["PARTITION"], []),
             note=f"every partition of '{name}' already has {replication_factor} replicas")
        return
    note = ""
    if not dry_run:
        note = partition_cli.apply_plan(st, plan.moves, wait=wait, wait_timeout=wait_timeout, throttle=throttle)
    verb = "would move" if dry_run else ("moved" if wait else "moving")
    show(st, data, partition_cli.plan_table(f"Replication factor of {name} to {replication_factor}", assignment,
                                            plan.moves),
         note=f"{verb} {len(plan.moves)} partitions of '{name}' to {replication_factor} replicas" + note)


@app.command(epilog="Examples:\n\nbrook topic delete orders\n\nbrook topic delete a b c")
def delete(
    ctx: typer.Context,
    names: Annotated[list[str], typer.Argument(help="Topic name(s).")],
    if_exists: Annotated[bool, typer.Option(help="Skip topics that do not exist.")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Delete topics and all their data."""
    st = state(ctx, bootstrap, output)
    existing = {n for n, t in st.backend.metadata().topics.items() if t.error_code == 0}
    missing = [n for n in names if n not in existing]
    if missing and not if_exists:
        # Checked before deleting anything: a typo in one name must not delete the others.
        raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic '{missing[0]}' does not exist; nothing deleted")
    targets = [n for n in names if n in existing]
    if targets:
        st.backend.delete_topics(targets)
        st.backend.wait_for_deletion(targets)
    ok(st, f"deleted topic{'s' if len(targets) != 1 else ''} {', '.join(targets) or '(none)'}",
       {"deleted": targets, "missing": missing})
