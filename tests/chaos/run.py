"""``python -m tests.chaos.run --duration 60 --seed 7``: one chaos run, one summary line, exit 1 on a violation.

Starts a 3-node combined cluster (each node in its own network namespace when the machine
allows, else on loopback), creates a topic (RF 3, min.insync.replicas=2), runs idempotent
acks=all writers, a consumer and the seeded nemesis for ``--duration`` seconds, heals,
then checks the recorded history (see tests/chaos/checker.py). Everything the run made
(namespaces, processes) is removed at the end, also on failure or Ctrl-C; the run
directory (history.jsonl, node logs, verdict.json) is kept when the verdict is FAIL.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from types import FrameType

from client import errors
from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.types import TopicPartition
from storage.record_batch import iter_batches
from tests.chaos.checker import Verdict, check
from tests.chaos.nemesis import NETWORK_KINDS, PROCESS_KINDS, SPLIT_ONLY_KINDS, Nemesis, schedule
from tests.chaos.netns import make_network
from tests.chaos.nodes import ChaosCluster
from tests.chaos.workload import History, Probe, Reader, Writer, load_history

log = logging.getLogger("tests.chaos.run")

TOPIC = "chaos"
EXIT_VIOLATION = 1
EXIT_HARNESS = 2
STARTUP_TIMEOUT_S = 120.0
FINAL_READ_TIMEOUT_S = 120.0
WRITER_JOIN_S = 90.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=(
        "One chaos run: a 3-node cluster under idempotent acks=all writers and a seeded nemesis, then a "
        "history check. Prints one summary line; exit 0 PASS, 1 violation, 2 harness error."))
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of faults (default 60)")
    ap.add_argument("--seed", type=int, default=1, help="seeds the fault schedule (default 1)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of the topic (default 4)")
    ap.add_argument("--writers", type=int, default=2, help="idempotent producers (default 2)")
    ap.add_argument("--rate", type=float, default=50.0, help="records/s per writer (default 50)")
    ap.add_argument("--delivery-timeout-ms", type=int, default=30000,
                    help="writers' delivery.timeout.ms; lower it to make sends time out during faults (default 30000)")
    ap.add_argument("--recovery-bound", type=float, default=30.0,
                    help="seconds within which every partition must take acks=all writes after a heal (default 30)")
    ap.add_argument("--health-bound", type=float, default=60.0,
                    help="seconds within which every replica must be back in sync at the end (default 60)")
    ap.add_argument("--faults", default=None,
                    help="fault kinds to draw from (default kill,pause,isolate,cut; with --controllers also strand: "
                         "the active or another controller-only voter cut off from every broker)")
    ap.add_argument("--hold", default="1,8", help="min,max seconds a fault lasts (default 1,8)")
    ap.add_argument("--gap", default="1,5", help="min,max quiet seconds between faults (default 1,5)")
    ap.add_argument("--overlap", type=float, default=0.0,
                    help="chance (0-1) that a fault is injected together with the next one, up to 3 at once "
                         "(default 0: one fault at a time)")
    ap.add_argument("--controllers", type=int, default=0,
                    help="split mode: this many controller-only voters beside the 3 broker-only nodes "
                         "(default 0: 3 combined nodes)")
    ap.add_argument("--loopback", action="store_true", help="no network namespaces: process faults only")
    ap.add_argument("--dir", type=Path, default=None, help="run directory (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory even when the run passes")
    args = ap.parse_args(argv)
    if args.partitions < 1 or args.writers < 1 or args.rate <= 0 or args.duration < 0:
        ap.error("--partitions, --writers and --rate must be positive, --duration not negative")
    if not 0 <= args.overlap <= 1:
        ap.error("--overlap is a probability, 0 to 1")
    if args.controllers < 0:
        ap.error("--controllers must not be negative")
    if args.faults is None:
        args.faults = "kill,pause,isolate,cut" + (",strand" if args.controllers else "")
    args.faults = tuple(k for k in args.faults.split(",") if k)
    unknown = set(args.faults) - set(PROCESS_KINDS) - set(NETWORK_KINDS)
    if unknown or not args.faults:
        ap.error(f"--faults: unknown kinds {sorted(unknown)}; choose from {PROCESS_KINDS + NETWORK_KINDS}")
    if not args.controllers and set(args.faults) & set(SPLIT_ONLY_KINDS):
        ap.error(f"--faults: {', '.join(sorted(set(args.faults) & set(SPLIT_ONLY_KINDS)))} needs controller-only "
                 "voters (--controllers N)")
    for name in ("hold", "gap"):
        try:
            lo, hi = (float(x) for x in getattr(args, name).split(","))
        except ValueError:
            ap.error(f"--{name} must be min,max seconds, got {getattr(args, name)!r}")
        if not 0 <= lo <= hi:
            ap.error(f"--{name} must be 0 <= min <= max, got {getattr(args, name)!r}")
        setattr(args, name, (lo, hi))
    return args


def _create_topic(bootstrap: str, partitions: int, security: Mapping[str, str]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            with Admin(bootstrap, request_timeout_ms=10000, **security) as admin:
                admin.create_topics([NewTopic(TOPIC, partitions, 3, {"min.insync.replicas": "2"})])
                return
        except errors.TopicAlreadyExistsError:
            return
        except errors.BrookError as exc:
            if time.monotonic() > deadline:
                raise
            log.info("create topic: %r, retrying", exc)
            time.sleep(1.0)


def unhealthy_reason(bootstrap: str, nodes: list[int], partitions: int, security: Mapping[str, str]) -> str | None:
    """None when every broker is registered and unfenced and every partition has a leader and a full ISR."""
    try:
        with Admin(bootstrap, request_timeout_ms=3000, **security) as admin:
            desc = admin.describe_cluster()
            parts = admin.describe_topics([TOPIC])[TOPIC].partitions
    except errors.BrookError as exc:
        return f"describe failed: {exc!r}"
    if desc.controller_id < 0:
        return "no active controller"
    registered = {b.node_id for b in desc.brokers}
    if set(nodes) - registered or desc.fenced_brokers:
        return f"brokers registered {sorted(registered)}, fenced {desc.fenced_brokers}"
    for p in range(partitions):
        info = parts.get(p)
        if info is None or info.leader < 0 or len(info.isr) < len(nodes):
            return f"partition {p}: {info}"
    return None


def _wait(cond_reason: Callable[[], str | None], timeout_s: float) -> str | None:
    """Poll a reason-returning callable until it returns None; the last reason at the deadline."""
    deadline = time.monotonic() + timeout_s
    reason: str | None = "not checked"
    while time.monotonic() < deadline:
        reason = cond_reason()
        if reason is None:
            return None
        time.sleep(0.5)
    return reason


def read_final_log(bootstrap: str, partitions: int, security: Mapping[str, str],
                   ) -> tuple[dict[int, list[tuple[int, str]]], dict[int, int]]:
    """Every committed record of every partition, with a fresh consumer; and the high watermarks."""
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    out: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", request_timeout_ms=10000,
                  **security) as consumer:
        hws = {tp.partition: o for tp, o in consumer.end_offsets(tps).items()}
        consumer.assign(tps)
        deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
        while any(consumer.position(tp) < hws[tp.partition] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"final read incomplete: positions "
                                   f"{ {tp.partition: consumer.position(tp) for tp in tps} }, high watermarks {hws}")
            for tp, records in consumer.poll(timeout_ms=1000).items():
                out[tp.partition].extend((r.offset, (r.value or b"").decode(errors="replace"))
                                         for r in records if r.offset < hws[tp.partition])
    return out, hws


def replica_batches(data_dir: Path, partition: int, hw: int) -> list[bytes]:
    """The bytes of every batch below ``hw`` in one replica's segment files, in offset order."""
    pdir = data_dir / f"{TOPIC}-{partition}"
    out: list[bytes] = []
    for seg in sorted(pdir.glob("*.log")):
        buf = seg.read_bytes()
        for pos, h in iter_batches(buf):
            if h.base_offset >= hw:
                return out
            out.append(buf[pos:pos + h.size])
    return out


def compare_replicas(data_dirs: dict[int, Path], hws: dict[int, int]) -> list[str]:
    """Where replicas differ below the high watermark (each node's data dir, {partition: hw})."""
    divergences = []
    for p, hw in sorted(hws.items()):
        copies = {n: replica_batches(d, p, hw) for n, d in sorted(data_dirs.items())}
        reference_node = min(copies)
        reference = copies[reference_node]
        for n, batches in copies.items():
            if batches != reference:
                first = next((i for i, (a, b) in enumerate(zip(reference, batches, strict=False)) if a != b),
                             min(len(reference), len(batches)))
                divergences.append(f"partition {p} below hw {hw}: node {n} differs from node {reference_node} "
                                   f"at batch {first} ({len(batches)} vs {len(reference)} batches)")
    return divergences


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Expired sends are expected under faults (they are in the history); the client would log each one.
    for noisy in ("client", "grpc"):
        logging.getLogger(noisy).setLevel(logging.ERROR)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    run_dir = args.dir or Path(tempfile.mkdtemp(prefix=f"brook-chaos-{args.seed}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    node_ids = [1, 2, 3]  # the brokers (combined nodes unless --controllers)
    every_node = [*node_ids, *range(len(node_ids) + 1, len(node_ids) + 1 + args.controllers)]
    network, fallback_reason = make_network(every_node, want_netns=not args.loopback)
    kinds: tuple[str, ...] = args.faults
    if not network.supports_partitions:
        kinds = tuple(k for k in kinds if k in PROCESS_KINDS)
    network_label = network.mode if not fallback_reason else f"loopback({fallback_reason.replace(' ', '_')})"
    if args.controllers:
        network_label += f",split({args.controllers}_controllers)"
    faults = schedule(args.seed, args.duration, kinds or PROCESS_KINDS, args.hold, args.gap, args.overlap)
    cluster = ChaosCluster(run_dir, network, nodes=len(node_ids), controllers=args.controllers)
    history = History(run_dir / "history.jsonl")
    history.record(e="schedule", seed=args.seed, faults=[asdict(f) for f in faults])
    stop = threading.Event()
    verdict = Verdict(seed=args.seed, duration_s=args.duration, network=network_label, faults={})
    try:
        cluster.start()
        reason = _wait(lambda: None if cluster.all_serving() else "nodes not serving", STARTUP_TIMEOUT_S)
        if reason is not None:
            raise RuntimeError(f"cluster did not start: {reason}\n{cluster.log_tail(1)}")
        sec = cluster.client_config
        _create_topic(cluster.bootstrap_servers, args.partitions, sec)
        reason = _wait(lambda: unhealthy_reason(cluster.bootstrap_servers, node_ids, args.partitions, sec),
                       STARTUP_TIMEOUT_S)
        if reason is not None:
            raise RuntimeError(f"topic not ready: {reason}")
        probe = Probe(cluster.bootstrap_servers, TOPIC, args.partitions, history, security=sec)
        if probe.writable_within(STARTUP_TIMEOUT_S) is None:
            raise RuntimeError("the fresh cluster took no writes")
        workers: list[Writer | Reader] = [
            Writer(f"w{i}", cluster.bootstrap_servers, TOPIC, args.partitions, args.rate, history, stop,
                   args.delivery_timeout_ms, security=sec)
            for i in range(args.writers)]
        workers.append(Reader(cluster.bootstrap_servers, TOPIC, args.partitions, history, stop, security=sec))
        for w in workers:
            w.start()
        nemesis = Nemesis(cluster, network, TOPIC, args.partitions, history, probe, args.recovery_bound, stop.is_set)
        started = time.monotonic()
        nemesis.run(faults, started + args.duration)
        for r in nemesis.results:
            for kind in r.kinds:
                verdict.faults[kind] = verdict.faults.get(kind, 0) + 1
            if len(r.kinds) > 1:
                verdict.faults["overlapping"] = verdict.faults.get("overlapping", 0) + 1
        nemesis.heal()
        healed_at = time.monotonic()
        verdict.final_recovery_s = probe.writable_within(args.recovery_bound)
        history.record(e="final", recovery_s=verdict.final_recovery_s)
        stop.set()
        for w in workers:
            w.join(WRITER_JOIN_S)
            if w.is_alive() or w.crashed is not None:
                raise RuntimeError(f"{w.name} {'did not stop' if w.is_alive() else f'crashed: {w.crashed!r}'}")
        probe.close()
        # The bound runs from the final heal (writers stop within it unless the cluster is stuck).
        reason = _wait(lambda: unhealthy_reason(cluster.bootstrap_servers, node_ids, args.partitions, sec),
                       max(1.0, args.health_bound - (time.monotonic() - healed_at)))
        if reason is not None:
            verdict.note(f"liveness: replicas not in sync {args.health_bound:.0f} s after the final heal: {reason}")
            verdict.healthy_s = None
        else:
            verdict.healthy_s = time.monotonic() - healed_at
        final_log, hws = read_final_log(cluster.bootstrap_servers, args.partitions, sec)
        history.flush()
        cluster.stop()
        divergences = compare_replicas({n: cluster.data_dir(n) for n in cluster.broker_ids}, hws)
        history.close()
        check(verdict, load_history(history.path), final_log, divergences, args.recovery_bound)
    except KeyboardInterrupt:
        print(f"chaos: seed={args.seed} interrupted; run directory {run_dir}", file=sys.stderr)
        return 130
    except Exception as exc:  # the harness itself failed: say so, distinct from a verdict
        log.exception("chaos harness failed")
        print(f"chaos: seed={args.seed} network={network_label} HARNESS ERROR {exc!r}; run directory {run_dir}")
        return EXIT_HARNESS
    finally:
        stop.set()
        cluster.teardown()
        network.close()
    (run_dir / "verdict.json").write_text(json.dumps({**asdict(verdict), "ok": verdict.ok,
                                                      "steps": [asdict(r) for r in nemesis.results]}, indent=1))
    for example in verdict.examples:
        log.warning("%s", example)
    print(verdict.summary(), flush=True)
    if verdict.ok and not args.keep and args.dir is None:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        print(f"chaos: run directory {run_dir}", file=sys.stderr)
    return 0 if verdict.ok else EXIT_VIOLATION


if __name__ == "__main__":
    sys.exit(main())
