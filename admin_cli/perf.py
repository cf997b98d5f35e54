"""``brook perf``: the benchmark commands (they print records/s, MB/s, p50/p99).

The benchmarks live next to what they measure (storage.perf, client.perf) with their own
argument parsers; these commands hand them the rest of the command line unchanged.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import typer

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
    if any(a == "--bootstrap-servers" or a.startswith("--bootstrap-servers=") for a in args) or \
            any(a in ("-h", "--help") for a in args):
        return args
    st = state(ctx)
    security = [] if st.command_config is None or "--command-config" in args else [
        "--command-config", st.command_config]
    return ["--bootstrap-servers", st.bootstrap, *security, *args]


@app.command(context_settings=PASS_THROUGH, add_help_option=False,
             epilog="Examples:  brook perf storage --help  |  brook perf storage")
def storage(ctx: typer.Context) -> None:
    """Storage engine benchmark (append, read, recovery) on a temporary directory. Options: --help."""
    raise typer.Exit(_run("storage.perf", "main", list(ctx.args)))


@app.command(context_settings=PASS_THROUGH, add_help_option=False,
             epilog="Examples:  brook perf produce --num-records 100000 --record-size 1000 --acks all")
def produce(ctx: typer.Context) -> None:
    """Producer throughput and latency against the cluster (--bootstrap or BROOK_BOOTSTRAP). Options: --help."""
    raise typer.Exit(_run("client.perf", "produce_main", _with_bootstrap(ctx, list(ctx.args))))


@app.command(context_settings=PASS_THROUGH, add_help_option=False,
             epilog="Examples:  brook perf consume --num-records 100000 --group perf")
def consume(ctx: typer.Context) -> None:
    """Consumer throughput against the cluster (--bootstrap or BROOK_BOOTSTRAP). Options: --help."""
    raise typer.Exit(_run("client.perf", "consume_main", _with_bootstrap(ctx, list(ctx.args))))
