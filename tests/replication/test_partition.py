"""Partition leader/follower behaviour over real storage Logs (no network).

A tiny in-process "fetch" moves bytes from the leader Partition to follower logs exactly
as the replica fetcher does (append_as_follower + HW from the response), so HW, ISR and
divergence rules are checked against the real epoch caches and offsets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proto import errors
from replication import isr as isr_rules
from replication.partition import Partition, ReplicationInvariantError, Role
from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import RecordBatchBuilder


def batch(*values: bytes) -> bytes:
    b = RecordBatchBuilder()
    for v in values:
        b.append(1_700_000_000_000, None, v)
    return b.build()


def open_log(tmp: Path, name: str, **overrides: str) -> Log:
    return Log.open(tmp / name / "t-0", LogConfig.from_overrides(overrides))


def all_bytes(lg: Log) -> bytes:
    """The whole log (a read returns batches of one segment at most)."""
    return b"".join(lg.iter_batches_from(lg.log_start_offset))


def leader_of(tmp: Path, *, isr: tuple[int, ...] = (1, 2, 3), epoch: int = 1, **overrides: str) -> Partition:
    p = Partition("t", 0, "T1", open_log(tmp, "b1", **overrides), 1, broker_usable=lambda b: True)
    p.make_leader((1, 2, 3), isr, epoch, epoch, now_ms=0)
    return p


def follow(leader: Partition, replica_id: int, flog: Log, now_ms: int) -> isr_rules.IsrProposal | None:
    """One follower fetch round trip, as replication/fetcher.py processes it."""
    r = leader.fetch_for_follower(replica_id, flog.log_end_offset, flog.log_start_offset, flog.latest_epoch,
                                  leader.leader_epoch, 1 << 20, True, now_ms)
    if r.diverging_epoch is not None:
        ep, end = r.diverging_epoch
        target = isr_rules.truncation_offset(ep, end, flog.end_offset_for_epoch(ep), flog.log_end_offset,
                                             flog.high_watermark)
        flog.truncate_to(target)
        return None
    if r.records:
        flog.append_as_follower(r.records)
    flog.update_high_watermark(min(r.high_watermark, flog.log_end_offset))
    return r.isr_proposal


def test_hw_advances_only_when_every_isr_member_has_the_data(tmp_path: Path) -> None:
    p = leader_of(tmp_path)
    f2, f3 = open_log(tmp_path, "b2"), open_log(tmp_path, "b3")
    info = p.append_as_leader(batch(b"a", b"b", b"c"), acks=-1)
    assert (info.first_offset, info.last_offset) == (0, 2)
    assert p.log.high_watermark == 0
    follow(p, 2, f2, 10)
    assert p.log.high_watermark == 0, "follower 3 has nothing yet"
    follow(p, 3, f3, 10)
    assert p.log.high_watermark == 0, "follower LEOs are learned at their next fetch"
    follow(p, 2, f2, 20)
    follow(p, 3, f3, 20)
    assert p.log.high_watermark == 3
    follow(p, 2, f2, 30)
    assert f2.high_watermark == 3 and f2.log_end_offset == 3
    # followers got byte-identical batches
    assert all_bytes(f2) == all_bytes(p.log)


def test_acks_all_refused_below_min_isr_and_nothing_appended(tmp_path: Path) -> None:
    p = leader_of(tmp_path, isr=(1,), **{"min.insync.replicas": "2"})
    with pytest.raises(errors.NotEnoughReplicasError):
        p.append_as_leader(batch(b"x"), acks=-1)
    assert p.log.log_end_offset == 0
    info = p.append_as_leader(batch(b"x"), acks=1)
    assert info.first_offset == 0 and p.log.high_watermark == 1  # ISR = leader only


def test_lagging_follower_is_proposed_out_then_back_in(tmp_path: Path) -> None:
    p = leader_of(tmp_path)
    f2, f3 = open_log(tmp_path, "b2"), open_log(tmp_path, "b3")
    p.append_as_leader(batch(b"a"), acks=1)
    follow(p, 2, f2, 100)
    follow(p, 3, f3, 100)
    assert p.maybe_shrink_isr(now_ms=1000, lag_max_ms=2000) is None
    for t in (1500, 2500, 3500):  # 3 stops fetching; 2 keeps up
        p.append_as_leader(batch(b"more"), acks=1)
        follow(p, 2, f2, t)
        follow(p, 2, f2, t)
    prop = p.maybe_shrink_isr(now_ms=3500, lag_max_ms=2000)
    assert prop is not None and prop.new_isr == (1, 2) and prop.partition_epoch == 1
    assert p.isr == (1, 2, 3), "not believed until the controller commits it"
    assert p.maybe_shrink_isr(now_ms=3600, lag_max_ms=2000) is None, "one proposal in flight"
    assert p.apply_committed_state((1, 2), 1, 2)  # HW no longer waits for 3
    assert p.log.high_watermark == p.log.log_end_offset
    # 3 comes back and catches up: proposed back in once its LEO reaches the HW
    prop = None
    for t in (4000, 4100, 4200):
        prop = follow(p, 3, f3, t) or prop
    assert prop is not None and prop.new_isr == (1, 2, 3)
    assert p.maximal_isr() == (1, 2, 3)
    p.apply_committed_state((1, 2, 3), 1, 3)
    assert p.isr == (1, 2, 3) and p.isr_shrinks_total == 1 and p.isr_expands_total == 1


def test_stale_alter_result_is_ignored(tmp_path: Path) -> None:
    p = leader_of(tmp_path, epoch=4)
    assert not p.apply_committed_state((1,), leader_epoch=3, partition_epoch=9)
    assert p.isr == (1, 2, 3)


def test_former_leader_truncates_unreplicated_tail(tmp_path: Path) -> None:
    # Broker 1 leads epoch 1; 0..2 replicate to 2; 3..5 never do.
    a = leader_of(tmp_path)
    b_log = open_log(tmp_path, "b2")
    a.append_as_leader(batch(b"0", b"1", b"2"), acks=1)
    follow(a, 2, b_log, 10)
    a.append_as_leader(batch(b"3", b"4", b"5"), acks=1)
    assert a.log.log_end_offset == 6 and b_log.log_end_offset == 3
    # Broker 2 becomes leader at epoch 2 and takes new writes at 3..4.
    b = Partition("t", 0, "T1", b_log, 2, broker_usable=lambda x: True)
    b.make_leader((1, 2, 3), (2,), 2, 2, now_ms=20)
    b.append_as_leader(batch(b"B3", b"B4"), acks=1)
    a.make_follower(2, (1, 2, 3), (2,), 2, 2)
    assert a.role is Role.FOLLOWER
    with pytest.raises(errors.NotLeaderOrFollowerError):
        a.append_as_leader(batch(b"late"), acks=1)
    follow(b, 1, a.log, 30)  # divergence: cut to 3
    assert a.log.log_end_offset == 3
    follow(b, 1, a.log, 40)
    follow(b, 1, a.log, 50)
    assert all_bytes(a.log) == all_bytes(b.log)
    assert a.log.log_end_offset == 5


def test_fenced_and_unknown_leader_epochs(tmp_path: Path) -> None:
    p = leader_of(tmp_path, epoch=5)
    p.check_leader(5)
    with pytest.raises(errors.FencedLeaderEpochError):
        p.check_leader(4)
    with pytest.raises(errors.BrookError) as e:
        p.check_leader(6)
    assert e.value.name == "UNKNOWN_LEADER_EPOCH"


def test_a_follower_checks_the_epoch_before_saying_it_is_not_the_leader(tmp_path: Path) -> None:
    """Kafka's order (Partition.getLocalLog): a client behind the replica's epoch is fenced, one ahead
    told UNKNOWN_LEADER_EPOCH, and only one at its epoch NOT_LEADER_OR_FOLLOWER; -1 skips the epoch."""
    p = leader_of(tmp_path, epoch=5)
    p.make_follower(2, (1, 2, 3), (1, 2, 3), 6, 6)
    with pytest.raises(errors.FencedLeaderEpochError):
        p.check_leader(5)  # the client's metadata names this replica the leader at epoch 5: stale
    with pytest.raises(errors.BrookError) as e:
        p.check_leader(7)
    assert e.value.name == "UNKNOWN_LEADER_EPOCH"
    for current in (6, -1):
        with pytest.raises(errors.NotLeaderOrFollowerError):
            p.check_leader(current)


def test_consumer_read_stops_at_hw(tmp_path: Path) -> None:
    p = leader_of(tmp_path)
    p.append_as_leader(batch(b"a"), acks=1)
    assert p.read_for_consumer(0, 1 << 20, -1, True).records == b""
    f2, f3 = open_log(tmp_path, "b2"), open_log(tmp_path, "b3")
    for t in (1, 2):
        follow(p, 2, f2, t)
        follow(p, 3, f3, t)
    assert p.read_for_consumer(0, 1 << 20, -1, True).records == p.log.read(0, 1 << 20).records
    with pytest.raises(errors.OffsetOutOfRangeError):
        p.read_for_consumer(5, 1 << 20, -1, True)


def test_a_follower_serves_a_consumer_that_may_read_from_it_up_to_its_high_watermark(tmp_path: Path) -> None:
    """KIP-392: a consumer fetching with Fetch v11+ may read from a follower, which serves what it knows to be
    committed (its high watermark, learnt from the leader) and checks the consumer's epoch as a leader does; a
    consumer that may not (older versions, Brook's own client) is told NOT_LEADER_OR_FOLLOWER as before."""
    leader = leader_of(tmp_path)
    leader.append_as_leader(batch(b"a", b"b"), acks=1)
    f2 = open_log(tmp_path, "b2")
    p2 = Partition("t", 0, "T1", f2, 2, broker_usable=lambda b: True)
    p2.make_follower(1, (1, 2, 3), (1, 2, 3), 1, 1)
    follow(leader, 2, f2, 1)  # the data, and the high watermark before it moved: nothing committed here yet
    assert f2.log_end_offset == 2 and f2.high_watermark == 0
    assert p2.read_for_consumer(0, 1 << 20, 1, True, follower_read=True).records == b""
    f3 = open_log(tmp_path, "b3")
    follow(leader, 3, f3, 1)
    follow(leader, 3, f3, 2)  # at the leader's end: with broker 2's next fetch the high watermark moves
    follow(leader, 2, f2, 2)  # and reaches this follower in that fetch's answer
    assert f2.high_watermark == 2
    assert p2.read_for_consumer(0, 1 << 20, 1, True, follower_read=True).records == f2.read(0, 1 << 20).records
    with pytest.raises(errors.NotLeaderOrFollowerError):
        p2.read_for_consumer(0, 1 << 20, 1, True)
    with pytest.raises(errors.FencedLeaderEpochError):
        p2.read_for_consumer(0, 1 << 20, 0, True, follower_read=True)
    with pytest.raises(errors.BrookError) as ahead:
        p2.read_for_consumer(0, 1 << 20, 2, True, follower_read=True)
    assert ahead.value.name == "UNKNOWN_LEADER_EPOCH"
    with pytest.raises(errors.OffsetOutOfRangeError):
        p2.read_for_consumer(5, 1 << 20, 1, True, follower_read=True)
    p2.make_follower(1, (1, 2, 3), (1, 3), 1, 2)  # out of the ISR: its consumers go back to the leader
    with pytest.raises(errors.NotLeaderOrFollowerError):
        p2.read_for_consumer(0, 1 << 20, 1, True, follower_read=True)


def test_a_lower_leader_epoch_is_a_bug_not_a_new_leadership(tmp_path: Path) -> None:
    p = leader_of(tmp_path, epoch=5)
    p.append_as_leader(batch(b"a"), acks=1)
    with pytest.raises(ReplicationInvariantError, match="epoch 4, older than the current 5"):
        p.make_leader((1, 2, 3), (1, 2, 3), 4, 9, now_ms=10)
    assert p.leader_epoch == 5 and p.is_leader and p.log.latest_epoch == 5  # nothing changed
    assert p.make_leader((1, 2, 3), (1, 2, 3), 6, 10, now_ms=10)  # a newer epoch is a new leadership


def test_a_high_watermark_past_the_log_end_is_raised_not_clamped(tmp_path: Path) -> None:
    p = leader_of(tmp_path, isr=(1,))
    p.append_as_leader(batch(b"a", b"b"), acks=1)
    assert p.log.high_watermark == p.log.log_end_offset == 2
    # The broken state a buggy truncation would leave (the Log itself clamps every update, so the
    # test reaches in): the leader must say so, not serve or acknowledge past its log.
    p.log._high_watermark = 5
    with pytest.raises(ReplicationInvariantError, match="high watermark 5 is past the log end offset 2"):
        p.append_as_leader(batch(b"c"), acks=1)
    assert p.log.log_end_offset == 2  # refused before appending
    with pytest.raises(ReplicationInvariantError):
        p.make_leader((1, 2, 3), (1,), 2, 2, now_ms=0)


def test_a_refusal_carrying_moved_replicas_updates_the_leaders_followers(tmp_path: Path) -> None:
    """A move adds replica 4 without a new leader epoch. When a refused AlterPartition hands the leader
    that state (and its partition epoch), the leader must learn the replicas with it: the metadata of
    the same partition epoch is ignored afterwards, so 4 could otherwise never fetch."""
    p = leader_of(tmp_path, epoch=1)
    prop = p.maybe_shrink_isr(now_ms=10**12, lag_max_ms=1)  # everybody lags: a proposal is pending
    assert prop is not None
    p.alter_refused(prop, ((1, 2, 3), 1, p.partition_epoch + 2, (4, 1, 2, 3)), now_ms=10**12)
    assert p.replicas == (4, 1, 2, 3) and set(p.followers) == {2, 3, 4}
    assert not p.make_leader((4, 1, 2, 3), (1, 2, 3), 1, p.partition_epoch, 10**12)  # nothing newer


def isr_check(p: Partition, last_ms: int, now_ms: int, interval_ms: int = 1000,
              lag_max_ms: int = 2000) -> isr_rules.IsrProposal | None:
    """One run of ReplicaManager._isr_loop on ``p``: forgive the time the loop did not run, then check."""
    excess = isr_rules.own_stall_ms(last_ms, now_ms, interval_ms)
    if excess > 0:
        p.forgive_followers(excess, now_ms)
    return p.maybe_shrink_isr(now_ms, lag_max_ms)


def test_a_pause_of_the_leader_alone_is_not_its_followers_lag(tmp_path: Path) -> None:
    """replica.lag.time.max.ms 2 s, the check every 1 s. Both followers fetched 0.4 s before the check at 1.0 s,
    then every process stopped for 6 s right after it. Forgiving only what was past a second of slack (the old
    rule) left them 2.4 s behind at the next check and shrank the ISR to the leader (seen in CI,
    test_a_pause_of_every_node_moves_nothing)."""
    p = leader_of(tmp_path)
    f2, f3 = open_log(tmp_path, "b2"), open_log(tmp_path, "b3")
    for f, rid in ((f2, 2), (f3, 3)):
        follow(p, rid, f, 600)
    assert isr_check(p, 0, 1000) is None
    assert isr_check(p, 1000, 8000) is None, "the followers could not fetch from a stopped leader"
    for f, rid in ((f2, 2), (f3, 3)):  # they fetch again once every process runs
        follow(p, rid, f, 8100)
    assert isr_check(p, 8000, 9000) is None and p.isr == (1, 2, 3)


def test_a_late_isr_check_still_drops_a_dead_follower(tmp_path: Path) -> None:
    """A loop that runs 0.5 s late each time (a busy host, not a stopped process) forgives that 0.5 s, yet a
    follower that never fetches again still ages one interval a run and leaves the ISR."""
    p = leader_of(tmp_path)
    f2, f3 = open_log(tmp_path, "b2"), open_log(tmp_path, "b3")
    follow(p, 2, f2, 0)
    follow(p, 3, f3, 0)
    last, proposal = 0, None
    for run in range(1, 10):
        now = run * 1500
        follow(p, 2, f2, now)  # 2 keeps fetching; 3 is gone
        proposal = isr_check(p, last, now)
        last = now
        if proposal is not None:
            break
    assert proposal is not None and proposal.new_isr == (1, 2), "follower 3 never left the ISR"
    assert run <= 3, f"follower 3 left the ISR only at run {run}"
    assert isr_rules.own_stall_ms(0, 700, 1000) == 0, "an early run forgives nothing"
