"""``brook partition``: move partitions between brokers, list and cancel moves in progress."""

from __future__ import annotations

import dataclasses
import time
from typing import Annotated, Any

import typer
from rich.text import Text

from admin_cli.common import (
    INT32_MAX,
    BootstrapOpt,
    CliError,
    OutputOpt,
    err,
    number_in,
    ok,
    show,
    state,
    table,
)
from client.admin import Admin
from client.cluster import as_timeout_ms
from client.types import TopicPartition
from proto import controller_pb2

app = typer.Typer(help="Move partitions between brokers (reassignment).", no_args_is_help=True)

WAIT_POLL_S = 0.5
DEFAULT_WAIT_S = 600.0

WaitOpt = Annotated[bool, typer.Option("--wait", help="Wait until the move is complete.")]
WaitTimeoutOpt = Annotated[float, typer.Option("--wait-timeout", help="Seconds --wait waits at most (>= 1).",
                                               callback=number_in(low=1))]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Show the moves; change nothing.")]
ThrottleOpt = Annotated[int | None, typer.Option(
    "--throttle", help="Limit the copy to this many bytes/s per broker (follower.replication.throttled.rate; "
                       "removed again when --wait sees the moves done).", min=1)]
THROTTLE_KEY = "follower.replication.throttled.rate"


def parse_replicas(text: str) -> list[int]:
    """``3,1,2`` -> [3, 1, 2]. Every element must be a broker id: an empty one (``1,,2``, a trailing comma)
    is refused, not skipped (it is more likely a lost id than a stray comma); so are int()'s extras (``1_0``)."""
    elements = [x.strip() for x in text.split(",")]
    if not all(x.isascii() and x.isdigit() for x in elements):
        raise CliError(f"--replicas must be broker ids separated by commas (e.g. 3,1,2), not {text!r}", code=2)
    replicas = [int(x) for x in elements]
    if any(not 0 <= r <= INT32_MAX for r in replicas):
        raise CliError(f"--replicas must be broker ids separated by commas (e.g. 3,1,2), not {text!r}", code=2)
    if len(set(replicas)) != len(replicas):
        raise CliError(f"--replicas {text} names a broker twice", code=2)
    return replicas


def submit(admin: Admin, moves: dict[TopicPartition, list[int] | None], timeout_s: float) -> dict[TopicPartition, str]:
    """Send the moves; {tp: error text} for the refused ones."""
    results = admin.alter_partition_reassignments(moves, timeout_ms=int(timeout_s * 1000))
    return {tp: f"{e.name}: {e.message}" for tp, e in results.items() if e is not None}


@dataclasses.dataclass(frozen=True)
class Throttle:
    """The copy throttle a command sets for its moves (``rate``, None: none) and the cluster's dynamic value
    before it (None: none), which it puts back: an operator's own throttle outlives the command."""

    rate: int | None
    before: str | None = None


def set_throttle(st: Any, rate: int | None) -> Throttle:
    if rate is None:
        return Throttle(None)
    entry = st.backend.admin.describe_cluster_configs().get(THROTTLE_KEY)
    before = entry.value if entry is not None and entry.source == "dynamic" else None
    st.backend.admin.alter_cluster_configs(set={THROTTLE_KEY: str(rate)})
    return Throttle(rate, before)


def restore_throttle(st: Any, throttle: Throttle) -> None:
    """Put back the throttle there was before ``set_throttle`` (or none)."""
    if throttle.rate is None:
        return
    if throttle.before is None:
        st.backend.admin.alter_cluster_configs(delete=[THROTTLE_KEY])
    else:
        st.backend.admin.alter_cluster_configs(set={THROTTLE_KEY: throttle.before})


def end_throttle(st: Any, throttle: Throttle, waited: bool) -> str:
    """Put back the throttle there was before once the moves are done; else say how to."""
    if throttle.rate is None:
        return ""
    if waited:
        restore_throttle(st, throttle)
        return "; throttle removed" if throttle.before is None else f"; throttle back to {throttle.before} bytes/s"
    if throttle.before is None:
        return f"; throttled to {throttle.rate} bytes/s until: brook cluster config delete {THROTTLE_KEY}"
    return (f"; throttled to {throttle.rate} bytes/s until: brook cluster config set "
            f"{THROTTLE_KEY}={throttle.before} (the throttle before)")


def wait_done(admin: Admin, tps: list[TopicPartition], timeout_s: float, *, quiet: bool) -> None:
    """Poll until none of ``tps`` is being reassigned; CliError at the deadline, naming what is left."""
    deadline = time.monotonic() + timeout_s
    last_report = 0.0
    wanted = set(tps)
    while True:
        left = {tp: r for tp, r in admin.list_partition_reassignments().items() if tp in wanted}
        if not left:
            # Done in the quorum; done for whoever asks next once every broker has applied it.
            admin.wait_for_brokers(timeout_ms=as_timeout_ms(deadline - time.monotonic()))
            return
        now = time.monotonic()
        if now >= deadline:
            detail = ", ".join(f"{tp.topic}-{tp.partition} (waiting for {waiting_for(r)} to be in sync, ISR {r.isr})"
                               for tp, r in sorted(left.items())[:5])
            raise CliError(f"{len(left)} moves still in progress after {timeout_s:.0f} s: {detail}")
        if not quiet and now - last_report >= 5:
            err.print(f"waiting: {len(left)} of {len(tps)} moves in progress", highlight=False)
            last_report = now
        time.sleep(WAIT_POLL_S)


@app.command(epilog="Examples:\n\nbrook partition move orders 0 --replicas 3,1,2 --wait\n\n"
             "brook partition move orders 0 --cancel")
def move(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    partition: Annotated[int, typer.Argument(help="Partition.", min=0, max=INT32_MAX)],
    replicas: Annotated[str | None, typer.Option(
        "--replicas", help="Target broker ids, preferred leader first, e.g. 3,1,2 (another count changes the "
                           "replication factor).")] = None,
    cancel: Annotated[bool, typer.Option("--cancel", help="Cancel the move in progress instead.")] = False,
    wait: WaitOpt = False,
    wait_timeout: WaitTimeoutOpt = DEFAULT_WAIT_S,
    throttle: ThrottleOpt = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Move a partition's replicas to other brokers. The new replicas copy the log as followers while the
    old ones keep serving; once every target replica is in sync the controller drops the others (and moves
    leadership if the leader leaves). Nothing acknowledged is lost on the way."""
    if cancel == (replicas is not None):
        raise CliError("give either --replicas B1,B2,... or --cancel", code=2)
    target = None if cancel else parse_replicas(replicas or "")
    st = state(ctx, bootstrap, output)
    t = st.backend.topic(topic)
    if partition not in t.partitions:
        raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic '{topic}' has no partition {partition}; nothing moved")
    tp = TopicPartition(topic, partition)
    throttled = set_throttle(st, throttle)
    refused = submit(st.backend.admin, {tp: target}, st.backend.timeout_s)
    if refused:
        restore_throttle(st, throttled)  # nothing moves: the cluster is as it was
        raise CliError(refused[tp])
    if wait and not cancel:
        wait_done(st.backend.admin, [tp], wait_timeout, quiet=st.json)
    note = end_throttle(st, throttled, wait)
    verb = "cancelled the move of" if cancel else ("moved" if wait else "moving")
    ok(st, f"{verb} {topic}-{partition}" + ("" if cancel else f" to replicas {target}") + note,
       {"topic": topic, "partition": partition, "replicas": target, "cancelled": cancel, "complete": wait,
        "throttle": throttle})


@app.command(epilog="Examples:\n\nbrook partition reassignments\n\nbrook partition reassignments -t orders -o json")
def reassignments(
    ctx: typer.Context,
    topic: Annotated[list[str] | None, typer.Option("--topic", "-t", help="Only this topic (repeatable).")] = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """The moves in progress: target and leaving replicas, and which target replicas the move waits for (new ones
    catching up, or ones out of sync: stopped, or behind)."""
    st = state(ctx, bootstrap, output)
    st.backend.metadata()
    moves = st.backend.admin.list_partition_reassignments(topic or None)
    rows = [{"topic": tp.topic, "partition": tp.partition, "replicas": r.replicas, "adding": r.adding_replicas,
             "removing": r.removing_replicas, "isr": r.isr, "leader": r.leader, "catching_up": waiting_for(r)}
            for tp, r in sorted(moves.items())]
    show(st, rows, table("Reassignments in progress", ["PARTITION", "ADDING", "REMOVING", "ISR", "CATCHING UP"],
                         [[f"{r['topic']}-{r['partition']}", r["adding"] or "-", r["removing"] or "-", r["isr"],
                           Text(str(r["catching_up"]), style="yellow") if r["catching_up"] else "-"] for r in rows]),
         note=None if rows else "no reassignment in progress")


def waiting_for(move: Any) -> list[int]:
    """The target replicas of a move not in the ISR yet: it completes once there are none (a shrink's kept replica
    that is stopped counts as well as a new one copying)."""
    return [b for b in move.replicas if b not in move.removing_replicas and b not in move.isr]


def current_assignment(st: Any) -> tuple[dict[tuple[str, int], list[int]], dict[int, str],
                                         controller_pb2.DescribeClusterResponse]:
    """(assignment, {live broker id: rack}, the cluster description); refuses while moves are in progress."""
    desc = st.backend.describe_cluster()
    moving = [f"{p.topic}-{p.partition}" for p in desc.partitions if p.adding_replicas or p.removing_replicas]
    if moving:
        raise CliError(f"{len(moving)} moves are in progress ({', '.join(sorted(moving)[:5])}): wait for them "
                       f"(brook partition reassignments) or cancel them first")
    assignment = {(p.topic, p.partition): list(p.replicas) for p in desc.partitions}
    live = {b.node_id: b.rack for b in desc.brokers if not b.fenced and not b.in_controlled_shutdown}
    return assignment, live, desc


def apply_plan(st: Any, moves: dict[tuple[str, int], list[int]], *, wait: bool, wait_timeout: float,
               throttle: int | None = None) -> str:
    """Submit the moves (and wait); returns a note about the throttle."""
    throttled = set_throttle(st, throttle)
    refused = submit(st.backend.admin, {TopicPartition(*tp): r for tp, r in moves.items()}, st.backend.timeout_s)
    if refused:
        lines = "; ".join(f"{tp.topic}-{tp.partition}: {e}" for tp, e in sorted(refused.items())[:5])
        if len(refused) == len(moves):
            restore_throttle(st, throttled)  # nothing moves
            raise CliError(f"{len(refused)} of {len(moves)} moves refused, nothing moved: {lines}")
        raise CliError(f"{len(refused)} of {len(moves)} moves refused: {lines}; the other {len(moves) - len(refused)} "
                       f"are in progress (brook partition reassignments){end_throttle(st, throttled, False)}")
    if wait:
        wait_done(st.backend.admin, [TopicPartition(*tp) for tp in moves], wait_timeout, quiet=st.json)
    return end_throttle(st, throttled, wait)


def moves_json(assignment: dict[tuple[str, int], list[int]],
               moves: dict[tuple[str, int], list[int]]) -> list[dict[str, Any]]:
    """A plan's moves as the commands' json output lists them."""
    return [{"topic": t, "partition": p, "from": assignment[(t, p)], "to": r} for (t, p), r in sorted(moves.items())]


def plan_table(title: str, assignment: dict[tuple[str, int], list[int]],
               moves: dict[tuple[str, int], list[int]]) -> Any:
    return table(title, ["PARTITION", "FROM", "TO"],
                 [[f"{t}-{p}", assignment[(t, p)], moves[(t, p)]] for t, p in sorted(moves)])
