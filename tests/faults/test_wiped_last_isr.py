"""The last in-sync replica comes back on a replaced (empty) disk: the partition goes offline, no data is lost.

A real split-mode cluster (one controller, brokers 1-3), one topic with RF 3 and ``min.insync.replicas=2``:

- acks=all records are acknowledged while the ISR is [1, 2, 3], then [1, 2] (broker 3 killed with SIGKILL);
- the leader, broker 1, is killed: broker 2 leads with ISR [2], and acks=all writes fail with
  NOT_ENOUGH_REPLICAS, so every acknowledged record is also on broker 1;
- broker 2 is killed, its data directory deleted (its disk was replaced), and it is started again,
  then brokers 1 and 3.

Broker 2 is still the partition's last ISR member, but its log is empty. It used to be elected
leader anyway. Brokers 1 and 3 then followed it and logged ``truncating N -> 0``, so every
acknowledged record was lost without any error. Kafka has the same hole before KIP-966 (Eligible
Leader Replicas). A replaced disk on the last in-sync replica must not silently become the partition.
The broker now tells the controller at registration that its storage was just created, and the
controller takes it out of the ISR even though it is the last member. The test requires the following:

1. once all three brokers are registered and unfenced, the partition has no leader (-1) and an empty ISR:
   it is offline, not served by an empty replica;
2. brokers 1 and 3 truncated nothing: their log files hold at least what they held when they were killed,
   and their logs show no truncation of the topic;
3. an operator's unclean election (Admin.elect_leaders("unclean")) does not pick broker 2. Before the
   faults the replicas are reordered to [2, 1, 3], so that the wiped broker comes first in assignment order
   and the controller has to prefer the replicas that did not start on empty storage. Then a Brook
   consumer reading from offset 0 gets every acknowledged record once, in order;
4. acks=all writes are taken again within WRITE_BOUND_S of the election, once another replica has caught up.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from pathlib import Path

import pytest
from faultkit import assert_every_acknowledged_record_once_in_order, partition_consumer, read_until
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import ClusterError, LocalCluster
from proto import controller_pb2, errors

pytestmark = pytest.mark.slow

TOPIC = "wiped-last-isr"
BROKERS = (1, 2, 3)
FIRST_LEADER, LAST_ISR, FIRST_DOWN = 1, 2, 3
RECORDS_PER_PHASE = 150
# Once the election is done, another replica (3, a little behind, or 2, from empty) has a few hundred small
# records to copy before the ISR has 2 members again: seconds on a local cluster, 60 s on a loaded machine.
WRITE_BOUND_S = 60.0
# A killed broker is fenced after broker.session.timeout.ms (6 s on a local cluster), and then it leaves the
# ISR and loses leadership.
FENCE_BOUND_S = 30.0
REGISTER_BOUND_S = 60.0

# The follower's truncation lines (replication/fetcher.py); they count only when they drop records.
_DIVERGED = re.compile(r"truncating (\d+) -> (\d+)")
_PAST_END = re.compile(r"our end (\d+) is past leader \d+'s end (\d+); truncating")
_RESTARTED = re.compile(r"our end (\d+) is before leader \d+'s log start \d+; restarting the log there")


def _controller_partition(cluster: LocalCluster) -> controller_pb2.PartitionRecord:
    """Partition 0 of the topic as the active controller has it."""
    found: list[controller_pb2.PartitionRecord] = []

    def described() -> bool:
        try:
            found[:] = [p for p in cluster.describe_cluster(5.0).partitions if p.topic == TOPIC and p.partition == 0]
        except ClusterError:
            return False  # a moment without an active controller: asked again
        return bool(found)
    wait_for(described, 30, f"the active controller to describe {TOPIC}-0", poll_s=0.2)
    return found[0]


def _show(p: controller_pb2.PartitionRecord) -> str:
    return (f"leader {p.leader} (epoch {p.leader_epoch}), ISR {list(p.isr)}, replicas {list(p.replicas)}, "
            f"partition epoch {p.partition_epoch}")


def _brokers(cluster: LocalCluster) -> dict[int, controller_pb2.BrokerRecord]:
    try:
        return {b.node_id: b for b in cluster.describe_cluster(5.0).brokers}
    except ClusterError:
        return {}


def _wait_partition(cluster: LocalCluster, cond, what: str, timeout_s: float = FENCE_BOUND_S
                    ) -> controller_pb2.PartitionRecord:
    seen: list[controller_pb2.PartitionRecord] = []

    def reached() -> bool:
        seen.append(_controller_partition(cluster))
        return bool(cond(seen[-1]))
    wait_for(reached, timeout_s, lambda: f"{what} (last: {_show(seen[-1]) if seen else None})", poll_s=0.2)
    return seen[-1]


def _log_bytes(cluster: LocalCluster, broker: int) -> int:
    """Bytes in the segment files of the broker's replica of partition 0 (0 when it has none)."""
    directory = cluster.node_dir(broker) / "data" / f"{TOPIC}-0"
    return sum(p.stat().st_size for p in directory.glob("*.log")) if directory.is_dir() else 0


def _log_size(cluster: LocalCluster, broker: int) -> int:
    path = cluster.node_log(broker)
    return path.stat().st_size if path.exists() else 0


def _dropping_truncations(cluster: LocalCluster, broker: int, since: int) -> list[str]:
    """Lines the broker logged after byte ``since`` of its log where its replica of the topic dropped records."""
    with open(cluster.node_log(broker), "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    out = []
    for line in text.splitlines():
        if f"{TOPIC}-0" not in line:
            continue
        m = _DIVERGED.search(line) or _PAST_END.search(line)
        if (m and int(m.group(1)) > int(m.group(2))) or ((r := _RESTARTED.search(line)) and int(r.group(1)) > 0):
            out.append(line.strip()[:240])
    return out


def _end_offset(cluster: LocalCluster) -> object:
    tp = TopicPartition(TOPIC, 0)
    try:
        with Admin(cluster.bootstrap_servers, request_timeout_ms=5000) as admin:
            return admin.list_offsets({tp: "latest"})[tp][0]
    except Exception as exc:  # noqa: BLE001 - only shown in a failure message
        return repr(exc)[:160]


def _loss_evidence(cluster: LocalCluster, acked: int, marks: dict[int, int], kept: dict[int, int]) -> str:
    """What the old behaviour does next, for the failure message: the others follow the empty leader and
    truncate. Waits a bounded time for the lines that show it, and never fails itself."""
    lines: dict[int, list[str]] = {}

    def truncated() -> bool:
        for b in (FIRST_LEADER, FIRST_DOWN):
            lines[b] = _dropping_truncations(cluster, b, marks[b])
        return all(lines.values())
    with contextlib.suppress(AssertionError):
        wait_for(truncated, 20, "the other replicas to truncate", poll_s=0.5)
    sizes = {b: f"{kept[b]} -> {_log_bytes(cluster, b)}" for b in (FIRST_LEADER, FIRST_DOWN)}
    return (f"{acked} records were acknowledged; the partition's end offset is now {_end_offset(cluster)}; "
            f"log bytes of brokers 1 and 3 (when killed -> now): {sizes}; their truncations: {lines}")


def _read_from_start(cluster: LocalCluster, timeout_s: float = 45.0) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of partition 0 up to its end offset now, read from offset 0 by a new
    Brook consumer."""
    with partition_consumer(cluster, TOPIC) as consumer:
        return read_until(consumer, TOPIC, timeout_s=timeout_s,
                          describe=lambda: _show(_controller_partition(cluster)))


def _produce(producer: Producer, prefix: bytes) -> list[bytes]:
    """RECORDS_PER_PHASE acks=all records; every one must be acknowledged (the ISR is big enough)."""
    values = [b"%s-%04d" % (prefix, i) for i in range(RECORDS_PER_PHASE)]
    futures = [producer.send(TOPIC, v, partition=0) for v in values]
    producer.flush(30)
    for f in futures:
        f.get(timeout=30)
    return values


def _assert_writes_refused(cluster: LocalCluster) -> str:
    """With ISR [2] an acks=all write must fail with NOT_ENOUGH_REPLICAS (so nothing acknowledged is on broker 2
    alone). Tried without retries until that error comes (a first attempt may meet the old leader)."""
    seen: list[str] = []
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=0, retries=0,
                  request_timeout_ms=3000, delivery_timeout_ms=5000) as producer:
        def refused() -> bool:
            try:
                producer.send(TOPIC, b"never-acknowledged-%03d" % len(seen), partition=0).get(timeout=10)
            except errors.NotEnoughReplicasError as exc:
                seen.append(f"{type(exc).__name__}: {exc}"[:160])
                return True
            except Exception as exc:  # noqa: BLE001 - e.g. NOT_LEADER from the old leader: tried again
                seen.append(f"{type(exc).__name__}: {exc}"[:160])
                return False
            raise AssertionError(f"an acks=all write was acknowledged with ISR {list(_controller_partition(cluster).isr)} "
                                 f"and min.insync.replicas=2")
        wait_for(refused, 20, lambda: f"an acks=all write refused with NOT_ENOUGH_REPLICAS (got {seen[-3:]})",
                 poll_s=0.2)
    return seen[-1]


def _write_again(cluster: LocalCluster, since: float, bound_s: float) -> tuple[float, bytes]:
    """Send one acks=all record at a time until one is acknowledged: (seconds from ``since``, its value)."""
    attempts: list[str] = []
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=0, request_timeout_ms=2000,
                  delivery_timeout_ms=4000, retry_backoff_ms=100) as producer:
        for i in range(10_000):
            left = since + bound_s - time.monotonic()
            assert left > 0, (f"no acks=all write to {TOPIC} acknowledged within {bound_s:.0f} s of the election; "
                              f"attempts: {attempts[-5:]}; partition {_show(_controller_partition(cluster))}")
            value = b"after-election-%04d" % i
            try:
                producer.send(TOPIC, value, partition=0).get(timeout=max(0.1, left))
                return time.monotonic() - since, value
            except Exception as exc:  # noqa: BLE001 - every failure is reported if the bound is missed
                attempts.append(f"{time.monotonic() - since:.1f}s: {type(exc).__name__}: {exc}"[:200])
    raise AssertionError("unreachable")


def test_the_last_in_sync_replica_back_on_an_empty_disk_does_not_become_the_partition(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=3, mode="split", controllers=1) as cluster:
        tp = TopicPartition(TOPIC, 0)
        with Admin(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 3, {"min.insync.replicas": "2"},
                                          replica_assignments=[[FIRST_LEADER, LAST_ISR, FIRST_DOWN]])])
            _wait_partition(cluster, lambda p: p.leader == FIRST_LEADER and len(p.isr) == 3,
                            f"{TOPIC}-0 led by broker {FIRST_LEADER} with 3 in-sync replicas")
            # The wiped broker first in assignment order: an unclean election that simply took the first live
            # replica would pick it; the controller must prefer the replicas that kept their logs. Same replicas,
            # another order: nothing moves, broker 1 still leads.
            moved = admin.alter_partition_reassignments({tp: [LAST_ISR, FIRST_LEADER, FIRST_DOWN]})
            assert moved[tp] is None, f"reordering the replicas of {TOPIC}-0 failed: {moved}"
        _wait_partition(cluster, lambda p: list(p.replicas) == [LAST_ISR, FIRST_LEADER, FIRST_DOWN]
                        and p.leader == FIRST_LEADER and len(p.isr) == 3 and not p.adding_replicas
                        and not p.removing_replicas, f"replicas of {TOPIC}-0 reordered, broker 1 still leading")
        incarnations = {b: r.incarnation_id for b, r in _brokers(cluster).items()}
        assert set(incarnations) == set(BROKERS), incarnations

        acked: list[bytes] = []
        kept: dict[int, int] = {}
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=5,
                      request_timeout_ms=10_000, delivery_timeout_ms=30_000) as producer:
            acked += _produce(producer, b"isr-123")
            cluster.kill_node(FIRST_DOWN)
            kept[FIRST_DOWN] = _log_bytes(cluster, FIRST_DOWN)
            _wait_partition(cluster, lambda p: sorted(p.isr) == [FIRST_LEADER, LAST_ISR] and p.leader == FIRST_LEADER,
                            f"ISR [1, 2] once broker {FIRST_DOWN} was killed")
            acked += _produce(producer, b"isr-12")
        cluster.kill_node(FIRST_LEADER)
        kept[FIRST_LEADER] = _log_bytes(cluster, FIRST_LEADER)
        _wait_partition(cluster, lambda p: p.leader == LAST_ISR and list(p.isr) == [LAST_ISR],
                        f"broker {LAST_ISR} leading with ISR [{LAST_ISR}] once broker {FIRST_LEADER} was killed")
        refused = _assert_writes_refused(cluster)
        assert kept[FIRST_LEADER] > 0 and kept[FIRST_DOWN] > 0, kept

        # Broker 2's disk is replaced: killed, its data directory gone, started again on an empty one.
        cluster.kill_node(LAST_ISR)
        shutil.rmtree(cluster.node_dir(LAST_ISR) / "data")
        cluster.start_node(LAST_ISR)
        seen: list[dict[int, controller_pb2.BrokerRecord]] = []

        def registered(ids: tuple[int, ...]) -> bool:
            seen.append(_brokers(cluster))
            return all(b in seen[-1] and seen[-1][b].incarnation_id != incarnations[b] and not seen[-1][b].fenced
                       for b in ids)

        def shown() -> str:
            return str({b: (r.incarnation_id[:8], "fenced" if r.fenced else "unfenced")
                        for b, r in (seen[-1] if seen else {}).items()})
        wait_for(lambda: registered((LAST_ISR,)), REGISTER_BOUND_S,
                 lambda: f"broker {LAST_ISR} registered again and unfenced ({shown()})", poll_s=0.2)
        marks = {b: _log_size(cluster, b) for b in (FIRST_LEADER, FIRST_DOWN)}
        cluster.start_node(FIRST_LEADER)
        cluster.start_node(FIRST_DOWN)
        wait_for(lambda: registered(BROKERS), REGISTER_BOUND_S,
                 lambda: f"brokers {BROKERS} registered again and unfenced ({shown()})", poll_s=0.2)

        # (1) The partition is offline: no leader, an empty ISR, not an empty replica serving it.
        offline = _controller_partition(cluster)
        if offline.leader != -1 or list(offline.isr):
            raise AssertionError(
                f"{TOPIC}-0 is served although its last in-sync replica (broker {LAST_ISR}) came back on an empty "
                f"disk: {_show(offline)}; {_loss_evidence(cluster, len(acked), marks, kept)}")

        # (2) Brokers 1 and 3 kept their records.
        for b in (FIRST_LEADER, FIRST_DOWN):
            assert _log_bytes(cluster, b) >= kept[b], (
                f"broker {b}'s log of {TOPIC}-0 shrank from {kept[b]} to {_log_bytes(cluster, b)} bytes "
                f"while the partition was offline: {_dropping_truncations(cluster, b, marks[b])}")
            assert not _dropping_truncations(cluster, b, marks[b]), _dropping_truncations(cluster, b, marks[b])

        # (3) The operator accepts the risk: an unclean election. Not the empty broker 2.
        with Admin(cluster.bootstrap_servers) as admin:
            result = admin.elect_leaders("unclean", [(TOPIC, 0)])
        elected_at = time.monotonic()
        leader, error = result[tp]
        assert error is None and leader not in (-1, LAST_ISR), (
            f"unclean election of {TOPIC}-0 gave leader {leader} ({error!r}): broker {LAST_ISR} started on an empty "
            f"disk; partition {_show(_controller_partition(cluster))}")
        _wait_partition(cluster, lambda p: p.leader == leader, f"broker {leader} leading {TOPIC}-0")
        assert_every_acknowledged_record_once_in_order(
            _read_from_start(cluster), acked, f"read from broker {leader} after the unclean election")
        if leader in marks:  # the new leader never truncated what it kept
            assert not _dropping_truncations(cluster, leader, marks[leader]), (
                _dropping_truncations(cluster, leader, marks[leader]))

        # (4) acks=all writes are taken again once another replica has caught up.
        took, value = _write_again(cluster, elected_at, WRITE_BOUND_S)
        acked.append(value)
        after = _controller_partition(cluster)
        assert after.leader == leader and len(after.isr) >= 2, _show(after)
        read = _read_from_start(cluster)
        assert_every_acknowledged_record_once_in_order(read, acked, f"read from broker {leader} after a new write")
        print(f"wiped last ISR: {len(acked) - 1} records acknowledged before the wipe (ISR [1, 2, 3], then [1, 2]; "
              f"with ISR [{LAST_ISR}]: {refused.split(':')[0]}); offline with all 3 brokers up ({_show(offline)}); "
              f"unclean election chose broker {leader}; {len(read)} records read back; acks=all writes taken again "
              f"{took:.1f} s after the election (ISR {list(after.isr)})")
