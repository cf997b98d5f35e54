"""``brook quota``: per-principal produce/fetch byte-rate, request-rate and controller mutation quotas."""

from __future__ import annotations

from typing import Annotated

import typer

from admin_cli.common import BootstrapOpt, CliError, OutputOpt, number_in, ok, show, state, table
from metadata_quorum.security import DEFAULT_ENTITY, MAX_QUOTA_VALUE, QUOTA_KEYS

app = typer.Typer(help="Set, describe and delete client quotas (byte and request rates: enforced by every broker; "
                       "controller mutation rate: by the active controller).", no_args_is_help=True)

UserOpt = Annotated[str | None, typer.Option("--user", help="User name (User:<name>).")]
DefaultOpt = Annotated[bool, typer.Option("--default", help="The default for every user without its own.")]


def _entity(user: str | None, default: bool, *, required: bool = True) -> str:
    if user and default:
        raise CliError("give --user NAME or --default, not both", code=2)
    if user:
        return user if user.startswith("User:") else f"User:{user}"
    if default:
        return DEFAULT_ENTITY
    if required:
        raise CliError("give --user NAME or --default", code=2)
    return ""


_finite = number_in()


def _rate(value: float | None) -> float | None:
    """Option callback: a quota is a finite number > 0 and <= MAX_QUOTA_VALUE. Checked here, as a usage error
    (exit 2), rather than refused by the controller as a failed operation (exit 1)."""
    value = _finite(value)
    if value is not None and not 0 < value <= MAX_QUOTA_VALUE:
        raise typer.BadParameter(f"must be > 0 and <= {MAX_QUOTA_VALUE:g}, got {value:g}")
    return value


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


@app.command("set", epilog="Examples:  brook quota set --user alice --producer-byte-rate 1048576  |  "
                           "brook quota set --default --consumer-byte-rate 10485760 --request-rate 100  |  "
                           "brook quota set --user etl --controller-mutation-rate 10")
def set_(
    ctx: typer.Context,
    user: UserOpt = None,
    default: DefaultOpt = False,
    producer_byte_rate: Annotated[float | None, typer.Option(help="Produce bytes/s per broker.", callback=_rate)]
    = None,
    consumer_byte_rate: Annotated[float | None, typer.Option(help="Fetch bytes/s per broker.", callback=_rate)]
    = None,
    request_rate: Annotated[float | None, typer.Option(help="Requests/s per broker.", callback=_rate)]
    = None,
    controller_mutation_rate: Annotated[float | None, typer.Option(
        help="Partitions created, added or deleted per second, cluster-wide (KIP-599).", callback=_rate)]
    = None,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Set quotas; over-quota clients get throttle_time_ms and back off (topic changes over the controller
    mutation rate are refused with THROTTLING_QUOTA_EXCEEDED)."""
    st = state(ctx, bootstrap, output)
    entity = _entity(user, default)
    values = {k: v for k, v in (("producer_byte_rate", producer_byte_rate), ("consumer_byte_rate",
                                                                              consumer_byte_rate),
                                ("request_rate", request_rate),
                                ("controller_mutation_rate", controller_mutation_rate)) if v is not None}
    if not values:
        raise CliError("give at least one of --producer-byte-rate, --consumer-byte-rate, --request-rate, "
                       "--controller-mutation-rate", code=2)
    after = st.backend.admin.alter_client_quotas(entity, set=values)
    ok(st, f"quotas of {entity}: " + ", ".join(f"{k}={_number(v)}" for k, v in sorted(after.items())),
       {"entity": entity, "quotas": after})


@app.command(epilog="Examples:  brook quota describe  |  brook quota describe --user alice -o json")
def describe(
    ctx: typer.Context,
    user: UserOpt = None,
    default: DefaultOpt = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Quotas of one entity, or of all."""
    st = state(ctx, bootstrap, output)
    found = st.backend.admin.describe_client_quotas(_entity(user, default, required=False))
    rows = [{"entity": e, **{k: v.get(k) for k in QUOTA_KEYS}} for e, v in sorted(found.items())]
    cells = [[r["entity"], *[None if r[k] is None else _number(r[k]) for k in QUOTA_KEYS]] for r in rows]
    show(st, rows, table(None, ["ENTITY", *[k.upper() for k in QUOTA_KEYS]],
                         cells),
         note=None if rows else "no quotas")


@app.command(epilog="Examples:  brook quota delete --user alice  |  brook quota delete --default --request-rate")
def delete(
    ctx: typer.Context,
    user: UserOpt = None,
    default: DefaultOpt = False,
    producer_byte_rate: Annotated[bool, typer.Option("--producer-byte-rate", help="Remove this quota.")] = False,
    consumer_byte_rate: Annotated[bool, typer.Option("--consumer-byte-rate", help="Remove this quota.")] = False,
    request_rate: Annotated[bool, typer.Option("--request-rate", help="Remove this quota.")] = False,
    controller_mutation_rate: Annotated[bool, typer.Option("--controller-mutation-rate",
                                                           help="Remove this quota.")] = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Remove some (or, with no flag, all) quotas of an entity."""
    st = state(ctx, bootstrap, output)
    entity = _entity(user, default)
    chosen = [k for k, flag in (("producer_byte_rate", producer_byte_rate), ("consumer_byte_rate",
                                                                              consumer_byte_rate),
                                ("request_rate", request_rate),
                                ("controller_mutation_rate", controller_mutation_rate)) if flag] or list(QUOTA_KEYS)
    after = st.backend.admin.alter_client_quotas(entity, remove=chosen)
    ok(st, f"removed {', '.join(chosen)} of {entity}", {"entity": entity, "quotas": after})
