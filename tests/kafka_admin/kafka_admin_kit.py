"""Helpers of the Kafka admin tests (a module of its own: ``from conftest import`` finds whichever conftest
a full run imported last)."""

from __future__ import annotations

import uuid
from typing import Any

from deploy.local.cluster import LocalCluster


def kafka_python_ssl(cluster: LocalCluster, name: str = "admin") -> dict[str, Any]:
    c = cluster.client_config_for(name)
    return {"bootstrap_servers": cluster.kafka_bootstrap_servers.split(","), "security_protocol": "SSL",
            "ssl_cafile": c["ssl.ca.location"], "ssl_certfile": c["ssl.certificate.location"],
            "ssl_keyfile": c["ssl.key.location"], "ssl_check_hostname": False}


def principal_of_its_own(cluster: LocalCluster, prefix: str) -> str:
    """The name of a new client certificate issued by the cluster's CA (principal ``User:<name>``), so that the
    ACLs a test grants it never reach the demo user whose lack of cluster rights other tests rely on."""
    from deploy.local.certs import CertificateAuthority

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    CertificateAuthority.load_or_create(cluster.tls_dir).issue(cluster.tls_dir, name, hosts=(), server=False)
    return name
