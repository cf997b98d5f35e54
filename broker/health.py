"""Liveness and readiness over plain HTTP on a port of their own (``health.listener``).

Kubernetes probes (and load balancers) need an answer no client load can delay: the client
port may be at ``max.connections`` or its in-flight bounds, and a probe refused there would get
a healthy broker restarted. This listener is separate and tiny: answers built from in-memory state
only (no disk, no RPC), served by broker/http_serving.py's bounded server. It is reachable by
anyone who can reach the node, so one client cannot hold it: before, it served one connection at a
time, and a client sending a byte of its request every second kept it from every probe (the
orchestrator then restarts the node). Now a connection has REQUEST_TIMEOUT_S in all and one address
``PER_ADDRESS`` connections at once: an attacker holds at most those, and the probes from their
own address are answered.

- ``GET /livez``: 200 while the node's roles work: the broker's event loop has run within
  ``LOOP_STALL_S`` (a wedged loop would answer nothing), the controller's Raft thread is up.
- ``GET /readyz``: 200 once the node can take its share of traffic: the broker is registered,
  unfenced, and in the ISR of every partition it hosts that has a leader (a restarted broker is
  ready only after it has caught up, so a rolling restart never takes down a second replica of
  a partition that is still under-replicated); a controller-only node once its quorum has a
  leader.

Bodies are one JSON line with a status and a reason made of counts (no topic names).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from broker.http_serving import BoundedHTTPServer

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 2.0  # a connection's whole exchange: a probe's takes a millisecond
WORKERS = 2
MAX_PENDING = 16
PER_ADDRESS = 4
Check = Callable[[], tuple[bool, str]]


class HealthServer:
    def __init__(self, host: str, port: int, live: Check, ready: Check) -> None:
        checks = {"/livez": live, "/readyz": ready}

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S
            server_version = "brook-health"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                check = checks.get(self.path.split("?", 1)[0])
                if check is None:
                    self._answer(404, {"status": "not found", "paths": sorted(checks)})
                    return
                try:
                    ok, reason = check()
                except Exception as exc:  # a failing check is an unhealthy answer, not a dead listener
                    log.exception("health check %s failed", self.path)
                    ok, reason = False, f"check failed: {type(exc).__name__}"
                self._answer(200 if ok else 503, {"status": "ok" if ok else "unavailable", "reason": reason})

            def _answer(self, code: int, body: dict[str, object]) -> None:
                data = (json.dumps(body) + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
                log.debug("health %s - %s", self.address_string(), format % args)

        self._server = BoundedHTTPServer((host, port), Handler, name="health-http", workers=WORKERS,
                                         max_pending=MAX_PENDING, per_address=PER_ADDRESS,
                                         deadline_s=REQUEST_TIMEOUT_S, io_timeout_s=REQUEST_TIMEOUT_S)
        self.port = int(self._server.server_address[1])

    def start(self) -> None:
        self._server.serve_in_thread()

    def stop(self) -> None:
        self._server.close()
