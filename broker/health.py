"""Liveness and readiness over plain HTTP on a port of their own (``health.listener``).

Kubernetes probes (and load balancers) need an answer no client load can delay: the client
port may be at ``max.connections`` or its in-flight bounds, and a probe refused there would get
a healthy broker restarted. This listener is separate and tiny: one request at a time, each
bounded by a socket timeout, answers built from in-memory state only (no disk, no RPC).

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
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 2.0  # a client that sends nothing cannot hold the (single) handler longer
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

        self._server = HTTPServer((host, port), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="health-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
