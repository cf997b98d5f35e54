"""Run one controller-only ControllerNode as its own process.

Used by the multi-process quorum tests and ``metadata_quorum.bench`` (through
``LocalQuorum``); production nodes run ``brook-server``, which builds the same
ControllerNode from the node's TOML file.

    python -m metadata_quorum.runner --node-id 1 \
        --voters 1@127.0.0.1:p:q,2@... --data-dir DIR --cluster-id C [--password P]

Prints ``READY`` once both ports are bound; SIGTERM stops it cleanly.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from broker.log_limits import log_handler
from metadata_quorum.node import ControllerNode, ControllerSettings, parse_voters
from metadata_quorum.raft import RaftTiming

PASSWORD_ENV = "BROOK_QUORUM_PASSWORD"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--voters", required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--cluster-id", required=True)
    # The quorum password comes from the environment, not argv: a command line is visible to every
    # local user (ps), and a password may begin with "-".
    parser.add_argument("--password", default=os.environ.get(PASSWORD_ENV, ""),
                        help=f"quorum password (default: ${PASSWORD_ENV})")
    parser.add_argument("--session-timeout-ms", type=int, default=9000)
    parser.add_argument("--snapshot-min-entries", type=int, default=5000)
    parser.add_argument("--snapshot-min-interval-s", type=float, default=300.0)
    parser.add_argument("--request-timeout-ms", type=int, default=30000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, handlers=[log_handler("%(asctime)s %(levelname)s %(name)s: %(message)s")])
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a fatal signal leaves the stacks in the log
    settings = ControllerSettings(
        args.node_id, parse_voters(args.voters), args.data_dir, args.cluster_id, args.password or None,
        broker_session_timeout_ms=args.session_timeout_ms, request_timeout_ms=args.request_timeout_ms,
        raft_timing=RaftTiming(snapshot_min_entries=args.snapshot_min_entries,
                               snapshot_min_interval_s=args.snapshot_min_interval_s))
    node = ControllerNode(settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    node.start()
    print("READY", flush=True)
    while not stop.wait(0.5):
        pass
    node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
