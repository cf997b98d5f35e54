"""`brook` on bad input: one clear error line, the documented exit code, no traceback, nothing sent.

Covers the client properties file (size, encoding, what an error quotes), times on the command
line (digits, range), `brook produce` input that does not parse (checked up front for -v; for a
file or stdin the command stops at the bad line and says how many records went before it), and
float options given nan/inf. Parse-time checks run in-process with nothing listening at the
bootstrap address; the rest runs against the shared ops cluster (tests/ops/conftest.py).
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest

from admin_cli.main import main as brook_main
from admin_cli.partition import parse_replicas
from admin_cli.timeparse import TIMESTAMP_MS_MAX, parse_timestamp_ms
from client.security import PROPERTIES_FILE_BYTES_MAX, SecurityConfig, read_properties
from deploy.local.cluster import free_port
from proto import errors

ERROR_LINE_CHARS_MAX = 400  # an error line quotes at most ~80 characters of the input


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at the bootstrap address: a check that ran after dialling would say "cannot reach"."""
    monkeypatch.setenv("BROOK_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    monkeypatch.delenv("BROOK_COMMAND_CONFIG", raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """(exit code, the one error line); fails unless stderr is exactly one `error:` line, no traceback."""
    capsys.readouterr()
    code = brook_main(list(argv))
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert "Traceback" not in captured.err + captured.out, captured.err
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err[:2000]
    assert len(lines[0]) <= ERROR_LINE_CHARS_MAX, f"a {len(lines[0])}-character error line"
    return code, lines[0]


# ----------------------------------------------------------------------------- --command-config


def test_command_config_over_the_size_limit_is_refused(capsys: pytest.CaptureFixture[str], nowhere: None,
                                                       tmp_path: Path) -> None:
    big = tmp_path / "big.props"
    big.write_bytes(b"\0" * (2 * PROPERTIES_FILE_BYTES_MAX))  # one 2 MiB "line": it used to be echoed whole
    code, line = run(capsys, "--command-config", str(big), "topic", "list")
    assert code == 1 and f"larger than {PROPERTIES_FILE_BYTES_MAX} bytes" in line, line


def test_command_config_names_the_brokers_when_nothing_else_does(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """The file the local launcher writes carries bootstrap.servers; it was ignored for 127.0.0.1:9092."""
    monkeypatch.delenv("BROOK_BOOTSTRAP", raising=False)
    monkeypatch.delenv("BROOK_COMMAND_CONFIG", raising=False)
    port, other = free_port(), free_port()
    props = tmp_path / "client.properties"
    props.write_text(f"# as deploy/local writes it\nbootstrap.servers=127.0.0.1:{port}\n")
    code, line = run(capsys, "--timeout", "2", "--command-config", str(props), "topic", "list")
    assert code == 1 and f"127.0.0.1:{port}" in line and "9092" not in line, line
    code, line = run(capsys, "--timeout", "2", "--command-config", str(props), "-b", f"127.0.0.1:{other}",
                     "topic", "list")
    assert code == 1 and f"127.0.0.1:{other}" in line and f"127.0.0.1:{port}" not in line, line  # -b wins
    props.write_text("bootstrap.servers=127.0.0.1:70000\n")
    code, line = run(capsys, "--command-config", str(props), "topic", "list")
    assert code == 2 and "port must be 1..65535" in line, line


def test_command_config_keys_brook_does_not_use_are_named_in_a_warning(capsys: pytest.CaptureFixture[str],
                                                                        nowhere: None, tmp_path: Path) -> None:
    """As Kafka's tools warn of configs "supplied but not used": a misspelt key (or a Java-only one) was ignored
    without a word, and the command ran without the setting meant."""
    props = tmp_path / "client.properties"
    props.write_text("security.protocl=SSL\nssl.truststore.location=/etc/kafka/truststore.jks\n"
                     "ssl.ca.location=/nonexistent/ca.pem\n")
    capsys.readouterr()
    code = brook_main(["--timeout", "2", "--command-config", str(props), "topic", "list"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 1 and len(err) == 2, err
    assert err[0].startswith(f"warning: --command-config {props}: not used by brook: security.protocl, "
                             "ssl.truststore.location (it reads "), err[0]
    assert "ssl.ca.location" not in err[0].split("(it reads")[0], err[0]  # a key it uses is not named
    assert err[1].startswith("error: "), err[1]


def test_command_config_from_a_pipe_reads_no_more_than_the_limit(tmp_path: Path) -> None:
    """A FIFO (or /dev/zero, or `<(cmd)`) has st_size 0: only a bounded read stops it."""
    fifo = tmp_path / "props.fifo"
    os.mkfifo(fifo)
    written = []

    def writer() -> None:
        try:
            with fifo.open("wb") as f:
                for _ in range(4):
                    f.write(b"a=" + b"x" * PROPERTIES_FILE_BYTES_MAX + b"\n")
                    written.append(1)
        except BrokenPipeError:  # the reader stopped reading: the point of the test
            pass

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    with pytest.raises(errors.InvalidConfigError, match="larger than"):
        read_properties(fifo)
    t.join(10)
    assert len(written) < 4, "the whole stream was read"


def test_command_config_bad_line_is_quoted_short(capsys: pytest.CaptureFixture[str], nowhere: None,
                                                 tmp_path: Path) -> None:
    props = tmp_path / "long.props"
    props.write_text("security.protocol=PLAINTEXT\n" + "y" * 5000 + "\n")
    code, line = run(capsys, "--command-config", str(props), "topic", "list")
    assert code == 1 and f"{props}:2: expected key=value, got 'yyyy" in line and line.endswith("..."), line


def test_command_config_bad_password_line_is_not_echoed(capsys: pytest.CaptureFixture[str], nowhere: None,
                                                        tmp_path: Path) -> None:
    props = tmp_path / "colon.props"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.password: hunter2\n")  # Java's ':' separator
    code, line = run(capsys, "--command-config", str(props), "topic", "list")
    assert code == 1 and f"{props}:2: expected key=value" in line and "hunter2" not in line, line


def test_command_config_not_utf8_is_one_line(capsys: pytest.CaptureFixture[str], nowhere: None,
                                             tmp_path: Path) -> None:
    props = tmp_path / "latin1.props"
    props.write_bytes(b"security.protocol=PLAINTEXT\nsasl.username=j\xf6rg\n")
    code, line = run(capsys, "--command-config", str(props), "topic", "list")
    assert code == 1 and f"{props}:2: not UTF-8 text (byte 0xf6" in line, line


def test_command_config_with_a_bom_keeps_its_first_key(capsys: pytest.CaptureFixture[str], nowhere: None,
                                                       tmp_path: Path) -> None:
    """The first key after a byte-order mark used to be read as "\\ufeffsecurity.protocol" and ignored."""
    props = tmp_path / "bom.props"
    props.write_bytes("\ufeffsecurity.protocol=BOGUS\n".encode())
    code, line = run(capsys, "--command-config", str(props), "topic", "list")
    assert code == 1 and "security.protocol 'BOGUS' must be one of" in line, line


def test_pem_file_from_a_pipe_is_bounded(tmp_path: Path) -> None:
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)

    def writer() -> None:
        try:
            with fifo.open("wb") as f:
                f.write(b"-" * (2 * 1024 * 1024 + 1))
        except BrokenPipeError:
            pass

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    with pytest.raises(errors.InvalidConfigError, match="larger than"):
        SecurityConfig(protocol="SSL", ssl_ca_location=str(fifo)).channel_credentials()
    t.join(10)


# ----------------------------------------------------------------------------- times


BAD_TIMES = [
    ("²", "is not a time"),  # str.isdigit() says yes, int() says no
    ("١٢٣", "is not a time"),  # Arabic-Indic digits: int() would read them as 123
    ("99999999999999999999999", "is out of range"),  # beyond int64
    ("9" * 5000, "is out of range"),  # beyond what int() converts at all
    ("-999999999999999d", "is out of range"),
    ("-1", "is not a time"),
    ("0001-01-01", "is out of range"),  # before the epoch: a negative ListOffsets time means latest/earliest
    ("253402300800000", "is out of range"),  # after 9999-12-31T23:59:59.999Z
]


@pytest.mark.parametrize(("text", "problem"), BAD_TIMES, ids=[t[:24] for t, _ in BAD_TIMES])
@pytest.mark.parametrize("argv", [["consume", "t", "-e", "--from-timestamp"],
                                  ["group", "seek", "g", "-t", "t", "--to-timestamp"]], ids=lambda a: a[0])
def test_bad_times_are_one_usage_error(capsys: pytest.CaptureFixture[str], nowhere: None, argv: list[str],
                                       text: str, problem: str) -> None:
    code, line = run(capsys, *argv, text)
    assert code == 2 and f"{argv[-1]} " in line and problem in line, line


def test_time_range_bounds() -> None:
    assert parse_timestamp_ms("0", "--t") == 0
    assert parse_timestamp_ms("9999-12-31T23:59:59.999Z", "--t") == TIMESTAMP_MS_MAX
    assert parse_timestamp_ms("-1d", "--t", now_ms=86_400_000) == 0
    assert parse_timestamp_ms("2026-01-01", "--t") == 1_767_225_600_000


def test_an_unforeseen_value_error_is_one_line_too(capsys: pytest.CaptureFixture[str], nowhere: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The last resort in main(): a ValueError no command check caught is one line, exit 1, no traceback."""
    def broken(text: str, flag: str) -> int:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    monkeypatch.setattr("admin_cli.console.parse_timestamp_ms", broken)
    code, line = run(capsys, "consume", "t", "--from-timestamp", "0")
    assert code == 1 and "UnicodeDecodeError" in line and "invalid start byte" in line, line


# ----------------------------------------------------------------------------- float options


@pytest.mark.parametrize(("argv", "text"), [
    (["--timeout", "nan", "topic", "list"], "must be a number, got nan"),
    (["--timeout", "inf", "topic", "list"], "must be a finite number from 0.1 to 86400, got inf"),
    (["--timeout", "0.01", "topic", "list"], "must be a finite number from 0.1 to 86400"),
    (["partition", "move", "t", "0", "--replicas", "1", "--wait", "--wait-timeout", "nan"], "must be a number"),
    (["partition", "move", "t", "0", "--replicas", "1", "--wait", "--wait-timeout", "inf"], "finite number >= 1"),
    (["quota", "set", "--user", "alice", "--producer-byte-rate", "nan"], "must be a number"),
    (["quota", "set", "--user", "alice", "--request-rate", "inf"], "must be a finite number"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_float_options_refuse_nan_and_inf(capsys: pytest.CaptureFixture[str], nowhere: None, argv: list[str],
                                          text: str) -> None:
    code, line = run(capsys, *argv)
    assert code == 2 and text in line and "cannot reach" not in line, line


@pytest.mark.parametrize("replicas", ["1,,2", "1,2,", ",1", "", " ", "1_0", "1,-2", "x"])
def test_partition_move_refuses_an_empty_or_odd_replica(capsys: pytest.CaptureFixture[str], nowhere: None,
                                                       replicas: str) -> None:
    """`--replicas 1,,2` used to be read as [1, 2]: a lost broker id moved the partition to fewer replicas."""
    code, line = run(capsys, "partition", "move", "t", "0", "--replicas", replicas)
    assert code == 2 and "--replicas must be broker ids separated by commas" in line, line


def test_parse_replicas_reads_ids_in_order() -> None:
    assert parse_replicas("3,1,2") == [3, 1, 2]
    assert parse_replicas(" 3 , 1 ") == [3, 1]


@pytest.mark.parametrize(("argv", "text"), [
    # the controller refused these: a failed operation (exit 1), after connecting
    (["quota", "set", "--user", "bob", "--producer-byte-rate", "-5"], "must be > 0 and <= 1e+15, got -5"),
    (["quota", "set", "--default", "--request-rate", "0"], "must be > 0"),
    (["quota", "set", "--user", "bob", "--controller-mutation-rate", "2e15"], "got 2e+15"),
    # the producer refused it: exit 1, after the topic was looked up
    (["produce", "t", "-v", "x", "--compression", "zip"], "--compression must be one of none, gzip"),
    # checked before salting: scramp's own error was a traceback
    (["user", "create", "carol", "--password", "x", "-m", "bogus"], "unknown SCRAM mechanism 'BOGUS'"),
    (["user", "create", "carol", "--password", "x", "-m", "SCRAM-SHA3-512"], "unknown SCRAM mechanism"),
    (["consume", "t", "-g", ""], "--group must not be empty"),  # consumed as no group, silently
    (["-b", "[::1", "topic", "list"], "IPv6 address is written"),  # 'cannot resolve host', exit 1
    (["cluster", "health", "--max-quorum-lag", "-5"], "--max-quorum-lag"),
], ids=["negative-rate", "zero-rate", "huge-rate", "compression", "mechanism", "sha3-mechanism", "empty-group",
        "ipv6-bracket", "negative-lag"])
def test_bad_option_values_are_usage_errors(capsys: pytest.CaptureFixture[str], nowhere: None, argv: list[str],
                                            text: str) -> None:
    code, line = run(capsys, *argv)
    assert code == 2 and text in line and "cannot reach" not in line, line


def test_group_list_refuses_an_unknown_state(capsys: pytest.CaptureFixture[str], nowhere: None) -> None:
    code, line = run(capsys, "group", "list", "--state", "Bogus")
    assert code == 2 and "'Bogus' is not a group state" in line, line
    assert "Empty, Stable, PreparingRebalance, CompletingRebalance, Dead" in line, line


# ----------------------------------------------------------------------------- consume --format


@pytest.mark.parametrize(("fmt", "text"), [
    ("%z %v", "unsupported formatter %z"),  # used to print "%z" literally before every value
    ("%p:%o %K", "unsupported formatter %K"),
    ("%v 100%", "unsupported formatter a lone % at the end"),
])
def test_consume_refuses_an_unknown_format_token(capsys: pytest.CaptureFixture[str], nowhere: None, fmt: str,
                                                 text: str) -> None:
    code, line = run(capsys, "consume", "t", "-e", "-F", fmt)
    assert code == 2 and text in line and "%t %p %o %T %k %v %h %%" in line and "cannot reach" not in line, line


def test_every_format_token_check_format_takes_is_rendered() -> None:
    from admin_cli.console import FORMAT_TOKENS, Format, check_format, render
    from client.types import ConsumerRecord

    fmt = "".join(f"[%{t}]" for t in FORMAT_TOKENS) + "\\n"
    assert check_format(fmt) == fmt
    rec = ConsumerRecord("tp", 1, 2, 3, 0, b"k", b"v", (("h", b"x"),))
    assert render(rec, fmt, Format.text, Format.text) == "[tp][1][2][3][k][v][h=x][%]\n"


# ----------------------------------------------------------------------------- produce, before sending


@pytest.mark.parametrize(("argv", "text"), [
    (["-v", "00ff", "-v", "0a", "-v", "zz", "--value-format", "hex"], "-v: value 'zz' is not valid hex"),
    (["-v", "a:1", "-v", "b", "-K", ":"], "-v: no key separator ':' in 'b'"),
    (["-v", "x", "-k", "zz", "--key-format", "hex"], "--key 'zz' is not valid hex"),
    (["-v", "a", "-K", ""], "--key-separator must not be empty"),  # was "ValueError: empty separator", exit 1
], ids=["hex", "key-separator", "key", "empty-key-separator"])
def test_produce_values_are_checked_before_connecting(capsys: pytest.CaptureFixture[str], nowhere: None,
                                                      argv: list[str], text: str) -> None:
    code, line = run(capsys, "produce", "t", *argv)
    assert code == 2 and text in line and "cannot reach" not in line, line


# ----------------------------------------------------------------------------- produce, against the ops cluster


def _offsets_and_values(brook, topic: str) -> list[str]:
    r = brook("consume", topic, "--from-beginning", "-e", "--value-format", "hex", "-F", "%o %v\\n")
    assert r.code == 0, r
    return r.out.splitlines()


def _topic(brook, name: str) -> str:
    r = brook("topic", "create", name, "-p", "1", "-r", "3")
    assert r.code == 0, r
    return name


@pytest.mark.slow
def test_produce_values_all_checked_before_any_is_sent(brook) -> None:
    topic = _topic(brook, "inerr-values")
    r = brook("produce", topic, "-v", "00ff", "-v", "0a", "-v", "zz", "--value-format", "hex")
    assert r.code == 2 and len(r.err_lines) == 1 and "nothing produced" in r.err, r
    assert _offsets_and_values(brook, topic) == []  # the old code had written 00ff and 0a


@pytest.mark.slow
def test_produce_file_stops_at_a_bad_line_and_says_what_was_produced(brook, tmp_path: Path) -> None:
    topic = _topic(brook, "inerr-hex")
    lines = tmp_path / "hexlines.txt"
    lines.write_text("00ff\n0a\nzz\n0b\n")
    r = brook("produce", topic, "-f", str(lines), "--value-format", "hex")
    assert r.code == 1 and len(r.err_lines) == 1 and "Traceback" not in r.err, r
    assert (f"error: line 3 of {lines}: value 'zz' is not valid hex" in r.err
            and f"the 2 records before it were produced to '{topic}' (partitions 0), none after it" in r.err), r.err
    assert _offsets_and_values(brook, topic) == ["0 00ff", "1 0a"]


@pytest.mark.slow
def test_produce_file_not_utf8_stops_at_that_line(brook, tmp_path: Path) -> None:
    topic = _topic(brook, "inerr-utf8")
    lines = tmp_path / "latin1.txt"
    lines.write_bytes(b"a\n\nb\nj\xf6rg\nc\n")  # the empty line counts as a line, is not a record
    r = brook("produce", topic, "-f", str(lines))
    assert r.code == 1 and len(r.err_lines) == 1 and "Traceback" not in r.err, r
    assert f"line 4 of {lines}: not UTF-8 text (byte 0xf6 at column 2)" in r.err, r.err
    assert "the 2 records before it were produced" in r.err, r.err
    assert _offsets_and_values(brook, topic) == ["0 61", "1 62"]


@pytest.mark.slow
def test_produce_stdin_bad_first_line_is_a_usage_error(brook, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = _topic(brook, "inerr-first")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe\nok\n"), encoding="utf-8"))
    r = brook("produce", topic)
    assert r.code == 2 and len(r.err_lines) == 1 and "Traceback" not in r.err, r
    assert "line 1 of stdin: not UTF-8 text" in r.err and "nothing produced" in r.err, r.err
    assert _offsets_and_values(brook, topic) == []


@pytest.mark.slow
def test_produce_stdin_missing_key_separator_stops_there(brook) -> None:
    topic = _topic(brook, "inerr-sep")
    r = brook("produce", topic, "-K", ":", stdin="k1:v1\nno-separator\nk3:v3\n")
    assert r.code == 1 and len(r.err_lines) == 1, r
    assert ("line 2 of stdin: no key separator ':' in 'no-separator'; stopped there: the 1 record before it "
            "was produced") in r.err, r.err
    assert _offsets_and_values(brook, topic) == ["0 " + b"v1".hex()]


@pytest.mark.slow
def test_valid_inputs_still_work(brook) -> None:
    topic = _topic(brook, "inerr-ok")
    assert brook("produce", topic, stdin="a\nb\n").code == 0
    r = brook("consume", topic, "--from-timestamp", "0", "-e", "-F", "%v")
    assert r.code == 0 and r.out.split() == ["a", "b"], r
    r = brook("consume", topic, "--from-timestamp", "9999-12-31T23:59:59.999Z", "-e")  # the latest time allowed
    assert r.code == 0 and r.out == "", r


@pytest.mark.slow
def test_group_list_state_in_any_case(brook) -> None:
    """The broker matches states exactly: "empty" used to list nothing, as if no group were Empty."""
    topic = _topic(brook, "inerr-groups")
    assert brook("produce", topic, "-v", "x").code == 0
    r = brook("consume", topic, "-g", "inerr-group", "--from-beginning", "-n", "1")
    assert r.code == 0, r  # it committed and left: the group is Empty
    r = brook("group", "list", "--state", "empty", "--state", "STABLE", "-o", "json")
    assert r.code == 0 and "inerr-group" in [g["group"] for g in r.json()], r


# ----------------------------------------------------------------------------- acl filters


@pytest.mark.parametrize(("argv", "text"), [
    # a typo used to be sent as a filter no binding has: "no ACLs" / "0 deleted", exit 0
    (["acl", "list", "--topic", "t", "--resource-pattern-type", "litral"], "--resource-pattern-type 'litral'"),
    (["acl", "list", "--resource-pattern-type", "bogus"], "--resource-pattern-type 'bogus'"),  # was ignored
    (["acl", "list", "--principal", "bob"], "'User:<name>'"),
    (["acl", "delete", "--topic", "t", "--operation", "REED"], "--operation 'REED' is not one of"),
    (["acl", "delete", "--topic", "t", "--principal", "bob"], "'User:<name>'"),
    (["acl", "delete", "--topic", "t", "--resource-pattern-type", "prefix"], "--resource-pattern-type 'prefix'"),
    # what no binding can be, as `acl create` refuses it
    (["acl", "delete", "--group", "g", "--operation", "WRITE"], "GROUP only supports operations"),
    (["acl", "delete", "--cluster", "--resource-pattern-type", "prefixed"], "the CLUSTER resource is LITERAL"),
    (["acl", "list", "--topic", "*", "--resource-pattern-type", "prefixed"], "cannot be the wildcard"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_acl_filters_are_checked_before_connecting(capsys: pytest.CaptureFixture[str], nowhere: None,
                                                   argv: list[str], text: str) -> None:
    code, line = run(capsys, *argv)
    assert code == 2 and text in line and "cannot reach" not in line, line


@pytest.mark.parametrize(("argv", "text"), [
    (["--operation", "ALTER_CONFIGS", "--group", "g"],
     "resource type GROUP only supports operations READ, DESCRIBE, DELETE, ALL, not ALTER_CONFIGS"),
    (["--operation", "READ", "--cluster"], "resource type CLUSTER only supports operations CREATE, CLUSTER_ACTION"),
    (["--operation", "READ", "--operation", "IDEMPOTENT_WRITE", "--topic", "t"],
     "resource type TOPIC only supports operations READ, WRITE"),
], ids=["group-alter-configs", "cluster-read", "topic-idempotent-write"])
def test_acl_create_refuses_operations_the_resource_type_cannot_have(capsys: pytest.CaptureFixture[str],
                                                                     nowhere: None, argv: list[str],
                                                                     text: str) -> None:
    """As kafka-acls.sh (AclEntry.supportedOperations): such a binding could never allow anything."""
    code, line = run(capsys, "acl", "create", "--allow-principal", "User:bob", *argv)
    assert code == 2 and text in line and "cannot reach" not in line, line


@pytest.mark.slow
def test_acl_filters_any_and_match_find_bindings(brook) -> None:
    """The filters kafka-acls.sh takes: a pattern type in any case, MATCH, ANY; an --operation ANY."""
    t = "inerr-acl"
    r = brook("acl", "create", "--allow-principal", "User:bob", "--operation", "READ", "--topic", t)
    assert r.code == 0, r

    def listed(*argv: str) -> int:
        r = brook("-o", "json", "acl", "list", *argv)
        assert r.code == 0, r
        return sum(1 for b in r.json() if b["resource_name"] == t and b["principal"] == "User:bob")

    assert listed("--topic", t, "--resource-pattern-type", "LITERAL") == 1
    assert listed("--topic", t, "--resource-pattern-type", "any") == 1
    assert listed("--topic", t) == 1  # match, the default
    assert listed("--resource-pattern-type", "prefixed") == 0  # without a resource the filter applies too
    assert listed("--principal", "User:bob") == 1
    r = brook("-o", "json", "acl", "delete", "--topic", t, "--operation", "ALL")  # ALL is a binding's operation
    assert r.code == 0 and r.json() == [], r
    r = brook("-o", "json", "acl", "delete", "--topic", t, "--operation", "any", "--resource-pattern-type", "ANY")
    assert r.code == 0 and [b["operation"] for b in r.json()] == ["READ"], r
    assert listed("--topic", t) == 0


@pytest.mark.slow
def test_log_dirs_of_an_unknown_topic_is_an_error(brook) -> None:
    """It used to print empty tables and exit 0, as if the topic had no partition logs."""
    topic = _topic(brook, "inerr-logdirs")
    r = brook("cluster", "log-dirs", "--topic", topic, "--topic", "inerr-nosuch")
    assert r.code == 1 and r.out == "", r
    assert r.err_lines == ["error: UNKNOWN_TOPIC_OR_PARTITION: topic 'inerr-nosuch' does not exist"], r
    r = brook("-o", "json", "cluster", "log-dirs", "--topic", topic)
    assert r.code == 0, r
    assert {p["topic"] for b in r.json() for d in b["dirs"] for p in d["partitions"]} == {topic}, r
