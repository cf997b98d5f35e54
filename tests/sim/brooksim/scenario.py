"""Data-driven scenarios in the style of etcd-raft's ``testdata/*.txt`` (cockroachdb/datadriven).

A file is a sequence of blocks::

    # comments and blank lines between blocks are ignored
    command key=value key=value
    ----
    the output the command is expected to print

Every command runs one simulator event (or prints a view) with no randomness, and its
output is the trace lines it produced; any invariant violated by the step is printed
as ``INVARIANT VIOLATED: ...`` (and the scenario goes on). ``quiet=true`` on any event
command prints nothing but violations. Set ``BROOK_SIM_REWRITE=1`` to rewrite the
expected output of every file from what the code prints now (then review the diff).

Commands (brokers are 1..N, controllers 100..):
  cluster brokers=3 controllers=3        elect 100, register and unfence every broker
  create-topic name=t replicas=1,2,3[;2,3,1] min-isr=2
  settle [rounds=10]                     fault-free rounds of every component (prints nothing)
  tick controller=100 | commit [n=all] | elect controller=101 | depose [keep=all|none] [stale=true]
  learn-term controller=100 | controller-crash controller=100 | controller-restart controller=100
  race controller=100                    elect another voter between its is_leader() and term reads
  heartbeat broker=1|all | metadata broker=1|all | isr-check broker=1 | alter broker=1 [lose-response=true]
  fetch broker=2 partition=t-0 [fault=lose|delay] | deliver broker=2
  produce broker=1 partition=t-0 acks=all|1 values=a,b
  flush broker=1 | crash broker=1 [power-loss=true] | restart broker=1 | pause broker=1 | resume broker=1
  advance ms=3000
  partition name=t-0 | controllers | check
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from brooksim.cluster import SimCluster, SimConfig, TopicSpec, quiet_logs
from brooksim.invariants import InvariantError
from replication.partition import Role

_STEP_PREFIX = re.compile(r"^\d+ t=\d+ ")


@dataclass
class Block:
    comment: str  # the comment lines just above the command (kept when rewriting)
    command: str
    expected: str


def parse(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    comment: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line:
            continue
        if line.startswith("#"):
            comment.append(lines[i - 1].rstrip())
            continue
        if i >= len(lines) or lines[i].strip() != "----":
            raise ValueError(f"line {i}: command {line!r} is not followed by ----")
        i += 1
        out: list[str] = []
        while i < len(lines) and lines[i].strip() != "":
            out.append(lines[i].rstrip())
            i += 1
        blocks.append(Block("\n".join(comment), line, "\n".join(out)))
        comment = []
    return blocks


def render(blocks: list[Block], outputs: list[str]) -> str:
    parts = []
    for block, out in zip(blocks, outputs, strict=True):
        head = f"{block.comment}\n\n" if blocks.index(block) == 0 and block.comment else \
            (f"{block.comment}\n" if block.comment else "")
        parts.append(f"{head}{block.command}\n----\n{out}".rstrip("\n"))
    return "\n\n".join(parts) + "\n"


class ScenarioRunner:
    def __init__(self) -> None:
        self.sim: SimCluster | None = None

    @property
    def s(self) -> SimCluster:
        if self.sim is None:
            raise ValueError("start with: cluster brokers=N controllers=M")
        return self.sim

    def run(self, command: str) -> str:
        with quiet_logs():
            return self._run(command)

    def _run(self, command: str) -> str:
        name, *rest = command.split()
        args = dict(a.split("=", 1) for a in rest)
        quiet = args.pop("quiet", "false") == "true"
        handler = getattr(self, "cmd_" + name.replace("-", "_"), None)
        if handler is None:
            raise ValueError(f"unknown command {name!r}")
        if self.sim is None:
            return handler(args) or ""
        mark = len(self.s.trace)
        violation = ""
        try:
            view = handler(args)
        except InvariantError as exc:
            view, violation = None, f"INVARIANT VIOLATED: {exc}"
        lines = [] if quiet else [_STEP_PREFIX.sub("", t) for t in self.s.trace[mark:]]
        if view:
            lines.append(view)
        if violation:
            lines.append(violation)
        return "\n".join(lines)

    # ---- helpers ----
    def _event(self, fn: Callable[..., str], *a: object) -> None:
        self.s.run_event(fn, *a)

    def _brokers(self, args: dict[str, str]) -> list[int]:
        return sorted(self.s.brokers) if args["broker"] == "all" else [int(args["broker"])]

    @staticmethod
    def _key(name: str) -> tuple[str, int]:
        topic, _, index = name.rpartition("-")
        return topic, int(index)

    # ---- setup ----
    def cmd_cluster(self, args: dict[str, str]) -> str:
        config = SimConfig(brokers=int(args.get("brokers", 3)), controllers=int(args.get("controllers", 3)),
                           topics=[], faults=False)
        self.sim = SimCluster(0, config)
        self.sim.bootstrap()
        self.sim.trace.clear()
        return self.cmd_controllers({})

    def cmd_create_topic(self, args: dict[str, str]) -> str:
        assignments = [[int(r) for r in part.split(",")] for part in args["replicas"].split(";")]
        spec = TopicSpec(args["name"], len(assignments), len(assignments[0]), int(args.get("min-isr", 1)))
        self.s.create_topic(spec, assignments)
        mark = len(self.s.trace)
        self.s.settle(3)  # every replica learns of it
        del self.s.trace[mark:]
        return ""

    def cmd_settle(self, args: dict[str, str]) -> str:
        mark = len(self.s.trace)
        self.s.settle(int(args.get("rounds", 10)))
        del self.s.trace[mark:]  # too long to be worth diffing; views show the outcome
        return ""

    # ---- quorum and controllers ----
    def cmd_tick(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_controller_tick, int(args["controller"]))

    def cmd_commit(self, args: dict[str, str]) -> None:
        n = args.get("n", "all")
        count = 0
        while (n == "all" or count < int(n)) and self.s.quorum.uncommitted and self.s.quorum.leader is not None:
            self._event(self.s.ev_commit)
            count += 1

    def cmd_elect(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_elect, int(args["controller"]))

    def cmd_depose(self, args: dict[str, str]) -> None:
        keep = args.get("keep", "all")
        self._event(self.s.ev_depose, (1 << 30) - 1 if keep == "all" else 0, args.get("stale") == "true")

    def cmd_learn_term(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_learn_term, int(args["controller"]))

    def cmd_controller_crash(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_controller_crash, int(args["controller"]))

    def cmd_controller_restart(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_controller_restart, int(args["controller"]))

    def cmd_race(self, args: dict[str, str]) -> None:
        self._event(self.s.arm_stale_term_read, int(args["controller"]))

    # ---- brokers ----
    def cmd_heartbeat(self, args: dict[str, str]) -> None:
        for bid in self._brokers(args):
            self._event(self.s.ev_heartbeat, bid)

    def cmd_metadata(self, args: dict[str, str]) -> None:
        for bid in self._brokers(args):
            self._event(self.s.ev_metadata, bid)

    def cmd_isr_check(self, args: dict[str, str]) -> None:
        for bid in self._brokers(args):
            self._event(self.s.ev_isr_check, bid)

    def cmd_alter(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_alter, int(args["broker"]), args.get("lose-response") == "true")

    def cmd_fetch(self, args: dict[str, str]) -> None:
        self._event(self.s.fetch_partition, int(args["broker"]), self._key(args["partition"]), args.get("fault", ""))

    def cmd_deliver(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_deliver, int(args["broker"]))

    def cmd_produce(self, args: dict[str, str]) -> None:
        acks = -1 if args.get("acks", "all") == "all" else int(args["acks"])
        self._event(self.s.produce, int(args["broker"]), self._key(args["partition"]), acks,
                    args["values"].split(","))

    def cmd_flush(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_flush, int(args["broker"]))

    def cmd_crash(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_crash, int(args["broker"]), args.get("power-loss") == "true")

    def cmd_restart(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_restart, int(args["broker"]))

    def cmd_pause(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_pause, int(args["broker"]))

    def cmd_resume(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_resume, int(args["broker"]))

    def cmd_advance(self, args: dict[str, str]) -> None:
        self._event(self.s.ev_advance, int(args["ms"]))

    # ---- views ----
    def cmd_partition(self, args: dict[str, str]) -> str:
        key = self._key(args["name"])
        ps = self.s.quorum.state.topics[key[0]].partitions[key[1]]
        out = [f"metadata: leader={ps.leader} leader_epoch={ps.leader_epoch} partition_epoch={ps.partition_epoch} "
               f"isr={ps.isr} replicas={ps.replicas}"]
        for bid in ps.replicas:
            b = self.s.brokers[bid]
            lg = b.logs.get(key)
            p = b.partitions.get(key)
            role = "down" if not b.up else ("paused " if b.paused else "") + (
                p.role.value if p is not None else "none")
            if p is not None and p.role is Role.LEADER:
                role += f" isr={list(p.isr)}" + (f" pending={list(p.pending_isr)}" if p.pending_isr else "")
            if lg is None:
                out.append(f"  {bid}: {role} (no log)")
                continue
            epochs = [(e.epoch, e.start_offset) for e in lg.epoch_cache.entries()]
            values = " ".join(f"{v}@{e}" for e, v in lg.records())
            out.append(f"  {bid}: {role} epoch={p.leader_epoch if p else '-'} leo={lg.log_end_offset} "
                       f"hw={lg.high_watermark} epochs={epochs} log=[{values}]")
        return "\n".join(out)

    def cmd_controllers(self, args: dict[str, str]) -> str:
        q = self.s.quorum
        st = q.state
        parts = [f"raft: leader={q.leader} term={q.term}",
                 f"state: active_controller={st.active_controller_id} epoch={st.controller_epoch}",
                 f"active: {self.s.active_controllers()}"]
        return "\n".join(parts)

    def cmd_check(self, args: dict[str, str]) -> str:
        self.s.invariants.check()
        self.s.invariants.check_converged()
        return "invariants: ok, converged"


def run_file(path: Path) -> tuple[str, str]:
    """(expected, actual) text of one scenario file."""
    text = path.read_text()
    blocks = parse(text)
    runner = ScenarioRunner()
    outputs = []
    for block in blocks:
        try:
            outputs.append(runner.run(block.command))
        except InvariantError as exc:
            outputs.append(f"INVARIANT VIOLATED: {exc}")
    return text, render(blocks, outputs)
