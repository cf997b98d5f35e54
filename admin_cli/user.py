"""``brook user``: SCRAM users stored (salted) in the metadata quorum."""

from __future__ import annotations

from typing import Annotated

import typer

from admin_cli.common import BootstrapOpt, CliError, OutputOpt, ok, show, state, table
from metadata_quorum.security import MECHANISMS

app = typer.Typer(help="Create, delete and list SCRAM-SHA-256/512 users.", no_args_is_help=True)

MechanismOpt = Annotated[list[str] | None, typer.Option(
    "--mechanism", "-m", help="SCRAM-SHA-256 and/or SCRAM-SHA-512 (repeatable; default both).")]


@app.command(epilog="Examples:  brook user create alice --password s3cret  |  "
                    "BROOK_USER_PASSWORD=s3cret brook user create alice -m SCRAM-SHA-512")
def create(
    ctx: typer.Context,
    user: Annotated[str, typer.Argument(help="User name (the principal is User:<name>).")],
    password: Annotated[str, typer.Option(envvar="BROOK_USER_PASSWORD", prompt=True, hide_input=True,
                                          help="The password; prompted for when not given.")],
    mechanism: MechanismOpt = None,
    iterations: Annotated[int, typer.Option(min=4096, max=16_384, help="PBKDF2 iterations (Kafka's bounds).")] = 4096,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Create a user, or set a new password for an existing one. Only salt and keys leave this machine."""
    mechanisms = list(dict.fromkeys(m.strip().upper() for m in mechanism or MECHANISMS))  # scram-sha-256 too
    if unknown := [m for m in mechanisms if m not in MECHANISMS]:
        raise CliError(f"unknown SCRAM mechanism {unknown[0]!r}: {' or '.join(MECHANISMS)}", code=2)
    st = state(ctx, bootstrap, output)
    st.backend.admin.create_user(user, password, mechanisms=mechanisms, iterations=iterations)
    ok(st, f"user {user} has credentials for {', '.join(mechanisms)}", {"user": user, "mechanisms": mechanisms})


@app.command(epilog="Examples:  brook user delete alice  |  brook user delete alice -m SCRAM-SHA-256")
def delete(
    ctx: typer.Context,
    user: Annotated[str, typer.Argument(help="User name.")],
    mechanism: Annotated[str, typer.Option("--mechanism", "-m", help="Only this mechanism (default: all).")] = "",
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Delete a user's credentials; its sessions end when they expire (sasl.session.lifetime.ms)."""
    st = state(ctx, bootstrap, output)
    st.backend.admin.delete_user(user, mechanism)
    ok(st, f"user {user} deleted", {"user": user})


@app.command("list", epilog="Examples:  brook user list  |  brook user list -o json")
def list_(ctx: typer.Context, bootstrap: BootstrapOpt = None, output: OutputOpt = None) -> None:
    """Users and their mechanisms (never passwords or keys)."""
    st = state(ctx, bootstrap, output)
    users = st.backend.admin.list_users()
    rows = [{"user": u, "mechanisms": [{"mechanism": m, "iterations": i} for m, i in mechs]}
            for u, mechs in sorted(users.items())]
    show(st, rows, table(None, ["USER", "MECHANISMS"],
                         [[r["user"], [f"{m['mechanism']} ({m['iterations']})" for m in r["mechanisms"]]]
                          for r in rows]), note=None if rows else "no users")
