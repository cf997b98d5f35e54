"""Stalls of the whole machine during a benchmark: a process that does nothing but sleep.

On the shared 2-core virtual machines Brook is measured on, every process now and then stops
for 10-65 ms at once: the client's send loop, every broker's event loop and a process that only
sleeps all resume late by the same amount at the same moment, on an idle machine as on a busy
one (README, Client performance). Nothing a broker or the client does can shorten such a pause,
but one of them in a 10-second latency run decides its p99: the records in flight wait it out,
and the ones the paced sender owes are sent in one burst after it.

``PauseWatch`` runs this module in a process of its own (``python -m deploy.local.pause_watch``):
it sleeps ``interval_ms`` at a time and writes a line for every wake-up that came
``threshold_ms`` or more late, until its stdin closes. The benchmark prints them next to each
latency figure, so that a run's p99 can be read against the stalls it had: not a figure of Brook's.
"""

from __future__ import annotations

import argparse
import selectors
import subprocess
import sys
import time
from types import TracebackType

DEFAULT_INTERVAL_MS = 2.0
# A sleeper that shares two cores with four busy processes wakes up to a scheduler slice late
# (about 3 ms on the development machine); 10 ms is well beyond that, and a pause this long
# holds up about 100 records at 10,000 a second.
DEFAULT_THRESHOLD_MS = 10.0
MAX_REPORTED = 1000  # lines the watcher writes at most: an overloaded machine must not flood the pipe


def watch(interval_s: float, threshold_s: float) -> None:
    """The watcher's loop: sleep, and report each wake-up ``threshold_s`` or more late as
    ``<late ms> <when, time.monotonic()>`` on stdout. Ends when stdin closes."""
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    reported = 0
    due = time.monotonic() + interval_s
    while True:
        if selector.select(max(0.0, due - time.monotonic())):
            return  # stdin readable: the parent closed it (or wrote): stop
        now = time.monotonic()
        late = now - due
        if late >= threshold_s and reported < MAX_REPORTED:
            sys.stdout.write(f"{late * 1000:.1f} {now:.3f}\n")
            sys.stdout.flush()
            reported += 1
        due = now + interval_s


class PauseWatch:
    """``with PauseWatch() as w: <a latency run>``; then ``w.pauses_ms`` and ``w.line()``."""

    def __init__(self, interval_ms: float = DEFAULT_INTERVAL_MS, threshold_ms: float = DEFAULT_THRESHOLD_MS) -> None:
        self.interval_ms = interval_ms
        self.threshold_ms = threshold_ms
        self.pauses_ms: list[float] = []
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> PauseWatch:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.local.pause_watch", "--interval-ms", str(self.interval_ms),
             "--threshold-ms", str(self.threshold_ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> list[float]:
        """End the watcher; the pauses it saw, in ms, in the order they happened."""
        proc, self._proc = self._proc, None
        if proc is None:
            return self.pauses_ms
        try:
            out, _ = proc.communicate(timeout=10)  # closes its stdin: it ends at its next wake-up
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        for line in out.splitlines():
            fields = line.split()
            if fields:
                self.pauses_ms.append(float(fields[0]))
        return self.pauses_ms

    def line(self) -> str:
        """One line for the benchmark's output."""
        what = (f"a process that only sleeps ({self.interval_ms:g} ms at a time) woke {self.threshold_ms:g} ms "
                f"or more late")
        if not self.pauses_ms:
            return f"the machine: {what} 0 times during the run"
        shown = ", ".join(f"{p:.0f}" for p in self.pauses_ms[:10]) + (", ..." if len(self.pauses_ms) > 10 else "")
        return (f"the machine: {what} {len(self.pauses_ms)} time(s) during the run ({shown} ms; "
                f"{sum(self.pauses_ms):.0f} ms in all); on this machine the client and the brokers stall with it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.pause_watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval-ms", type=float, default=DEFAULT_INTERVAL_MS)
    parser.add_argument("--threshold-ms", type=float, default=DEFAULT_THRESHOLD_MS)
    args = parser.parse_args(argv)
    if args.interval_ms <= 0 or args.threshold_ms <= 0:
        parser.error("--interval-ms and --threshold-ms must be positive")
    try:
        watch(args.interval_ms / 1000, args.threshold_ms / 1000)
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
