"""Option parsing and validation: a wrong or contradictory option names itself."""

from __future__ import annotations

import logging

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
        ({"kafka.group.id": " "}, "kafka.group.id"),
        ({"groupIdPrefix": ""}, "groupIdPrefix"),
        ({"kafka.no.such.setting": "1"}, "kafka.no.such.setting"),
        ({"minOffsetsPerTrigger": "0"}, "minoffsetspertrigger"),
        ({"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger"),
        ({"minOffsetsPerTrigger": "10", "maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        ({"endingTimestamp": "5"}, "endingTimestamp"),
        ({"endingOffsetsByTimestamp": '{"t":{"0":5}}'}, "endingOffsetsByTimestamp"),
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


# ----------------------------------------------------------------------------- issue 13 options

PATTERN_BASE = {"bootstrap.servers": "127.0.0.1:9092"}


def test_maxoffsetspertrigger_in_a_batch_query_warns_as_spark_does(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="spark_source.options"):
        opts = parse_read_options({**BASE, "maxOffsetsPerTrigger": "5", "minOffsetsPerTrigger": "2"}, streaming=False)
    assert opts.max_offsets_per_trigger == 5  # parsed (and range-checked), then unused by the batch reader
    assert "maxOffsetsPerTrigger option ignored in batch queries" in caplog.text
    assert "minOffsetsPerTrigger option ignored in batch queries" in caplog.text


def test_ending_by_timestamp_options() -> None:
    one = parse_read_options({**BASE, "endingTimestamp": "1700000000000"}, streaming=False)
    assert one.ending is not None and (one.ending.kind, one.ending.timestamp) == ("timestamp", 1700000000000)
    per = parse_read_options({**BASE, "endingOffsetsByTimestamp": '{"t":{"0":5,"1":6}}'}, streaming=False)
    assert per.ending is not None and per.ending.timestamps == {("t", 0): 5, ("t", 1): 6}
    both = {**BASE, "endingTimestamp": "5", "endingOffsets": "latest"}
    assert "give at most one" in _read_error(both, streaming=False)
    assert "< 0" in _read_error({**BASE, "endingOffsetsByTimestamp": '{"t":{"0":-5}}'}, streaming=False)


def test_min_offsets_and_trigger_delay() -> None:
    opts = parse_read_options({**BASE, "minOffsetsPerTrigger": "100", "maxTriggerDelay": "30s"}, streaming=True)
    assert (opts.min_offsets_per_trigger, opts.max_trigger_delay_ms) == (100, 30_000)
    default = parse_read_options({**BASE, "minOffsetsPerTrigger": "100"}, streaming=True)
    assert default.max_trigger_delay_ms == 15 * 60 * 1000  # Spark's default, 15m
    for text, ms in (("250ms", 250), ("5m", 300_000), ("2 minutes", 120_000), ("1h", 3_600_000), ("400", 400)):
        assert parse_read_options({**BASE, "minOffsetsPerTrigger": "1", "maxTriggerDelay": text},
                                  streaming=True).max_trigger_delay_ms == ms, text


def test_group_id_options(caplog: pytest.LogCaptureFixture) -> None:
    assert parse_read_options({**BASE, "kafka.group.id": "billing"}, streaming=True).group_id == "billing"
    a = parse_read_options({**BASE, "groupIdPrefix": "jobs"}, streaming=True).group_id
    b = parse_read_options({**BASE, "groupIdPrefix": "jobs"}, streaming=True).group_id
    assert a.startswith("jobs-") and b.startswith("jobs-") and a != b  # unique per query, as Spark's
    assert parse_read_options(BASE, streaming=True).group_id.startswith("spark-kafka-source-")
    with caplog.at_level(logging.WARNING, logger="spark_source.options"):
        parse_read_options({**BASE, "kafka.group.id": "g", "groupIdPrefix": "p"}, streaming=True)
    assert "groupIdPrefix is ignored" in caplog.text


def test_kafka_consumer_settings_pass_through(caplog: pytest.LogCaptureFixture) -> None:
    """kafka.* consumer settings that apply are used; those with no effect here are accepted with a warning."""
    with caplog.at_level(logging.WARNING, logger="spark_source.options"):
        opts = parse_read_options({**BASE, "kafka.fetch.max.wait.ms": "250", "kafka.request.timeout.ms": "5000",
                                   "kafka.session.timeout.ms": "10000", "kafka.max.poll.records": "10"},
                                  streaming=True)
    assert (opts.fetch.fetch_max_wait_ms, opts.fetch.request_timeout_ms) == (250, 5000)
    assert "kafka.session.timeout.ms" in caplog.text and "kafka.max.poll.records" in caplog.text
    assert "session.timeout.ms" in _read_error({**BASE, "session.timeout.ms": "1"})  # without the prefix: unknown
    assert "auto.offset.reset" in _read_error({**BASE, "kafka.auto.offset.reset": "earliest"})  # Spark refuses it too


@pytest.mark.parametrize(("pattern", "topic", "matches"), [
    ("orders", "orders", True),
    ("orders", "orders-eu", False),  # the whole name must match (Java's Matcher.matches), not a prefix
    ("orders", "old-orders", False),
    ("orders.*", "orders-eu", True),
    ("orders|payments", "payments", True),
    ("(?<region>eu|us)-orders", "eu-orders", True),  # Java named group syntax
    ("[a-z]+-\\d+", "topic-12", True),
    (".*", "__consumer_offsets", True),  # matched here, then internal topics are skipped at discovery
])
def test_subscribe_pattern_matches_the_whole_name(pattern: str, topic: str, matches: bool) -> None:
    sub = parse_read_options({**PATTERN_BASE, "subscribePattern": pattern}, streaming=True).subscription
    assert sub.matches(topic) is matches


@pytest.mark.parametrize("pattern", ["\\p{Lower}+", "\\Qa.b\\E", "[a-z&&[^x]]+", "(unclosed", " "])
def test_subscribe_pattern_java_only_or_invalid_is_named(pattern: str) -> None:
    assert "subscribePattern" in _read_error({**PATTERN_BASE, "subscribePattern": pattern})


# ----------------------------------------------------------------------------- kafka.sasl.jaas.config
# As Kafka's JaasConfig (a java.io.StreamTokenizer) reads it: values quoted or not, comments, any-case
# control flags; refused where Kafka refuses, naming the option and never repeating the password.

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
SASL = {**BASE, "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "SCRAM-SHA-512"}
SECRET = "S3cr3t-pw"  # must never appear in an error message


def _jaas(text: str) -> tuple[str | None, str | None]:
    security = parse_read_options({**SASL, "kafka.sasl.jaas.config": text}, streaming=True).fetch.security
    return security.sasl_username, security.sasl_password


@pytest.mark.parametrize(("text", "user", "password"), [
    (f"{SCRAM} required username=alice password={SECRET};", "alice", SECRET),  # unquoted: was an empty user
    (f'{SCRAM} required username="alice" password="{SECRET}";', "alice", SECRET),
    (f"{SCRAM} required username='alice' password={SECRET} ;", "alice", SECRET),  # single quotes, mixed
    (f"{SCRAM} REQUIRED\n  username = alice\n  password = p@ss!#%&*()[]{{}}<>?~`^|\\x ;", "alice", "p@ss!#%&*()[]{}<>?~`^|\\x"),
    (f'{SCRAM} required username="al ice" password="a\\"b\\\\c;=/d";', "al ice", 'a"b\\c;=/d'),
    (f'{SCRAM} required username="\\141\\154\\151ce" password="tab\\there";', "alice", "tab\there"),  # Java escapes
    (f"/* lead */ {SCRAM} optional // note\n username=alice /* mid */ password={SECRET};", "alice", SECRET),
    (f"kafkashaded.{SCRAM} Sufficient username=alice password={SECRET};", "alice", SECRET),  # a shaded client
    (f'"{SCRAM}" "required" "username"=alice password={SECRET};', "alice", SECRET),
    (f"{SCRAM} required username=bob username=alice password={SECRET};", "alice", SECRET),  # Kafka: the last wins
    (f"{SCRAM} required username=alice password={SECRET} extra=ignored;", "alice", SECRET),
    (f"{SCRAM} required username=älice password=密码;", "älice", "密码"),
])
def test_jaas_config_values_quoted_or_not(text: str, user: str, password: str) -> None:
    assert _jaas(text) == (user, password)


def test_explicit_sasl_username_and_password_take_precedence_over_the_jaas_config() -> None:
    opts = {**SASL, "kafka.sasl.username": "carol", "kafka.sasl.password": "pw",
            "kafka.sasl.jaas.config": f"{SCRAM} required username=alice password={SECRET};"}
    security = parse_read_options(opts, streaming=True).fetch.security
    assert (security.sasl_username, security.sasl_password) == ("carol", "pw")
    write = parse_write_options({"bootstrap.servers": "h:1", "kafka.security.protocol": "SASL_PLAINTEXT",
                                 "kafka.sasl.jaas.config": f"{SCRAM} required username=alice password={SECRET};"})
    assert (write.security.sasl_username, write.security.sasl_password) == ("alice", SECRET)


@pytest.mark.parametrize(("text", "why"), [
    (f"{SCRAM} username=alice password={SECRET};", "control flag"),  # no flag: Kafka refuses
    (f"{SCRAM} requried username=alice password={SECRET};", "control flag"),
    (f"{SCRAM} {SECRET} username=alice;", "control flag"),
    (f"{SCRAM}", "control flag"),
    (f"{SCRAM} required username=alice password={SECRET}", "does not end with ';'"),
    (f"{SCRAM} required username=alice password={SECRET}/x;", "does not end with ';'"),  # '/' starts a comment
    (f'{SCRAM} required username=alice password="{SECRET}', "does not end with ';'"),  # unclosed quote
    (f"{SCRAM} required username=alice password;", "'password' (at character 81) has no value"),
    (f"{SCRAM} required username=alice password=;", "'password' (at character 81) has no value"),
    (f"{SCRAM} required username alice password={SECRET};", "'username' (at character 66) has no value"),
    (f"{SCRAM} required username=alice {SECRET};", "the key at character 81 has no value"),
    ("", "no login module"),
    ("   // nothing\n", "no login module"),
    (f"; required password={SECRET};", "login module name is missing"),
    (f"{SCRAM} required username=a password={SECRET}; {SCRAM} required username=b password={SECRET};",
     "holds 2 login modules"),
    (f"org.apache.kafka.common.security.plain.PlainLoginModule required username=alice password={SECRET};",
     "'org.apache.kafka.common.security.plain.PlainLoginModule'"),
    (f"{SCRAM} required username=alice password={SECRET} tokenauth=true;", "tokenauth"),
    (f"{SCRAM} required password={SECRET};", "no username"),
    (f"{SCRAM} required username=alice;", "no password"),
    (f'{SCRAM} required username="" password={SECRET};', "empty username"),
])
def test_jaas_config_that_kafka_refuses_is_one_clear_error(text: str, why: str) -> None:
    message = _read_error({**SASL, "kafka.sasl.jaas.config": text})
    assert "option 'kafka.sasl.jaas.config'" in message, message
    assert why in message, message
    assert SECRET not in message, message
