"""The read-only web console, driven in a real headless Chromium against a real 3-node cluster.

What the browser shows (after the page's own JavaScript fetched and rendered the data) is
checked against the Admin API: brokers, partition leaders / replicas / ISRs / high watermarks,
consumer groups and their lag, the quorum's voters. A group id with HTML in it must come out as
text. Authentication and ACLs on a TLS cluster: tests/security/test_local_default.py.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster
from deploy.local.tools import debian_tool

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]
XSS_GROUP = '<img src=x onerror="document.title=1">'


def _chromium() -> str:
    """Debian's chromium; installed with apt-get when the tests run as root (CI), else skipped."""
    found, why = debian_tool("chromium", "chromium")
    if found is None:
        pytest.skip(why)
    return found


def browse(chromium: str, url: str, tmp: Path, *extra: str) -> str:
    """The DOM after the page's scripts ran (virtual time lets its first polls finish)."""
    proc = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}",
                           "--virtual-time-budget=10000", *extra, "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class Rows(HTMLParser):
    """{table id: [{data-name: text} per row]} plus every tag seen in <body>."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, str]]] = {}
        self.tags: list[str] = []
        self.attrs: list[dict[str, str]] = []
        self._table: str | None = None
        self._row: dict[str, str] | None = None
        self._cell: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append(tag)
        self.attrs.append(a)
        if tag == "table":
            self._table = a.get("id")
        elif tag == "tr" and self._table and a:
            self._row = dict(a)
            self.tables.setdefault(self._table, []).append(self._row)
        elif tag == "td" and self._row is not None:
            self._cell = a.get("data-name")
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._row is not None and self._cell:
            self._row[self._cell] = "".join(self._text)
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "table":
            self._table = None


def parse(dom: str) -> Rows:
    r = Rows()
    r.feed(dom)
    return r


@pytest.fixture(scope="module")
def chromium() -> str:
    return _chromium()


@pytest.fixture(scope="module")
def seeded(ops_cluster: LocalCluster) -> LocalCluster:
    """A topic with records, a group that committed part of it (lag), and a group id made of HTML."""
    bootstrap = ops_cluster.bootstrap_servers
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic("console-t", 3, 3)])
    with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
        for i in range(90):
            producer.send("console-t", b"v%d" % i, partition=i % 3)
        producer.flush()
    for group, upto in (("console-g", 20), (XSS_GROUP, 5)):
        with Consumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False) as consumer:
            consumer.assign([TopicPartition("console-t", 0)])
            consumer.commit({TopicPartition("console-t", 0): upto})
    return ops_cluster


def test_the_console_shows_what_the_admin_api_says(seeded: LocalCluster, chromium: str, tmp_path: Path) -> None:
    node = seeded.broker_ids[0]
    url = seeded.console_url(node)
    with Admin(seeded.bootstrap_servers) as admin:
        # The overview is cached for 2 s: wait until the groups' commits are in what it serves.
        seen: list[Rows] = []

        def rendered() -> Rows | None:
            page = parse(browse(chromium, url, tmp_path))
            seen.append(page)
            lag = {r.get("data-group"): r.get("lag") for r in page.tables.get("groups", [])}
            return page if lag.get("console-g") == "10" else None

        page = wait_for(rendered, 60, lambda: f"the console to show console-g's lag; groups shown: "
                                              f"{seen[-1].tables.get('groups') if seen else None}, "
                                              f"notes: {seen[-1].tables.get('notes') if seen else None}")
        topics = admin.describe_topics(["console-t"])
        hws = admin.list_offsets({TopicPartition("console-t", p): "latest" for p in range(3)})
        groups = admin.describe_groups(["console-g", XSS_GROUP])
        quorum = admin.describe_quorum()
        brokers = admin.describe_cluster().brokers

    shown = {int(r["data-partition"]): r for r in page.tables["partitions"] if r["data-topic"] == "console-t"}
    assert sorted(shown) == [0, 1, 2]
    for p, meta in topics["console-t"].partitions.items():
        row = shown[p]
        assert int(row["leader"]) == meta.leader
        assert [int(x) for x in row["replicas"].split(",")] == list(meta.replicas)
        assert sorted(int(x) for x in row["isr"].split(",")) == sorted(meta.isr)
        assert int(row["hw"]) == hws[TopicPartition("console-t", p)][0] == 30
    assert {int(r["data-broker"]) for r in page.tables["brokers"]} == {b.node_id for b in brokers}
    assert all(r["state"] == "active" for r in page.tables["brokers"])
    assert {int(r["data-voter"]) for r in page.tables["quorum"]} == {v.node_id for v in quorum.voters}
    lags = {r["data-group"]: r for r in page.tables["groups"]}
    assert int(lags["console-g"]["lag"]) == groups["console-g"].offsets[TopicPartition("console-t", 0)].lag == 10
    # The group id made of HTML is shown as text and creates no element.
    assert lags[XSS_GROUP]["group"] == XSS_GROUP and int(lags[XSS_GROUP]["lag"]) == 25
    assert "img" not in page.tags


def test_the_console_is_read_only_and_answers_only_what_it_serves(seeded: LocalCluster) -> None:
    url = seeded.console_url(seeded.broker_ids[0])
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        policy = resp.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert resp.headers["X-Frame-Options"] == "DENY"
    # DNS rebinding: a page elsewhere reaching this address under a name of its own gets nothing.
    rebound = urllib.request.Request(url + "api/overview", headers={"Host": "attacker.example:80"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(rebound, timeout=10)
    assert info.value.code == 421
    for method, path, code in (("POST", "api/overview", 405), ("DELETE", "", 405), ("GET", "api/nope", 404),
                               ("GET", "../../etc/passwd", 404)):
        req = urllib.request.Request(url + path, method=method, data=b"" if method == "POST" else None)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == code, (method, path)


def test_throughput_graphs_follow_the_nodes_own_counters(seeded: LocalCluster, chromium: str,
                                                         tmp_path: Path) -> None:
    """Two samples apart: the page draws a line for each rate from the node's counters."""
    leader = None
    with Admin(seeded.bootstrap_servers) as admin:
        leader = admin.describe_topics(["console-t"])["console-t"].partitions[0].leader
    stop = time.monotonic() + 8
    with Producer(bootstrap_servers=seeded.bootstrap_servers, acks=1, linger_ms=5) as producer:
        import threading

        def load() -> None:
            while time.monotonic() < stop:
                producer.send("console-t", b"x" * 100, partition=0)
                time.sleep(0.002)

        t = threading.Thread(target=load, daemon=True)
        t.start()
        dom = browse(chromium, seeded.console_url(leader), tmp_path, "--run-all-compositor-stages-before-draw")
        t.join(15)
        producer.flush()
    page = parse(dom)
    lines = [a for tag, a in zip(page.tags, page.attrs, strict=True) if tag == "polyline"]
    assert len(lines) == 3 and all(a.get("points") for a in lines), lines

