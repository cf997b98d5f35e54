"""A read-only web console served by every broker (``console.listener``).

One static page (``broker/console_static/``: HTML, CSS and JS, no build step, nothing from a
CDN) polls two JSON endpoints of the broker that serves it:

- ``/api/overview``: cluster health, the metadata quorum, brokers, topics with each partition's
  leader, ISR and high watermark, consumer groups with their lag. Built with the broker's own
  Admin client (its node identity), cached for ``CACHE_TTL_S`` so any number of viewers costs
  the cluster one round of requests per TTL.
- ``/api/throughput``: this node's own produce / fetch counters; the page turns successive
  samples into rates and draws them.

Security: the same as the API. On a TLS listener (``ssl.*`` of the node) a client certificate
is verified against ``ssl.ca.location`` when ``ssl.client.auth=required`` and mapped to a
principal by ``ssl.principal.mapping.rules``; on plaintext the caller is ANONYMOUS. The caller
needs DESCRIBE on the CLUSTER (super users and the nodes have it), and sees only the topics and
groups it may DESCRIBE. Only GET exists: nothing can be changed from the console. Every answer
carries a strict Content-Security-Policy; the page writes data with ``textContent`` only.
Bounded: a few worker threads, a socket timeout per request, at most ``MAX_TOPICS`` topics,
``MAX_PARTITIONS`` partitions and ``MAX_GROUPS`` groups in one overview.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any

from broker import authorizer as authz
from broker import principal as principals
from broker.http_serving import BoundedHTTPServer

log = logging.getLogger(__name__)

CACHE_TTL_S = 2.0
REQUEST_TIMEOUT_S = 5.0  # a connection's whole exchange (broker/http_serving.py)
WORKERS = 4
MAX_PENDING = 32  # connections accepted but not yet handled; more are closed at once
PER_ADDRESS = 8  # a browser opens up to 6 connections to a site
MAX_TOPICS = 200
MAX_PARTITIONS = 2000
MAX_GROUPS = 100
ADMIN_TIMEOUT_MS = 3000

_STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
           "/console.js": ("console.js", "text/javascript; charset=utf-8"),
           "/console.css": ("console.css", "text/css; charset=utf-8")}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def principal_of_socket(sock: Any) -> principals.Principal:
    """The verified client certificate's principal (ssl.principal.mapping.rules), else ANONYMOUS; with
    the client's address, for ACLs that name a host."""
    try:
        address = str(sock.getpeername()[0])
    except (OSError, AttributeError, IndexError):
        address = ""
    getpeercert = getattr(sock, "getpeercert", None)
    der = getpeercert(binary_form=True) if getpeercert is not None else None
    if not der:
        return principals.at_address(principals.ANONYMOUS, address)
    from cryptography import x509

    subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    return principals.at_address(principals.principal_from_subject(subject), address)


class ConsoleServer:
    def __init__(self, host: str, port: int, data: ConsoleData, *, tls: ssl.SSLContext | None = None,
                 extra_hosts: tuple[str, ...] = ()) -> None:
        console = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "brook-console"
            timeout = REQUEST_TIMEOUT_S

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if not console.host_allowed(self.headers.get("Host", "")):
                    # DNS rebinding: a web page the viewer opened elsewhere must not read the console
                    # through a name of its own that resolves to this address.
                    self._send(421, "application/json", b'{"error": "unknown Host: use the address of the console"}')
                    return
                try:
                    caller = principal_of_socket(self.connection)
                except Exception as exc:  # a certificate no mapping rule accepts
                    self._send(401, "application/json", json.dumps({"error": str(exc)}).encode())
                    return
                if not data.may_view(caller):
                    self._send(403, "application/json", json.dumps(
                        {"error": f"{caller} may not DESCRIBE the cluster: the console needs that ACL"}).encode())
                    return
                if path in _STATIC:
                    name, ctype = _STATIC[path]
                    self._send(200, ctype, console.static(name))
                elif path == "/api/overview":
                    self._json(lambda: data.overview(caller))
                elif path == "/api/throughput":
                    self._json(data.throughput)
                else:
                    self._send(404, "application/json", b'{"error": "not found"}')

            def do_POST(self) -> None:  # noqa: N802 - read-only: nothing else is served
                self._send(405, "application/json", b'{"error": "the console is read-only"}')

            do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

            def _json(self, build: Callable[[], dict[str, Any]]) -> None:
                try:
                    body = json.dumps(build()).encode()
                except Exception:
                    log.exception("console: building %s failed", self.path)
                    self._send(500, "application/json", b'{"error": "internal error, see the broker log"}')
                    return
                self._send(200, "application/json", body)

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in _HEADERS.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
                log.debug("console %s - %s", self.address_string(), format % args)

        self._static: dict[str, bytes] = {}
        self._hosts = {host.lower(), "localhost", "127.0.0.1", "[::1]", socket.getfqdn().lower(),
                       socket.gethostname().lower(), *(h.lower() for h in extra_hosts)}
        self._server = BoundedHTTPServer((host, port), Handler, name="console-http", tls=tls, workers=WORKERS,
                                         max_pending=MAX_PENDING, per_address=PER_ADDRESS,
                                         deadline_s=REQUEST_TIMEOUT_S)
        self.port = int(self._server.server_address[1])

    def host_allowed(self, header: str) -> bool:
        """The Host a browser sent names this console (its host, this machine, loopback, or an address)."""
        host = header.strip().lower()
        if host.startswith("["):
            host = host[:host.find("]") + 1]
        else:
            host = host.rsplit(":", 1)[0]
        if host in self._hosts:
            return True
        try:  # an IP address cannot be rebound to another origin
            import ipaddress

            ipaddress.ip_address(host.strip("[]"))
            return True
        except ValueError:
            return False

    def static(self, name: str) -> bytes:
        if name not in self._static:
            self._static[name] = resources.files("broker").joinpath("console_static", name).read_bytes()
        return self._static[name]

    def start(self) -> None:
        self._server.serve_in_thread()

    def stop(self) -> None:
        self._server.close()


class ConsoleData:
    """What the page shows, from the broker's memory and its own Admin client (cached)."""

    def __init__(self, broker: Any, admin_factory: Callable[[], Any], authorizer: Any) -> None:
        self._broker = broker
        self._admin_factory = admin_factory
        self._admin: Any = None
        self._authz = authorizer
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None

    def may_view(self, caller: principals.Principal) -> bool:
        return bool(self._authz.authorize(caller, authz.DESCRIBE, authz.CLUSTER))

    def close(self) -> None:
        with self._lock:
            if self._admin is not None:
                self._admin.close()
                self._admin = None

    # ---- /api/throughput ----
    def throughput(self) -> dict[str, Any]:
        rm = self._broker.replica_manager
        stats = rm.stats() if rm is not None else []
        topics: dict[str, dict[str, int]] = {}
        for s in stats:
            t = topics.setdefault(s.topic, {"messages_in": 0, "bytes_in": 0, "bytes_out": 0})
            t["messages_in"] += s.messages_in_total
            t["bytes_in"] += s.bytes_in_total
            t["bytes_out"] += s.bytes_out_total
        total = {k: sum(t[k] for t in topics.values()) for k in ("messages_in", "bytes_in", "bytes_out")}
        return {"node_id": self._broker.node_id, "time_ms": int(time.time() * 1000), "total": total}

    # ---- /api/overview ----
    def overview(self, caller: principals.Principal) -> dict[str, Any]:
        with self._lock:  # concurrent viewers share one refresh
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > CACHE_TTL_S:
                self._cached = (now, self._collect())
            full = self._cached[1]
        may_describe = functools.cache(lambda topic: self._authz.may_describe_topic(caller, topic))
        topics = [t for t in full["topics"] if may_describe(t["name"])]
        groups = []
        for g in full["groups"]:
            if not self._authz.authorize(caller, authz.DESCRIBE, authz.GROUP, g["group_id"]):
                continue
            # A group's offsets only on topics the viewer may describe, as OffsetFetch answers it (the
            # group's viewer saw every topic it had committed, found by an audit).
            rows = [r for r in g["partitions"] if may_describe(r["topic"])]
            lag = sum(n for topic, n in g["lag_by_topic"].items() if may_describe(topic))
            groups.append({k: v for k, v in g.items() if k != "lag_by_topic"} | {"partitions": rows, "lag": lag})
        # The notes tell how much of the cluster is not shown: for its operators only, not every viewer.
        notes = full["notes"] if self._authz.authorize(caller, authz.DESCRIBE, authz.CLUSTER) else []
        return {**full, "topics": topics, "groups": groups, "notes": notes, "viewer": str(caller)}

    def _admin_client(self) -> Any:
        if self._admin is None:
            self._admin = self._admin_factory()
        return self._admin

    def _collect(self) -> dict[str, Any]:
        cache = self._broker.metadata_cache
        admin = self._admin_client()
        brokers = [{"node_id": b.node_id, "address": f"{b.host}:{b.port}", "rack": b.rack, "fenced": b.fenced}
                   for b in cache.brokers()]
        out: dict[str, Any] = {"cluster_id": cache.cluster_id, "controller_id": cache.controller_id,
                               "metadata_version": cache.version, "served_by": self._broker.node_id,
                               "brokers": brokers, "notes": []}
        topics, partitions, hw = [], 0, {}
        names = sorted(t.name for t in cache.topics())
        if len(names) > MAX_TOPICS:
            out["notes"].append(f"showing {MAX_TOPICS} of {len(names)} topics")
        for name in names[:MAX_TOPICS]:
            parts = sorted(cache.partitions_of(name), key=lambda p: p.partition)
            room = MAX_PARTITIONS - partitions
            if room <= 0:
                out["notes"].append(f"partitions beyond the first {MAX_PARTITIONS} are not shown")
                break
            parts = parts[:room]
            partitions += len(parts)
            topics.append({"name": name, "partitions": [
                {"partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
                 "replicas": list(p.replicas), "isr": list(p.isr), "high_watermark": None} for p in parts]})
        # High watermarks from the leaders (ListOffsets latest), only for partitions with a leader.
        from client.types import TopicPartition

        led = [TopicPartition(t["name"], p["partition"]) for t in topics for p in t["partitions"] if p["leader"] >= 0]
        try:
            if led:
                hw = {tp: off for tp, (off, _) in admin.cluster.list_offsets(
                    {tp: -1 for tp in led}, timeout_ms=ADMIN_TIMEOUT_MS).items()}
        except Exception as exc:
            out["notes"].append(f"high watermarks unavailable: {exc}")
        for t in topics:
            for p in t["partitions"]:
                p["high_watermark"] = hw.get(TopicPartition(t["name"], p["partition"]))
        out["topics"] = topics
        # min.insync.replicas: the topic's, else the dynamic cluster default, else this node's file.
        default_min_isr = cache.cluster_configs().get(
            "min.insync.replicas", self._broker.settings.defaults.get("min.insync.replicas", "1"))
        out["health"] = _health(topics, brokers, cache, int(default_min_isr))
        out["quorum"] = self._quorum(admin)
        out["groups"] = self._groups(admin, out["notes"])
        return out

    @staticmethod
    def _quorum(admin: Any) -> dict[str, Any]:
        try:
            q = admin.describe_quorum()
        except Exception as exc:
            return {"error": str(exc)}
        return {"leader_id": q.leader_id, "term": q.term, "commit_index": q.commit_index,
                "voters": [{"node_id": v.node_id, "raft_address": v.raft_address, "lag": v.lag,
                            "last_contact_ms_ago": v.last_contact_ms_ago, "is_leader": v.is_leader}
                           for v in sorted(q.voters, key=lambda v: v.node_id)]}

    @staticmethod
    def _groups(admin: Any, notes: list[str]) -> list[dict[str, Any]]:
        try:
            listings = sorted(admin.list_groups(), key=lambda g: g.group_id)
            if len(listings) > MAX_GROUPS:
                notes.append(f"showing {MAX_GROUPS} of {len(listings)} consumer groups")
            described = admin.describe_groups([g.group_id for g in listings[:MAX_GROUPS]]) if listings else {}
        except Exception as exc:
            notes.append(f"consumer groups unavailable: {exc}")
            return []
        out = []
        room = MAX_PARTITIONS  # group-partition rows over all groups, as for the topics' partitions
        for gid, g in sorted(described.items()):
            offsets = sorted(g.offsets.items())
            if len(offsets) > room >= 0:
                notes.append(f"partitions of consumer groups beyond the first {MAX_PARTITIONS} are not shown")
            rows = [{"topic": tp.topic, "partition": tp.partition, "committed": o.committed_offset,
                     "end": o.log_end_offset, "lag": o.lag} for tp, o in offsets[:max(room, 0)]]
            room = room - len(rows) if len(offsets) <= room else -1
            lag_by_topic: dict[str, int] = {}  # over all its partitions, shown or not (a viewer's sum: see overview)
            for tp, o in offsets:
                if o.lag >= 0:
                    lag_by_topic[tp.topic] = lag_by_topic.get(tp.topic, 0) + o.lag
            out.append({"group_id": gid, "state": g.state, "members": len(g.members),
                        "lag": sum(lag_by_topic.values()), "partitions": rows, "lag_by_topic": lag_by_topic})
        return out


def _health(topics: list[dict[str, Any]], brokers: list[dict[str, Any]], cache: Any,
            default_min_isr: int) -> dict[str, Any]:
    offline = under = under_min = 0
    for t in topics:
        info = cache.topic(t["name"])
        min_isr = int((info.configs if info is not None else {}).get("min.insync.replicas", default_min_isr))
        for p in t["partitions"]:
            offline += p["leader"] < 0
            under += len(p["isr"]) < len(p["replicas"])
            under_min += p["leader"] >= 0 and len(p["isr"]) < min_isr
    fenced = [b["node_id"] for b in brokers if b["fenced"]]
    return {"offline_partitions": offline, "under_replicated_partitions": under,
            "under_min_isr_partitions": under_min, "fenced_brokers": fenced,
            "healthy": not (offline or under or under_min or fenced)}
