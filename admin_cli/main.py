"""``brook``: the Brook admin and console CLI.

    brook topic create orders -p 6 -r 3
    brook cluster health
    brook produce orders < lines.txt
    brook consume orders --from-beginning -e

Every command takes ``--bootstrap``/``-b`` (or ``BROOK_BOOTSTRAP``) and ``--output``/``-o``
``table|json``. Every failure is one line on stderr and a non-zero exit: 1 for a refused
or failed operation, 2 for bad usage, 130 for Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import grpc
import typer
from typer import main as typer_main
from typer._click import exceptions as click_exceptions
from typer._click.core import ParameterSource

from admin_cli import acl, cluster, features, group, partition, perf, quota, topic, user
from admin_cli.backend import Unreachable
from admin_cli.common import (
    BOOTSTRAP_ENV,
    COMMAND_CONFIG_ENV,
    DEFAULT_BOOTSTRAP,
    DEFAULT_TIMEOUT_S,
    MAX_TIMEOUT_S,
    CliError,
    Output,
    State,
    check_bootstrap,
    error_line,
    number_in,
)
from admin_cli.console import consume, produce
from client.security import read_properties
from proto import errors

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("brook")
    except metadata.PackageNotFoundError:  # run from a source tree without an install
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"brook {_version()}")
        raise typer.Exit(0)

app = typer.Typer(
    name="brook",
    help="Administer a Brook cluster: topics, consumer groups, health, console produce/consume, benchmarks.",
    epilog="Examples:\n\nbrook topic list\n\nbrook -o json cluster info\n\n"
           "BROOK_BOOTSTRAP=10.0.0.5:9092 brook cluster health",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(topic.app, name="topic")
app.add_typer(cluster.app, name="cluster")
app.add_typer(partition.app, name="partition")
app.add_typer(group.app, name="group")
app.add_typer(perf.app, name="perf")
app.add_typer(user.app, name="user")
app.add_typer(acl.app, name="acl")
app.add_typer(quota.app, name="quota")
app.add_typer(features.app, name="features")
app.command("produce", epilog="Examples:\n\necho hello | brook produce orders\n\n"
                              "brook produce orders -K : -H source=cli < keyed.txt\n\n"
                              "brook produce orders -v '{\"id\":1}' --value-format json")(produce)
app.command("consume", epilog="Examples:\n\nbrook consume orders --from-beginning -e\n\n"
                              "brook consume orders -g billing -n 10\n\n"
                              "brook consume orders -p 0 --offset 42 -F '%p:%o %k=%v\\n'\n\n"
                              "brook consume orders --from-timestamp -15m -o json")(consume)


@app.callback()
def root(
    ctx: typer.Context,
    bootstrap: Annotated[str, typer.Option("--bootstrap", "-b", envvar=BOOTSTRAP_ENV,
                                           help="Brokers host:port,...", callback=check_bootstrap)]
    = DEFAULT_BOOTSTRAP,
    output: Annotated[Output, typer.Option("--output", "-o", help="table or json.")] = Output.table,
    timeout: Annotated[float, typer.Option(help=f"Seconds each operation may take (0.1 to {MAX_TIMEOUT_S:g}).",
                                           callback=number_in(0.1, MAX_TIMEOUT_S))]
    = DEFAULT_TIMEOUT_S,
    verbose: Annotated[bool, typer.Option("--verbose", help="Log client internals to stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", is_eager=True,
                                          callback=_print_version)] = False,
    command_config: Annotated[str | None, typer.Option(
        "--command-config", envvar=COMMAND_CONFIG_ENV,
        help="Client properties file (security.protocol, ssl.*, sasl.*); BROOK_SECURITY_PROTOCOL, "
             "BROOK_SSL_CA_LOCATION, ... work too.")] = None,
) -> None:
    """Administer a Brook cluster."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.CRITICAL, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if command_config and ctx.get_parameter_source("bootstrap") == ParameterSource.DEFAULT:
        # The file the local launcher writes (and Kafka's tools take) names the brokers too: used when neither
        # -b nor BROOK_BOOTSTRAP does. Before, such a file's bootstrap.servers was ignored for 127.0.0.1:9092.
        named = read_properties(command_config).get("bootstrap.servers", "").strip()
        if named:
            bootstrap = check_bootstrap(named) or bootstrap
    st = State(bootstrap=bootstrap, output=output, timeout_s=timeout, command_config=command_config)
    ctx.obj = st
    ctx.call_on_close(st.close)


def _describe_rpc_error(e: grpc.RpcError) -> str:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"cannot reach the cluster ({code.name}: {details})"
    return f"{code.name if code else 'RPC failed'}: {details}"


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code (and exits with it when run as a script)."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = typer_main.get_command(app)
    stdout_was_devnull = _is_devnull(sys.stdout)
    try:
        try:
            code = command.main(args=args, prog_name="brook", standalone_mode=False)
        except SystemExit as e:
            # `brook --help | head -1`: typer prints help through a rich console of its own, whose answer to a
            # broken pipe is to point stdout at /dev/null and raise SystemExit(1). Ours hands it to the
            # BrokenPipeError branch below; theirs is told by what it did to stdout.
            if e.code == 1 and not stdout_was_devnull and _is_devnull(sys.stdout):
                raise BrokenPipeError from None
            raise
    except click_exceptions.UsageError as e:
        hint = f" (see: {e.ctx.command_path} --help)" if e.ctx is not None else ""
        error_line(f"{e.format_message()}{hint}")
        code = EXIT_USAGE
    except click_exceptions.ClickException as e:
        error_line(e.format_message())
        code = e.exit_code
    except CliError as e:
        error_line(e.message)
        code = e.code
    except Unreachable as e:
        error_line(str(e))
        code = EXIT_FAILED
    except errors.BrookError as e:
        error_line(str(e))
        code = EXIT_FAILED
    except grpc.RpcError as e:
        error_line(_describe_rpc_error(e))
        code = EXIT_FAILED
    except (KeyboardInterrupt, typer.Abort):
        error_line("interrupted")
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        # `brook consume ... | head`: the reader went away; that is a normal end.
        _stdout_broken()
        code = 0
    except OSError as e:
        error_line(f"{e.strerror or e}")
        code = EXIT_FAILED
    except ValueError as e:  # UnicodeDecodeError is one too
        # A last resort: input the commands check (times, files, record formats) is refused before
        # this with a precise message; anything that still gets here is one line, not a traceback
        # (--verbose logs it).
        logging.getLogger("brook").debug("unexpected error", exc_info=True)
        error_line(f"{type(e).__name__}: {str(e)[:200]}")
        code = EXIT_FAILED
    if not isinstance(code, int):
        code = 0
    if argv is None:
        sys.exit(code)
    return code


def _is_devnull(stream: Any) -> bool:
    try:
        st, null = os.fstat(stream.fileno()), os.stat(os.devnull)
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (null.st_dev, null.st_ino)


def _stdout_broken() -> None:
    # Python flushes stdout at exit; after a broken pipe that flush would print a traceback.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    main()
