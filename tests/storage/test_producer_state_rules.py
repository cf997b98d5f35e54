"""Idempotent-producer sequence rules of the partition log (KIP-98, with Kafka's pre-KIP-360 broker rule).

A producer id the log has no state for must start at sequence 0: a later batch that
overtook an earlier one is refused (OUT_OF_ORDER_SEQUENCE_NUMBER, nothing appended) so
the earlier one can still go first. Where the log has evidence that producer state may
have been lost (log start moved, compaction, truncation, the producer cap) the answer
is UNKNOWN_PRODUCER_ID instead. Followers take whatever the leader wrote.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from storage_testlib import make_batch

from proto import errors
from storage.log import Log, LogConfig
from storage.producer_state import ProducerBudget, ProducerStateManager
from storage.record_batch import BatchHeader


def open_log(tmp_path: Path, **cfg) -> Log:
    return Log.open(tmp_path / "t-0", LogConfig(**cfg))


def batch(pid: int, seq: int, count: int = 3, epoch: int = 0, base_offset: int = 0, leader_epoch: int = -1) -> bytes:
    return make_batch(count, producer_id=pid, producer_epoch=epoch, base_sequence=seq, base_offset=base_offset,
                      epoch=leader_epoch)


def test_new_producer_must_start_at_zero_and_a_refused_overtaker_succeeds_after_its_predecessor(
        tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="expected sequence 0"):
        lg.append_as_leader(batch(7, 408), 0)
    assert lg.log_end_offset == 0 and lg.producer_state.entry(7) is None, "a refused batch left traces"
    assert lg.append_as_leader(batch(7, 0), 0).first_offset == 0
    assert lg.append_as_leader(batch(7, 3), 0).first_offset == 3  # the refused batch, retried in order
    assert lg.log_end_offset == 6
    # several batches of a new producer in one append chain from 0; a chain not starting at 0 is refused whole
    both = batch(8, 0) + batch(8, 3)
    assert lg.append_as_leader(both, 0).num_batches == 2
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        lg.append_as_leader(batch(-1, -1) + batch(9, 3), 0)
    assert lg.log_end_offset == 12, "a refused multi-batch append must write nothing"
    # no sequence at all (-1) carries no ordering claim: accepted as before
    assert lg.append_as_leader(batch(10, -1), 0).first_offset == 12
    lg.close()


def test_existing_rules_are_kept(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    infos = [lg.append_as_leader(batch(7, 3 * i), 0) for i in range(6)]
    dup = lg.append_as_leader(batch(7, 15), 0)  # one of the last five -> original offsets
    assert dup.duplicate and (dup.first_offset, dup.last_offset) == (infos[5].first_offset, infos[5].last_offset)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        lg.append_as_leader(batch(7, 0), 0)  # the sixth-newest is no longer remembered
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="expected sequence 18"):
        lg.append_as_leader(batch(7, 21), 0)  # gap
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="new epoch"):
        lg.append_as_leader(batch(7, 18, epoch=1), 0)  # a new epoch must start at 0
    assert lg.append_as_leader(batch(7, 0, epoch=1), 0).first_offset == 18
    with pytest.raises(errors.InvalidProducerEpochError):
        lg.append_as_leader(batch(7, 18, epoch=0), 0)
    assert lg.log_end_offset == 21
    lg.close()


def _fill_and_roll(lg: Log, pid: int) -> None:
    lg.append_as_leader(batch(pid, 0), 0)
    lg.append_as_leader(batch(pid, 3), 0)
    lg.roll()
    lg.append_as_leader(batch(-1, -1), 0)  # someone else's data keeps the active segment non-empty


def test_unknown_producer_id_after_retention_moved_the_log_start_past_its_batches(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    _fill_and_roll(lg, 7)
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(6)
    assert lg.delete_old_segments() == 1 and lg.log_start_offset == 6
    # the live state outlives the segment: the producer just continues
    assert lg.append_as_leader(batch(7, 6), 0).first_offset == 9
    lg.close_without_flush()  # a crash: the state is rebuilt from the remaining batch headers only
    lg = Log.open(tmp_path / "t-0", LogConfig())
    assert lg.log_start_offset == 6 and lg.producer_state.entry(7) is not None
    lg.roll()
    lg.append_as_leader(batch(-1, -1), 0)
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(lg.log_end_offset - 3)
    lg.delete_old_segments()
    lg.close_without_flush()
    lg = Log.open(tmp_path / "t-0", LogConfig())
    assert lg.producer_state.entry(7) is None, "producer 7 should be gone with its segments"
    end = lg.log_end_offset
    with pytest.raises(errors.UnknownProducerIdError, match="no state for producer 7"):
        lg.append_as_leader(batch(7, 9), 0)
    # a brand-new producer's overtaking batch gets the same answer on such a log (it cannot be told apart)
    with pytest.raises(errors.UnknownProducerIdError):
        lg.append_as_leader(batch(8, 3), 0)
    assert lg.log_end_offset == end
    # the client's recovery: bumped epoch, sequences from 0
    assert lg.append_as_leader(batch(7, 0, epoch=1), 0).first_offset == end
    assert lg.append_as_leader(batch(8, 0), 0).first_offset == end + 3
    lg.close()


def test_unknown_producer_id_on_compacted_logs_after_truncation_and_past_the_producer_cap(tmp_path: Path) -> None:
    compacted = Log.open(tmp_path / "c-0", LogConfig(cleanup_policy=("compact",)))
    with pytest.raises(errors.UnknownProducerIdError):
        compacted.append_as_leader(batch(7, 5), 0)
    assert compacted.append_as_leader(batch(7, 0), 0).first_offset == 0
    compacted.close()

    lg = open_log(tmp_path)
    lg.append_as_leader(batch(-1, -1), 0)
    lg.append_as_leader(batch(7, 0), 0)
    lg.truncate_to(3)  # producer 7's only batch goes (a new leader's log was shorter)
    with pytest.raises(errors.UnknownProducerIdError):
        lg.append_as_leader(batch(7, 3), 0)
    assert lg.append_as_leader(batch(7, 0), 0).first_offset == 3  # its retry from 0 is fine
    lg.close()

    capped = Log.open(tmp_path / "p-0", LogConfig())
    capped.producer_state.max_producers = 2
    for pid in (1, 2):
        capped.append_as_leader(batch(pid, 0), 0)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        capped.append_as_leader(batch(3, 3), 0)  # nothing forgotten yet: a plain reorder
    capped.append_as_leader(batch(3, 0), 0)  # producer 1 is forgotten now
    with pytest.raises(errors.UnknownProducerIdError):
        capped.append_as_leader(batch(1, 3), 0)
    capped.close()

    restarted = Log.open(tmp_path / "f-0", LogConfig())
    restarted.truncate_fully_and_start_at(100)  # a follower whose log start is beyond what it had
    with pytest.raises(errors.UnknownProducerIdError):
        restarted.append_as_leader(batch(7, 3), 0)
    restarted.close()


def test_followers_never_refuse_and_keep_the_leaders_state(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    off = 0
    # an unknown producer mid-history, a gap, an older epoch, a repeated sequence: all the leader's word
    for pid, seq, epoch in [(7, 408, 0), (7, 500, 0), (7, 0, 1), (7, 9, 0), (7, 9, 0), (8, 42, 3)]:
        info = lg.append_as_follower(batch(pid, seq, epoch=epoch, base_offset=off, leader_epoch=1))
        assert info.first_offset == off
        off += 3
    assert lg.log_end_offset == 18
    entry = lg.producer_state.entry(8)
    assert entry is not None and (entry.epoch, entry.last_seq) == (3, 44)
    # promoted to leader, it continues the history it replicated
    assert lg.append_as_leader(batch(8, 45, epoch=3), 2).first_offset == 18
    dup = lg.append_as_leader(batch(8, 42, epoch=3), 2)
    assert dup.duplicate and dup.first_offset == 15
    lg.close()


def _header(pid: int, seq: int = 0) -> BatchHeader:
    return BatchHeader(base_offset=0, batch_length=70, partition_leader_epoch=0, magic=2, crc=0, attributes=0,
                       last_offset_delta=0, base_timestamp=0, max_timestamp=0, producer_id=pid, producer_epoch=0,
                       base_sequence=seq, record_count=1)


def test_the_process_bound_on_tracked_producers_is_kept_by_the_log_that_adds_them() -> None:
    """Producer ids are the client's to choose and each tracked one costs about 1 KB on every replica:
    a client writing under ever new ids must not grow the broker without end. Past the process's bound
    (producer.id.max.tracked) a log taking new producers forgets its own least recently active ones,
    never the ones just written, and other logs keep theirs."""
    budget = ProducerBudget(max_producers=100)
    quiet, flooded = ProducerStateManager(budget=budget), ProducerStateManager(budget=budget)
    for pid in range(100):
        quiet.update(_header(pid), pid)
    assert len(quiet) == 100 and not quiet.forgot_producers
    for pid in range(1000, 1050):  # a client inventing producer ids
        flooded.update(_header(pid), pid)
    assert len(quiet) == 100, "another log's producers were forgotten"
    assert len(flooded) == 1 and flooded.entry(1049) is not None and flooded.forgot_producers
    assert budget.forgotten == 49
    quiet.update(_header(7, seq=1), 100)  # a producer it tracks already: nothing new, nothing forgotten
    assert len(quiet) == 100
    quiet.update(_header(500), 101)  # a new one while over the bound: its oldest go
    assert quiet.entry(500) is not None and quiet.entry(0) is None and quiet.forgot_producers
    assert len(quiet) + len(flooded) <= 101


def test_a_producer_quiet_for_producer_id_expiration_ms_is_forgotten(tmp_path: Path) -> None:
    """Kafka's producer.id.expiration.ms (KIP-854): a producer whose last batch is that old is forgotten, and its
    next batch is answered UNKNOWN_PRODUCER_ID (the client restarts its sequence). Brook kept every producer until
    the count bound pushed it out, so a broker's state grew with every client restart for good."""
    from storage.log_manager import LogManager

    day = 86_400_000
    lm = LogManager([tmp_path], producer_expiration_ms=day)
    lm.startup()
    try:
        lg = lm.get_or_create_log("t", 0, topic_id="T1", overrides={})
        now = int(time.time() * 1000)
        lg.append_as_leader(make_batch(3, producer_id=7, producer_epoch=0, base_sequence=0, ts=now - day - 10), 0)
        lg.append_as_leader(make_batch(3, producer_id=8, producer_epoch=0, base_sequence=0, ts=now - day + 10), 0)
        assert lm.expire_producers(now) == 1
        assert lg.producer_state.entry(7) is None and lg.producer_state.entry(8) is not None
        with pytest.raises(errors.UnknownProducerIdError, match="no state for producer 7"):
            lg.append_as_leader(batch(7, 3), 0)
        assert lg.append_as_leader(batch(7, 0, epoch=1), 0).first_offset == 6  # the client's recovery
        assert lg.append_as_leader(batch(8, 3), 0).first_offset == 9  # the other goes on
        assert lm.expire_producers(now) == 0
    finally:
        lm.shutdown()
