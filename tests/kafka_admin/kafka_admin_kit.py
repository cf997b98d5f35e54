"""Helpers of the Kafka admin tests (a module of its own: ``from conftest import`` finds whichever conftest
a full run imported last)."""

from __future__ import annotations

from typing import Any

from deploy.local.cluster import LocalCluster


def kafka_python_ssl(cluster: LocalCluster, name: str = "admin") -> dict[str, Any]:
    c = cluster.client_config_for(name)
    return {"bootstrap_servers": cluster.kafka_bootstrap_servers.split(","), "security_protocol": "SSL",
            "ssl_cafile": c["ssl.ca.location"], "ssl_certfile": c["ssl.certificate.location"],
            "ssl_keyfile": c["ssl.key.location"], "ssl_check_hostname": False}
