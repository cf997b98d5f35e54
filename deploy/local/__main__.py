"""The local cluster launcher: start, stop and report on an N-node cluster in the background.

    python -m deploy.local start  --dir ./.brook/local --nodes 3 [--mode combined|split]
    python -m deploy.local status --dir ./.brook/local
    python -m deploy.local stop   --dir ./.brook/local [--node 2]
    python -m deploy.local start  --dir ./.brook/local --node 2     # bring one node back

Nodes keep running after the launcher exits (pid files in DIR/node-N/server.pid, logs
in DIR/node-N/server.log). Ports are chosen at the first start and reused afterwards.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from deploy.local.cluster import CLIENT_PROPERTIES, ENV_FILE, ClusterError, LocalCluster

app = typer.Typer(
    name="deploy.local",
    help="Start, stop and inspect a local Brook cluster running in the background.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

DirOpt = Annotated[Path, typer.Option("--dir", "-d", help="Cluster directory (configs, data, logs, pids).")]
NodeOpt = Annotated[int | None, typer.Option("--node", help="Only this node id.")]


class Mode(StrEnum):
    combined = "combined"
    split = "split"


def _fail(message: str) -> typer.Exit:
    err.print(Text("error: ", style="red") + Text(message), highlight=False)
    return typer.Exit(1)


def _parse_overrides(items: list[str]) -> dict[str, str]:
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"--override {item!r} must look like key=value")
        result[key.strip()] = value
    return result


# How the command line says each value of a boolean layout option.
_BOOL_FLAGS = {("tls", True): "--tls", ("tls", False): "--plaintext", ("authorizer", True): "--authorizer",
               ("authorizer", False): "--no-authorizer"}


def _kept_layout_notes(ctx: typer.Context, cluster: LocalCluster, given: dict[str, object]) -> list[str]:
    """What the command line asked of the layout that an existing DIR's cluster keeps (its ids, ports and data
    are in cluster.json): said, not dropped without a word (docs audit)."""
    existing: dict[str, object] = {
        "nodes": len(cluster.broker_ids), "mode": cluster.mode, "tls": cluster.tls, "authorizer": cluster.authorizer,
        "controllers": len(cluster.controller_ids) if cluster.mode == "split" else None}
    notes = []
    for name, value in given.items():
        source = ctx.get_parameter_source(name)  # typer's click: COMMANDLINE, DEFAULT, ...
        if source is None or source.name != "COMMANDLINE" or existing[name] == value:
            continue
        notes.append(_BOOL_FLAGS[(name, value)] if isinstance(value, bool) else f"--{name} {value}")
    return notes


@app.command()
def start(
    ctx: typer.Context,
    dir: DirOpt,
    nodes: Annotated[int, typer.Option(min=1, max=9, help="Brokers (combined: nodes).")] = 3,
    mode: Annotated[Mode, typer.Option(help="combined: every node controller+broker; split: separate "
                                            "controllers (ids 1001..) and brokers (ids 1..N).")] = Mode.combined,
    controllers: Annotated[int | None, typer.Option(min=1, max=5, help="Controllers in split mode.")] = None,
    node: NodeOpt = None,
    override: Annotated[list[str], typer.Option("--override", "-o", help="key=value for every node's config.")]
    = [],  # noqa: B006  (typer reads the default; it is never mutated)
    timeout: Annotated[float, typer.Option(help="Seconds to wait until the cluster is ready.")] = 60.0,
    wait: Annotated[bool, typer.Option(help="Wait until ready (health + brokers registered).")] = True,
    tls: Annotated[bool, typer.Option("--tls/--plaintext", help="mTLS on every listener with a CA made under "
                                      "DIR/tls (default), or plaintext (dev only). Kept for an existing DIR.")]
    = True,
    authorizer: Annotated[bool, typer.Option(
        "--authorizer/--no-authorizer", help="ACLs enforced (StandardAuthorizer): User:admin is the super user, "
        "User:demo may use demo-* topics and groups only (default with TLS). Kept for an existing DIR.")] = True,
) -> None:
    """Start the cluster (or one node) in the background and wait until it is ready.

    Example: python -m deploy.local start --dir /tmp/brook --nodes 3 --mode split
    """
    try:
        existed = (dir / "cluster.json").exists()
        cluster = LocalCluster(dir, nodes=nodes, mode=mode.value, overrides=_parse_overrides(override),
                               controllers=controllers, detach=True, tls=tls, authorizer=authorizer and tls)
        if existed and (kept := _kept_layout_notes(ctx, cluster, {
                "nodes": nodes, "mode": mode.value, "controllers": controllers, "tls": tls, "authorizer": authorizer})):
            err.print(f"note: {dir} holds a cluster already ({len(cluster.broker_ids)} brokers, {cluster.mode}"
                      f"{', mTLS' if cluster.tls else ', plaintext'}): {', '.join(kept)} ignored, its layout is kept "
                      f"(a new layout needs a new --dir; a broker is added as README 'Cluster operations' says)",
                      highlight=False)
        if node is not None:
            if not (dir / "cluster.json").exists():
                raise _fail(f"no cluster in {dir}: start the whole cluster first")
            cluster.start_node(node)
        else:
            cluster.start()
        if wait:
            cluster.wait_ready(timeout)
            cluster.grant_demo_acls(timeout)
    except ClusterError as e:
        raise _fail(str(e)) from None
    out.print(f"cluster in {cluster.base_dir} is {'ready' if wait else 'starting'}")
    out.print(f"bootstrap servers: {cluster.bootstrap_servers}")
    consoles = [cluster.console_url(n) for n in cluster.broker_ids if cluster.spec(n).console_port]
    if consoles:
        d = cluster.tls_dir
        out.print(f"web console: {consoles[0]}" + (
            f" (needs a client certificate: curl --cacert {d / 'ca.pem'} --cert {d / 'admin.pem'} "
            f"--key {d / 'admin.key'} {consoles[0]}api/overview)" if cluster.tls else ""), highlight=False)
    env_file = cluster.base_dir / ENV_FILE
    if cluster.tls:
        out.print(f"mTLS on every listener; CA and certificates in {cluster.tls_dir}")
        out.print(f"client settings: {cluster.base_dir / CLIENT_PROPERTIES} (brook --command-config FILE)")
        if cluster.authorizer:
            out.print(f"ACLs enforced: {cluster.tls_dir / 'admin.pem'} is User:admin (super user, used by "
                      f"{env_file}); {cluster.tls_dir / 'demo.pem'} is User:demo (demo-* topics and groups only)",
                      highlight=False)
        out.print(f"try: . {env_file} && brook cluster health", highlight=False)
    else:
        out.print(f"try: BROOK_BOOTSTRAP={cluster.bootstrap_servers} brook cluster health")


@app.command()
def stop(
    dir: DirOpt,
    node: NodeOpt = None,
    kill: Annotated[bool, typer.Option(help="SIGKILL instead of a controlled shutdown.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds before a controlled stop becomes SIGKILL.")] = 60.0,
) -> None:
    """Stop the cluster (or one node): controlled shutdown, SIGKILL after --timeout.

    Example: python -m deploy.local stop --dir /tmp/brook --node 2
    """
    try:
        cluster = LocalCluster.open(dir)
        if node is not None:
            cluster.spec(node)
            if kill:
                cluster.kill_node(node)
            else:
                cluster.stop_node(node, timeout)
        elif kill:
            cluster.teardown()
        else:
            cluster.stop(timeout)
    except ClusterError as e:
        raise _fail(str(e)) from None
    out.print(f"stopped {'node ' + str(node) if node is not None else 'cluster'} in {cluster.base_dir}")


@app.command()
def status(
    dir: DirOpt,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Show each node's process, gRPC health and addresses. Exit 1 if any node is down.

    Example: python -m deploy.local status --dir /tmp/brook --output json
    """
    try:
        cluster = LocalCluster.open(dir)
    except ClusterError as e:
        raise _fail(str(e)) from None
    rows = cluster.status()
    if output == "json":
        out.print_json(json.dumps({"bootstrap_servers": cluster.bootstrap_servers, "nodes": rows}))
    else:
        table = Table(title=f"Brook local cluster {cluster.base_dir}")
        for col in ("node", "roles", "pid", "state", "health", "broker", "controller"):
            table.add_column(col, no_wrap=col in ("broker", "controller", "pid"), overflow="fold")
        for r in rows:
            state = "paused" if r["paused"] else ("running" if r["running"] else "[red]stopped[/red]")
            statuses = r["health"]
            health = "-" if not statuses else "ok" if all(v == "SERVING" for v in statuses.values()) \
                else ", ".join(f"{k}={v}" for k, v in statuses.items())
            table.add_row(str(r["node_id"]), r["roles"], str(r["pid"] or "-"), state, health, r["broker"],
                          r["controller"])
        out.print(table)
        out.print(f"bootstrap servers: {cluster.bootstrap_servers}")
    if not all(r["running"] for r in rows):
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
