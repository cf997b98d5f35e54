"""``brook features``: the finalized feature level (Kafka's kafka-features.sh describe / upgrade)."""

from __future__ import annotations

from typing import Annotated

import typer

from admin_cli.common import BootstrapOpt, OutputOpt, ok, show, state, table
from metadata_quorum.features import LEVEL_FEATURES, METADATA_VERSION

app = typer.Typer(help=f"Describe and raise {METADATA_VERSION}: what every node may be asked to apply. Raise it "
                       "once every node runs the release that supports the level (after a rolling upgrade); it is "
                       "never lowered.", no_args_is_help=True)


@app.command(epilog="Examples:  brook features describe  |  brook features describe -o json")
def describe(ctx: typer.Context, bootstrap: BootstrapOpt = None, output: OutputOpt = None) -> None:
    """The finalized level, the levels the active controller's release supports, and each node's highest."""
    st = state(ctx, bootstrap, output)
    d = st.backend.admin.describe_features()
    data = {"feature": d.name, "finalized_level": d.finalized_level, "supported_min": d.supported_min,
            "supported_max": d.supported_max, "metadata_version": d.metadata_version,
            "nodes": [{"node_id": n.node_id, "role": n.role, "supported_max": n.supported_max or None,
                       "problem": n.problem or None} for n in d.nodes]}
    summary = table(None, ["FEATURE", "FINALIZED", "SUPPORTED (ACTIVE CONTROLLER)", "LEVELS"],
                    [[d.name, d.finalized_level, f"{d.supported_min}-{d.supported_max}",
                      "; ".join(f"{lvl}: {what}" for lvl, what in sorted(LEVEL_FEATURES.items()))]])
    nodes = table(None, ["NODE", "ROLE", "SUPPORTS UP TO", "PROBLEM"],
                  [[n.node_id, n.role, n.supported_max or "?", n.problem] for n in d.nodes])
    show(st, data, summary, nodes)


@app.command(epilog="Examples:  brook features upgrade --level 2 --dry-run  |  brook features upgrade --level 2")
def upgrade(
    ctx: typer.Context,
    level: Annotated[int, typer.Option("--level", min=1, help=f"The {METADATA_VERSION} to finalize.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check that every node supports it; change nothing.")]
    = False,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Finalize a higher level. Refused (naming them) while any voter or registered broker runs a release that
    does not support it."""
    st = state(ctx, bootstrap, output)
    finalized = st.backend.admin.update_features(level, validate_only=dry_run)
    if dry_run:
        ok(st, f"every node supports {METADATA_VERSION} {level} (finalized: {finalized}; nothing changed)",
           {"feature": METADATA_VERSION, "level": level, "finalized_level": finalized, "dry_run": True})
    else:
        ok(st, f"{METADATA_VERSION} finalized at {finalized}",
           {"feature": METADATA_VERSION, "finalized_level": finalized})
