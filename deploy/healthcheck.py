"""Standard gRPC health check of one Brook listener, for container health checks and scripts.

    python -m deploy.healthcheck 127.0.0.1:9092 [--service brook.BrokerService] [--timeout 3]

Exit 0 when the service is SERVING, 1 otherwise (the status is printed). Kubernetes uses
its built-in gRPC probes instead; this is for Docker's HEALTHCHECK and for humans.
"""

from __future__ import annotations

import argparse
import sys

from deploy.local.cluster import check_health


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.healthcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("target", help="host:port of a BROKER or CONTROLLER listener")
    p.add_argument("--service", default="", help="service name ('' = the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds")
    args = p.parse_args(argv)
    status = check_health(args.target, timeout_s=args.timeout, service=args.service)
    print(f"{args.target}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
