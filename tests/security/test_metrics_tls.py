"""/metrics over HTTPS (metrics.ssl.enable), optionally requiring a client certificate, on a real socket."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from broker.metrics import NodeMetrics
from deploy.local.certs import CertificateAuthority


@pytest.fixture()
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path / "ca")


def _serve(ca: CertificateAuthority, tmp_path: Path, *, required: bool) -> tuple[NodeMetrics, int]:
    node = ca.issue(tmp_path / "node", "node-1")
    metrics = NodeMetrics.create(1, ["broker"], "c")
    port = metrics.serve("127.0.0.1", 0, tls={"certfile": str(node.cert), "keyfile": str(node.key),
                                              "client_cafile": str(ca.path) if required else None,
                                              "client_auth_required": required})
    return metrics, port


def test_https_only(ca: CertificateAuthority, tmp_path: Path) -> None:
    metrics, port = _serve(ca, tmp_path, required=False)
    try:
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        ctx = ssl.create_default_context(cafile=str(ca.path))
        body = urllib.request.urlopen(f"https://localhost:{port}/metrics", timeout=5, context=ctx).read()
        assert b"brook_node_info" in body or b"process_" in body
    finally:
        metrics.close()


def test_client_certificate_required(ca: CertificateAuthority, tmp_path: Path) -> None:
    metrics, port = _serve(ca, tmp_path, required=True)
    try:
        ctx = ssl.create_default_context(cafile=str(ca.path))
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            urllib.request.urlopen(f"https://localhost:{port}/metrics", timeout=5, context=ctx).read()
        scraper = ca.issue(tmp_path / "prom", "prometheus", hosts=(), server=False)
        ctx.load_cert_chain(str(scraper.cert), str(scraper.key))
        assert urllib.request.urlopen(f"https://localhost:{port}/metrics", timeout=5, context=ctx).status == 200
    finally:
        metrics.close()
