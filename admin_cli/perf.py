"""``brook perf``: the benchmark commands (they print records/s, MB/s, p50/p99).

The benchmarks live next to what they measure (storage.perf, client.perf) with their own
argument parsers; these commands hand them the rest of the command line unchanged.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import typer

from admin_cli.backend import probe_bootstrap
from admin_cli.common import CliError, state

app = typer.Typer(help="Benchmarks: storage engine, producer and consumer throughput and latency.",
                  no_args_is_help=True)

PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _run(module: str, func: str, args: list[str]) -> int:
    try:
        entry: Callable[[list[str]], int | None] = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError):
        raise CliError(f"{module}.{func} is not available in this build") from None
    return int(entry(args) or 0)


def _with_bootstrap(ctx: typer.Context, args: list[str]) -> list[str]:
    if any(a in ("-h", "--help") for a in args):
        return args
    st = state(ctx)
    given = _given_bootstrap(args)
    # An unreachable cluster is one line at once here too, not the benchmark's own 30 s of retries.
    probe_bootstrap(given or st.bootstrap, min(st.timeout_s, 5.0))
    security = [] if st.command_config is None or "--command-config" in args else [
        "--command-config", st.command_config]
    return [*security, *args] if given else ["--bootstrap", st.bootstrap, *security, *args]


def _given_bootstrap(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a in ("-b", "--bootstrap", "--bootstrap-servers"):
            return args[i + 1] if i + 1 < len(args) else None
        for prefix in ("--bootstrap=", "--bootstrap-servers="):
            if a.startswith(prefix):
                return a[len(prefix):]
    return None


@app.command(context_settings=PASS_THROUGH, add_help_option=False,
             epilog="Examples:\n\nbrook perf storage --help\n\nbrook perf storage")
def storage(ctx: typer.Context) -> None:
    """Storage engine benchmark (append, read, recovery) on a temporary directory. Options: --help."""
    raise typer.Exit(_run("storage.perf", "main", list(ctx.args)))


@app.command(context_settings=PASS_THROUGH, add_help_option=False,
             epilog="Examples:\n\nbrook perf produce -t perf -n 100000 --record-size 1000 --acks all")
def produce(ctx: typer.Context) -> None:
    """Producer throughput and latency against the cluster (--bootstrap or BROOK_BOOTSTRAP). Options: --help."""
    raise typer.Exit(_run("client.perf", "produce_main", _with_bootstrap(ctx, list(ctx.args))))


@app.command(context_settings=PASS_THROUGH, add_help_option=False,
             epilog="Examples:\n\nbrook perf consume -t perf -n 100000 -g perf")
def consume(ctx: typer.Context) -> None:
    """Consumer throughput against the cluster (--bootstrap or BROOK_BOOTSTRAP). Options: --help."""
    raise typer.Exit(_run("client.perf", "consume_main", _with_bootstrap(ctx, list(ctx.args))))


@app.command("end-to-end", context_settings=PASS_THROUGH, add_help_option=False,
             epilog="Examples:\n\nbrook perf end-to-end -t e2e -n 100000 --throughput 10000 --acks all")
def end_to_end(ctx: typer.Context) -> None:
    """End-to-end latency (send() to a consumer's poll()) at a fixed rate (--bootstrap or BROOK_BOOTSTRAP). Options: --help."""
    raise typer.Exit(_run("client.perf", "e2e_main", _with_bootstrap(ctx, list(ctx.args))))
