"""Node config: parsing, precedence, Kafka key mapping, and refusal of bad config naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import KEYS, ConfigError, env_var, flatten, load_config
from proto.errors import InvalidConfigError

COMBINED = """
"process.roles" = "controller,broker"
"node.id" = 1
"cluster.id" = "test"
"listeners" = "BROKER://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
"controller.quorum.voters" = "1@127.0.0.1:19093:19193,2@127.0.0.1:19095:19195,3@127.0.0.1:19097:19197"
"controller.quorum.password" = "q7-Hv2pLx9-RtZ4mWc8NbK3s"
"log.dirs" = "/tmp/brook/a,/tmp/brook/b"
"metadata.log.dir" = "/tmp/brook/meta"
"metrics.listener" = "127.0.0.1:19100"
"""

NESTED = """
listeners = "BROKER://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
[process]
roles = "controller,broker"
[node]
id = 1
[cluster]
id = "test"
[controller.quorum]
voters = ["1@127.0.0.1:19093:19193", "2@127.0.0.1:19095:19195", "3@127.0.0.1:19097:19197"]
password = "q7-Hv2pLx9-RtZ4mWc8NbK3s"
[log]
dirs = ["/tmp/brook/a", "/tmp/brook/b"]
segment.bytes = 1048576
retention.hours = 2
[metadata.log]
dir = "/tmp/brook/meta"
[metrics]
listener = "127.0.0.1:19100"
"""


def write(tmp_path: Path, text: str, extra: str = "") -> Path:
    p = tmp_path / "node.toml"
    p.write_text(text + extra)
    return p


def refused(tmp_path: Path, text: str, overrides=(), env=None) -> ConfigError:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(p, overrides, env=env or {})
    return info.value


def test_combined_file_parses_with_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, COMBINED), env={})
    assert cfg.node_id == 1 and cfg.is_broker and cfg.is_controller
    assert cfg.log_dirs == [Path("/tmp/brook/a"), Path("/tmp/brook/b")]
    assert cfg.listeners["BROKER"].port == 19092
    assert cfg.voters[2].raft_port == 19195
    assert cfg.controller_endpoints == [("127.0.0.1", 19093), ("127.0.0.1", 19095), ("127.0.0.1", 19097)]
    assert cfg["num.partitions"] == 1 and cfg["auto.create.topics.enable"] is True
    assert cfg.metrics_address == ("127.0.0.1", 19100)
    assert cfg.quorum_password == "q7-Hv2pLx9-RtZ4mWc8NbK3s"


def test_nested_tables_and_arrays_equal_dotted_keys(tmp_path: Path) -> None:
    dotted = load_config(write(tmp_path, COMBINED), env={})
    (tmp_path / "n").mkdir()
    nested = load_config(write(tmp_path / "n", NESTED), env={})
    for key in ("process.roles", "node.id", "cluster.id", "log.dirs", "controller.quorum.voters",
                "metadata.log.dir", "listeners"):
        assert nested[key] == dotted[key], key
    # log.retention.hours is Kafka's coarse spelling of log.retention.ms
    assert nested["log.retention.ms"] == str(2 * 3600 * 1000)
    assert nested.topic_defaults()["retention.ms"] == str(2 * 3600 * 1000)
    assert nested.topic_defaults()["segment.bytes"] == "1048576"


def test_same_key_twice_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        flatten({"log.dirs": "/a", "log": {"dirs": "/b"}})
    assert info.value.key == "log.dirs"


def test_precedence_file_env_flag(tmp_path: Path) -> None:
    p = write(tmp_path, COMBINED, '"num.partitions" = 2\n')
    assert load_config(p, env={})["num.partitions"] == 2
    env = {env_var("num.partitions"): "3", "BROOK_BOOTSTRAP": "ignored:1"}
    assert env_var("num.partitions") == "BROOK_NUM_PARTITIONS"
    assert load_config(p, env=env)["num.partitions"] == 3
    assert load_config(p, ["num.partitions=4"], env=env)["num.partitions"] == 4
    cfg = load_config(p, ["log.retention.ms=1000", "log.retention.hours=5"], env={})
    assert cfg["log.retention.ms"] == "1000", "the finer unit wins, as in Kafka"
    cfg = load_config(p, ["log.retention.hours=5", "log.retention.minutes=7"], env={})
    assert cfg["log.retention.ms"] == str(7 * 60 * 1000), "minutes win over hours, as in Kafka"
    cfg = load_config(p, ["log.retention.minutes=7", "log.retention.hours=5"], env={})
    assert cfg["log.retention.ms"] == str(7 * 60 * 1000), "whatever the order they are given in"


def test_kafka_log_keys_map_to_topic_configs(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, COMBINED), [
        "log.segment.bytes=2048", "log.retention.bytes=4096", "log.cleanup.policy=compact,delete",
        "message.max.bytes=5000", "log.roll.ms=60000", "min.insync.replicas=1",
        "log.message.timestamp.type=LogAppendTime"], env={})
    td = cfg.topic_defaults()
    assert td == {"segment.bytes": "2048", "retention.bytes": "4096", "cleanup.policy": "compact,delete",
                  "max.message.bytes": "5000", "segment.ms": "60000", "min.insync.replicas": "1",
                  "message.timestamp.type": "LogAppendTime"}
    defaults = cfg.defaults()
    assert defaults["segment.bytes"] == "2048" and defaults["log.segment.bytes"] == "2048"
    assert defaults["num.partitions"] == "1" and defaults["replica.lag.time.max.ms"] == "30000"
    assert "node.id" not in defaults and "controller.quorum.password" not in defaults


def test_every_key_has_doc_and_valid_default() -> None:
    for name, d in KEYS.items():
        assert d.doc, name
    # a broker-only file with nothing but the required keys is valid: every default parses
    cfg = load_config(None, {"process.roles": "broker", "node.id": "7", "cluster.id": "c",
                             "listeners": "BROKER://127.0.0.1:1234",
                             "controller.quorum.voters": "1@127.0.0.1:1235:1236", "log.dirs": "/d"}, env={})
    assert cfg.is_broker and not cfg.is_controller


BAD_CASES = [
    # (extra config line or override, key the message must name)
    ('"num.partitons" = 3', "num.partitons"),
    ('"num.partitions" = "three"', "num.partitions"),
    # the metadata is a string of Kafka's offset record (an int16 length): past it, commits could not be written
    ('"offset.metadata.max.bytes" = 32768', "offset.metadata.max.bytes"),
    ('"num.partitions" = 0', "num.partitions"),
    ('"auto.create.topics.enable" = "maybe"', "auto.create.topics.enable"),
    ('"log.segment.bytes" = 5', "log.segment.bytes"),
    ('"log.cleanup.policy" = "shred"', "log.cleanup.policy"),
    ('"log.retention.ms" = "soon"', "log.retention.ms"),
    ('"metrics.listener" = "nowhere"', "metrics.listener"),
    ('"metrics.listener" = "127.0.0.1:19092"', "metrics.listener"),
    ('"broker.heartbeat.interval.ms" = 10000', "broker.heartbeat.interval.ms"),
    ('"group.consumer.heartbeat.interval.ms" = 45000', "group.consumer.heartbeat.interval.ms"),  # >= the timeout
    ('"group.consumer.heartbeat.interval.ms" = 10', "group.consumer.heartbeat.interval.ms"),
    ('"group.consumer.session.timeout.ms" = 0', "group.consumer.session.timeout.ms"),
    ('"min.insync.replicas" = 2', "min.insync.replicas"),
    ('"logging.level" = "LOUD"', "logging.level"),
    ('"event.loop.stall.warn.ms" = 5', "event.loop.stall.warn.ms"),
    ('"event.loop.stall.fence.ms" = -1', "event.loop.stall.fence.ms"),
    ('"event.loop.stall.fence.ms" = 30', "event.loop.stall.fence.ms"),  # would fence a healthy broker
    # A fetch answer (plus one whole batch beyond its bound) must fit the 128 MiB gRPC message.
    ('"fetch.max.bytes" = 134217728', "fetch.max.bytes"),
    ('"fetch.partition.max.bytes" = 67108864', "fetch.partition.max.bytes"),
    ('"replica.fetch.response.max.bytes" = 100000000', "replica.fetch.response.max.bytes"),
    ('"replica.fetch.max.bytes" = 0', "replica.fetch.max.bytes"),
    # Coarse-unit keys: refused with a traceback (exit 1) rather than one line, and with Kafka's bounds.
    ('"log.roll.hours" = 0', "log.roll.hours"),
    ('"log.roll.jitter.hours" = -1', "log.roll.jitter.hours"),
    ('"log.retention.hours" = 9999999999999999', "log.retention.hours"),
    ('"log.retention.minutes" = 99999999999999999', "log.retention.minutes"),
    # str.isdigit() takes "²", which int() then refuses (a traceback).
    ('"controller.quorum.voters" = "\u00b2@127.0.0.1:19093:19094"', "controller.quorum.voters"),
    ('"controller.quorum.voters" = "1@127.0.0.1:\u00b2:19094"', "controller.quorum.voters"),
    ('"max.connections.per.ip.overrides" = "10.0.0.7"', "max.connections.per.ip.overrides"),
    ('"max.connections.per.ip.overrides" = "10.0.0.7:many"', "max.connections.per.ip.overrides"),
    ('"max.connections.per.ip.overrides" = "10.0.0.7:-1"', "max.connections.per.ip.overrides"),
    ('"max.connections.per.ip.overrides" = "10.0.0.8:5,:5"', "max.connections.per.ip.overrides"),
    ('"max.connections.per.ip.overrides" = "10.0.0.7:\u00b2"', "max.connections.per.ip.overrides"),
    ('"socket.send.buffer.bytes" = 0', "socket.send.buffer.bytes"),
    ('"socket.receive.buffer.bytes" = -2', "socket.receive.buffer.bytes"),
]


@pytest.mark.parametrize(("line", "key"), BAD_CASES)
def test_bad_values_are_refused_naming_the_key(tmp_path: Path, line: str, key: str) -> None:
    err = refused(tmp_path, replace(COMBINED, line.split(" = ")[0].strip('"'), line.split(" = ", 1)[1]))
    assert err.key == key, str(err)
    assert f"'{key}'" in str(err)
    assert isinstance(err, InvalidConfigError)


def replace(text: str, key: str, value: str | None) -> str:
    lines = [ln for ln in text.splitlines() if not ln.startswith(f'"{key}"')]
    if value is not None:
        lines.append(f'"{key}" = {value}')
    return "\n".join(lines) + "\n"


CONTRADICTIONS = [
    ("node.id", "4", "controller.quorum.voters"),  # controller not among voters
    ("log.dirs", None, "log.dirs"),  # broker without log dirs
    ("listeners", '"CONTROLLER://127.0.0.1:19093"', "listeners"),  # broker without BROKER listener
    ("listeners", '"BROKER://127.0.0.1:19092"', "listeners"),  # controller without CONTROLLER listener
    ("listeners", '"BROKER://127.0.0.1:19092,CONTROLLER://127.0.0.1:19099"', "controller.quorum.voters"),
    # Extra named listeners are allowed, but each needs a security protocol.
    ("listeners", '"BROKER://127.0.0.1:19092,ADMIN://127.0.0.1:19099"', "listener.security.protocol.map"),
    ("listeners", '"BROKER://127.0.0.1:19093,CONTROLLER://127.0.0.1:19093"', "listeners"),
    ("controller.quorum.password", '"s3cret"', "controller.quorum.password"),  # a weak password
    ("metadata.log.dir", None, "metadata.log.dir"),
    ("process.roles", '"broker,zookeeper"', "process.roles"),
    ("process.roles", None, "process.roles"),
    ("cluster.id", None, "cluster.id"),
    ("controller.quorum.voters", '"1@127.0.0.1:19093"', "controller.quorum.voters"),
    ("controller.quorum.voters", '"1@127.0.0.1:19093:19093"', "controller.quorum.voters"),
    ("controller.quorum.voters", '"1@127.0.0.1:19093:19193,1@127.0.0.1:19095:19195"', "controller.quorum.voters"),
    ("controller.quorum.voters", '"1@127.0.0.1:19093:19192"', "metrics.listener"),  # raft port != others
]


@pytest.mark.parametrize(("key", "value", "named"), CONTRADICTIONS)
def test_contradictory_config_is_refused_naming_the_key(tmp_path: Path, key: str, value: str | None,
                                                        named: str) -> None:
    text = replace(COMBINED, key, value)
    if named == "metrics.listener":
        text = replace(text, "metrics.listener", '"127.0.0.1:19192"')
    err = refused(tmp_path, text)
    assert err.key == named, str(err)
    assert named in str(err)


def test_loopback_only_quorum_needs_a_password_too(tmp_path: Path) -> None:
    # Every local user reaches a loopback quorum port, and the port runs pickles.
    text = replace(COMBINED, "controller.quorum.password", None)
    err = refused(tmp_path, text)
    assert err.key == "controller.quorum.password" and "is required" in str(err), str(err)


def test_voters_off_loopback_need_a_password(tmp_path: Path) -> None:
    text = replace(COMBINED, "controller.quorum.password", None)
    text = replace(text, "controller.quorum.voters",
                   '"1@127.0.0.1:19093:19193,2@10.0.0.2:19095:19195,3@10.0.0.3:19097:19197"')
    err = refused(tmp_path, text)
    assert err.key == "controller.quorum.password" and "10.0.0.2:19195" in str(err), str(err)


def test_broker_only_node_needs_no_password(tmp_path: Path) -> None:
    text = replace(COMBINED, "controller.quorum.password", None)
    text = replace(text, "process.roles", '"broker"')
    text = replace(text, "node.id", "4")
    text = replace(text, "listeners", '"BROKER://127.0.0.1:19092"')
    p = tmp_path / "b.toml"
    p.write_text(text)
    cfg = load_config(p, env={})
    assert cfg.is_broker and not cfg.is_controller


def test_broker_node_listed_as_voter_is_refused(tmp_path: Path) -> None:
    text = replace(COMBINED, "process.roles", '"broker"')
    text = replace(text, "listeners", '"BROKER://127.0.0.1:19092"')
    err = refused(tmp_path, text)
    assert err.key == "node.id", str(err)


def test_bad_env_and_override_name_the_key(tmp_path: Path) -> None:
    p = write(tmp_path, COMBINED)
    with pytest.raises(ConfigError) as info:
        load_config(p, env={"BROOK_NUM_PARTITIONS": "x"})
    assert info.value.key == "num.partitions" and "BROOK_NUM_PARTITIONS" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(p, ["no-equals-sign"], env={})
    assert "key=value" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(p, ["log.dir=/x"], env={})
    assert info.value.key == "log.dir" and "did you mean 'log.dirs'" in str(info.value)


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml", env={})
    assert "does not exist" in str(info.value)
    err = refused(tmp_path, "this is = = not toml")
    assert "not valid TOML" in str(err)
    err = refused(tmp_path, COMBINED + '"node.id" = 2\n')
    assert "node.id" in str(err)  # TOML itself refuses duplicate keys; the message names it


def test_settings_objects_carry_the_config(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, COMBINED), ["controller.quorum.election.timeout.ms=300",
                                                  "log.segment.bytes=4096", "broker.rack=r1"], env={})
    cs = cfg.controller_settings()
    assert cs.node_id == 1 and cs.cluster_id == "test" and cs.password == "q7-Hv2pLx9-RtZ4mWc8NbK3s"
    assert cs.voters[3].raft_port == 19197 and cs.voters[3].grpc_port == 19097
    assert cs.data_dir == Path("/tmp/brook/meta")
    assert cs.raft_timing.election_timeout_min_s == 0.3 and cs.raft_timing.election_timeout_max_s == 0.75
    assert cs.defaults["segment.bytes"] == "4096"
    bs = cfg.broker_settings()
    assert (bs.host, bs.port, bs.rack) == ("127.0.0.1", 19092, "r1")
    assert bs.log_dirs == [Path("/tmp/brook/a"), Path("/tmp/brook/b")]
    assert bs.controller_endpoints == [("127.0.0.1", 19093), ("127.0.0.1", 19095), ("127.0.0.1", 19097)]
    assert bs.defaults["log.segment.bytes"] == "4096" and bs.defaults["segment.bytes"] == "4096"
    default_timing = load_config(write(tmp_path, COMBINED), env={}).controller_settings().raft_timing
    from metadata_quorum.raft import RaftTiming
    assert default_timing == RaftTiming(), "unset keys leave the quorum's own timing alone"
