"""Option parsing and validation: a wrong or contradictory option names itself."""

from __future__ import annotations

import pytest

from proto import errors
from spark_source.options import parse_read_options, parse_write_options

BASE = {"bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


def _read_error(opts: dict[str, str], *, streaming: bool = True) -> str:
    with pytest.raises(errors.InvalidConfigError) as info:
        parse_read_options(opts, streaming=streaming)
    return str(info.value)


def test_defaults_follow_the_kafka_source() -> None:
    stream = parse_read_options(BASE, streaming=True)
    assert stream.starting.kind == "latest" and stream.ending is None
    assert stream.fail_on_data_loss is True and stream.include_headers is False
    batch = parse_read_options(BASE, streaming=False)
    assert batch.starting.kind == "earliest" and batch.ending is not None and batch.ending.kind == "latest"


def test_kafka_prefix_and_case_are_accepted() -> None:
    opts = parse_read_options(
        {"kafka.bootstrap.servers": "h:1,h:2", "SUBSCRIBE": "a, b", "maxOffsetsPerTrigger": "10",
         "kafka.max.partition.fetch.bytes": "65536", "includeHeaders": "TRUE"},
        streaming=True,
    )
    assert opts.subscription.topics == ("a", "b")
    assert opts.max_offsets_per_trigger == 10
    assert opts.fetch.max_partition_fetch_bytes == 65536
    assert opts.include_headers is True


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"subscribePattern": "t.*"}, "subscribe/subscribePattern/assign"),
        ({"assign": '{"t":[0]}'}, "subscribe/subscribePattern/assign"),
        ({"maxOffsetsPerTrigger": "0"}, "maxoffsetspertrigger"),
        ({"maxOffsetsPerTrigger": "ten"}, "maxoffsetspertrigger"),
        ({"minPartitions": "-1"}, "minpartitions"),
        ({"failOnDataLoss": "yes"}, "failondataloss"),
        ({"startingOffsets": "newest"}, "startingOffsets"),
        ({"startingOffsets": '{"t":{"0":-3}}'}, "startingOffsets"),
        ({"startingOffsets": '{"t":{"x":1}}'}, "startingOffsets"),
        ({"startingOffsets": "{bad json"}, "startingOffsets"),
        ({"startingOffsets": "earliest", "startingOffsetsByTimestamp": '{"t":{"0":5}}'}, "startingOffsets"),
        ({"endingOffsets": "latest"}, "endingOffsets"),
        ({"auto.offset.reset": "earliest"}, "auto.offset.reset"),
        ({"kafka.group.id": "g"}, "kafka.group.id"),
        ({"subscibe": "typo"}, "subscibe"),
        ({"startingOffsetsByTimestampStrategy": "skip"}, "startingOffsetsByTimestampStrategy"),
    ],
)
def test_bad_streaming_option_is_named(extra: dict[str, str], named: str) -> None:
    message = _read_error({**BASE, **extra})
    assert named in message, message


def test_missing_subscription_and_servers() -> None:
    assert "subscribe/subscribePattern/assign" in _read_error({"bootstrap.servers": "h:1"})
    assert "bootstrap.servers" in _read_error({"subscribe": "t"})
    assert "bootstrap.servers" in _read_error({"bootstrap.servers": "nohostport", "subscribe": "t"})


def test_batch_only_rules() -> None:
    assert "startingOffsets" in _read_error({**BASE, "startingOffsets": "latest"}, streaming=False)
    assert "startingOffsets" in _read_error({**BASE, "startingOffsets": '{"t":{"0":-1}}'}, streaming=False)
    assert "endingOffsets" in _read_error({**BASE, "endingOffsets": "earliest"}, streaming=False)
    assert "endingOffsets" in _read_error({**BASE, "endingOffsets": '{"t":{"0":-2}}'}, streaming=False)
    assert "maxOffsetsPerTrigger" in _read_error({**BASE, "maxOffsetsPerTrigger": "5"}, streaming=False)
    ok = parse_read_options({**BASE, "endingOffsets": '{"t":{"0":7,"1":-1}}'}, streaming=False)
    assert ok.ending is not None and ok.ending.offsets == {("t", 0): 7, ("t", 1): -1}


def test_assign_and_offsets_json() -> None:
    opts = parse_read_options(
        {"bootstrap.servers": "h:1", "assign": '{"a":[1,0],"b":[2]}', "startingOffsets": '{"a":{"0":-2,"1":5}}'},
        streaming=True,
    )
    assert opts.subscription.assigned == (("a", 0), ("a", 1), ("b", 2))
    assert opts.starting.offsets == {("a", 0): -2, ("a", 1): 5}
    msg = _read_error({"bootstrap.servers": "h:1", "assign": '{"a":[0]}', "startingOffsets": '{"a":{"3":0}}'})
    assert "startingOffsets" in msg and "not assigned" in msg
    assert "assign" in _read_error({"bootstrap.servers": "h:1", "assign": '{"a":[]}'})
    assert "assign" in _read_error({"bootstrap.servers": "h:1", "assign": "[1]"})


def test_pattern_must_compile_and_matches_whole_name() -> None:
    assert "subscribePattern" in _read_error({"bootstrap.servers": "h:1", "subscribePattern": "t[("})
    sub = parse_read_options({"bootstrap.servers": "h:1", "subscribePattern": "ev.*"}, streaming=True).subscription
    assert sub.matches("events") and not sub.matches("xevents")


def test_timestamps() -> None:
    opts = parse_read_options({**BASE, "startingOffsetsByTimestamp": '{"t":{"0":1000}}'}, streaming=True)
    assert opts.starting.kind == "timestamps" and opts.starting.timestamps == {("t", 0): 1000}
    one = parse_read_options({**BASE, "startingTimestamp": "1000"}, streaming=True)
    assert one.starting.kind == "timestamp" and one.starting.timestamp == 1000
    assert "startingOffsetsByTimestamp" in _read_error({**BASE, "startingOffsetsByTimestamp": '{"t":{"0":-5}}'})


def test_write_options() -> None:
    w = parse_write_options({"kafka.bootstrap.servers": "h:1", "topic": "out", "checkpointLocation": "/x"})
    assert w.topic == "out" and w.bootstrap_servers == "h:1"
    for bad, named in (({"acks": "1"}, "acks"), ({"enable.idempotence": "false"}, "enable.idempotence"),
                       ({"compression.type": "brotli"}, "compression.type"), ({"topic": " "}, "topic"),
                       ({"value.serializer": "x"}, "value.serializer")):
        with pytest.raises(errors.InvalidConfigError) as info:
            parse_write_options({"bootstrap.servers": "h:1", **bad})
        assert named in str(info.value)
    with pytest.raises(errors.InvalidConfigError, match="bootstrap.servers"):
        parse_write_options({"topic": "x"})
