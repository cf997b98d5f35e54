"""Where the local launcher picks its ports (deploy/local/cluster.py free_port)."""

from __future__ import annotations

import pytest

from deploy.local import cluster
from deploy.local.cluster import PORT_RANGE_ENV, ClusterError, free_port


def test_free_ports_come_from_the_range_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "20000-20063")
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= p <= 20063 for p in ports), sorted(ports)
    assert len(ports) == 20, "a process is never given the same port twice"


def test_without_a_range_they_stay_below_the_ephemeral_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    low, _ = cluster._ephemeral_range()
    assert all(15000 <= free_port() < low for _ in range(20))


@pytest.mark.parametrize("text", ["20000", "x-y", "20000-19000", "80-90", "60000-70000"])
def test_a_bad_range_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, text)
    with pytest.raises(ClusterError, match=PORT_RANGE_ENV):
        free_port()
