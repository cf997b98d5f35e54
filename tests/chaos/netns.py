"""The chaos harness's network: one network namespace per node, or loopback only.

``NamespaceNetwork`` (root with CAP_NET_ADMIN and iproute2): a hub namespace holds a
bridge; every node gets its own namespace with one veth to the bridge and an address in
a private /24 chosen per run; the harness reaches the nodes through one more veth from
its own namespace. No traffic leaves the namespaces this run created (plus that one veth).
Faults need nothing but iproute2 (no iptables, no tc qdisc modules, which many kernels
and containers lack):

- ``isolate(n)``: the bridge side of n's veth goes down; n's packets are silently
  dropped, as on a real cut cable (peers and clients time out rather than fail fast);
- ``cut(a, b)``: a blackhole route to the other in both a's and b's namespaces; sends
  between them fail at once (as with an ICMP reject) while both stay reachable to the rest.

``LoopbackNetwork`` is the fallback: every node on 127.0.0.1, no network faults.

Names carry a random per-run prefix (``bkc<6 hex>``) so parallel runs never collide, and
``close()`` (also called from atexit) deletes everything this run created.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "bkc"
# One file per live run, naming the pid that owns its namespaces: a later run deletes the
# namespaces of runs whose process is gone (SIGKILLed harness, crashed machine session).
OWNERS_DIR = Path("/run/brook-chaos")
_CMD_TIMEOUT_S = 20.0
_SUBNET_ATTEMPTS_MAX = 50


class NetworkError(RuntimeError):
    """A namespace/veth/route command failed."""


def _run(args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def namespaces_unavailable_reason() -> str | None:
    """None when this process can build namespaces; else why not (for the summary line)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) not installed"
    name = f"{PREFIX}probe{secrets.token_hex(3)}"
    try:
        probe = _run(["ip", "netns", "add", name], check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"ip netns failed: {exc}"
    if probe.returncode != 0:
        return f"ip netns add failed: {probe.stderr.strip()}"
    _run(["ip", "netns", "del", name], check=False)
    return None


class LoopbackNetwork:
    """Every node on 127.0.0.1; network faults are not available."""

    mode = "loopback"
    supports_partitions = False

    def node_ip(self, node_id: int) -> str:
        return "127.0.0.1"

    def command_prefix(self, node_id: int) -> list[str]:
        return []

    def isolate(self, node_id: int) -> None:
        raise NetworkError("network faults need network namespaces (run as root with iproute2)")

    def cut(self, a: int, b: int) -> None:
        raise NetworkError("network faults need network namespaces (run as root with iproute2)")

    def heal(self) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass
class _Faults:
    isolated: set[int] = field(default_factory=set)
    cuts: set[tuple[int, int]] = field(default_factory=set)


class NamespaceNetwork:
    mode = "netns"
    supports_partitions = True

    def __init__(self, node_ids: list[int]) -> None:
        self.run_id = secrets.token_hex(3)
        self.prefix = f"{PREFIX}{self.run_id}"
        self.node_ids = list(node_ids)
        self.subnet = self._pick_subnet()
        self._created_ns: list[str] = []
        self._host_veth: str | None = None
        self._faults = _Faults()
        self._closed = False
        atexit.register(self.close)
        remove_stale_runs()
        OWNERS_DIR.mkdir(parents=True, exist_ok=True)
        (OWNERS_DIR / self.prefix).write_text(f"{os.getpid()}\n")
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ---- layout
    def ns(self, node_id: int) -> str:
        return f"{self.prefix}n{node_id}"

    @property
    def hub(self) -> str:
        return f"{self.prefix}h"

    def node_ip(self, node_id: int) -> str:
        return str(self.subnet.network_address + 10 + node_id)

    @property
    def host_ip(self) -> str:
        return str(self.subnet.network_address + 1)

    def _node_veth(self, node_id: int) -> str:
        return f"{self.prefix}n{node_id}"

    def _hub_veth(self, node_id: int) -> str:
        return f"{self.prefix}b{node_id}"

    def command_prefix(self, node_id: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node_id)]

    @staticmethod
    def _pick_subnet() -> ipaddress.IPv4Network:
        """A random 10.x.y.0/24 that overlaps no route this machine already has."""
        routes = _run(["ip", "-4", "route", "show", "table", "all"], check=False).stdout
        taken = []
        for line in routes.splitlines():
            word = line.split()[0] if line.split() else ""
            if word in ("local", "broadcast", "unreachable", "blackhole", "prohibit"):
                word = line.split()[1]
            try:
                taken.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
        for _ in range(_SUBNET_ATTEMPTS_MAX):
            net = ipaddress.IPv4Network(f"10.{secrets.randbelow(50) + 200}.{secrets.randbelow(256)}.0/24")
            if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
                return net
        raise NetworkError("no free private /24 for the chaos network")

    def _build(self) -> None:
        hub = self.hub
        self._add_ns(hub)
        _run(["ip", "-n", hub, "link", "add", "name", "br0", "type", "bridge"])
        _run(["ip", "-n", hub, "link", "set", "dev", "br0", "up"])
        # The harness's own leg into the hub (clients, probes, health checks).
        host, host_peer = f"{self.prefix}c0", f"{self.prefix}c1"
        _run(["ip", "link", "add", "name", host, "type", "veth", "peer", "name", host_peer])
        self._host_veth = host
        _run(["ip", "link", "set", "dev", host_peer, "netns", hub])
        _run(["ip", "-n", hub, "link", "set", "dev", host_peer, "master", "br0"])
        _run(["ip", "-n", hub, "link", "set", "dev", host_peer, "up"])
        _run(["ip", "addr", "add", f"{self.host_ip}/{self.subnet.prefixlen}", "dev", host])
        _run(["ip", "link", "set", "dev", host, "up"])
        for node_id in self.node_ids:
            ns, veth, peer = self.ns(node_id), self._node_veth(node_id), self._hub_veth(node_id)
            self._add_ns(ns)
            _run(["ip", "link", "add", "name", veth, "type", "veth", "peer", "name", peer])
            _run(["ip", "link", "set", "dev", veth, "netns", ns])
            _run(["ip", "link", "set", "dev", peer, "netns", hub])
            _run(["ip", "-n", hub, "link", "set", "dev", peer, "master", "br0"])
            _run(["ip", "-n", hub, "link", "set", "dev", peer, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.node_ip(node_id)}/{self.subnet.prefixlen}", "dev", veth])
            _run(["ip", "-n", ns, "link", "set", "dev", veth, "up"])
        log.info("chaos network %s: %s, nodes %s", self.prefix, self.subnet,
                 {n: self.node_ip(n) for n in self.node_ids})

    def _add_ns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._created_ns.append(name)
        _run(["ip", "-n", name, "link", "set", "dev", "lo", "up"])

    # ---- faults
    def isolate(self, node_id: int) -> None:
        _run(["ip", "-n", self.hub, "link", "set", "dev", self._hub_veth(node_id), "down"])
        self._faults.isolated.add(node_id)

    def cut(self, a: int, b: int) -> None:
        """Cut a from b both ways; a pair already cut (in either order) stays cut as it is."""
        pair = (min(a, b), max(a, b))
        if pair in self._faults.cuts:
            return
        self._faults.cuts.add(pair)  # before the routes: heal() removes whatever half got added
        _run(["ip", "-n", self.ns(a), "route", "add", "blackhole", f"{self.node_ip(b)}/32"])
        _run(["ip", "-n", self.ns(b), "route", "add", "blackhole", f"{self.node_ip(a)}/32"])

    def heal(self) -> None:
        """Undo every network fault (idempotent)."""
        for node_id in sorted(self._faults.isolated):
            _run(["ip", "-n", self.hub, "link", "set", "dev", self._hub_veth(node_id), "up"])
        self._faults.isolated.clear()
        for a, b in sorted(self._faults.cuts):
            _run(["ip", "-n", self.ns(a), "route", "del", "blackhole", f"{self.node_ip(b)}/32"], check=False)
            _run(["ip", "-n", self.ns(b), "route", "del", "blackhole", f"{self.node_ip(a)}/32"], check=False)
        self._faults.cuts.clear()

    def close(self) -> None:
        """Delete every namespace and veth this run made; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for name in reversed(self._created_ns):
            _run(["ip", "netns", "del", name], check=False)  # takes the veths inside with it
        if self._host_veth is not None:
            _run(["ip", "link", "del", "dev", self._host_veth], check=False)
        self._created_ns.clear()
        (OWNERS_DIR / self.prefix).unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_runs() -> list[str]:
    """Delete the namespaces and veth of earlier runs whose owning process is gone; their prefixes."""
    if not OWNERS_DIR.is_dir():
        return []
    listed = _run(["ip", "netns", "list"], check=False).stdout.split()
    removed = []
    for owner in OWNERS_DIR.iterdir():
        try:
            pid = int(owner.read_text().strip())
        except (OSError, ValueError):
            pid = -1
        if pid > 0 and _pid_alive(pid):
            continue
        prefix = owner.name
        for name in listed:
            if name.startswith(prefix):
                # Nodes of a SIGKILLed harness stop on their own (parent watch), except SIGSTOPped ones.
                for member in _run(["ip", "netns", "pids", name], check=False).stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(member), signal.SIGKILL)
                _run(["ip", "netns", "del", name], check=False)
        _run(["ip", "link", "del", "dev", f"{prefix}c0"], check=False)
        owner.unlink(missing_ok=True)
        removed.append(prefix)
        log.warning("removed the network of a dead chaos run (%s, pid %d)", prefix, pid)
    return removed


def make_network(node_ids: list[int], want_netns: bool = True) -> tuple[NamespaceNetwork | LoopbackNetwork, str]:
    """The best network this machine allows, and why it fell back (empty when it did not)."""
    if not want_netns:
        return LoopbackNetwork(), "loopback requested"
    reason = namespaces_unavailable_reason()
    if reason is not None:
        log.warning("network namespaces unavailable (%s): loopback only, no network faults", reason)
        return LoopbackNetwork(), reason
    return NamespaceNetwork(node_ids), ""
