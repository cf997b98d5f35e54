"""Replication under real faults: 3 brokers + 3 controllers as real brook-server processes.

Split mode (controllers apart from brokers) so that killing or pausing brokers never
takes the metadata quorum's majority with it. Faults are real: SIGKILL, SIGSTOP/SIGCONT.
Each test leaves the cluster healed (every node running and unfenced) for the next.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from brokerkit import (
    FAST_FAILURE_DETECTION,
    FETCH_DRAIN_S,
    Kit,
    make_batch,
    replica_log_bytes,
    running_kit,
    wait_until,
)

from deploy.local.cluster import ClusterError
from proto.errors import ErrorCode
from storage.record_batch import decode_records

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    base: Path = tmp_path_factory.mktemp("repl-cluster")
    with running_kit(base, nodes=3, mode="split", overrides=FAST_FAILURE_DETECTION) as k:
        yield k


@pytest.fixture
def healed(kit: Kit) -> Iterator[Kit]:
    kit.heal()
    yield kit
    kit.heal()


class AckedProducer:
    """Produces one-record batches with acks=all in a loop, following the leader; remembers every ack."""

    def __init__(self, kit: Kit, topic: str) -> None:
        self.kit, self.topic = kit, topic
        self.acked: dict[int, bytes] = {}
        self.ack_times: list[tuple[float, int]] = []  # (monotonic time, leader that acked)
        self.errors: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> AckedProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        i, leader = 0, -1
        while not self._stop.is_set():
            value = f"rec-{i}".encode()
            i += 1
            try:
                if leader < 0:
                    leader = self.kit.leader(self.topic)
                    if leader < 0:
                        time.sleep(0.05)
                        continue
                r = self.kit.produce(self.topic, 0, make_batch(value), acks=-1, timeout_ms=3000, node_id=leader)
            except grpc.RpcError as e:
                self.errors[str(e.code())] = self.errors.get(str(e.code()), 0) + 1
                leader = -1
                time.sleep(0.05)
                continue
            except Exception as e:  # controller unavailable for a moment: count and retry
                self.errors[type(e).__name__] = self.errors.get(type(e).__name__, 0) + 1
                leader = -1
                time.sleep(0.05)
                continue
            if r.error_code == ErrorCode.NONE:
                assert r.base_offset not in self.acked, f"offset {r.base_offset} acknowledged twice"
                self.acked[r.base_offset] = value
                self.ack_times.append((time.monotonic(), leader))
            else:
                name = ErrorCode.Name(r.error_code)
                self.errors[name] = self.errors.get(name, 0) + 1
                leader = r.current_leader.leader_id if r.current_leader.leader_id > 0 else -1
                time.sleep(0.02)

    def wait_acks(self, n: int, timeout_s: float) -> None:
        start = len(self.acked)
        wait_until(lambda: len(self.acked) >= start + n, timeout_s, f"{n} more acks (errors {self.errors})")

    def first_ack_after(self, t0: float, not_from: int, timeout_s: float) -> float:
        def found() -> float | None:
            for t, leader in list(self.ack_times):
                if t > t0 and leader != not_from:
                    return t
            return None
        return wait_until(found, timeout_s, f"an ack from a new leader (errors {self.errors})", poll_s=0.01)


def assert_replicas_identical(kit: Kit, topic: str, upto: int) -> bytes:
    prefixes = {n: replica_log_bytes(kit.cluster, n, topic, 0, upto) for n in kit.cluster.broker_ids}
    reference = prefixes[kit.leader(topic)]
    for n, data in prefixes.items():
        assert data == reference, (f"replica {n} differs below offset {upto}: {len(data)} vs {len(reference)} "
                                   f"bytes (leader {kit.leader(topic)})")
    return reference


def test_sigkill_leader_twice_loses_no_acked_write(healed: Kit) -> None:
    kit = healed
    topic = "ha-acks-all"
    kit.create_topic(topic, rf=3, configs={"min.insync.replicas": "2"})
    failovers: list[float] = []
    with AckedProducer(kit, topic) as producer:
        for _ in range(2):
            producer.wait_acks(20, 30)
            victim = kit.leader(topic)
            t0 = time.monotonic()
            kit.cluster.kill_node(victim, signal.SIGKILL)
            t_ack = producer.first_ack_after(t0, victim, 60)
            failovers.append(t_ack - t0)
            producer.wait_acks(10, 30)
            kit.cluster.start_node(victim)
            wait_until(lambda: kit.isr_size(topic) == 3, 60, "the restarted replica back in the ISR")
        producer.wait_acks(10, 30)
    print(f"\nFAILOVER (SIGKILL of leader -> first acks=all ack on new leader): "
          f"{', '.join(f'{f:.2f}s' for f in failovers)}; {len(producer.acked)} acked, errors {producer.errors}")
    # every replica back in sync; then every acked record is committed where it was acked
    sentinel = kit.produce(topic, 0, make_batch(b"sentinel"), acks=-1)
    assert sentinel.error_code == ErrorCode.NONE, sentinel
    values, raw, hw = kit.consume_all(topic)
    assert hw == sentinel.base_offset + 1
    missing = {o: v for o, v in producer.acked.items() if values.get(o) != v}
    assert not missing, f"{len(missing)} acked records not at their acked offsets, e.g. {list(missing.items())[:5]}"
    wait_until(lambda: all(replica_log_bytes(kit.cluster, n, topic, 0, hw) == raw for n in kit.cluster.broker_ids),
               30, "every replica's committed prefix byte-identical to the leader's")


def test_paused_follower_leaves_isr_and_returns(healed: Kit) -> None:
    kit = healed
    topic = "pause-follower"
    kit.create_topic(topic, rf=3)
    st = kit.state(topic)
    follower = next(r for r in st.replicas if r != st.leader)
    kit.cluster.pause_node(follower)
    t0 = time.monotonic()
    try:
        for i in range(5):
            r = kit.produce(topic, 0, make_batch(f"while-paused-{i}".encode()), acks=1)
            assert r.error_code == ErrorCode.NONE, r
        wait_until(lambda: follower not in kit.state(topic).isr, 20, f"paused follower {follower} out of the ISR")
        left_after = time.monotonic() - t0
        assert left_after >= 1.5, f"left the ISR after {left_after:.2f}s, before replica.lag.time.max.ms"
        r = kit.produce(topic, 0, make_batch(b"after-shrink"), acks=-1)
        assert r.error_code == ErrorCode.NONE, f"acks=all must work with the 2 remaining in-sync replicas: {r}"
    finally:
        kit.cluster.resume_node(follower)
    wait_until(lambda: follower in kit.state(topic).isr, 30, f"resumed follower {follower} back in the ISR")
    values, raw, hw = kit.consume_all(topic)
    assert len(values) == 6
    wait_until(lambda: replica_log_bytes(kit.cluster, follower, topic, 0, hw) == raw, 20, "follower caught up")


def test_idle_partitions_stay_in_sync_while_another_takes_writes(healed: Kit) -> None:
    """Fetch sessions: while one partition takes acks=all writes, a follower's requests name only that
    one and the leader reads only it. The idle partitions must still stay in the ISR for several
    replica.lag.time.max.ms (the session's periodic full read records their followers as caught up),
    take an acks=all write at once afterwards, and every replica of the busy one ends identical."""
    kit = healed
    topic = "sessions-idle"
    partitions = 4
    kit.create_topic(topic, partitions=partitions, rf=3)
    lag_max_s = int(FAST_FAILURE_DETECTION["replica.lag.time.max.ms"]) / 1000
    end = time.monotonic() + 3 * lag_max_s
    writes = 0
    shrunk: dict[int, list[int]] = {}  # partition -> the smaller ISR seen
    while time.monotonic() < end:
        r = kit.produce(topic, 0, make_batch(f"busy-{writes}".encode()), acks=-1)
        assert r.error_code == ErrorCode.NONE, r
        writes += 1
        if writes % 20 == 0:
            shrunk.update((p, list(st.isr)) for p in range(1, partitions) if len((st := kit.state(topic, p)).isr) < 3)
    assert not shrunk, f"idle partitions left the ISR while partition 0 took {writes} writes: {shrunk}"
    for p in range(1, partitions):
        r = kit.produce(topic, p, make_batch(b"idle-no-more"), acks=-1, timeout_ms=2000)
        assert r.error_code == ErrorCode.NONE, f"partition {p}: {r}"
    values, raw, hw = kit.consume_all(topic)
    assert len(values) == writes
    wait_until(lambda: all(replica_log_bytes(kit.cluster, n, topic, 0, hw) == raw for n in kit.cluster.broker_ids),
               30, "every replica of the busy partition byte-identical to the leader's")


def test_acks_all_refused_below_min_isr_while_acks_1_works(healed: Kit) -> None:
    kit = healed
    topic = "min-isr"
    kit.create_topic(topic, rf=3, configs={"min.insync.replicas": "2"})
    st = kit.state(topic)
    followers = [r for r in st.replicas if r != st.leader]
    for f in followers:
        kit.cluster.kill_node(f, signal.SIGKILL)
    wait_until(lambda: kit.isr_seen_by(st.leader, topic) == [st.leader], 30,
               "the leader applying an ISR of itself alone")
    r = kit.produce(topic, 0, make_batch(b"all"), acks=-1, node_id=st.leader)
    assert r.error_code == ErrorCode.NOT_ENOUGH_REPLICAS, r
    before = kit.fetch(st.leader, topic, 0, 0)
    r1 = kit.produce(topic, 0, make_batch(b"one"), acks=1, node_id=st.leader)
    assert r1.error_code == ErrorCode.NONE, r1
    assert r1.base_offset == before.log_end_offset, "the refused acks=all batch must not have been appended"


def test_unclean_election_off_stays_offline_on_brings_back(healed: Kit) -> None:
    kit = healed
    topic = "unclean"
    kit.create_topic(topic, rf=3, configs={"min.insync.replicas": "1"})
    st = kit.state(topic)
    leader = st.leader
    others = [r for r in st.replicas if r != leader]
    for f in others:
        kit.cluster.kill_node(f, signal.SIGKILL)
    wait_until(lambda: list(kit.state(topic).isr) == [leader], 30, "ISR = leader alone")
    assert kit.produce(topic, 0, make_batch(b"only-on-leader"), acks=1, node_id=leader).error_code == ErrorCode.NONE
    kit.cluster.kill_node(leader, signal.SIGKILL)
    for f in others:
        kit.cluster.start_node(f)
    def others_up_leader_fenced() -> bool:
        try:
            brokers = {b.node_id: b for b in kit.cluster.describe_cluster().brokers}
        except ClusterError:
            return False  # a moment without an active controller (every one answered NOT_CONTROLLER): again
        return (all(f in brokers and not brokers[f].fenced for f in others)
                and (leader not in brokers or brokers[leader].fenced) and kit.state(topic).leader < 0)
    wait_until(others_up_leader_fenced, 60, "old leader fenced, out-of-sync replicas registered and unfenced")
    # With unclean election off nothing may elect them: watch that it stays offline for a while.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        s = kit.state(topic)
        assert s.leader < 0, f"partition came back on an out-of-sync replica with unclean election off: {s}"
        time.sleep(0.2)
    kit.alter_topic_config(topic, {"unclean.leader.election.enable": "true"})
    wait_until(lambda: kit.state(topic).leader in others and kit.broker_knows_leader(topic), 30,
               "unclean leader elected")
    r = kit.produce(topic, 0, make_batch(b"after-unclean"), acks=1)
    assert r.error_code == ErrorCode.NONE, r


def test_consumer_never_sees_offsets_later_truncated(healed: Kit) -> None:
    kit = healed
    topic = "no-phantom-reads"
    kit.create_topic(topic, rf=3)
    seen: dict[int, bytes | None] = {}
    violations: list[str] = []
    stop = threading.Event()

    def consume() -> None:
        offset = 0
        while not stop.is_set():
            try:
                leader = kit.leader(topic)
                r = kit.fetch(leader, topic, 0, offset, max_wait_ms=200, min_bytes=1) if leader >= 0 else None
            except Exception:
                time.sleep(0.05)
                continue
            if r is None or r.error_code != ErrorCode.NONE:
                time.sleep(0.05)
                continue
            for rec in decode_records(r.records):
                if rec.offset >= r.high_watermark:
                    violations.append(f"served offset {rec.offset} at/after HW {r.high_watermark}")
                seen[rec.offset] = rec.value
                offset = rec.offset + 1

    def produce(prefix: str, n: int) -> None:
        for i in range(n):
            try:
                kit.produce(topic, 0, make_batch(f"{prefix}-{i}".encode()), acks=1, timeout_ms=1000)
            except grpc.RpcError:
                time.sleep(0.05)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    try:
        produce("before", 30)
        st = kit.state(topic)
        followers = [r for r in st.replicas if r != st.leader]
        # Followers freeze; the leader takes acks=1 writes only it has, then dies.
        for f in followers:
            kit.cluster.pause_node(f)
        time.sleep(FETCH_DRAIN_S)  # their pending fetches answered: the next appends cannot reach them
        for i in range(10):
            kit.produce(topic, 0, make_batch(f"doomed-{i}".encode()), acks=1, node_id=st.leader)
        kit.cluster.kill_node(st.leader, signal.SIGKILL)
        for f in followers:
            kit.cluster.resume_node(f)
        wait_until(lambda: kit.state(topic).leader in followers and kit.broker_knows_leader(topic), 30,
                   "a new leader among the former followers")
        produce("after", 20)
        kit.cluster.start_node(st.leader)
        wait_until(lambda: kit.isr_size(topic) == 3, 60, "old leader back in the ISR")
        final, _raw, hw = kit.consume_all(topic)
        wait_until(lambda: len(seen) >= len(final), 20, "consumer caught up")
    finally:
        stop.set()
        t.join(10)
    assert not violations, violations[:5]
    wrong = {o: v for o, v in seen.items() if final.get(o) != v}
    assert not wrong, f"consumer saw records that are not in the final log: {list(wrong.items())[:5]}"
    assert not any(v.startswith(b"doomed") for v in final.values() if v), "unreplicated acks=1 tail survived"


def test_former_leader_truncates_unreplicated_tail_on_rejoin(healed: Kit) -> None:
    kit = healed
    topic = "divergent-tail"
    kit.create_topic(topic, rf=3)
    for i in range(10):
        assert kit.produce(topic, 0, make_batch(f"shared-{i}".encode()), acks=-1).error_code == ErrorCode.NONE
    st = kit.state(topic)
    old_leader = st.leader
    followers = [r for r in st.replicas if r != old_leader]
    for f in followers:
        kit.cluster.pause_node(f)
    time.sleep(FETCH_DRAIN_S)  # their pending fetches answered: the tail cannot reach them
    tail = kit.produce(topic, 0, make_batch(b"tail-1", b"tail-2", b"tail-3"), acks=1, node_id=old_leader)
    assert tail.error_code == ErrorCode.NONE, tail
    kit.cluster.kill_node(old_leader, signal.SIGKILL)
    for f in followers:
        kit.cluster.resume_node(f)
    wait_until(lambda: kit.state(topic).leader in followers and kit.broker_knows_leader(topic), 30,
               "new leader elected from the ISR")
    for i in range(5):
        assert kit.produce(topic, 0, make_batch(f"new-{i}".encode()), acks=-1).error_code == ErrorCode.NONE
    kit.cluster.start_node(old_leader)
    wait_until(lambda: kit.isr_size(topic) == 3, 60, "former leader back in the ISR")
    values, raw, hw = kit.consume_all(topic)
    assert values.get(tail.base_offset) == b"new-0", f"offset {tail.base_offset} holds {values.get(tail.base_offset)!r}"
    wait_until(lambda: replica_log_bytes(kit.cluster, old_leader, topic, 0, hw) == raw, 20,
               "former leader's log identical to the new leader's")
    old_log = replica_log_bytes(kit.cluster, old_leader, topic, 0, 1 << 62)
    assert b"tail-1" not in old_log, "the unreplicated tail is still on the former leader"


def test_controlled_shutdown_moves_leadership_before_stopping(healed: Kit) -> None:
    kit = healed
    topic = "controlled"
    kit.create_topic(topic, rf=3, configs={"min.insync.replicas": "2"})
    with AckedProducer(kit, topic) as producer:
        producer.wait_acks(20, 30)
        leader = kit.leader(topic)
        kit.cluster.stop_node(leader, timeout_s=30)
        assert kit.cluster.returncode(leader) == 0, kit.cluster.log_tail(leader)
        st = kit.state(topic)
        assert st.leader not in (leader, -1) and leader not in st.isr, st
        producer.wait_acks(20, 30)
        kit.cluster.start_node(leader)
        wait_until(lambda: kit.isr_size(topic) == 3, 60, "restarted broker back in the ISR")
        producer.wait_acks(10, 30)
    values, _raw, _hw = kit.consume_all(topic)
    lost = {o: v for o, v in producer.acked.items() if values.get(o) != v}
    assert not lost, f"acked records lost across a controlled restart: {list(lost.items())[:5]}"
    log_text = kit.cluster.node_log(leader).read_text(errors="replace")
    assert "controlled shutdown complete" in log_text


@pytest.mark.soak
def test_soak_repeated_random_leader_and_follower_kills(healed: Kit) -> None:
    """Ten rounds of SIGKILL on a random broker (leader or follower) while producing acks=all."""
    import random
    kit = healed
    topic = "soak"
    kit.create_topic(topic, rf=3, configs={"min.insync.replicas": "2"})
    rng = random.Random(7)
    with AckedProducer(kit, topic) as producer:
        for _ in range(10):
            producer.wait_acks(50, 60)
            victim = rng.choice(kit.cluster.broker_ids)
            kit.cluster.kill_node(victim, signal.SIGKILL)
            producer.wait_acks(20, 60)
            kit.cluster.start_node(victim)
            wait_until(lambda: kit.isr_size(topic) == 3, 90, "restarted replica back in the ISR")
    sentinel = kit.produce(topic, 0, make_batch(b"sentinel"), acks=-1)
    assert sentinel.error_code == ErrorCode.NONE, sentinel
    values, raw, hw = kit.consume_all(topic)
    lost = {o: v for o, v in producer.acked.items() if values.get(o) != v}
    assert not lost, f"{len(lost)} acked records lost, e.g. {list(lost.items())[:5]}"
    wait_until(lambda: all(replica_log_bytes(kit.cluster, n, topic, 0, hw) == raw for n in kit.cluster.broker_ids),
               30, "replicas byte-identical")
