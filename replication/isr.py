"""Pure leader-side replication rules: follower progress, high watermark, ISR changes.

No clocks, no I/O: callers pass ``now_ms`` and log end offsets, so every rule is tested
as plain arithmetic (tests/replication/test_isr.py).

Rules (Kafka's, KIP-497 / KIP-841):
- A follower is *caught up* at a fetch when it fetches at or past the leader's log end
  offset (LEO) as it was at that fetch; or past the LEO of its previous fetch, in which
  case it was caught up at the previous fetch's time.
- It is out of sync when it has not been caught up for ``replica.lag.time.max.ms``.
- HW = min LEO over the *maximal* ISR: the committed ISR plus replicas whose addition is
  in flight (so acks=all never completes on fewer replicas than the ISR will hold).
  Shrinking takes effect only once committed, so HW keeps waiting for the old members.
- A follower may join the ISR when its LEO >= HW and >= the start of the leader's epoch,
  and its broker is registered, unfenced and not shutting down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

UNKNOWN_OFFSET = -1


@dataclass(slots=True)
class FollowerProgress:
    broker_id: int
    log_end_offset: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = 0
    last_fetch_time_ms: int = 0
    last_fetch_leader_leo: int = UNKNOWN_OFFSET

    def record_fetch(self, fetch_offset: int, log_start_offset: int, leader_leo: int, now_ms: int) -> None:
        if fetch_offset >= leader_leo:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        elif self.last_fetch_leader_leo != UNKNOWN_OFFSET and fetch_offset >= self.last_fetch_leader_leo:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.log_end_offset = fetch_offset
        self.log_start_offset = log_start_offset
        self.last_fetch_leader_leo = leader_leo
        self.last_fetch_time_ms = now_ms

    def reset(self, now_ms: int, in_isr: bool) -> None:
        """New leadership: the LEO is unknown until the follower fetches; ISR members get a grace period."""
        self.log_end_offset = UNKNOWN_OFFSET
        self.log_start_offset = UNKNOWN_OFFSET
        self.last_fetch_leader_leo = UNKNOWN_OFFSET
        self.last_fetch_time_ms = 0
        self.last_caught_up_time_ms = now_ms if in_isr else 0

    def is_out_of_sync(self, now_ms: int, lag_max_ms: int) -> bool:
        return now_ms - self.last_caught_up_time_ms > lag_max_ms


def high_watermark(leader_id: int, leader_leo: int, maximal_isr: Iterable[int],
                   followers: dict[int, FollowerProgress]) -> int:
    """Smallest LEO over the maximal ISR; a member with unknown LEO holds the HW where it is (-1)."""
    hw = leader_leo
    for rid in maximal_isr:
        if rid == leader_id:
            continue
        f = followers.get(rid)
        if f is None or f.log_end_offset == UNKNOWN_OFFSET:
            return UNKNOWN_OFFSET
        hw = min(hw, f.log_end_offset)
    return hw


def out_of_sync_replicas(leader_id: int, isr: Iterable[int], followers: dict[int, FollowerProgress],
                         now_ms: int, lag_max_ms: int) -> set[int]:
    out: set[int] = set()
    for rid in isr:
        if rid == leader_id:
            continue
        f = followers.get(rid)
        if f is None or f.is_out_of_sync(now_ms, lag_max_ms):
            out.add(rid)
    return out


def can_join_isr(f: FollowerProgress, high_watermark_offset: int, leader_epoch_start_offset: int,
                 broker_usable: Callable[[int], bool]) -> bool:
    return (f.log_end_offset != UNKNOWN_OFFSET
            and f.log_end_offset >= high_watermark_offset
            and f.log_end_offset >= leader_epoch_start_offset
            and broker_usable(f.broker_id))


def shrunk_isr(isr: tuple[int, ...], remove: set[int]) -> tuple[int, ...]:
    return tuple(r for r in isr if r not in remove)


def expanded_isr(isr: tuple[int, ...], add: int) -> tuple[int, ...]:
    return isr if add in isr else tuple(sorted((*isr, add)))


# ---- follower side: where to truncate after a divergence (KIP-101 / KIP-279 / KIP-320) ----

def truncation_offset(leader_epoch: int, leader_end_offset: int,
                      follower_epoch_end: tuple[int, int], follower_leo: int, follower_hw: int) -> int:
    """Offset the follower truncates to, given the leader's (epoch, end offset) answer.

    ``follower_epoch_end`` is the follower's own (largest epoch <= leader_epoch, its end offset).
    - leader knows no such epoch: fall back to the follower's high watermark (committed).
    - follower has that exact epoch: keep the shorter of the two epoch ends.
    - follower only has an older epoch: truncate to the end of that one; the next fetch
      (with the new last epoch) checks again, so this converges in a bounded number of rounds.
    """
    if leader_epoch < 0 or leader_end_offset < 0:
        return min(follower_hw, follower_leo)
    f_epoch, f_end = follower_epoch_end
    if f_epoch < 0 or f_end < 0:
        return min(follower_hw, follower_leo)
    if f_epoch == leader_epoch:
        return min(leader_end_offset, f_end, follower_leo)
    return min(f_end, follower_leo)


def diverging_epoch(last_fetched_epoch: int, fetch_offset: int,
                    leader_epoch_end: tuple[int, int]) -> tuple[int, int] | None:
    """Leader side of KIP-320: the (epoch, end offset) a follower must truncate to, or None.

    ``leader_epoch_end`` is the leader's (largest epoch <= last_fetched_epoch, its end offset).
    """
    if last_fetched_epoch < 0:
        return None
    epoch, end = leader_epoch_end
    if epoch < last_fetched_epoch or end < fetch_offset:
        return epoch, end
    return None


def own_stall_ms(last_ms: int, now_ms: int, interval_ms: int) -> int:
    """How long a loop meant to run every ``interval_ms``, last run at ``last_ms``, did not run before
    ``now_ms``: the time past its interval. A follower could not fetch from a leader that did not run, so
    the ISR check moves the followers' catch-up times on by this much. All of it, not only what is past
    some slack: a follower caught up shortly before a 6 s pause is otherwise short by the slack plus its
    last fetch's age, past a replica.lag.time.max.ms of 2 s. A merely slow loop still ages a dead follower
    by one interval a run."""
    return max(0, now_ms - last_ms - interval_ms)
