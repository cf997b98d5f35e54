"""Standard gRPC health check of one Brook listener, for container health checks and scripts.

    python -m deploy.healthcheck 127.0.0.1:9092 [--service brook.BrokerService] [--timeout 3]
    python -m deploy.healthcheck localhost:9092 --command-config /etc/brook/probe.properties   # an mTLS listener

TLS settings come from ``--command-config`` (``security.protocol=SSL``, ``ssl.*``) or
``BROOK_SECURITY_PROTOCOL`` / ``BROOK_SSL_CA_LOCATION`` / ... in the environment.

Exit 0 when the service is SERVING, 1 otherwise (the status is printed). Kubernetes uses
its built-in gRPC probes instead; this is for Docker's HEALTHCHECK and for humans.
"""

from __future__ import annotations

import argparse
import socket
import sys

from client.security import SecurityConfig, read_properties
from deploy.local.cluster import check_health


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.healthcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("target", help="host:port of a BROKER or CONTROLLER listener")
    p.add_argument("--service", default="", help="service name ('' = the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds")
    p.add_argument("--command-config", default=None, help="client properties file (security.protocol, ssl.*)")
    args = p.parse_args(argv)
    security = SecurityConfig.from_env()
    if args.command_config:
        security = security.merged(read_properties(args.command_config))
    status = check_health(args.target, timeout_s=args.timeout, service=args.service, security=security)
    hint = ""
    if status == "UNREACHABLE" and not security.uses_ssl and _accepts(args.target, args.timeout):
        # A TLS listener asked in plaintext: reachable, and the handshake is what failed (it read as a port down).
        hint = " (the port accepts connections but did not answer in plaintext: a TLS listener? give " \
               "--command-config FILE with security.protocol=SSL and ssl.*)"
    print(f"{args.target}: {status}{hint}")
    return 0 if status == "SERVING" else 1


def _accepts(target: str, timeout_s: float) -> bool:
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
