"""Shared pieces of the ``brook`` commands: options, connection, output, errors."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from admin_cli.backend import Backend
from client.security import CONFIG_KEYS, SecurityConfig, read_properties

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_ENV = "BROOK_BOOTSTRAP"
COMMAND_CONFIG_ENV = "BROOK_COMMAND_CONFIG"
DEFAULT_TIMEOUT_S = 15.0
MAX_TIMEOUT_S = 86_400.0  # a day: beyond it a deadline is a typo, and time.monotonic() arithmetic stays sane
# Kafka's wire types: a partition count or id is an int32, an offset an int64. Options are
# checked against these at parse time, so an out-of-range number is one usage error (exit 2)
# instead of an overflow deep in the protobuf encoder.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
PORT_MAX = 65535

class _Stdout(Console):
    def on_broken_pipe(self) -> None:
        """``brook ... | head``: the reader went away, a normal end (main() answers exit code 0). rich's own
        answer is ``SystemExit(1)``, so a command that had done its work exited 1 with nothing said (docs audit)."""
        self.quiet = True
        raise BrokenPipeError


out = _Stdout(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class Output(StrEnum):
    table = "table"
    json = "json"


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def check_bootstrap(value: str | None) -> str | None:
    """Option callback: ``host:port,...`` with every port in 1..65535 (gRPC would wrap 70000 to 4464)."""
    if value is None:
        return None
    from client.cluster import parse_bootstrap
    from proto import errors

    try:
        parse_bootstrap(value)
    except errors.BrookError as e:
        raise typer.BadParameter(e.message) from None
    return value


def number_in(low: float | None = None, high: float | None = None) -> Callable[[float | None], float | None]:
    """Option callback for a float option: a finite number in [low, high].

    Used instead of typer's min/max, which call "nan" out of range ("Input should be less than or
    equal to 86400") when it is not a number at all, and let "inf" through an open end.
    """
    if low is not None and high is not None:
        bounds = f" from {low:g} to {high:g}"
    elif low is not None:
        bounds = f" >= {low:g}"
    elif high is not None:
        bounds = f" <= {high:g}"
    else:
        bounds = ""

    def check(value: float | None) -> float | None:
        if value is None:
            return None
        if math.isnan(value):
            raise typer.BadParameter(f"must be a number, got {value}")
        if math.isinf(value) or (low is not None and value < low) or (high is not None and value > high):
            raise typer.BadParameter(f"must be a finite number{bounds}, got {value:g}")
        return value

    return check


# Options every leaf command takes (they may also come before the command: `brook -o json topic list`).
BootstrapOpt = Annotated[str | None, typer.Option(
    "--bootstrap", "-b", help=f"Brokers host:port,... [env {BOOTSTRAP_ENV}; default {DEFAULT_BOOTSTRAP}]",
    show_default=False, callback=check_bootstrap)]
OutputOpt = Annotated[Output | None, typer.Option("--output", "-o", help="table (default) or json.",
                                                  show_default=False)]


USED_COMMAND_CONFIG_KEYS = frozenset({*CONFIG_KEYS, "bootstrap.servers"})


def security_config(command_config: str | None, environ: Mapping[str, str] | None = None) -> SecurityConfig:
    """Client security from ``BROOK_SECURITY_PROTOCOL``/``BROOK_SSL_*``/``BROOK_SASL_*``, then the
    ``--command-config`` properties file (Kafka's ``security.protocol=SSL`` lines) on top."""
    sec = SecurityConfig.from_env(environ)
    if command_config:
        properties = read_properties(command_config)
        unused = sorted(k for k in properties if str(k).replace("_", ".") not in USED_COMMAND_CONFIG_KEYS)
        if unused:
            # As Kafka's tools log "were supplied but are not used": a misspelt key is not silently ignored.
            typer.echo(f"warning: --command-config {command_config}: not used by brook: {', '.join(unused)} "
                       f"(it reads {', '.join(sorted(USED_COMMAND_CONFIG_KEYS))})", err=True)
        sec = sec.merged(properties)
    return sec


@dataclass
class State:
    bootstrap: str = ""
    output: Output = Output.table
    timeout_s: float = DEFAULT_TIMEOUT_S
    command_config: str | None = None
    _backend: Backend | None = field(default=None, repr=False)
    _security: SecurityConfig | None = field(default=None, repr=False)

    @property
    def json(self) -> bool:
        return self.output == Output.json

    @property
    def security(self) -> SecurityConfig:
        if self._security is None:
            self._security = security_config(self.command_config or os.environ.get(COMMAND_CONFIG_ENV))
        return self._security

    def client_config(self) -> dict[str, str]:
        """Security keys as Producer/Consumer keyword arguments."""
        return {k.replace(".", "_"): v for k, v in self.security.to_config().items()}

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = Backend(self.bootstrap, self.timeout_s, self.security)
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None


def state(ctx: typer.Context, bootstrap: str | None = None, output: Output | None = None) -> State:
    """The command's State: root options, overridden by the leaf's own --bootstrap/--output."""
    root = ctx.find_root()
    st = root.obj if isinstance(root.obj, State) else None
    if st is None:
        st = State(bootstrap=os.environ.get(BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP))
        root.obj = st
    if bootstrap:
        st.bootstrap = bootstrap
    if output is not None:
        st.output = output
    return st


# ----------------------------------------------------------------------------- output


def print_json(data: Any) -> None:
    # Plain print through rich without markup/highlighting: scripts get exactly this JSON.
    out.print(json.dumps(data, indent=2, sort_keys=False, default=str), markup=False, highlight=False)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[_cell(v) for v in r])
    return t


def _cell(v: Any) -> str | Text:
    if isinstance(v, Text):
        return v
    if isinstance(v, list | tuple):
        return Text(",".join(str(x) for x in v))
    if v is None:
        return Text("-")
    return Text(str(v))


def show(st: State, data: Any, *tables: Table, note: str | None = None) -> None:
    """JSON for scripts, tables (and an optional note line) for people."""
    if st.json:
        print_json(data)
        return
    for t in tables:
        if note and t.row_count == 0 and len(tables) == 1:
            break  # an empty listing: the note says so better than an empty frame
        out.print(t)
    if note:
        out.print(note, markup=False, highlight=False)


def ok(st: State, message: str, data: dict[str, Any] | None = None) -> None:
    if st.json:
        print_json({"ok": True, "message": message, **(data or {})})
    else:
        out.print(Text("✔ ", style="green") + Text(message), highlight=False)


def error_line(message: str) -> None:
    one_line = " ".join(message.split())
    err.print(Text("error: ", style="bold red") + Text(one_line), highlight=False)


def rows_failed(what: str, failed: Sequence[str], total: int) -> NoReturn:
    """End a command whose table (or JSON) shows some rows failed: one ``error:`` line on stderr naming how
    many and the first, exit code 1, as every other failure. The table alone left stderr empty (docs audit)."""
    first = failed[0] if failed else ""
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    error_line(f"{len(failed)} of {total} {what}: {first}{more}")
    raise typer.Exit(1)


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """["k=v", ...] -> {k: v}; a malformed item is a usage error naming it."""
    out_: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"{what} {item!r} must look like key=value", code=2)
        out_[key.strip()] = value.strip()
    return out_
