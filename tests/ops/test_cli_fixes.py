"""`brook` CLI behaviour fixed by issue 13 (part 2), end to end.

Parse-time checks run in-process without a cluster; connection failures and signals use
the real console script in a real process; the rest runs against the shared 3-node ops
cluster (tests/ops/conftest.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from waiting import wait_for

from admin_cli.main import main as brook_main
from deploy.local.cluster import LocalCluster, free_port

BROOK_BIN = str(Path(sys.executable).with_name("brook"))
README = Path(__file__).resolve().parents[2] / "README.md"
SESSION_TIMEOUT_MS = 45_000  # the consumer default `brook consume -g` runs with


def run_in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = brook_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_bin(*argv: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    full_env = {"PATH": "/usr/bin:/bin", **(env or {})}
    return subprocess.run([BROOK_BIN, *argv], capture_output=True, text=True, timeout=timeout_s, env=full_env)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_in_process(capsys, "--version")
    assert code == 0 and out.strip() == f"brook {metadata.version('brook')}", (out, err)


PARSE_ERRORS = [
    # (argv, env, text the one error line must contain)
    (["-b", "127.0.0.1:70000", "topic", "list"], {}, "port must be 1..65535"),
    (["topic", "list", "-b", "127.0.0.1:0"], {}, "port must be 1..65535"),
    (["topic", "list"], {"BROOK_BOOTSTRAP": "127.0.0.1:99999"}, "BROOK_BOOTSTRAP"),
    (["-b", "no-port", "topic", "list"], {}, "not host:port"),
    (["topic", "create", "x", "-p", "2147483648"], {}, "--partitions"),
    (["topic", "create", "x", "-r", "-2"], {}, "--replication-factor"),
    (["topic", "add-partitions", "x", "--count", "99999999999"], {}, "--count"),
    (["group", "seek", "g", "-t", "x", "--to-offset", "1e20"], {}, "--to-offset"),
    (["group", "seek", "g", "-t", "x", "--to-offset", "100000000000000000000"], {}, "--to-offset"),
    (["group", "seek", "g", "-t", "x", "-p", "-1", "--to-earliest"], {}, "--partition"),
    (["consume", "x", "--offset", "-1"], {}, "--offset"),
    (["consume", "x", "-p", "4294967296"], {}, "--partition"),
    (["produce", "x", "-p", "2147483648", "-v", "v"], {}, "--partition"),
    (["--timeout", "1e12", "topic", "list"], {}, "--timeout"),
]


@pytest.mark.parametrize(("argv", "env", "text"), PARSE_ERRORS,
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_out_of_range_options_are_one_usage_error(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                  env: dict[str, str], text: str) -> None:
    # Nothing listens at the default bootstrap: a check that ran after dialling would say "cannot reach".
    monkeypatch.setenv("BROOK_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, out, err = run_in_process(capsys, *argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], err
    assert "Traceback" not in err + out and "cannot reach" not in err


@pytest.mark.parametrize("bootstrap", [f"127.0.0.1:{free_port()}", "brook-no-such-host.invalid:9092",
                                       f"brook-no-such-host.invalid:9092,127.0.0.1:{free_port()}"],
                         ids=["refused", "unresolvable", "unresolvable-then-refused"])  # the same in every worker
def test_refused_or_unresolvable_bootstrap_fails_at_once(bootstrap: str) -> None:
    """With --timeout 120 the answer must come long before the deadline (not after retrying until it)."""
    started = time.monotonic()
    proc = run_bin("-b", bootstrap, "--timeout", "120", "topic", "list", timeout_s=300)
    elapsed_s = time.monotonic() - started
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc
    assert "cannot reach the cluster" in lines[0], lines
    assert ("connection refused" in lines[0]) or ("cannot resolve host" in lines[0]), lines
    assert elapsed_s < 60, f"took {elapsed_s:.1f} s: the command waited for its --timeout"


@pytest.mark.parametrize("argv", [["perf", "produce", "-n", "10"], ["perf", "consume", "-n", "10"],
                                  ["consume", "orders", "-e"], ["produce", "orders", "-v", "x"]], ids=" ".join)
def test_other_commands_fail_at_once_too(argv: list[str]) -> None:
    started = time.monotonic()
    proc = run_bin("-b", f"127.0.0.1:{free_port()}", "--timeout", "120", *argv, timeout_s=300)
    elapsed_s = time.monotonic() - started
    assert proc.returncode == 1 and "connection refused" in proc.stderr, proc
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert elapsed_s < 60, f"took {elapsed_s:.1f} s: the command waited for its --timeout"


@pytest.mark.parametrize("argv", [["--help"], ["topic", "--help"], ["group", "seek", "--help"]], ids=" ".join)
def test_help_cut_short_by_its_reader_is_a_normal_end(argv: list[str]) -> None:
    """`brook --help | head -1`: typer prints help through a rich console of its own, which answered the reader
    going away with exit 1 (a command's output cut short already ended with 0)."""
    proc = subprocess.Popen([BROOK_BIN, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert (proc.wait(60), err) == (0, ""), err


# ----------------------------------------------------------------------------- against the ops cluster


@pytest.fixture(scope="module")
def filled_topic(ops_cluster: LocalCluster) -> str:
    code = brook_main(["-b", ops_cluster.bootstrap_servers, "topic", "create", "fixes", "-p", "2", "-r", "3",
                       "--if-not-exists"])
    assert code == 0
    code = brook_main(["-b", ops_cluster.bootstrap_servers, "produce", "fixes", "-p", "0", "-v", "a", "-v", "b",
                       "-v", "c"])
    assert code == 0
    return "fixes"


@pytest.mark.slow
def test_consume_offset_past_the_end_says_so(brook, filled_topic: str) -> None:
    r = brook("consume", filled_topic, "-p", "0", "--offset", "999999", "-e")
    assert r.code == 0 and r.out == "", r
    assert "offset 999999 is past the end of fixes-0 (end offset 3)" in r.err, r.err
    r = brook("consume", filled_topic, "-p", "0", "--offset", "1", "-e", "-F", "%o")
    assert r.code == 0 and r.out.split() == ["1", "2"] and "past the end" not in r.err, r


@pytest.mark.slow
def test_new_group_says_where_it_starts(brook, filled_topic: str) -> None:
    r = brook("consume", filled_topic, "-g", "fresh-group", "--idle-timeout-ms", "1500")
    assert r.code == 0 and r.out == "", r
    assert "group 'fresh-group' has no committed offset on 'fixes'" in r.err, r.err
    assert "starting at the latest offset" in r.err and "--from-beginning" in r.err, r.err
    r = brook("consume", filled_topic, "-g", "fresh-group-2", "--from-beginning", "-n", "3")
    assert r.code == 0 and len(r.out.splitlines()) == 3 and "starting at the earliest offset" in r.err, r
    r = brook("consume", filled_topic, "-g", "fresh-group-2", "--idle-timeout-ms", "1000")
    assert r.code == 0 and "no committed offset" not in r.err, r  # it has offsets now: no note


def _start_group_consumer(ops_cluster: LocalCluster, topic: str, group: str, tmp_path: Path
                          ) -> tuple[subprocess.Popen, Path]:
    out_path = tmp_path / f"{group}.out"
    with out_path.open("w") as out_file:
        proc = subprocess.Popen([BROOK_BIN, "consume", topic, "-g", group, "--from-beginning", "-F", "%v"],
                                stdout=out_file, stderr=subprocess.PIPE, text=True,
                                env={"PATH": "/usr/bin:/bin", "BROOK_BOOTSTRAP": ops_cluster.bootstrap_servers})
    # Records printed: the member has joined, owns the partitions and is in its poll loop.
    wait_for(lambda: len(out_path.read_text().split()) >= 3, 90, "the consumer to print the 3 records")
    return proc, out_path


def _members(brook, group: str) -> list:
    return brook("group", "describe", group, "-o", "json").json()["members"]


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "exit_code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_leaves_the_group_and_exits_as_documented(brook, ops_cluster: LocalCluster, filled_topic: str,
                                                         tmp_path: Path, signum: int, exit_code: int) -> None:
    from client.consumer import Consumer
    from client.types import TopicPartition

    group = f"leaver-{signum}"
    proc, _ = _start_group_consumer(ops_cluster, filled_topic, group, tmp_path)
    try:
        assert len(_members(brook, group)) == 1
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == exit_code, (proc.returncode, stderr)
    assert "Traceback" not in stderr and "consumed 3 records" in stderr, stderr
    # LeaveGroup, not the session timeout: the member is gone as soon as the process is.
    assert _members(brook, group) == [], "the member is still in the group after the process exited"
    committed = brook("group", "describe", group, "-o", "json").json()["offsets"]
    assert sum(o["committed_offset"] for o in committed) == 3, committed  # its final commit happened too
    if signum != signal.SIGTERM:
        return
    # The next member gets the partitions well before the session timeout would have freed them.
    started = time.monotonic()
    nxt = Consumer(bootstrap_servers=ops_cluster.bootstrap_servers, group_id=group, client_id="next-member",
                   enable_auto_commit=False)
    try:
        nxt.subscribe([filled_topic])

        def owns_all() -> bool:
            nxt.poll(timeout_ms=200)
            return nxt.assignment() == {TopicPartition(filled_topic, 0), TopicPartition(filled_topic, 1)}

        wait_for(owns_all, SESSION_TIMEOUT_MS / 1000, "the next member to own both partitions")
        took_s = time.monotonic() - started
    finally:
        nxt.close()
    assert took_s < SESSION_TIMEOUT_MS / 1000 / 2, f"the next member waited {took_s:.1f} s"


TABLE_COMMANDS = [["topic", "list"], ["topic", "describe", "fixes"], ["cluster", "info"], ["cluster", "quorum"],
                  ["cluster", "health"], ["group", "list"], ["group", "describe", "tables-group"],
                  ["group", "seek", "tables-group", "-t", "fixes", "--to-earliest", "--dry-run"]]


@pytest.fixture(scope="module")
def tables_group(ops_cluster: LocalCluster, filled_topic: str) -> str:
    code = brook_main(["-b", ops_cluster.bootstrap_servers, "consume", filled_topic, "-g", "tables-group",
                       "--from-beginning", "-n", "3"])
    assert code == 0
    return "tables-group"


@pytest.mark.slow
@pytest.mark.parametrize("argv", TABLE_COMMANDS, ids=" ".join)
def test_tables_fit_80_columns(ops_cluster: LocalCluster, tables_group: str, argv: list[str]) -> None:
    proc = run_bin(*argv, env={"BROOK_BOOTSTRAP": ops_cluster.bootstrap_servers, "COLUMNS": "80"})
    assert proc.returncode == 0, proc
    widths = [len(line) for line in proc.stdout.splitlines()]
    assert widths and max(widths) <= 80, proc.stdout


@pytest.mark.slow
def test_perf_takes_the_option_names_of_the_other_commands(brook) -> None:
    r = brook("perf", "produce", "-t", "perf-alias", "-n", "200", "--record-size", "32", "-p", "1", "-r", "1")
    assert r.code == 0 and "records/s" in r.out + r.err, r
    r = brook("perf", "consume", "-t", "perf-alias", "-n", "200", "-g", "perf-alias-group", "--timeout-ms", "20000")
    assert r.code == 0 and "records/s" in r.out + r.err, r


def test_readme_commands_are_safe_to_paste() -> None:
    """No `a | b` alternatives in the README's shell blocks: pasted, they would pipe one command into another."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    offenders = []
    for block in blocks:
        for line in block.splitlines():
            code = line.split("  #", 1)[0]
            if re.search(r"\|\s*brook\b", code) and not re.search(r"(echo|cat|printf|seq)\b[^|]*\|\s*brook", code):
                offenders.append(line)
            if re.search(r"--[a-z-]+\|--", code):
                offenders.append(line)
    assert not offenders, offenders


def test_readme_bootstrap_export_matches_the_launcher() -> None:
    """The README tells users to take the local cluster's address from what `python -m deploy.local` wrote or
    reports, not a local port nobody listens on."""
    text = README.read_text()
    assert ". .brook/local/env.sh" in text, "the README sources the launcher's env.sh"
    exports = re.findall(r"export BROOK_BOOTSTRAP=(\S+)", text)
    local = [e for e in exports if "127.0.0.1" in e or "localhost" in e]
    assert all("deploy.local status" in e or e.startswith("$(") for e in local), local
    proc = subprocess.run([sys.executable, "-m", "deploy.local", "status", "--help"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert "--output" in proc.stdout and "--dir" in proc.stdout, proc  # what the README's export line uses
