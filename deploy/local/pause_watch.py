"""Stalls of the machine during a benchmark: processes that do nothing but sleep, one per core.

On the shared 2-core virtual machines Brook is measured on, processes now and then stop for
10-65 ms: the client's send loop, every broker's event loop and a process that only sleeps
resume late by the same amount at the same moment, on an idle machine as on a busy one
(README, Client performance). The host stops the VM's cores, both or one: a stalled core stops
whatever runs on it, and a broker stopped in the middle of a request holds up every partition
it leads or follows. Nothing a broker or the client does can shorten such a stall, but one of
them in a 10-second latency run decides its p99: the records in flight wait it out, and the
ones the paced sender owes are sent in one burst after it.

``PauseWatch`` runs this module once per core (``python -m deploy.local.pause_watch --cpu N``),
each process pinned to its core: it sleeps ``interval_ms`` at a time and writes a line for every
wake-up that came ``threshold_ms`` or more late, until its stdin closes. Pinned, a watcher cannot
be moved to the other core, so a stall of its core reaches it. The benchmark prints the stalls
next to each latency figure, so that a run's p99 can be read against them: not a figure of
Brook's. A core that is busy but not stalled wakes a watcher within a scheduler slice (a few ms),
well under the threshold.

The host also takes a VM's cores in slices too short for a watcher to see: the guest kernel counts
the time its cores were ready to run but the hypervisor ran something else as steal time
(``/proc/stat``). ``PauseWatch`` reads it before and after the run. On the development machine
(2026-12-04, 10-second runs at 10,000 records/s), runs the hypervisor took 30-50 ms of the cores'
22 s from had a produce p99 of 5.4-6.2 ms, runs it took 310-430 ms from 8.6-9.8 ms, and runs it
took 1.15-3.59 s from 14.8-33.4 ms; the watchers had seen a stall in only 4 of those last 9 runs.
"""

from __future__ import annotations

import argparse
import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass
from types import TracebackType

DEFAULT_INTERVAL_MS = 2.0
# A sleeper that shares two cores with four busy processes wakes up to a scheduler slice late
# (about 3 ms on the development machine); 10 ms is well beyond that, and a pause this long
# holds up about 100 records at 10,000 a second.
DEFAULT_THRESHOLD_MS = 10.0
MAX_REPORTED = 1000  # lines a watcher writes at most: an overloaded machine must not flood the pipe
# Above this many cores, one unpinned watcher (reported as core -1): a stalled core is a small share of such a
# machine, and a process per core would cost more than the figures it explains.
MAX_PINNED = 8
UNPINNED = -1
STARTUP_S = 10.0  # the longest a watch waits for its watchers to start
READY = "ready"  # a watcher's first line: it is sleeping, and the parent's watch has begun
# A run is marked as disturbed when the hypervisor took this share of the VM's core time during it (steal time):
# 0.5% lies between the runs measured undisturbed (under 0.25%) and those whose p99 it clearly raised (1.4% and more).
STEAL_MARK_SHARE = 0.005
PROC_STAT = "/proc/stat"


def steal_seconds(path: str = PROC_STAT) -> float | None:
    """The time the hypervisor has kept this machine's cores from running, summed over the cores, since boot (the
    ``steal`` column of the ``cpu`` line of ``/proc/stat``); None where there is no such file or column."""
    try:
        with open(path) as f:
            for line in f:
                fields = line.split()
                if fields and fields[0] == "cpu":
                    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else None
    except (OSError, ValueError):
        return None
    return None


def watch(interval_s: float, threshold_s: float) -> None:
    """A watcher's loop: say ``READY``, sleep, and report each wake-up ``threshold_s`` or more late as
    ``<late ms> <when it woke, time.monotonic()>`` on stdout. Ends when stdin closes, after reporting the
    wake-up that saw it (a stall just before the end of a run is still one of the run's)."""
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    reported = 0
    # Due before READY is told: a stall that begins as the parent reads it is counted from the first wake-up's
    # due time (set after the line, a watcher stopped between the two missed the stall; a flaky test showed it).
    due = time.monotonic() + interval_s
    sys.stdout.write(READY + "\n")
    sys.stdout.flush()
    while True:
        closed = bool(selector.select(max(0.0, due - time.monotonic())))  # stdin readable: the parent closed it
        now = time.monotonic()
        late = now - due
        if late >= threshold_s and reported < MAX_REPORTED:
            sys.stdout.write(f"{late * 1000:.1f} {now:.6f}\n")
            sys.stdout.flush()
            reported += 1
        if closed:
            return
        due = now + interval_s


@dataclass
class Stall:
    """One stall: how long (the longest any watcher saw of it), when it ended, and the cores it reached."""

    ms: float
    ended: float
    cpus: set[int]


def merge(seen: dict[int, list[tuple[float, float]]]) -> list[Stall]:
    """The watchers' reports (per core: (late ms, woke at)) as stalls in time order: reports whose late
    spans overlap are one stall of several cores."""
    spans = sorted((woke - ms / 1000, woke, ms, cpu) for cpu, reports in seen.items() for ms, woke in reports)
    stalls: list[Stall] = []
    for start, end, ms, cpu in spans:
        if stalls and start <= stalls[-1].ended:  # the spans are in start order: only the last stall can overlap
            stall = stalls[-1]
            stall.ms = max(stall.ms, ms)
            stall.ended = max(stall.ended, end)
            stall.cpus.add(cpu)
        else:
            stalls.append(Stall(ms, end, {cpu}))
    return stalls


class PauseWatch:
    """``with PauseWatch() as w: <a latency run>``; then ``w.stalls`` and ``w.line()``."""

    def __init__(self, interval_ms: float = DEFAULT_INTERVAL_MS, threshold_ms: float = DEFAULT_THRESHOLD_MS,
                 cpus: list[int] | None = None) -> None:
        self.interval_ms = interval_ms
        self.threshold_ms = threshold_ms
        if cpus is None:
            affinity = getattr(os, "sched_getaffinity", None)  # Linux: elsewhere one unpinned watcher
            cpus = sorted(affinity(0)) if affinity is not None else [UNPINNED]
            if len(cpus) > MAX_PINNED:
                cpus = [UNPINNED]
        self.cpus = cpus
        self.stalls: list[Stall] = []
        self.steal_ms: float | None = None  # the hypervisor's steal time during the watch, all cores together
        self.watched_s = 0.0
        self._procs: dict[int, subprocess.Popen[str]] = {}
        self._started: tuple[float, float | None] | None = None  # (time.monotonic(), steal_seconds()) at the start

    def __enter__(self) -> PauseWatch:
        for cpu in self.cpus:
            pin = [] if cpu == UNPINNED else ["--cpu", str(cpu)]
            self._procs[cpu] = subprocess.Popen(
                [sys.executable, "-m", "deploy.local.pause_watch", "--interval-ms", str(self.interval_ms),
                 "--threshold-ms", str(self.threshold_ms), *pin],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        # The run starts once every watcher sleeps (an interpreter takes tens of ms to start), at most STARTUP_S.
        deadline = time.monotonic() + STARTUP_S
        for proc in self._procs.values():
            if proc.stdout is None:
                continue
            with selectors.DefaultSelector() as selector:
                selector.register(proc.stdout, selectors.EVENT_READ)
                if selector.select(max(0.0, deadline - time.monotonic())):
                    proc.stdout.readline()  # READY, or "" from a watcher that failed to start
        self._started = (time.monotonic(), steal_seconds())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> list[Stall]:
        """End the watchers; the stalls they saw, in the order they happened."""
        procs, self._procs = self._procs, {}
        if self._started is not None:
            (began, stolen), self._started = self._started, None
            self.watched_s = time.monotonic() - began
            now = steal_seconds()
            self.steal_ms = (now - stolen) * 1000 if now is not None and stolen is not None else None
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()  # each ends at its next wake-up: all of them at once, then read each
                proc.stdin = None
        seen: dict[int, list[tuple[float, float]]] = {}
        for cpu, proc in procs.items():
            try:
                out, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            reports = seen.setdefault(cpu, [])
            for line in out.splitlines():
                fields = line.split()
                if len(fields) == 2:
                    reports.append((float(fields[0]), float(fields[1])))
        if procs:
            self.stalls = merge(seen)
        return self.stalls

    @property
    def steal_share(self) -> float | None:
        """The share of the machine's core time during the watch that the hypervisor took (None: not known)."""
        cores = os.cpu_count() or 1
        if self.steal_ms is None or self.watched_s <= 0:
            return None
        return self.steal_ms / (self.watched_s * 1000 * cores)

    @property
    def disturbed(self) -> bool:
        """The machine stalled during the watch, or the hypervisor took ``STEAL_MARK_SHARE`` of its core time or
        more."""
        share = self.steal_share
        return bool(self.stalls) or (share is not None and share >= STEAL_MARK_SHARE)

    def line(self) -> str:
        """One line for the benchmark's output."""
        return self._stalls_line() + self._steal_words()

    def _steal_words(self) -> str:
        share = self.steal_share
        if share is None or self.steal_ms is None:
            return ""
        return (f"; the hypervisor kept the cores from running for {self.steal_ms:.0f} ms (steal time, "
                f"{share * 100:.2f}% of their time{', marked' if share >= STEAL_MARK_SHARE else ''})")

    def _stalls_line(self) -> str:
        who = "a process that" if self.cpus == [UNPINNED] else "a process per core that"
        what = f"{who} only sleeps ({self.interval_ms:g} ms at a time) woke {self.threshold_ms:g} ms or more late"
        if not self.stalls:
            return f"the machine: {what} 0 times during the run"
        every = set(self.cpus)

        def one(s: Stall) -> str:
            where = "" if s.cpus >= every else f" (core {', '.join(str(c) for c in sorted(s.cpus))})"
            return f"{s.ms:.0f}{where}"
        shown = ", ".join(one(s) for s in self.stalls[:10]) + (", ..." if len(self.stalls) > 10 else "")
        return (f"the machine: {what} {len(self.stalls)} time(s) during the run ({shown} ms; "
                f"{sum(s.ms for s in self.stalls):.0f} ms in all); the client and the brokers stall with it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.pause_watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval-ms", type=float, default=DEFAULT_INTERVAL_MS)
    parser.add_argument("--threshold-ms", type=float, default=DEFAULT_THRESHOLD_MS)
    parser.add_argument("--cpu", type=int, default=None, help="the core to pin this watcher to")
    args = parser.parse_args(argv)
    if args.interval_ms <= 0 or args.threshold_ms <= 0:
        parser.error("--interval-ms and --threshold-ms must be positive")
    if args.cpu is not None:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except (OSError, ValueError) as exc:
            parser.error(f"--cpu {args.cpu}: {exc}")
    try:
        watch(args.interval_ms / 1000, args.threshold_ms / 1000)
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
