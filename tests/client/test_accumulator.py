"""RecordAccumulator: batching by size and linger, futures, buffer.memory blocking, retry order."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from waiting import wait_for

from client import errors
from client.accumulator import RecordAccumulator, estimate_record_bytes
from client.producer import Producer
from client.sender import SENDER_TIMER_SLACK_NS
from client.types import TopicPartition
from storage.record_batch import decode_batch

TP = TopicPartition("t", 0)


def make_acc(**overrides) -> RecordAccumulator:
    params = dict(batch_size=1000, linger_ms=50, buffer_memory=1 << 20, compression=0, max_block_ms=200,
                  delivery_timeout_ms=60000, retry_backoff_ms=10)
    params.update(overrides)
    return RecordAccumulator(**params)


def append(acc: RecordAccumulator, value: bytes, tp: TopicPartition = TP, **kw):
    size = estimate_record_bytes(None, value, [])
    return acc.append(tp, 1000, None, value, [], size, **kw)


def test_batches_split_at_batch_size_and_full_batch_is_ready_before_linger() -> None:
    acc = make_acc()
    for _ in range(25):  # 25 * (100 + 21) bytes > 1000: several batches
        append(acc, b"x" * 100)
    dq = acc.batches[TP]
    assert len(dq) == 4, [b.record_count for b in dq]
    assert all(b.size_bytes <= 1000 for b in dq)
    assert sum(b.record_count for b in dq) == 25
    with acc.lock:
        ready, _ = acc.ready(time.monotonic(), ())
    assert ready == [TP], "a full batch must be ready without waiting for linger"


def test_open_batch_waits_for_linger() -> None:
    acc = make_acc(linger_ms=50)
    append(acc, b"v")
    with acc.lock:
        ready, wait_s = acc.ready(time.monotonic(), ())
    assert ready == [] and 0 < wait_s <= 0.05
    with acc.lock:
        ready, _ = acc.ready(time.monotonic() + 0.06, ())
    assert ready == [TP]


def test_flush_makes_open_batches_ready() -> None:
    acc = make_acc(linger_ms=10_000)
    append(acc, b"v")
    acc.flushes_in_progress += 1
    with acc.lock:
        ready, _ = acc.ready(time.monotonic(), ())
    assert ready == [TP]


def test_futures_resolve_with_per_record_offsets_and_callbacks() -> None:
    acc = make_acc()
    futures = [append(acc, b"r%d" % i) for i in range(3)]
    seen = []
    futures[2].add_callback(lambda md: seen.append(md.offset))
    with acc.lock:
        batch = acc.pop_head(TP)
    header, records = decode_batch(batch.build())
    assert [r.value for r in records] == [b"r0", b"r1", b"r2"]
    acc.complete(batch, 40, -1, None)
    assert [f.get(timeout=1).offset for f in futures] == [40, 41, 42]
    assert seen == [42]
    assert acc.used_bytes == 0, "completed batch must release its buffer memory"


def test_failed_batch_fails_every_future_with_the_error() -> None:
    acc = make_acc()
    futures = [append(acc, b"a"), append(acc, b"b")]
    errs = []
    futures[0].add_errback(errs.append)
    with acc.lock:
        batch = acc.pop_head(TP)
    acc.complete(batch, -1, -1, errors.InvalidTopicException("bad topic name"))
    for f in futures:
        with pytest.raises(errors.InvalidTopicException, match="bad topic name"):
            f.result(timeout=1)
    assert len(errs) == 1 and isinstance(errs[0], errors.InvalidTopicException)


def test_buffer_memory_blocks_then_raises_after_max_block_ms() -> None:
    acc = make_acc(buffer_memory=500, max_block_ms=150, batch_size=10_000)
    while acc.used_bytes + 121 + 61 <= 500:
        append(acc, b"x" * 100)
    start = time.monotonic()
    with pytest.raises(errors.BufferExhaustedError):
        append(acc, b"x" * 100)
    waited = time.monotonic() - start
    assert waited >= 0.14, f"send returned after {waited:.3f}s, before max.block.ms"


def test_buffer_memory_unblocks_when_a_batch_completes() -> None:
    acc = make_acc(buffer_memory=400, max_block_ms=5000, batch_size=10_000)
    append(acc, b"x" * 200)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(append(acc, b"y" * 200, TopicPartition("t", 1))))
    t.start()
    deadline = time.monotonic() + 2
    while acc.space_waiters == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert acc.space_waiters == 1 and not result, "second append should be blocked on buffer memory"
    with acc.lock:
        batch = acc.pop_head(TP)
    acc.complete(batch, 0, -1, None)
    t.join(2)
    assert result and result[0] is not None, "blocked append did not resume after memory was freed"


def test_reenqueue_puts_retries_first_in_sequence_order() -> None:
    acc = make_acc(batch_size=130)
    for i in range(4):
        append(acc, b"x" * 100 + bytes([i]))
    with acc.lock:
        b0, b1 = acc.pop_head(TP), acc.pop_head(TP)
    b0.base_sequence, b1.base_sequence = 0, 1
    acc.reenqueue(b1)
    acc.reenqueue(b0)
    order = list(acc.batches[TP])
    assert order[0] is b0 and order[1] is b1 and not order[2].retry


def test_retry_waits_for_backoff_and_for_in_flight_batches() -> None:
    acc = make_acc()
    append(acc, b"a")
    with acc.lock:
        batch = acc.pop_head(TP)
    now = time.monotonic()
    batch.last_attempt = now
    acc.reenqueue(batch)
    with acc.lock:
        assert acc.ready(now, ())[0] == []
        assert acc.ready(now + 0.02, [TP])[0] == [], "retry must wait while the partition has a batch in flight"
        assert acc.ready(now + 0.02, ())[0] == [TP]


def test_expired_batches_are_removed() -> None:
    acc = make_acc(delivery_timeout_ms=10)
    append(acc, b"a")
    with acc.lock:
        assert acc.expired(time.monotonic()) == []
        assert len(acc.expired(time.monotonic() + 1)) == 1


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"acks": 2}, "acks"),
        ({"compression.type": "brotli"}, "compression.type"),
        ({"batch.sise": 1}, "unknown producer config"),
        ({"linger.ms": -1}, "linger.ms"),
        ({"enable.idempotence": True, "acks": 1}, "acks must be all"),
        ({"enable.idempotence": True, "max.in.flight.requests.per.connection": 6}, "<= 5"),
        ({"delivery.timeout.ms": 1000, "request.timeout.ms": 30000}, "delivery.timeout.ms"),
        ({"compression.type": "zstd", "compression.zstd.level": 23}, "compression.zstd.level"),
        ({"compression.type": "gzip", "compression.gzip.level": 0}, "compression.gzip.level"),
        ({"compression.type": "lz4", "compression.lz4.level": "fast"}, "compression.lz4.level"),
    ],
)
def test_producer_config_validation(config: dict, match: str) -> None:
    with pytest.raises(errors.InvalidConfigError, match=match):
        Producer(config, bootstrap_servers="127.0.0.1:1")


def test_the_producer_compresses_at_its_compression_level() -> None:
    from storage.compression import compress
    from storage.record_batch import BATCH_HEADER_SIZE, CODEC_NONE, CODEC_ZSTD, RecordBatchBuilder

    values = [b"%05d " % i * 30 for i in range(40)]
    plain = RecordBatchBuilder(CODEC_NONE)
    for v in values:
        plain.append(1000, None, v)
    section = plain.build()[BATCH_HEADER_SIZE:]
    for level in (1, 19):
        p = Producer(bootstrap_servers="127.0.0.1:1", compression_type="zstd", compression_zstd_level=level,
                     max_block_ms=100)
        try:
            acc = p._accumulator
            assert acc.compression_level == level
            for v in values:
                append(acc, v)
            built = acc.batches[TP][0].builder.build()
            assert built[BATCH_HEADER_SIZE:] == compress(CODEC_ZSTD, section, level)
        finally:
            p.close(timeout=1)


def test_idempotence_defaults_follow_kafka() -> None:
    p = Producer(bootstrap_servers="127.0.0.1:1", acks=1, max_block_ms=100)
    try:
        assert p.idempotent is False, "acks=1 turns default idempotence off quietly"
    finally:
        p.close(timeout=1)


def test_sender_window_bounds_batches_written_after_an_unanswered_one() -> None:
    from client.cluster import ClusterClient
    from client.sender import Sender, SenderConfig

    acc = make_acc(batch_size=130)
    for i in range(8):
        append(acc, b"x" * 100 + bytes([i]))
    cluster = ClusterClient("127.0.0.1:1", request_timeout_ms=100)
    sender = Sender(cluster, acc, SenderConfig(acks=-1, request_timeout_ms=100, max_request_size=1 << 20,
                                               max_in_flight=5, retries=3, retry_backoff_ms=10, idempotent=True))
    sender.pid.producer_id, sender.pid.epoch, sender.pid.reset_needed = 9, 0, False
    # Brokers refuse a batch that overtook an earlier one (a new producer must start at
    # sequence 0), so up to max.in.flight batches go out from the first one on.
    with acc.lock:
        sent = [sender._drain_node(1, [TP]) for _ in range(6)]
    assert [len(s) for s in sent] == [1, 1, 1, 1, 1, 0], "a 6th batch must wait for the oldest to complete"
    assert [s[0].base_sequence for s in sent[:5]] == [0, 1, 2, 3, 4]
    # Sent while batch 0 was unanswered: an OUT_OF_ORDER_SEQUENCE for them may be the broker
    # handling requests out of order, hence retriable.
    assert [s[0].sent_behind for s in sent[:5]] == [False, True, True, True, True]
    acc.complete(sent[1][0], 1, -1, None)  # a later answer does not open the window...
    with acc.lock:
        assert sender._drain_node(1, [TP]) == []
    acc.complete(sent[0][0], 0, -1, None)  # ...the oldest one's does
    with acc.lock:
        nxt = sender._drain_node(1, [TP])
    assert len(nxt) == 1 and nxt[0].base_sequence == 5
    cluster.close()


def _answer(sender, batch, code: int) -> None:
    """Feed the sender a Produce response for one in-flight batch, as gRPC's thread would."""
    from proto import broker_pb2

    resp = broker_pb2.ProduceResponse()
    resp.partitions.add(topic=batch.tp.topic, partition=batch.tp.partition, error_code=code,
                        error_message=errors.code_name(code), base_offset=0 if code == 0 else -1,
                        log_append_time_ms=-1, log_start_offset=0)
    with sender.acc.lock:
        sender.in_flight_requests[1] = sender.in_flight_requests.get(1, 0) + 1
    sender._on_done(1, [batch], resp, None)


def test_sender_retries_reordered_batches_in_sequence_order_and_resets_a_broken_partition() -> None:
    from client.cluster import ClusterClient
    from client.sender import Sender, SenderConfig

    acc = make_acc(batch_size=130)
    for i in range(4):
        append(acc, b"x" * 100 + bytes([i]))
    cluster = ClusterClient("127.0.0.1:1", request_timeout_ms=100)
    sender = Sender(cluster, acc, SenderConfig(acks=-1, request_timeout_ms=100, max_request_size=1 << 20,
                                               max_in_flight=5, retries=10, retry_backoff_ms=0, idempotent=True))
    sender.pid.producer_id, sender.pid.epoch, sender.pid.reset_needed = 9, 0, False
    oos, unknown = errors.ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, errors.ErrorCode.UNKNOWN_PRODUCER_ID
    with acc.lock:
        b0, b1, b2 = (sender._drain_node(1, [TP])[0] for _ in range(3))
    # b2 and b1 overtook b0 on the broker: refused, queued again with their sequences, in order
    _answer(sender, b2, oos)
    _answer(sender, b1, unknown)
    assert [(b.base_sequence, b.retry) for b in list(acc.batches[TP])[:2]] == [(1, True), (2, True)]
    assert not sender.pid.resets and not b1.completion.event.is_set()
    _answer(sender, b0, 0)
    with acc.lock:
        assert sender._drain_node(1, [TP]) == [b1] and b1.base_sequence == 1, "retries keep their sequence"
    # b1's retry is refused although nothing earlier is pending: the broker lost the producer
    _answer(sender, b1, unknown)
    assert TP in sender.pid.resets
    with acc.lock:
        sender._reset_partitions()
        assert sender.pid.bump_needed, "a reset needs an epoch newer than the partition's"
        sender.pid.epoch, sender.pid.bump_needed = 1, False  # what InitProducerId(9, 0) answers
        sender._reset_partitions()
        assert not sender.pid.resets
    # b1, b2 (refused, so never written) and the unsent batch go out under the new epoch from
    # sequence 0; the former retries one at a time (acc.ready holds a retry while its
    # partition has a batch in flight)
    resent = []
    for _ in range(3):
        with acc.lock:
            ready, _wait = acc.ready(time.monotonic() + 1, sender.in_flight_batches.keys())
            assert ready == [TP], f"nothing ready with {len(acc.batches[TP])} batch(es) queued"
            out = sender._drain_node(1, [TP])
            ready_again, _wait = acc.ready(time.monotonic() + 1, sender.in_flight_batches.keys())
        assert len(out) == 1 and (out[0] is b2 or ready_again == []), "a retry must not overtake"
        resent.append(out[0])
        _answer(sender, out[0], 0)
    assert resent[:2] == [b1, b2]
    assert [(b.producer_epoch, b.base_sequence) for b in resent] == [(1, 0), (1, 1), (1, 2)]
    assert all(b.completion.event.is_set() and b.completion.error is None for b in [b0, *resent])
    assert not acc.batches[TP]
    cluster.close()


def test_send_to_unreachable_cluster_fails_after_max_block_ms() -> None:
    producer = Producer(bootstrap_servers="127.0.0.1:1", max_block_ms=300, retry_backoff_ms=20)
    try:
        start = time.monotonic()
        with pytest.raises(errors.BrookError, match="max.block.ms=300") as info:
            producer.send("t", b"v")
        elapsed = time.monotonic() - start
        assert info.value.retriable, f"an unreachable cluster is a retriable condition, got {info.value!r}"
        assert elapsed < 5, f"send() blocked {elapsed:.1f}s with max.block.ms=300"
    finally:
        producer.close(timeout=1)
    with pytest.raises(errors.ProducerClosedError):
        producer.send("t", b"v")


def test_complete_wakes_the_sender_after_the_batch_counts_as_completed() -> None:
    """The sender's window checks completion.event: a wakeup before it is set could be missed."""
    acc = make_acc()
    append(acc, b"v")
    with acc.lock:
        batch = acc.pop_head(TP)
    seen: list[bool] = []

    class Recording(threading.Condition):
        def notify(self, n: int = 1) -> None:
            seen.append(batch.completion.event.is_set())
            super().notify(n)

    acc.wakeup = Recording(acc.lock)
    acc.complete(batch, 0, -1, None)
    assert seen and seen[-1], "the last wakeup must come after the completion is set"


def test_callbacks_run_in_send_order_whatever_order_batches_complete_in() -> None:
    """Kafka's guarantee: callbacks of one partition's records run in send order, although responses
    (and retries) complete batches on several threads in any order. A later batch's future is done at
    once; only its callbacks wait for the earlier batch."""
    acc = make_acc()
    ran: list[bytes] = []
    futures = []
    for i in range(25):
        value = b"%02d" % i + b"x" * 98
        f = append(acc, value)
        f.add_callback(lambda md, v=value: ran.append(v[:2]))
        futures.append(f)
    first, second, third = list(acc.batches[TP])[:3]
    other = TopicPartition("t", 1)
    f_other = append(acc, b"o", tp=other)
    f_other.add_callback(lambda md: ran.append(b"other"))

    acc.complete(third, 20, -1, None)
    acc.complete(second, 10, -1, None)
    assert ran == [], "a later batch's callbacks ran before the first batch completed"
    assert futures[first.record_count + second.record_count].done()  # the outcome is known at once
    other_batch = acc.batches[other][0]
    acc.complete(other_batch, 0, -1, None)
    assert ran == [b"other"], "another partition is not held back"
    acc.complete(first, 0, -1, None)
    counts = [b.record_count for b in (first, second, third)]
    assert ran[1:] == [b"%02d" % i for i in range(sum(counts))], ran
    # Callbacks added after dispatch run at once.
    futures[0].add_callback(lambda md: ran.append(b"late"))
    assert ran[-1] == b"late"


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-writer", "python-writer"])
def test_a_refused_record_changes_nothing_and_gives_its_buffer_memory_back(
        compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # A timestamp whose delta from the batch's first record does not fit a varlong is refused at
    # send() with the record error, on the compiled path and the Python one alike; the batch and the
    # buffer memory are as they were.
    from client import accumulator
    from storage import record_batch

    if not compiled:
        monkeypatch.setattr(accumulator, "_FAST_APPEND", False)
        monkeypatch.setattr(record_batch, "_RecordsWriter", record_batch._PyRecordsWriter)
    elif not accumulator._FAST_APPEND:
        pytest.skip("storage._record_walk is not built")
    acc = make_acc()
    first = acc.append(TP, -(2**62), None, b"v", [], 22)
    used, batch = acc.used_bytes, acc.open_batches[TP]
    with pytest.raises(errors.InvalidRecordError, match="does not fit a varlong"):
        acc.append(TP, 2**62, None, b"v", [], 22)  # delta 2**63
    assert acc.used_bytes == used and acc.open_batches[TP] is batch and batch.record_count == 1
    later = acc.append(TP, None, None, b"now", [], 24)  # no timestamp: now
    assert abs(later._timestamp - time.time() * 1000) < 60_000 and later._delta == 1
    header, records = decode_batch(batch.build())
    assert [r.value for r in records] == [b"v", b"now"] and first._delta == 0


@pytest.mark.parametrize("codec", [0, 3])  # none, lz4
def test_a_batch_built_with_its_producer_state_is_the_stamped_batch(codec: int) -> None:
    """The sender builds an idempotent batch with its sequence in one pass: the same bytes as stamping
    the built batch afterwards (one checksum instead of two, no copies)."""
    from client.sender import stamp_producer_state

    state = (4242, 7, 2_000_000_000)
    built = []
    for with_state in (True, False):
        acc = make_acc(compression=codec, batch_size=100_000)
        for i in range(30):
            acc.append(TP, 1000 + i, b"k%d" % i, b"v" * i, [], 200)
        (batch,) = acc.batches[TP]
        built.append(batch.build(state) if with_state else stamp_producer_state(batch.build(), *state))
        assert batch.stamped == (state if with_state else None)
    assert built[0] == built[1]
    header, records = decode_batch(built[0])  # checks the CRC
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == state and len(records) == 30


@pytest.mark.parametrize("code", [errors.ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, errors.ErrorCode.NOT_LEADER_OR_FOLLOWER])
def test_a_retriable_answer_after_the_delivery_timeout_fails_the_batch_as_timed_out(code: int) -> None:
    """A batch out of time (not out of retries) when a retriable answer comes is told it timed out, as
    Kafka's producer tells it. A fault that outlasted delivery.timeout.ms used to fail idempotent batches
    with OutOfOrderSequenceNumber (a probe: 1, 67 and 165 records in three runs)."""
    from client.cluster import ClusterClient
    from client.sender import Sender, SenderConfig

    acc = make_acc()
    future = append(acc, b"x")
    cluster = ClusterClient("127.0.0.1:1", request_timeout_ms=100)
    sender = Sender(cluster, acc, SenderConfig(acks=-1, request_timeout_ms=100, max_request_size=1 << 20,
                                               max_in_flight=5, retries=10, retry_backoff_ms=0, idempotent=True))
    sender.pid.producer_id, sender.pid.epoch, sender.pid.reset_needed = 9, 0, False
    with acc.lock:
        (batch,) = sender._drain_node(1, [TP])
    batch.deadline = time.monotonic() - 1  # delivery.timeout.ms passed while the request was out
    _answer(sender, batch, code)
    assert batch.completion.event.is_set()
    err = batch.completion.error
    assert isinstance(err, errors.RequestTimedOutError), err
    assert "delivery.timeout.ms elapsed" in str(err) and errors.code_name(code) in str(err), err
    with pytest.raises(errors.RequestTimedOutError):
        future.get(timeout=1)
    cluster.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is a Linux thread attribute")
def test_the_sender_thread_sleeps_with_a_sharp_timer_and_leaves_other_threads_alone() -> None:
    """linger.ms is a timer of a millisecond or two: the default 50 us timer slack let each batch go out
    ~0.1 ms late. Only the sender's own thread is changed."""
    def slack(thread: threading.Thread) -> int:
        with open(f"/proc/{thread.native_id}/timerslack_ns") as f:  # a thread id names its /proc entry too
            return int(f.read())

    before = slack(threading.current_thread())
    producer = Producer(bootstrap_servers="127.0.0.1:1", max_block_ms=300)
    try:
        sender = producer._sender
        wait_for(lambda: slack(sender) == SENDER_TIMER_SLACK_NS, 10,
                 lambda: f"the sender thread's timer slack at 1 us; it is {slack(sender)} ns")
        assert slack(threading.current_thread()) == before, "the application's thread must keep its timer slack"
    finally:
        producer.close(timeout=1)
