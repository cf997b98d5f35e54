"""Bad input to the brook source fails with a clear error, found by an audit.

Options: every bad value is an INVALID_CONFIG naming the option and the value (cut short when
long), never a raw ValueError/RecursionError and never a value accepted at parse time that
cannot be a Kafka partition (int32), offset or timestamp (int64) or port. The executor: a topic
deleted after its range was planned is data loss (per failOnDataLoss), not a 30 s wait ending in
REQUEST_TIMED_OUT that advises raising kafkaConsumer.pollTimeoutMs. Batch offsets (found by a probe):
a starting offset after the ending one is the user's contradiction, refused whatever failOnDataLoss
says (it was reported as data loss, and skipped with failOnDataLoss=false), and an ending offset past
the high watermark is refused by the driver (a task waited kafkaConsumer.pollTimeoutMs for it).
"""

from __future__ import annotations

import logging
import time

import pytest

from client.types import ClusterMetadata, FetchResult, PartitionMetadata, TopicMetadata
from proto import errors
from spark_source import fetcher
from spark_source.fetcher import DataLossError, RangeTask, read_range
from spark_source.options import FetchSettings, parse_read_options, parse_write_options
from spark_source.source import _check_batch_ranges
from storage.record_batch import CODEC_NONE, RecordBatchBuilder

BASE = {"bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}
BATCH_BASE = {"bootstrap.servers": "127.0.0.1:9092", "assign": '{"t":[0]}'}
HUGE = "9" * 5000  # past Python's 4300-digit limit of int()


def _nested(depth: int) -> str:
    return '{"t":' + '{"a":' * depth + "1" + "}" * (depth + 1)


@pytest.mark.parametrize(
    ("options", "streaming", "named", "shown"),
    [
        # Raw ValueError / RecursionError before.
        ({**BASE, "startingOffsets": '{"t":{"0":' + HUGE + "}}"}, True, "startingOffsets", "over 4300 digits"),
        ({**BASE, "startingOffsets": _nested(100_000)}, True, "startingOffsets", "nested too deeply"),
        ({**BASE, "minOffsetsPerTrigger": "1", "maxTriggerDelay": HUGE + "ms"}, True, "maxTriggerDelay", "9999"),
        # Accepted before: values beyond what Kafka's int32 partitions / int64 offsets and timestamps hold.
        ({**BASE, "startingOffsets": '{"t":{"0":9223372036854775808}}'}, True, "startingOffsets",
         "9223372036854775808"),
        ({**BASE, "startingOffsets": '{"t":{"0":' + "9" * 4000 + "}}"}, True, "startingOffsets", "9999"),
        ({**BASE, "startingOffsetsByTimestamp": '{"t":{"0":18446744073709551616}}'}, True,
         "startingOffsetsByTimestamp", "18446744073709551616"),
        ({**BATCH_BASE, "endingOffsets": '{"t":{"0":9223372036854775808}}'}, False, "endingOffsets",
         "9223372036854775808"),
        ({**BASE, "startingOffsets": '{"t":{"2147483648":0}}'}, True, "startingOffsets", "2147483648"),
        ({"bootstrap.servers": "h:1", "assign": '{"t":[2147483648]}'}, True, "assign", "2147483648"),
        ({"bootstrap.servers": "h:1", "assign": '{"t":[99999999999]}'}, True, "assign", "99999999999"),
        ({"bootstrap.servers": "h:1", "assign": '{"t":[-1]}'}, True, "assign", "-1"),
        # int() takes underscores, other scripts' digits and spaces: "1_0" was read as partition 10.
        ({**BASE, "startingOffsets": '{"t":{"1_0":5}}'}, True, "startingOffsets", "1_0"),
        ({**BASE, "startingOffsets": '{"t":{" 1":5}}'}, True, "startingOffsets", " 1"),
        ({**BASE, "startingOffsets": '{"t":{"\u0661":5}}'}, True, "startingOffsets", "\u0661"),
        ({**BASE, "maxOffsetsPerTrigger": "1_000"}, True, "maxoffsetspertrigger", "1_000"),
        ({**BASE, "minOffsetsPerTrigger": "1", "maxTriggerDelay": "\u0665s"}, True, "maxTriggerDelay", "\u0665s"),
        # Two values for one partition: which one was meant?
        ({**BASE, "startingOffsets": '{"t":{"0":1,"0":2}}'}, True, "startingOffsets", "'0'"),
        ({**BASE, "startingOffsets": '{"t":{"0":1,"00":2}}'}, True, "startingOffsets", "'00'"),
        # A message that quoted the whole 5000-digit value.
        ({**BASE, "startingTimestamp": HUGE}, True, "startingtimestamp", "(5000 characters)"),
        ({**BASE, "failOnDataLoss": "x" * 5000}, True, "failondataloss", "(5000 characters)"),
        # Ports: ASCII digits 1..65535 ("²".isdigit() is True; gRPC dials 99999 modulo 65536).
        ({"bootstrap.servers": "h:\u00b2", "subscribe": "t"}, True, "bootstrap.servers", "h:\u00b2"),
        ({"bootstrap.servers": "h:99999", "subscribe": "t"}, True, "bootstrap.servers", "h:99999"),
        ({"bootstrap.servers": "h:1,h:0", "subscribe": "t"}, True, "bootstrap.servers", "h:0"),
        ({"bootstrap.servers": "h:\u0669\u0660\u0669\u0662", "subscribe": "t"}, True, "bootstrap.servers", "h:"),
    ],
)
def test_bad_read_option_is_one_clear_error(options: dict[str, str], streaming: bool, named: str, shown: str) -> None:
    with pytest.raises(errors.InvalidConfigError) as info:
        parse_read_options(options, streaming=streaming)
    message = str(info.value)
    assert f"option '{named}'" in message, message
    assert shown in message, message
    assert len(message) < 300, message[:500]


@pytest.mark.parametrize("servers", ["h:99999", "h:\u00b2", "h:0", "h"])
def test_bad_write_bootstrap_servers_is_one_clear_error(servers: str) -> None:
    with pytest.raises(errors.InvalidConfigError, match="option 'bootstrap.servers'"):
        parse_write_options({"bootstrap.servers": servers, "topic": "t"})


def test_good_values_at_the_limits_are_still_accepted() -> None:
    opts = parse_read_options(
        {"bootstrap.servers": "h:1,[::1]:65535", "assign": '{"t":[0,2147483647]}',
         "startingOffsets": '{"t":{"0":9223372036854775807,"2147483647":-2}}', "maxOffsetsPerTrigger": " +10 ",
         "minOffsetsPerTrigger": "1", "maxTriggerDelay": "007d"},
        streaming=True,
    )
    assert opts.subscription.assigned == (("t", 0), ("t", 2147483647))
    assert opts.starting.offsets == {("t", 0): 2**63 - 1, ("t", 2147483647): -2}
    assert opts.max_offsets_per_trigger == 10 and opts.max_trigger_delay_ms == 7 * 86_400_000
    # Leading zeros count towards int()'s 4300-digit limit (a raw ValueError before), not towards the value.
    zeros = parse_read_options({**BASE, "minOffsetsPerTrigger": "1", "maxTriggerDelay": "0" * 5000 + "5s"},
                               streaming=True)
    assert zeros.max_trigger_delay_ms == 5000
    stamps = parse_read_options({**BASE, "startingOffsetsByTimestamp": '{"t":{"007":9223372036854775807}}'},
                                streaming=True)
    assert stamps.starting.timestamps == {("t", 7): 2**63 - 1}
    assert parse_write_options({"bootstrap.servers": "h:09092"}).bootstrap_servers == "h:09092"


# ----------------------------------------------------------------------------- batch offsets the user gave

# The probe's topic "sp": partition 0 holds offsets 0..9 (high watermark 10), partition 1 offsets 0..4.
SP_HW = {("sp", 0): 10, ("sp", 1): 5}


def _batch_options(fail: bool, **given: str):  # type: ignore[no-untyped-def]
    return parse_read_options({"bootstrap.servers": "127.0.0.1:9092", "subscribe": "sp",
                               "failOnDataLoss": str(fail).lower(), **given}, streaming=False)


@pytest.mark.parametrize("fail", [True, False])
def test_beginning_after_the_ending_offset_the_user_gave_is_refused_not_data_loss(fail: bool) -> None:
    options = _batch_options(fail, startingOffsets='{"sp":{"0":8,"1":0}}', endingOffsets='{"sp":{"0":3,"1":5}}')
    with pytest.raises(errors.InvalidConfigError) as info:
        _check_batch_ranges({("sp", 0): 8, ("sp", 1): 0}, {("sp", 0): 3, ("sp", 1): 5}, SP_HW, options)
    message = str(info.value)
    assert "option 'startingOffsets': beginning offset 8 is after the ending offset 3" in message, message
    assert "option 'endingOffsets'" in message and "topic 'sp' partition 0" in message, message
    assert "went backwards" not in message, message


@pytest.mark.parametrize("fail", [True, False])
def test_starting_offset_past_the_high_watermark_is_refused(fail: bool) -> None:
    # endingOffsets latest: the end is the high watermark, 10.
    options = _batch_options(fail, startingOffsets='{"sp":{"0":999,"1":0}}')
    with pytest.raises(errors.InvalidConfigError) as info:
        _check_batch_ranges({("sp", 0): 999, ("sp", 1): 0}, dict(SP_HW), {}, options)
    message = str(info.value)
    assert "beginning offset 999 is after the ending offset 10 (latest: the high watermark)" in message, message
    assert "topic 'sp' partition 0" in message, message
    by_time = _batch_options(fail, startingOffsetsByTimestamp='{"sp":{"0":5,"1":5}}', endingOffsets='{"sp":{"0":3,"1":5}}')
    with pytest.raises(errors.InvalidConfigError, match="option 'startingOffsetsByTimestamp': beginning offset 7"):
        _check_batch_ranges({("sp", 0): 7, ("sp", 1): 0}, {("sp", 0): 3, ("sp", 1): 5}, SP_HW, by_time)


@pytest.mark.parametrize("fail", [True, False])
def test_ending_offset_past_the_high_watermark_is_refused_by_the_driver(fail: bool) -> None:
    options = _batch_options(fail, endingOffsets='{"sp":{"0":999,"1":5}}')
    with pytest.raises(errors.InvalidConfigError) as info:
        _check_batch_ranges({("sp", 0): 0, ("sp", 1): 0}, {("sp", 0): 999, ("sp", 1): 5}, SP_HW, options)
    message = str(info.value)
    assert "option 'endingOffsets': ending offset 999 for topic 'sp' partition 0" in message, message
    assert "high watermark 10" in message and "pollTimeoutMs" not in message, message
    # Below the log start (records removed) with no startingOffsets given: named as the ending offset's fault (it
    # blamed an option 'startingOffsets' that was never given).
    only_end = _batch_options(fail, endingOffsets='{"sp":{"0":3,"1":5}}')
    with pytest.raises(errors.InvalidConfigError) as info:
        _check_batch_ranges({("sp", 0): 6, ("sp", 1): 0}, {("sp", 0): 3, ("sp", 1): 5}, SP_HW, only_end)
    message = str(info.value)
    assert "option 'endingOffsets': ending offset 3 for topic 'sp' partition 0 is before the partition's earliest " \
        "offset 6" in message and "startingOffsets" not in message, message
    # Up to the high watermark is fine, and so is -1.
    ok = _batch_options(fail, endingOffsets='{"sp":{"0":10,"1":-1}}')
    assert _check_batch_ranges({("sp", 0): 2, ("sp", 1): 0}, SP_HW, SP_HW, ok) == {("sp", 0): 2, ("sp", 1): 0}


def test_offsets_from_the_cluster_that_went_backwards_are_still_data_loss() -> None:
    """earliest and latest both looked up, the log truncated or recreated in between: data loss, as before."""
    start, end = {("sp", 0): 8, ("sp", 1): 0}, {("sp", 0): 3, ("sp", 1): 5}
    with pytest.raises(DataLossError, match="went backwards"):
        _check_batch_ranges(start, end, {}, _batch_options(True))
    assert _check_batch_ranges(start, end, {}, _batch_options(False)) == {("sp", 0): 3, ("sp", 1): 0}


# ----------------------------------------------------------------------------- a deleted topic


class _DeletedTopicClient:
    """A ClusterClient whose partition answers UNKNOWN_TOPIC_OR_PARTITION (after ``batches``, if given)."""

    def __init__(self, topics: dict[str, list[int]], batches: list[bytes] | None = None) -> None:
        self.topics = topics
        self.batches = list(batches or [])
        self.fetches = 0
        self.metadata_calls = 0
        self.snapshot = ClusterMetadata("", -1, -1, {}, {}, [])

    def fetch(self, tp, offset: int, max_bytes: int, *, max_wait_ms: int = 0) -> FetchResult:  # type: ignore[no-untyped-def]
        self.fetches += 1
        if self.batches:
            return FetchResult(self.batches.pop(0), 100, 0)
        return FetchResult(b"", -1, -1, errors.UnknownTopicOrPartitionError(f"{tp} is not on this broker"))

    def metadata(self, topics: list[str] | None = None, *, refresh: bool = False,
                 timeout_ms: int | None = None) -> ClusterMetadata:
        self.metadata_calls += 1
        shown = {
            name: TopicMetadata(name, "id", False, {p: PartitionMetadata(name, p, 1, 0, (1,), (1,)) for p in parts})
            for name, parts in self.topics.items()
        }
        self.snapshot = ClusterMetadata("c", 1, 7, {}, shown, [])
        return self.snapshot

    def metadata_snapshot(self) -> ClusterMetadata:
        return self.snapshot

    def request_update(self) -> None:
        pass


def _use(monkeypatch: pytest.MonkeyPatch, client: _DeletedTopicClient) -> None:
    """Tasks fetch through ``client`` (fetcher._fetch_once is its one-request fetch)."""
    monkeypatch.setattr(fetcher, "_client", lambda settings: client)
    monkeypatch.setattr(fetcher, "_fetch_once", lambda c, tp, offset, settings: (c.fetch(
        tp, offset, settings.max_partition_fetch_bytes, max_wait_ms=settings.fetch_max_wait_ms), 1))


def _settings(*, fail_on_data_loss: bool) -> FetchSettings:
    # A short poll timeout: the old code's retries end in REQUEST_TIMED_OUT quickly instead of after 2 minutes.
    return FetchSettings("127.0.0.1:1", poll_timeout_ms=300, fail_on_data_loss=fail_on_data_loss)


def _batch(base: int, n: int) -> bytes:
    b = RecordBatchBuilder(CODEC_NONE, base_offset=base)
    for i in range(n):
        b.append(1_700_000_000_000 + i, None, f"v{base + i}".encode())
    return b.build()


def test_deleted_topic_is_data_loss_naming_the_partition_and_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _DeletedTopicClient({"other": [0]})
    _use(monkeypatch, client)
    with pytest.raises(DataLossError) as info:
        list(read_range(RangeTask("t", 0, 3, 10, _settings(fail_on_data_loss=True))))
    message = str(info.value)
    assert "t-0" in message and "topic no longer exists" in message and "offsets 3..9" in message, message
    assert "failOnDataLoss=false" in message and "pollTimeoutMs" not in message, message
    assert client.metadata_calls >= 1


def test_deleted_topic_without_fail_on_data_loss_skips_the_rest(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = _DeletedTopicClient({}, batches=[_batch(3, 4)])  # offsets 3..6 read, then the topic is gone
    _use(monkeypatch, client)
    with caplog.at_level(logging.WARNING, logger="spark_source.fetcher"):
        batches = list(read_range(RangeTask("t", 0, 3, 10, _settings(fail_on_data_loss=False))))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == [3, 4, 5, 6]
    assert any("t-0" in r.getMessage() and "offsets 7..9" in r.getMessage() for r in caplog.records), caplog.text


def test_partition_gone_from_an_existing_topic_is_data_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _DeletedTopicClient({"t": [0, 1]})  # recreated with fewer partitions
    _use(monkeypatch, client)
    with pytest.raises(DataLossError, match=r"t-5: the partition no longer exists"):
        list(read_range(RangeTask("t", 5, 0, 10, _settings(fail_on_data_loss=True))))


def test_unknown_partition_still_in_metadata_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader that has not applied the topic yet (or leadership moving): retried up to the poll timeout."""
    client = _DeletedTopicClient({"t": [0]})
    _use(monkeypatch, client)
    for fail in (True, False):
        with pytest.raises(errors.RequestTimedOutError, match="pollTimeoutMs"):
            list(read_range(RangeTask("t", 0, 0, 10, _settings(fail_on_data_loss=fail))))
    assert client.fetches > 2


@pytest.mark.slow
def test_topic_deleted_after_planning_on_a_real_cluster(brook) -> None:  # type: ignore[no-untyped-def]
    """The audit's reproduction: each task had read its first batch when the topic was deleted."""
    from client.admin import Admin

    topic = "deleted-after-planning"
    brook.create_topic(topic, 1, rf=3)
    brook.produce(topic, [b"a%d" % i for i in range(5)], partition=0)
    brook.produce(topic, [b"b%d" % i for i in range(5)], partition=0)  # a second batch: offsets 5..9
    assert brook.high_watermarks(topic) == {0: 10}

    def task(fail: bool) -> RangeTask:
        # max_partition_fetch_bytes=1: one batch per fetch. request.timeout.ms bounds the client's own
        # retries of a partition without a leader, before read_range sees the error.
        settings = FetchSettings(brook.bootstrap, max_partition_fetch_bytes=1, request_timeout_ms=2000,
                                 poll_timeout_ms=3000, fail_on_data_loss=fail)
        return RangeTask(topic, 0, 0, 10, settings)

    failing, skipping = read_range(task(True)), read_range(task(False))
    assert next(failing).column("offset").to_pylist() == list(range(5))
    assert next(skipping).column("offset").to_pylist() == list(range(5))
    with Admin(brook.bootstrap) as admin:
        admin.delete_topics([topic])
        admin.wait_for_brokers(timeout_ms=30_000)
    started = time.monotonic()
    assert list(skipping) == []
    with pytest.raises(DataLossError, match=rf"{topic}-0: the topic no longer exists, so offsets 5\.\.9"):
        list(failing)
    assert time.monotonic() - started < 20
