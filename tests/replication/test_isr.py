"""Pure leader/follower replication rules: HW, caught-up tracking, ISR changes, truncation points."""

from __future__ import annotations

from replication import isr
from replication.isr import UNKNOWN_OFFSET, FollowerProgress


def progress(bid: int, leo: int, caught_up_ms: int = 0) -> FollowerProgress:
    f = FollowerProgress(bid)
    f.log_end_offset = leo
    f.last_caught_up_time_ms = caught_up_ms
    return f


def test_hw_is_min_leo_over_isr_including_leader() -> None:
    followers = {2: progress(2, 7), 3: progress(3, 9)}
    assert isr.high_watermark(1, 10, (1, 2, 3), followers) == 7
    assert isr.high_watermark(1, 10, (1, 3), followers) == 9
    assert isr.high_watermark(1, 10, (1,), followers) == 10
    # a follower cannot be ahead of the leader's log end in the HW
    assert isr.high_watermark(1, 5, (1, 3), followers) == 5


def test_hw_held_while_an_isr_member_leo_is_unknown() -> None:
    followers = {2: progress(2, UNKNOWN_OFFSET), 3: progress(3, 9)}
    assert isr.high_watermark(1, 10, (1, 2, 3), followers) == UNKNOWN_OFFSET
    assert isr.high_watermark(1, 10, (1, 3), followers) == 9


def test_caught_up_when_fetching_at_leader_leo() -> None:
    f = FollowerProgress(2)
    f.record_fetch(fetch_offset=10, log_start_offset=0, leader_leo=10, now_ms=1000)
    assert f.last_caught_up_time_ms == 1000 and f.log_end_offset == 10
    assert not f.is_out_of_sync(now_ms=3000, lag_max_ms=2000)
    assert f.is_out_of_sync(now_ms=3001, lag_max_ms=2000)


def test_caught_up_at_previous_fetch_when_passing_previous_leo() -> None:
    f = FollowerProgress(2)
    f.record_fetch(10, 0, 10, now_ms=1000)
    # leader appended to 20 meanwhile; the follower now fetches at 10 -> not caught up "now",
    f.record_fetch(10, 0, 20, now_ms=1500)
    assert f.last_caught_up_time_ms == 1000
    # ...but once it reaches 20 (the LEO of its previous fetch), it was caught up at 1500.
    f.record_fetch(20, 0, 30, now_ms=2500)
    assert f.last_caught_up_time_ms == 1500


def test_lagging_follower_never_caught_up_goes_out_of_sync() -> None:
    f = FollowerProgress(2)
    f.reset(now_ms=0, in_isr=True)
    for t in range(0, 5000, 500):
        f.record_fetch(3, 0, 100 + t, now_ms=t)  # stuck at 3 while the leader grows
    assert f.is_out_of_sync(now_ms=4500, lag_max_ms=2000)
    out = isr.out_of_sync_replicas(1, (1, 2), {2: f}, now_ms=4500, lag_max_ms=2000)
    assert out == {2}


def test_reset_gives_isr_members_a_grace_period_only() -> None:
    a, b = FollowerProgress(2), FollowerProgress(3)
    a.reset(now_ms=10_000, in_isr=True)
    b.reset(now_ms=10_000, in_isr=False)
    assert a.log_end_offset == UNKNOWN_OFFSET
    assert not a.is_out_of_sync(11_000, 2000)
    assert b.is_out_of_sync(11_000, 2000)


def test_isr_join_rules() -> None:
    usable = {2: True, 3: False}.get
    f2, f3 = progress(2, 15), progress(3, 15)
    assert isr.can_join_isr(f2, high_watermark_offset=10, leader_epoch_start_offset=12, broker_usable=usable)
    # behind the HW
    assert not isr.can_join_isr(f2, 16, 0, usable)
    # not yet past the start of the leader's epoch (KIP-101: may still hold a divergent tail)
    assert not isr.can_join_isr(f2, 10, 16, usable)
    # fenced or shutting-down broker (KIP-841)
    assert not isr.can_join_isr(f3, 10, 0, lambda b: usable(b) or False)
    assert not isr.can_join_isr(progress(2, UNKNOWN_OFFSET), -1, 0, usable)


def test_isr_set_operations() -> None:
    assert isr.shrunk_isr((1, 2, 3), {2}) == (1, 3)
    assert isr.expanded_isr((1, 3), 2) == (1, 2, 3)
    assert isr.expanded_isr((1, 2), 2) == (1, 2)


def test_diverging_epoch_detection_on_leader() -> None:
    # follower last fetched epoch 1 at offset 16; leader's epoch 1 ended at 10 (epoch 2 from 10)
    assert isr.diverging_epoch(1, 16, (1, 10)) == (1, 10)
    # follower has epoch 3 that the leader never had; leader's largest <= 3 is 2, ending at 12
    assert isr.diverging_epoch(3, 12, (2, 12)) == (2, 12)
    # consistent: same epoch, ends at or after the fetch offset
    assert isr.diverging_epoch(2, 12, (2, 20)) is None
    assert isr.diverging_epoch(2, 20, (2, 20)) is None
    # consumers / empty followers send -1: never checked
    assert isr.diverging_epoch(-1, 5, (-1, -1)) is None


def test_truncation_offset_follower_side() -> None:
    # same epoch on both: the shorter end wins
    assert isr.truncation_offset(1, 10, follower_epoch_end=(1, 16), follower_leo=16, follower_hw=8) == 10
    assert isr.truncation_offset(1, 20, (1, 16), 16, 8) == 16
    # follower only has an older epoch: cut to its end, next fetch re-checks
    assert isr.truncation_offset(3, 30, (2, 12), 25, 5) == 12
    # leader knows nothing that old: fall back to the committed HW
    assert isr.truncation_offset(-1, -1, (1, 10), 16, 8) == 8
    assert isr.truncation_offset(2, 10, (-1, -1), 16, 8) == 8


def test_divergence_scenario_former_leader_with_unreplicated_tail() -> None:
    """Leader A (epoch 1) wrote 0..15, only 0..9 reached B. B leads epoch 2 from offset 10 and
    writes 10..12. A rejoins: one divergence round cuts it to 10, then it fetches B's data."""
    leader_epochs = [(1, 0), (2, 10)]  # (epoch, start) on B; LEO 13
    follower_epochs = [(1, 0)]  # A; LEO 16

    def end_for(epochs: list[tuple[int, int]], leo: int, e: int) -> tuple[int, int]:
        found = [(ep, st) for ep, st in epochs if ep <= e]
        if not found:
            return (-1, -1)
        ep = found[-1][0]
        later = [st for e2, st in epochs if e2 > ep]
        return (ep, later[0] if later else leo)

    div = isr.diverging_epoch(1, 16, end_for(leader_epochs, 13, 1))
    assert div == (1, 10)
    target = isr.truncation_offset(div[0], div[1], end_for(follower_epochs, 16, div[0]), 16, 9)
    assert target == 10
    assert isr.diverging_epoch(1, 10, end_for(leader_epochs, 13, 1)) is None
