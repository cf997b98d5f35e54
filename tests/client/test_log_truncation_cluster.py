"""KIP-320 on a real cluster: a consumer notices that the log it read was replaced by an unclean leader
election, and a consumer with stale metadata is fenced by the leader it fetches from.

Three brokers and one controller apart (split mode): stopping brokers never takes the metadata quorum
with them, so the elections happen as soon as the controller notices. Faults are real SIGSTOP/SIGCONT,
SIGKILL and restarts of brook-server processes; the divergence is made, not simulated: records only the
old leader had (acks=1 while its follower was frozen out of the ISR) are read, the old leader dies, the
stale follower comes back and is elected by unclean election, and other records are written at the
same offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from waiting import wait_for

from client import errors
from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.types import ConsumerRecord, TopicPartition
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

FAST = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "300",
    "replica.lag.time.max.ms": "2500",
    "replica.fetch.wait.max.ms": "300",
}
A, B, C = 1, 2, 3  # broker ids


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kip320"), nodes=3, mode="split", controllers=1, overrides=FAST) as c:
        yield c


@pytest.fixture
def healed(cluster: LocalCluster) -> Iterator[LocalCluster]:
    yield cluster
    for node_id in cluster.node_ids:
        if cluster.is_paused(node_id):
            cluster.resume_node(node_id)
        if not cluster.is_running(node_id):
            cluster.start_node(node_id)
    cluster.wait_ready(90)


def partition(admin: Admin, topic: str) -> Any:
    return admin.describe_topics([topic])[topic].partitions[0]


def read(consumer: Consumer, tp: TopicPartition, upto: int, timeout_s: float = 30) -> list[ConsumerRecord]:
    """Poll until the position reaches ``upto``; the records returned on the way."""
    got: list[ConsumerRecord] = []

    def done() -> bool:
        got.extend(consumer.poll(timeout_ms=200).get(tp, []))
        return consumer.position(tp) >= upto
    wait_for(done, timeout_s, lambda: f"{tp} read up to {upto} (read {[r.offset for r in got]})", poll_s=0)
    return got


def read_after_failover(consumer: Consumer, tp: TopicPartition, n: int, timeout_s: float = 60
                        ) -> tuple[list[ConsumerRecord], BaseException | None]:
    """Poll until ``n`` records came, an error was raised, or the deadline: (records, error)."""
    got: list[ConsumerRecord] = []
    raised: list[BaseException] = []

    def done() -> bool:
        try:
            got.extend(consumer.poll(timeout_ms=200).get(tp, []))
        except errors.BrookError as exc:
            raised.append(exc)
            return True
        return len(got) >= n
    try:
        wait_for(done, timeout_s, "records or an error", poll_s=0)
    except AssertionError:
        pass  # the caller says what is missing
    return got, raised[0] if raised else None


def truncation_warnings(caplog: pytest.LogCaptureFixture, topic: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "client.consumer" and r.levelno == logging.WARNING
            and f"{topic}-0: log truncation detected" in r.getMessage()]


def test_consumers_detect_the_log_replaced_by_an_unclean_election(healed: LocalCluster,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    cluster = healed
    topic, group = "diverging", "diverging-readers"
    tp = TopicPartition(topic, 0)
    bs = cluster.bootstrap_servers
    shared = [b"shared-%d" % i for i in range(10)]  # on both replicas
    old = [b"old-%d" % i for i in range(10)]  # offsets 10..19, on A only: read, then lost
    new = [b"new-%d" % i for i in range(15)]  # offsets 10..24, written by B after its unclean election
    with Admin(bs) as admin:
        admin.create_topics([NewTopic(topic, replica_assignments=[[A, B]], configs={
            "unclean.leader.election.enable": "true", "min.insync.replicas": "1"})])
        first = partition(admin, topic)
        assert first.leader == A, first
        with Producer(bootstrap_servers=bs, acks="all") as producer:
            assert [producer.send(topic, v).get(timeout=30).offset for v in shared] == list(range(10))
        common = {"bootstrap_servers": bs, "fetch_max_wait_ms": 100, "request_timeout_ms": 10000}
        # earliest (a group member: its position comes from ListOffsets, its commit is resumed below),
        # none and latest (explicit seeks to 0).
        x = Consumer(group_id=group, auto_offset_reset="earliest", enable_auto_commit=False, **common)
        y = Consumer(auto_offset_reset="none", **common)
        z = Consumer(auto_offset_reset="latest", **common)
        consumers = {"earliest": x, "none": y, "latest": z}
        try:
            for c in consumers.values():
                c.assign([tp])
            y.seek(tp, 0)
            z.seek(tp, 0)
            for c in consumers.values():
                assert [r.value for r in read(c, tp, 10)] == shared

            # B freezes (its fetch in flight answered empty well before the ISR drops it); A alone in the
            # ISR takes acks=1 writes B never gets, and the consumers read them.
            cluster.pause_node(B)
            wait_for(lambda: list(partition(admin, topic).isr) == [A], 30, "the ISR to shrink to the leader")
            with Producer(bootstrap_servers=bs, acks=1) as producer:
                assert [producer.send(topic, v).get(timeout=30).offset for v in old] == list(range(10, 20))
            for c in consumers.values():
                assert [r.value for r in read(c, tp, 20)] == old
            x.commit()
            committed = x.committed(tp)
            commit_epoch = getattr(committed, "leader_epoch", None)

            # A dies with them; B comes back with the shared records only and is elected uncleanly.
            cluster.kill_node(A)
            cluster.resume_node(B)

            def b_leads() -> Any:
                p = partition(admin, topic)
                return p.leader == B and p.leader_epoch > first.leader_epoch and p
            after = wait_for(b_leads, 60, "the out-of-sync replica elected (unclean)")
            with Producer(bootstrap_servers=bs, acks="all", request_timeout_ms=10000) as producer:
                offsets = [producer.send(topic, v).get(timeout=60).offset for v in new]
            assert offsets == list(range(10, 25)), f"the logs did not diverge as planned: {offsets}"

            problems: list[str] = []
            if commit_epoch != first.leader_epoch:
                problems.append(f"the commit carried leader epoch {commit_epoch}, not the position's "
                                f"{first.leader_epoch}")
            # earliest / latest: a WARNING, then on from the divergent offset 10 (Kafka's reset on
            # truncation, whatever the policy): offsets 10..19 come again, now with B's records.
            for name in ("earliest", "latest"):
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="client.consumer"):
                    got, exc = read_after_failover(consumers[name], tp, len(new))
                seen = [(r.offset, r.value) for r in got]
                if exc is not None or seen != list(zip(range(10, 25), new, strict=True)):
                    problems.append(f"auto.offset.reset={name}: expected offsets 10..24 = new-0..14 after the "
                                    f"truncation, got {seen} (error {exc!r})")
                warned = truncation_warnings(caplog, topic)
                if not warned or not any("Resuming from the divergent offset 10" in w for w in warned):
                    problems.append(f"auto.offset.reset={name}: no WARNING naming {topic}-0 and the divergent "
                                    f"offset 10 (warnings: {[r.getMessage() for r in caplog.records]})")
            # none: LogTruncationError naming the partition and the divergent offset, until a seek.
            got, exc = read_after_failover(y, tp, len(new))
            if not isinstance(exc, errors.OffsetOutOfRangeError) or type(exc).__name__ != "LogTruncationError":
                problems.append(f"auto.offset.reset=none: expected LogTruncationError, got {exc!r} and records "
                                f"{[(r.offset, r.value) for r in got]}")
            else:
                divergent = exc.divergent_offsets  # type: ignore[attr-defined]
                if (exc.positions != {tp: 20} or list(divergent) != [tp]  # type: ignore[attr-defined]
                        or divergent[tp].offset != 10 or f"{topic}-0" not in str(exc)
                        or "divergent offset 10" not in str(exc) or got):
                    problems.append(f"auto.offset.reset=none: wrong error {exc!r} {exc.__dict__}, records {got}")
                y.seek(tp, divergent[tp])  # with its epoch: checked, and valid
                seen = [(r.offset, r.value) for r in read(y, tp, 25)]
                if seen != list(zip(range(10, 25), new, strict=True)):
                    problems.append(f"auto.offset.reset=none, after seek to the divergent offset: got {seen}")
            # A new member of the group resumes from the commit (20, epoch of the old log): checked first.
            caplog.clear()
            with (caplog.at_level(logging.WARNING, logger="client.consumer"),
                  Consumer(group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                           **common) as g):
                g.assign([tp])
                got, exc = read_after_failover(g, tp, len(new))
            seen = [(r.offset, r.value) for r in got]
            if exc is not None or seen != list(zip(range(10, 25), new, strict=True)):
                problems.append(f"resuming from the committed offset: expected offsets 10..24 = new-0..14, got {seen} "
                                f"(error {exc!r})")
            if not truncation_warnings(caplog, topic):
                problems.append("resuming from the committed offset: no truncation WARNING")
            assert not problems, "\n".join(problems)
            assert after.leader == B
        finally:
            for c in consumers.values():
                c.close()


def test_stale_metadata_fetch_is_fenced_and_recovers(healed: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    """Leadership moves A -> B (or C) -> A while a consumer is paused: its metadata still says A at the first
    epoch, so its next fetch names that epoch and A, leading at a newer one, answers FENCED_LEADER_EPOCH
    instead of serving it. The consumer refreshes, checks its position against A's new epoch and goes on
    from where it was: every record once, in order."""
    cluster = healed
    topic = "fenced-reader"
    tp = TopicPartition(topic, 0)
    bs = cluster.bootstrap_servers
    values = [b"v-%d" % i for i in range(30)]
    cluster.wait_ready(90)
    with Admin(bs) as admin, Producer(bootstrap_servers=bs, acks="all", request_timeout_ms=10000) as producer:
        admin.create_topics([NewTopic(topic, replica_assignments=[[A, B, C]])])
        first = partition(admin, topic)
        assert first.leader == A
        for v in values[:10]:
            producer.send(topic, v).get(timeout=30)
        consumer = Consumer(bootstrap_servers=bs, auto_offset_reset="earliest", fetch_max_wait_ms=100)
        with consumer:
            consumer.assign([tp])
            got = read(consumer, tp, 10)
            consumer.pause(tp)
            # Its last fetch answered: nothing is in flight, nothing refreshes its metadata until resumed.
            wait_for(lambda: not consumer.poll(timeout_ms=100) and not consumer._fetcher.in_flight, 10,
                     "the paused consumer's fetches to end")

            cluster.stop_node(A)  # controlled: its leaderships move first

            def led_by(nodes: tuple[int, ...], above: int) -> Any:
                p = partition(admin, topic)
                return p.leader in nodes and p.leader_epoch > above and p
            middle = wait_for(lambda: led_by((B, C), first.leader_epoch), 60, "another broker to lead")
            for v in values[10:20]:
                producer.send(topic, v).get(timeout=60)
            cluster.start_node(A)
            wait_for(lambda: A in partition(admin, topic).isr, 60, "A back in the ISR")

            def a_leads_again() -> Any:
                admin.elect_leaders("preferred", [(topic, 0)])
                return led_by((A,), middle.leader_epoch)
            wait_for(a_leads_again, 60, "A to lead again (preferred election)", poll_s=0.5)
            for v in values[20:]:
                producer.send(topic, v).get(timeout=60)

            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="client.consumer"):
                consumer.resume(tp)
                got += read(consumer, tp, 30, timeout_s=60)
            fenced = [r.getMessage() for r in caplog.records
                      if r.name == "client.consumer" and "FENCED_LEADER_EPOCH" in r.getMessage()]
        assert [r.value for r in got] == values, "records lost or read twice across the leader moves"
        assert [r.offset for r in got] == list(range(30))
        assert fenced, "the fetch with the stale leader epoch was not fenced"
        assert f"at leader epoch {first.leader_epoch} from broker {A}" in fenced[0], fenced
