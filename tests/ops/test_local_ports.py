"""The local launcher's port range (deploy/local/cluster.py): a BROOK_LOCAL_PORT_RANGE inside the kernel's
ephemeral range is refused with the reason, not left to fail a cluster start now and then."""

from __future__ import annotations

import pytest

from deploy.local import cluster


@pytest.mark.parametrize(("text", "ok"), [("15000-23999", True), ("61000-64999", True), ("40000-47999", False),
                                          ("30000-33000", False), ("60000-65000", False)])
def test_a_port_range_inside_the_ephemeral_range_is_refused(monkeypatch: pytest.MonkeyPatch, text: str,
                                                              ok: bool) -> None:
    monkeypatch.setattr(cluster, "_ephemeral_range", lambda: (32768, 60999))
    monkeypatch.setenv(cluster.PORT_RANGE_ENV, text)
    if ok:
        lo, hi = (int(x) for x in text.split("-"))
        assert cluster._port_range() == (lo, hi)
        assert lo <= cluster.free_port() <= hi
    else:
        with pytest.raises(cluster.ClusterError, match="ephemeral port range 32768-60999"):
            cluster._port_range()
