"""``brook cluster``: info, health, quorum."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.text import Text

from admin_cli import partition as partition_cli
from admin_cli import planning
from admin_cli.common import (
    INT32_MAX,
    BootstrapOpt,
    CliError,
    OutputOpt,
    err,
    ok,
    out,
    parse_pairs,
    print_json,
    rows_failed,
    show,
    state,
    table,
)
from client.types import TopicPartition
from proto import controller_pb2, errors

app = typer.Typer(help="Cluster overview, health checks and the metadata quorum.", no_args_is_help=True)

DEFAULT_MAX_QUORUM_LAG = 1000  # Raft entries a voter may trail the commit index by and still count as healthy
DEFAULT_MAX_CONTACT_MS = 10_000


# ----------------------------------------------------------------------------- health (pure)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class HealthReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))


def assess_health(cluster: controller_pb2.DescribeClusterResponse | None,
                  quorum: controller_pb2.DescribeQuorumResponse | None, *, cluster_error: str = "",
                  quorum_error: str = "", max_quorum_lag: int = DEFAULT_MAX_QUORUM_LAG,
                  max_contact_ms: int = DEFAULT_MAX_CONTACT_MS) -> HealthReport:
    """Judge a cluster from DescribeCluster and DescribeQuorum (either may be missing)."""
    r = HealthReport()
    if cluster is None:
        r.add("active controller", False, cluster_error or "no answer from the controllers")
    else:
        active = cluster.active_controller_id
        r.add("active controller", active >= 0, f"node {active}" if active >= 0 else "none elected")
        fenced = [b.node_id for b in cluster.brokers if b.fenced]
        r.add("fenced brokers", not fenced,
              f"{len(fenced)} fenced: broker {_ids(fenced)}" if fenced
              else f"none ({len(cluster.brokers)} brokers registered)")
        offline = [f"{p.topic}-{p.partition}" for p in cluster.partitions if p.leader < 0]
        r.add("offline partitions", not offline,
              f"{len(offline)}: {', '.join(sorted(offline)[:10])}{' ...' if len(offline) > 10 else ''}"
              if offline else f"none ({len(cluster.partitions)} partitions)")
        under = [f"{p.topic}-{p.partition}" for p in cluster.partitions if len(p.isr) < len(p.replicas)]
        r.add("under-replicated partitions", not under,
              f"{len(under)}: {', '.join(sorted(under)[:10])}{' ...' if len(under) > 10 else ''}"
              if under else "none")
        # Under min ISR: acks=all writes to these partitions fail (NOT_ENOUGH_REPLICAS) right now.
        min_isr = _min_insync_by_topic(cluster)
        under_min = [f"{p.topic}-{p.partition} (isr {len(p.isr)} < {min_isr.get(p.topic, 1)})"
                     for p in cluster.partitions if p.leader >= 0 and len(p.isr) < min_isr.get(p.topic, 1)]
        r.add("under-min-ISR partitions", not under_min,
              f"{len(under_min)}, acks=all writes fail: {', '.join(sorted(under_min)[:10])}"
              f"{' ...' if len(under_min) > 10 else ''}" if under_min else "none")
    if quorum is None:
        r.add("quorum", False, quorum_error or "no answer from the controllers")
        return r
    if not quorum.responder_is_active:
        # No active controller answered: this is one follower's own view (voters' lag unknown).
        leader = f"Raft leader {quorum.leader_id}" if quorum.leader_id >= 0 else "no Raft leader known"
        r.add("quorum", False,
              f"no active controller answered; voter {quorum.responder_id} reports: {leader}, term {quorum.term}, "
              f"metadata says controller {quorum.active_controller_id} is active (epoch {quorum.controller_epoch}), "
              f"its commit index {quorum.commit_index}")
        return r
    if not quorum.voters:
        # The controller shows the voters only to callers allowed DESCRIBE on the cluster: "0 voters" would
        # read as a quorum with no members.
        r.add("quorum", True, f"active controller answers (leader {quorum.leader_id}, term {quorum.term}); the "
              "voters' state is shown only to principals allowed DESCRIBE on the cluster")
        return r
    problems = []
    worst_lag = 0
    for v in quorum.voters:
        if v.is_leader:
            continue
        worst_lag = max(worst_lag, v.lag)
        if not v.connected:
            problems.append(f"voter {v.node_id} not connected")
        elif v.lag > max_quorum_lag:
            problems.append(f"voter {v.node_id} lags by {v.lag}")
        elif v.last_contact_ms_ago < 0 or v.last_contact_ms_ago > max_contact_ms:
            ago = "never" if v.last_contact_ms_ago < 0 else f"{v.last_contact_ms_ago} ms ago"
            problems.append(f"voter {v.node_id} last caught up {ago}")
    n = len(quorum.voters)
    r.add("quorum", not problems,
          "; ".join(problems) if problems else f"{n} voters in sync (leader {quorum.leader_id}, max lag {worst_lag})")
    return r


def _min_insync_by_topic(cluster: controller_pb2.DescribeClusterResponse) -> dict[str, int]:
    default = max(1, cluster.default_min_insync_replicas or 1)
    out = {}
    for t in cluster.topics:
        try:
            out[t.name] = int(t.configs.get("min.insync.replicas", default))
        except ValueError:  # validated by the controller; never trust a display path to crash on it
            out[t.name] = default
    return out


# ----------------------------------------------------------------------------- commands


def _quiet(fn: Any) -> tuple[Any, str]:
    try:
        return fn(), ""
    except errors.BrookError as e:
        return None, str(e)


@app.command(epilog="Examples:\n\nbrook cluster info\n\nBROOK_BOOTSTRAP=host:9092 brook cluster info -o json")
def info(ctx: typer.Context, bootstrap: BootstrapOpt = None, output: OutputOpt = None) -> None:
    """Cluster id, active controller, metadata version, brokers and controllers."""
    st = state(ctx, bootstrap, output)
    meta = st.backend.metadata()
    desc = st.backend.describe_cluster()
    replicas: dict[int, int] = {}
    for p in desc.partitions:
        for r in p.replicas:
            replicas[r] = replicas.get(r, 0) + 1
    brokers = [{"node_id": b.node_id, "endpoints": [f"{e.host}:{e.port}" for e in b.endpoints], "rack": b.rack,
                "fenced": b.fenced, "epoch": b.broker_epoch, "in_controlled_shutdown": b.in_controlled_shutdown,
                "replicas": replicas.get(b.node_id, 0), "partition_capacity": b.partition_capacity or None}
               for b in sorted(desc.brokers, key=lambda b: b.node_id)]
    internal = {n for n, t in meta.topics.items() if t.is_internal}
    data = {"cluster_id": desc.cluster_id, "active_controller_id": desc.active_controller_id,
            "metadata_version": desc.metadata_version, "brokers": brokers,
            "controllers": [f"{h}:{p}" for h, p in meta.controllers],
            "topics": len([t for t in desc.topics if t.name not in internal]), "partitions": len(desc.partitions)}
    summary = table(f"Cluster {desc.cluster_id}", ["CONTROLLER", "METADATA VERSION", "TOPICS", "PARTITIONS",
                                                   "CONTROLLERS"],
                    # one address per line: three host:port side by side would not fit 80 columns
                    [[desc.active_controller_id, desc.metadata_version, data["topics"], data["partitions"],
                      "\n".join(data["controllers"])]])
    # REPLICAS: partition replicas placed on the broker, of the most it takes (its capacity; "-": unbounded).
    btable = table("Brokers", ["ID", "ADDRESS", "RACK", "STATE", "EPOCH", "REPLICAS"],
                   [[b["node_id"], b["endpoints"], b["rack"] or "-",
                     Text("fenced", style="red") if b["fenced"] else Text("active", style="green"), b["epoch"],
                     f"{b['replicas']}/{b['partition_capacity'] or '-'}"]
                    for b in brokers])
    show(st, data, summary, btable)


@app.command(epilog="Examples:  brook cluster health && echo ok  |  brook cluster health -o json")
def health(
    ctx: typer.Context,
    max_quorum_lag: Annotated[int, typer.Option(help="Raft entries a voter may trail by.", min=0)] = DEFAULT_MAX_QUORUM_LAG,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Check offline, under-replicated and under-min-ISR partitions, fenced brokers, quorum lag and the
    active controller. The quorum part answers from any voter when no controller is active.

    Exit code 0 when healthy, 1 when any check fails.
    """
    st = state(ctx, bootstrap, output)
    backend = st.backend
    try:
        desc, desc_err = backend.describe_cluster(), ""
    except errors.BrookError as e:
        if e.code == errors.ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
            # Not the cluster's health but the caller's rights: a monitor with the wrong certificate reported an
            # outage (docs audit).
            raise CliError(f"{e}; the cluster's health was not checked") from None
        desc, desc_err = None, str(e)
    quorum, quorum_err = _quiet(backend.describe_quorum)
    report = assess_health(desc, quorum, cluster_error=desc_err, quorum_error=quorum_err,
                           max_quorum_lag=max_quorum_lag)
    if st.json:
        print_json({"healthy": report.healthy, "checks": [asdict(c) for c in report.checks]})
    else:
        out.print(table(None, ["CHECK", "STATUS", "DETAIL"],
                        [[c.name, Text("ok", style="green") if c.ok else Text("FAIL", style="bold red"), c.detail]
                         for c in report.checks]))
        verdict = Text("healthy", style="bold green") if report.healthy else Text("UNHEALTHY", style="bold red")
        out.print(Text("cluster is ") + verdict)
    if not report.healthy:
        raise typer.Exit(1)


@app.command(epilog="Examples:\n\nbrook cluster quorum\n\nbrook cluster quorum -o json")
def quorum(ctx: typer.Context, bootstrap: BootstrapOpt = None, output: OutputOpt = None) -> None:
    """The Raft metadata quorum: leader, term, commit index and each voter's lag."""
    st = state(ctx, bootstrap, output)
    q = st.backend.describe_quorum()
    voters = [{"node_id": v.node_id, "raft_address": v.raft_address, "log_end_index": v.log_end_index,
               "lag": v.lag, "last_contact_ms_ago": v.last_contact_ms_ago, "connected": v.connected,
               "is_leader": v.is_leader} for v in sorted(q.voters, key=lambda v: v.node_id)]
    data = {"leader_id": q.leader_id, "term": q.term, "commit_index": q.commit_index,
            "last_applied": q.last_applied, "metadata_version": q.metadata_version, "voters": voters,
            "answered_by": q.responder_id, "answered_by_active_controller": q.responder_is_active,
            "active_controller_id": q.active_controller_id, "controller_epoch": q.controller_epoch}
    answered = f"{q.responder_id}" + ("" if q.responder_is_active else " (follower view: no active controller)")
    summary = table("Metadata quorum", ["LEADER", "TERM", "COMMIT INDEX", "LAST APPLIED", "METADATA VERSION",
                                        "ACTIVE CONTROLLER", "ANSWERED BY"],
                    [[q.leader_id, q.term, q.commit_index, q.last_applied, q.metadata_version,
                      f"{q.active_controller_id} (epoch {q.controller_epoch})", answered]])
    vtable = table("Voters", ["ID", "RAFT ADDRESS", "ROLE", "LOG END", "LAG", "LAST CONTACT", "CONNECTED"],
                   [[v["node_id"], v["raft_address"], "leader" if v["is_leader"] else "follower",
                     v["log_end_index"] if v["log_end_index"] >= 0 else "?", v["lag"] if v["lag"] >= 0 else "?",
                     "-" if v["last_contact_ms_ago"] < 0 else f"{v['last_contact_ms_ago']} ms ago",
                     "yes" if v["connected"] or v["is_leader"] else Text("no", style="red")] for v in voters])
    show(st, data, summary, vtable)


class ElectionType(StrEnum):
    preferred = "preferred"
    unclean = "unclean"


@app.command("elect-leaders", epilog="Examples:\n\nbrook cluster elect-leaders --all\n\n"
             "brook cluster elect-leaders --topic orders --partition 0 --partition 3\n\n"
             "brook cluster elect-leaders --type unclean --topic orders --partition 2")
def elect_leaders(
    ctx: typer.Context,
    election_type: Annotated[ElectionType, typer.Option(
        "--type", help="preferred: move leadership back to each partition's first replica. unclean: give a "
                       "leaderless partition an out-of-sync replica (may LOSE committed records).")
    ] = ElectionType.preferred,
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    partition: Annotated[list[int] | None, typer.Option(
        "--partition", "-p", help="Only this partition of --topic (repeatable).", min=0, max=INT32_MAX)] = None,
    all_partitions: Annotated[bool, typer.Option("--all", help="Every partition of the cluster.")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Elect partition leaders now instead of waiting for the periodic preferred-leader check.

    Exit code 0 when every named partition has its election done or not needed, 1 otherwise.
    """
    if all_partitions == (topic is not None):
        raise CliError("name the partitions: either --all or --topic T [--partition P ...]", code=2)
    if partition and topic is None:
        raise CliError("--partition needs --topic", code=2)
    st = state(ctx, bootstrap, output)
    st.backend.metadata()  # an unreachable cluster is reported as such
    targets: list[str | tuple[str, int]] | None = None
    if topic is not None:
        targets = [(topic, p) for p in partition] if partition else [topic]
    if election_type is ElectionType.unclean and not st.json:
        err.print("warning: an unclean election may lose records the out-of-sync replicas never received",
                  style="yellow", highlight=False)
    results = st.backend.admin.elect_leaders(str(election_type), targets, timeout_ms=int(st.backend.timeout_s * 1000))
    rows = []
    failed = False
    for tp in sorted(results, key=lambda t: (t.topic, t.partition)):
        leader, error = results[tp]
        fine = error is None or error.code == errors.ErrorCode.ELECTION_NOT_NEEDED
        failed |= not fine
        rows.append({"topic": tp.topic, "partition": tp.partition, "leader": leader,
                     "result": "elected" if error is None else error.name,
                     "detail": "" if error is None else error.message})
    data = {"election_type": str(election_type), "results": rows}
    problems = [r["detail"] for r in rows if r["result"] not in ("elected", "ELECTION_NOT_NEEDED")]
    note = "\n".join(problems) if problems else None if rows else "no partition needed an election"
    show(st, data, table(f"{str(election_type).capitalize()} leader election",
                         ["TOPIC", "PARTITION", "LEADER", "RESULT"],
                         [[r["topic"], r["partition"], r["leader"],
                           Text(r["result"], style="green" if r["result"] == "elected" else
                                "yellow" if r["result"] == "ELECTION_NOT_NEEDED" else "red")] for r in rows]),
         note=note)
    if failed:
        rows_failed("partitions not elected", [
            f"{r['topic']}-{r['partition']} {r['result']}" + (f" ({r['detail']})" if r["detail"] else "")
            for r in rows if r["result"] not in ("elected", "ELECTION_NOT_NEEDED")], len(rows))


def _size(n: int) -> str:
    if n < 0:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@app.command("log-dirs", epilog="Examples:\n\nbrook cluster log-dirs\n\nbrook cluster log-dirs --broker 2 --topic orders")
def log_dirs(
    ctx: typer.Context,
    broker: Annotated[list[int] | None, typer.Option(
        "--broker", help="Only this broker (repeatable; default: every broker).", min=0, max=INT32_MAX)] = None,
    topic: Annotated[list[str] | None, typer.Option("--topic", "-t", help="Only this topic (repeatable).")] = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Each broker's log directories (disk use) and the partition logs in them: size, segments, log start,
    high watermark and log end offset.

    Exit code 1 when a broker did not answer or a directory is offline.
    """
    st = state(ctx, bootstrap, output)
    meta = st.backend.metadata()
    unknown = sorted(set(broker or []) - set(meta.brokers))
    if unknown:
        raise CliError(f"broker {unknown[0]} is not in the cluster (brokers: {_ids(list(meta.brokers))})")
    for name in dict.fromkeys(topic or ()):  # an unknown topic would be an empty table and exit 0
        st.backend.topic(name)
    answers = st.backend.admin.describe_log_dirs(broker or None, topic or ())
    data = []
    dir_rows = []
    replica_rows = []
    failed = False
    for node_id, dirs in sorted(answers.items()):
        if isinstance(dirs, errors.BrookError):
            failed = True
            data.append({"broker": node_id, "error": dirs.name, "detail": dirs.message, "dirs": []})
            dir_rows.append([node_id, "-", Text(dirs.name, style="red"), "-", "-"])
            continue
        entry: dict[str, Any] = {"broker": node_id, "dirs": []}
        for d in dirs:
            failed |= d.error is not None
            entry["dirs"].append({
                "path": d.path, "error": None if d.error is None else d.error.name,
                "total_bytes": d.total_bytes, "usable_bytes": d.usable_bytes,
                "partitions": [{"topic": r.topic, "partition": r.partition, "size_bytes": r.size_bytes,
                                "segments": r.segments, "log_start_offset": r.log_start_offset,
                                "high_watermark": r.high_watermark, "log_end_offset": r.log_end_offset,
                                "offset_lag": r.offset_lag, "is_leader": r.is_leader} for r in d.replicas]})
            dir_rows.append([node_id, d.path, Text(d.error.name, style="red") if d.error else "online",
                             _size(sum(r.size_bytes for r in d.replicas)),
                             f"{_size(d.usable_bytes)} / {_size(d.total_bytes)}"])
            for r in d.replicas:
                replica_rows.append([node_id, f"{r.topic}-{r.partition}", "leader" if r.is_leader else "follower",
                                     _size(r.size_bytes), r.log_start_offset, r.high_watermark, r.log_end_offset])
        data.append(entry)
    show(st, data, table("Log directories", ["BROKER", "PATH", "STATE", "USED", "FREE / TOTAL"], dir_rows),
         table("Partition logs", ["BROKER", "PARTITION", "ROLE", "SIZE", "START", "HW", "END"], replica_rows))
    if failed:
        rows_failed("brokers with a failed log directory or no answer", [
            f"broker {e['broker']} " + (f"{e['error']} ({e['detail']})" if "error" in e else
                                        ", ".join(f"{d['path']} {d['error']}" for d in e["dirs"] if d["error"]))
            for e in data if "error" in e or any(d["error"] for d in e["dirs"])], len(data))


# ----------------------------------------------------------------------------- replica placement


@app.command(epilog="Examples:\n\nbrook cluster decommission 4 --dry-run\n\nbrook cluster decommission 4 --wait")
def decommission(
    ctx: typer.Context,
    broker: Annotated[int, typer.Argument(help="The broker to empty.", min=0, max=INT32_MAX)],
    dry_run: partition_cli.DryRunOpt = False,
    wait: partition_cli.WaitOpt = False,
    wait_timeout: partition_cli.WaitTimeoutOpt = partition_cli.DEFAULT_WAIT_S,
    throttle: partition_cli.ThrottleOpt = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Move every replica off a broker onto the others (least loaded first, other racks preferred).
    Then stop the broker and release its id with `brook cluster unregister`."""
    st = state(ctx, bootstrap, output)
    assignment, live, desc = partition_cli.current_assignment(st)
    if broker not in {b.node_id for b in desc.brokers}:
        raise CliError(f"BROKER_ID_NOT_REGISTERED: broker {broker} is not registered")
    try:
        plan = planning.plan_decommission(assignment, live, {broker})
    except planning.PlanError as e:
        raise CliError(f"cannot decommission broker {broker}: {e}") from None
    data = {"broker": broker, "dry_run": dry_run,
            "moves": partition_cli.moves_json(assignment, plan.moves)}
    if plan.empty:
        show(st, data, table(None, ["PARTITION"], []), note=f"broker {broker} holds no replicas")
        return
    note = ""
    if not dry_run:
        note = partition_cli.apply_plan(st, plan.moves, wait=wait, wait_timeout=wait_timeout, throttle=throttle)
    verb = "would move" if dry_run else ("moved" if wait else "moving")
    show(st, data, partition_cli.plan_table(f"Decommission broker {broker}", assignment, plan.moves),
         note=f"{verb} {len(plan.moves)} replicas off broker {broker}" + note
              + ("" if dry_run else "; when done, stop it and run: brook cluster unregister " + str(broker)))


@app.command(epilog="Examples:\n\nbrook cluster unregister 4")
def unregister(
    ctx: typer.Context,
    broker: Annotated[int, typer.Argument(help="The stopped, emptied broker.", min=0, max=INT32_MAX)],
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Release a decommissioned broker's id: refused while it runs or any partition still names it."""
    st = state(ctx, bootstrap, output)
    st.backend.metadata()
    st.backend.admin.unregister_broker(broker)
    ok(st, f"unregistered broker {broker}", {"broker": broker})


@app.command(epilog="Examples:\n\nbrook cluster rebalance --dry-run\n\nbrook cluster rebalance --wait")
def rebalance(
    ctx: typer.Context,
    dry_run: partition_cli.DryRunOpt = False,
    wait: partition_cli.WaitOpt = False,
    wait_timeout: partition_cli.WaitTimeoutOpt = partition_cli.DEFAULT_WAIT_S,
    throttle: partition_cli.ThrottleOpt = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Even out replicas and preferred leaders across the live brokers (e.g. after adding one). With
    --wait, also elects the preferred leaders once the moves are done."""
    st = state(ctx, bootstrap, output)
    assignment, live, _ = partition_cli.current_assignment(st)
    try:
        plan = planning.plan_rebalance({tp: r for tp, r in assignment.items() if all(b in live for b in r)}, live)
    except planning.PlanError as e:
        raise CliError(f"cannot rebalance: {e}") from None
    data = {"dry_run": dry_run, "moves": partition_cli.moves_json(assignment, plan.moves)}
    if plan.empty:
        show(st, data, table(None, ["PARTITION"], []), note="replicas and leaders are already even")
        return
    note = ""
    if not dry_run:
        note = partition_cli.apply_plan(st, plan.moves, wait=wait, wait_timeout=wait_timeout, throttle=throttle)
        if wait:
            st.backend.admin.elect_leaders("preferred", [TopicPartition(*tp) for tp in plan.moves])
    verb = "would move" if dry_run else ("moved" if wait else "moving")
    show(st, data, partition_cli.plan_table("Rebalance", assignment, plan.moves),
         note=f"{verb} {len(plan.moves)} partitions{note}")


# ----------------------------------------------------------------------------- dynamic configs

config_app = typer.Typer(help="Cluster-wide broker configs changed at runtime (stored in the quorum).",
                         no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("get", epilog="Examples:\n\nbrook cluster config get\n\nbrook cluster config get log.retention.ms")
def config_get(
    ctx: typer.Context,
    keys: Annotated[list[str] | None, typer.Argument(help="Only these keys.")] = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Every dynamic cluster config: its value and where it comes from (dynamic: set at runtime; node: the
    controller's file; default: built in)."""
    st = state(ctx, bootstrap, output)
    st.backend.metadata()
    entries = st.backend.admin.describe_cluster_configs()
    unknown = [k for k in keys or [] if k not in entries]
    if unknown:
        raise CliError(f"'{unknown[0]}' is not a dynamic cluster config (brook cluster config get lists them)",
                       code=2)
    rows = [{"name": e.name, "value": e.value, "source": e.source} for n, e in sorted(entries.items())
            if not keys or n in keys]
    show(st, rows, table("Cluster configs", ["KEY", "VALUE", "SOURCE"],
                         [[r["name"], r["value"] or "-", r["source"]] for r in rows]))


@config_app.command("set", epilog="Examples:\n\nbrook cluster config set log.retention.ms=86400000\n\n"
                    "brook cluster config set follower.replication.throttled.rate=10485760")
def config_set(
    ctx: typer.Context,
    pairs: Annotated[list[str], typer.Argument(help="key=value (one or more).")],
    validate_only: Annotated[bool, typer.Option(help="Check the change; apply nothing.")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Set cluster-wide broker configs; every broker applies them at once, no restart."""
    from metadata_quorum import cluster_configs

    values = parse_pairs(pairs, "key=value")
    try:
        cluster_configs.validate(values)  # a clear error before anything is sent
    except errors.BrookError as e:
        raise CliError(e.message, code=2) from None
    st = state(ctx, bootstrap, output)
    st.backend.metadata()
    st.backend.admin.alter_cluster_configs(set=values, validate_only=validate_only)
    ok(st, f"{'would set' if validate_only else 'set'} {', '.join(f'{k}={v}' for k, v in values.items())}",
       {"set": values, "validate_only": validate_only})


@config_app.command("delete", epilog="Examples:\n\nbrook cluster config delete follower.replication.throttled.rate")
def config_delete(
    ctx: typer.Context,
    keys: Annotated[list[str], typer.Argument(help="Keys to reset to the nodes' own values.")],
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Remove dynamic values: each node's file (or the built-in default) applies again."""
    from metadata_quorum import cluster_configs

    try:
        cluster_configs.validate({}, keys)
    except errors.BrookError as e:
        raise CliError(e.message, code=2) from None
    st = state(ctx, bootstrap, output)
    st.backend.metadata()
    st.backend.admin.alter_cluster_configs(delete=keys)
    ok(st, f"deleted {', '.join(keys)}", {"deleted": keys})
