"""The `brook` CLI end to end against a real 3-node local cluster.

Lifecycle: create, describe, alter-config, add-partitions, delete. Every bad input: one clear
line on stderr, a non-zero exit, and nothing changed in the cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import pytest

from client.admin import Admin
from client.partitioner import default_partition
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster, free_port

pytestmark = pytest.mark.slow


def topics(brook) -> dict[str, dict]:
    r = brook("topic", "list", "-o", "json")
    assert r.code == 0, r
    return {t["name"]: t for t in r.json()}


def describe(brook, name: str) -> dict:
    r = brook("topic", "describe", name, "-o", "json")
    assert r.code == 0, r
    return r.json()


def overrides(desc: dict) -> dict[str, str]:
    return {c["name"]: c["value"] for c in desc["configs"] if not c["is_default"]}


def test_topic_lifecycle(brook) -> None:
    r = brook("topic", "create", "life", "-p", "2", "-r", "3", "-c", "retention.ms=60000")
    assert r.code == 0 and "created topic 'life'" in r.out, r
    d = describe(brook, "life")
    assert [p["partition"] for p in d["partitions"]] == [0, 1]
    for p in d["partitions"]:
        assert len(p["replicas"]) == 3 and p["leader"] in p["replicas"] and sorted(p["isr"]) == sorted(p["replicas"])
    assert overrides(d) == {"retention.ms": "60000"}
    assert topics(brook)["life"]["partitions"] == 2

    r = brook("topic", "alter-config", "life", "--set", "segment.bytes=1048576", "--delete", "retention.ms")
    assert r.code == 0, r
    assert overrides(describe(brook, "life")) == {"segment.bytes": "1048576"}

    r = brook("topic", "add-partitions", "life", "--count", "4")
    assert r.code == 0 and "now has 4 partitions" in r.out, r
    d = describe(brook, "life")
    assert len(d["partitions"]) == 4 and all(p["leader"] >= 0 for p in d["partitions"]), d

    r = brook("topic", "describe", "life")  # the human form renders too
    assert r.code == 0 and "Partitions" in r.out and "segment.bytes" in r.out, r

    r = brook("topic", "delete", "life")
    assert r.code == 0, r
    assert "life" not in topics(brook)


BAD_INPUTS = [
    # (argv, exit code, text the single error line must contain)
    (["topic", "describe", "nope"], 1, "nope"),
    (["topic", "create", "stable"], 1, "TOPIC_ALREADY_EXISTS"),
    (["topic", "create", "x1", "-p", "0"], 2, "--partitions"),
    (["topic", "create", "x2", "-r", "5"], 1, "INVALID_REPLICATION_FACTOR"),
    (["topic", "create", "bad name!"], 1, "INVALID_TOPIC_EXCEPTION"),
    (["topic", "create", "x3", "-c", "no.such.key=1"], 2, "no.such.key"),
    (["topic", "create", "x4", "-c", "retention.ms"], 2, "key=value"),
    # the controller's own checks, made before sending (they failed as operations, exit 1)
    (["topic", "create", "x6", "-c", "retention.ms=1_000"], 2, "retention.ms"),
    (["topic", "create", "x7", "-c", "cleanup.policy=" + "delete," * 40], 2, "longer than 256"),
    (["topic", "create", "x5", "--partitons", "3"], 2, "--partitons"),
    (["topic", "alter-config", "stable", "--set", "retention.ms=soon"], 2, "retention.ms"),
    (["topic", "alter-config", "stable", "--set", "retention.mss=1"], 2, "retention.mss"),
    (["topic", "alter-config", "stable", "--delete", "nope.key"], 2, "nope.key"),
    (["topic", "alter-config", "stable"], 2, "nothing to change"),
    (["topic", "alter-config", "nope", "--set", "retention.ms=1"], 1, "nope"),
    (["topic", "add-partitions", "stable", "--count", "1"], 2, "larger than the current"),
    (["topic", "add-partitions", "stable"], 2, "--count"),
    (["topic", "delete", "stable", "nope"], 1, "nope"),
    (["topic", "frobnicate"], 2, "frobnicate"),
    (["produce", "nope", "-v", "x"], 1, "nope"),
    (["consume", "stable", "-p", "9", "-e"], 1, "no partition 9"),
    (["group", "describe", "no-such-group"], 1, "no-such-group"),
    (["group", "seek", "g", "-t", "stable"], 2, "exactly one of"),
    (["-o", "yaml", "topic", "list"], 2, "yaml"),
]


@pytest.fixture(scope="module")
def stable_topic(ops_cluster: LocalCluster):
    """A topic the bad inputs aim at; its state is compared before and after."""
    from admin_cli.main import main as brook_main

    code = brook_main(["-b", ops_cluster.bootstrap_servers, "topic", "create", "stable", "-p", "2", "-r", "2",
                       "-c", "retention.ms=123456", "--if-not-exists"])
    assert code == 0
    return "stable"


@pytest.mark.parametrize(("argv", "code", "text"), BAD_INPUTS, ids=lambda v: " ".join(v) if isinstance(v, list)
                         else None)
def test_bad_input_is_one_line_nonzero_and_changes_nothing(brook, stable_topic: str, argv: list[str], code: int,
                                                           text: str) -> None:
    before_topics = set(topics(brook))
    before = describe(brook, stable_topic)
    r = brook(*argv)
    assert r.code == code, r
    assert len(r.err_lines) == 1, f"expected one error line, got: {r.err!r}"
    assert r.err_lines[0].startswith("error: ") and text in r.err_lines[0], r.err
    assert "Traceback" not in r.err + r.out
    after = describe(brook, stable_topic)
    assert (after["partitions"], overrides(after)) == (before["partitions"], overrides(before))
    assert set(topics(brook)) == before_topics


def test_unreachable_cluster_is_one_line(brook) -> None:
    r = brook("-b", f"127.0.0.1:{free_port()}", "--timeout", "1", "topic", "list")
    assert r.code == 1 and len(r.err_lines) == 1 and "cannot reach the cluster" in r.err, r


def test_real_console_script_typo_flag_and_help(ops_cluster: LocalCluster, brook) -> None:
    brook_bin = str(__import__("pathlib").Path(sys.executable).with_name("brook"))
    proc = subprocess.run([brook_bin, "topic", "list", "--outptu", "json"], capture_output=True, text=True,
                          timeout=60, env={"BROOK_BOOTSTRAP": ops_cluster.bootstrap_servers, "PATH": "/usr/bin"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc
    assert len(proc.stderr.strip().splitlines()) == 1 and "--outptu" in proc.stderr, proc.stderr
    proc = subprocess.run([brook_bin], capture_output=True, text=True, timeout=60,
                          env={"_BROOK_COMPLETE": "complete_bash", "COMP_WORDS": "brook topic alt", "COMP_CWORD": "2",
                               "PATH": "/usr/bin"})
    assert proc.stdout.split() == ["alter-config"], proc  # shell completion of subcommands
    for cmd in (["topic", "create"], ["topic", "list"], ["topic", "describe"], ["topic", "alter-config"],
                ["topic", "add-partitions"], ["topic", "delete"], ["cluster", "info"], ["cluster", "health"],
                ["cluster", "quorum"], ["group", "list"], ["group", "describe"], ["group", "seek"],
                ["group", "delete"], ["produce"], ["consume"]):
        r = brook(*cmd, "--help")
        assert r.code == 0 and "Examples:" in r.out, (cmd, r.out[-500:], r.err)


def test_produce_consume_round_trip(brook) -> None:
    assert brook("topic", "create", "console", "-p", "2", "-r", "3").code == 0
    r = brook("produce", "console", "-K", ":", "-H", "src=test", stdin="k1:v1\nk2:v2\nk3:v3\n")
    assert r.code == 0 and "produced 3 records" in r.out, r
    r = brook("consume", "console", "--from-beginning", "-e", "-o", "json")
    assert r.code == 0, r
    got = [__import__("json").loads(line) for line in r.out.splitlines()]
    assert sorted((g["key"], g["value"]) for g in got) == [("k1", "v1"), ("k2", "v2"), ("k3", "v3")], got
    assert all(g["headers"] == {"src": "test"} for g in got)
    r = brook("produce", "console", "-p", "1", "-k", "fixed", "-v", '{"n": 1}', "--value-format", "json")
    assert r.code == 0, r
    offset = r.json()["records"][0]["offset"] if r.out.startswith("{") else None
    r = brook("consume", "console", "-p", "1", "--offset", "0", "-e", "-F", "%p|%o|%k|%v")
    assert r.code == 0 and '1|' in r.out and 'fixed|{"n":1}' in r.out, r
    assert offset is None or offset >= 0
    r = brook("consume", "console", "--from-timestamp", str(int(time.time() * 1000) + 3_600_000), "-e")
    assert r.code == 0 and r.out == "", r  # nothing at or after a future time


def test_output_cut_short_by_its_reader_is_a_normal_end(brook, ops_cluster: LocalCluster) -> None:
    """`brook ... | head -1`: the command did its work, the reader went away; exit 0 and nothing on stderr. rich
    exited 1 without a word, so a script saw a failure for an ACL that was created (docs audit)."""
    assert brook("topic", "create", "piped", "-p", "1", "-r", "1").code == 0
    proc = subprocess.Popen([sys.executable, "-m", "admin_cli.main", "-b", ops_cluster.bootstrap_servers, "topic",
                             "describe", "piped"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert (proc.wait(60), err) == (0, ""), err


def test_group_commands(brook) -> None:
    assert brook("topic", "create", "grouped", "-p", "2", "-r", "2").code == 0
    assert brook("produce", "grouped", stdin="".join(f"m{i}\n" for i in range(6))).code == 0
    r = brook("consume", "grouped", "-g", "cli-group", "--from-beginning", "-n", "6", "-o", "json")
    assert r.code == 0 and len(r.out.splitlines()) == 6, r
    groups = {g["group"]: g for g in brook("group", "list", "-o", "json").json()}
    assert "cli-group" in groups, groups
    d = brook("group", "describe", "cli-group", "-o", "json").json()
    assert d["total_lag"] == 0 and sum(o["committed_offset"] for o in d["offsets"]) == 6, d
    r = brook("group", "seek", "cli-group", "-t", "grouped", "--to-earliest", "--dry-run", "-o", "json")
    assert r.code == 0 and all(o["offset"] == 0 for o in r.json()["offsets"]), r
    assert brook("group", "describe", "cli-group", "-o", "json").json()["total_lag"] == 0  # dry run: unchanged
    r = brook("group", "seek", "cli-group", "-t", "grouped", "--to-earliest")
    assert r.code == 0 and "note:" not in r.err, r
    # A group with no committed offsets is given these, as Kafka's --reset-offsets does, and told so.
    r = brook("group", "seek", "cli-grup", "-t", "grouped", "--to-earliest")
    assert r.code == 0 and "note: group cli-grup had no committed offsets for grouped" in r.err, r
    assert brook("group", "delete", "cli-grup").code == 0
    d = brook("group", "describe", "cli-group", "-o", "json").json()
    assert sum(o["committed_offset"] for o in d["offsets"]) == 0 and d["total_lag"] == 6, d
    r = brook("group", "delete", "cli-group")
    assert r.code == 0, r
    assert "cli-group" not in {g["group"] for g in brook("group", "list", "-o", "json").json()}


def test_group_delete_deletes_none_while_one_named_has_members(brook, ops_cluster: LocalCluster) -> None:
    """Before, `brook group delete idle busy` deleted idle, then failed on busy (NON_EMPTY_GROUP), and
    `brook group delete idle idle` deleted it and then failed saying it did not exist (audit)."""
    from waiting import wait_for

    from client.consumer import Consumer

    assert brook("topic", "create", "delete-groups", "-p", "1", "-r", "2").code == 0
    assert brook("produce", "delete-groups", "-v", "x").code == 0
    assert brook("consume", "delete-groups", "-g", "idle-group", "--from-beginning", "-n", "1").code == 0
    consumer = Consumer(bootstrap_servers=ops_cluster.bootstrap_servers, group_id="busy-group",
                        auto_offset_reset="earliest")
    try:
        consumer.subscribe(["delete-groups"])
        wait_for(lambda: consumer.poll(100) is not None and consumer.assignment(), 30, "busy-group's member assigned")
        r = brook("group", "delete", "idle-group", "busy-group")
        assert r.code == 1 and "NON_EMPTY_GROUP: busy-group has 1 members" in r.err and "nothing deleted" in r.err, r
        listed = {g["group"] for g in brook("group", "list", "-o", "json").json()}
        assert {"idle-group", "busy-group"} <= listed, f"a refused delete removed a group: {listed}"
    finally:
        consumer.close()
    r = brook("group", "delete", "idle-group", "idle-group")
    assert r.code == 0 and "deleted group idle-group" in r.out, r
    assert "idle-group" not in {g["group"] for g in brook("group", "list", "-o", "json").json()}


def test_group_remove_member_ends_a_static_members_place(brook, ops_cluster: LocalCluster) -> None:
    """A closed static member keeps its place for its session; `brook group remove-member` ends it now."""
    from waiting import wait_for

    from client.consumer import Consumer

    assert brook("topic", "create", "static-cli", "-p", "2", "-r", "2").code == 0
    consumer = Consumer(bootstrap_servers=ops_cluster.bootstrap_servers, group_id="static-cli",
                        group_instance_id="worker-1", session_timeout_ms=60_000, heartbeat_interval_ms=500,
                        auto_offset_reset="earliest")
    try:
        consumer.subscribe(["static-cli"])
        wait_for(lambda: consumer.poll(100) is not None and consumer.assignment(), 30, "worker-1 assigned")
    finally:
        consumer.close()  # static: no LeaveGroup

    def members() -> list[str | None]:
        return [m["instance_id"] for m in brook("group", "describe", "static-cli", "-o", "json").json()["members"]]
    assert members() == ["worker-1"]
    table = brook("group", "describe", "static-cli")
    assert "INSTANCE" in table.out and "worker-1" in table.out, table.out
    r = brook("group", "remove-member", "static-cli", "--instance", "worker-2")
    assert r.code == 1 and "no static member worker-2" in r.err and "worker-1" in r.err, r
    assert members() == ["worker-1"]  # refused: nothing removed
    r = brook("group", "remove-member", "static-cli", "--instance", "worker-1")
    assert r.code == 0 and "removed worker-1" in r.out, r
    assert members() == []


def test_cluster_info_quorum_and_health(brook, ops_cluster: LocalCluster) -> None:
    info = brook("cluster", "info", "-o", "json").json()
    assert sorted(b["node_id"] for b in info["brokers"]) == ops_cluster.broker_ids
    assert info["active_controller_id"] in ops_cluster.controller_ids
    # Each broker's partition replicas, of the most it takes (its descriptor limit / 12: it registered that).
    placed = sum(len(p.replicas) for p in ops_cluster.describe_cluster().partitions)
    assert sum(b["replicas"] for b in info["brokers"]) == placed
    assert all(b["partition_capacity"] and b["partition_capacity"] >= b["replicas"] for b in info["brokers"]), info
    q = brook("cluster", "quorum", "-o", "json").json()
    assert q["leader_id"] == info["active_controller_id"] and len(q["voters"]) == 3, q
    r = brook("cluster", "health")
    assert r.code == 0 and "healthy" in r.out, r


def test_perf_commands_run_the_benchmarks(brook, ops_cluster, tmp_path) -> None:
    r = brook("perf", "storage", "--dir", str(tmp_path), "--total-mb", "1", "--repeat", "1")
    assert r.code == 0 and "MB/s" in r.out, r
    r = brook("perf", "produce", "--topic", "perf-cli", "--num-records", "300", "--record-size", "64",
              "--partitions", "2", "--replication-factor", "3")
    assert r.code == 0 and "records/s" in r.out + r.err, r
    r = brook("perf", "consume", "--topic", "perf-cli", "--num-records", "300", "--timeout-ms", "5000")
    assert r.code == 0 and "records/s" in r.out + r.err, r
    # end to end: every record sent is seen by the tool's consumer process, with its latency
    r = brook("perf", "end-to-end", "--topic", "perf-e2e", "--num-records", "500", "--throughput", "1000",
              "--warmup-records", "10", "--partitions", "2", "--replication-factor", "3")
    assert r.code == 0 and "500 seen by the consumer" in r.out and "ms 99th" in r.out, r
    # --keys: keyed records, murmur2 spread (the keyless default sticks to a partition per batch)
    r = brook("perf", "produce", "--topic", "perf-keyed", "--num-records", "400", "--record-size", "16",
              "--partitions", "4", "--replication-factor", "3", "--keys", "8")
    assert r.code == 0 and "records/s" in r.out + r.err, r
    with Admin(ops_cluster.bootstrap_servers) as admin:
        ends = admin.list_offsets({TopicPartition("perf-keyed", p): "latest" for p in range(4)})
    counts = {tp.partition: offset for tp, (offset, _) in ends.items()}
    spread = Counter(default_partition(b"key-%d" % (i % 8), 4) for i in range(400))
    assert counts == {p: spread.get(p, 0) for p in range(4)}, (counts, spread)
    with pytest.raises(SystemExit) as refused:  # argparse's usage error, exit code 2
        brook("perf", "produce", "--topic", "perf-keyed", "--num-records", "1", "--keys", "-1")
    assert refused.value.code == 2
    # A typo is one error line naming --help, as in every other command (argparse printed its usage block), and
    # --help has examples.
    for argv, line in ((["produce", "--topc", "x"], "error: unrecognized arguments: --topc x (see: brook perf "
                                                    "produce --help)\n"),
                       (["storage", "--repeat", "x"], "error: argument --repeat: invalid int value: 'x' (see: brook "
                                                      "perf storage --help)\n")):
        proc = subprocess.run([sys.executable, "-m", "admin_cli.main", "-b", ops_cluster.bootstrap_servers, "perf",
                               *argv], capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stderr) == (2, line), proc
    for command in ("storage", "produce", "consume", "end-to-end"):
        proc = subprocess.run([sys.executable, "-m", "admin_cli.main", "perf", command, "--help"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and f"Examples:\n  brook perf {command}" in proc.stdout, proc
