"""The health listener on its own: answers its two paths, and stops whether or not it was started."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from broker.health import HealthServer


def test_it_answers_live_and_ready_and_nothing_else() -> None:
    h = HealthServer("127.0.0.1", 0, live=lambda: (True, "loop ran"), ready=lambda: (False, "2 partitions behind"))
    h.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{h.port}/livez", timeout=5) as r:
            assert (r.status, json.loads(r.read())) == (200, {"status": "ok", "reason": "loop ran"})
        with pytest.raises(urllib.error.HTTPError) as not_ready:
            urllib.request.urlopen(f"http://127.0.0.1:{h.port}/readyz", timeout=5)
        assert not_ready.value.code == 503
        with pytest.raises(urllib.error.HTTPError) as unknown:
            urllib.request.urlopen(f"http://127.0.0.1:{h.port}/metrics", timeout=5)
        assert unknown.value.code == 404
    finally:
        h.stop()


def test_a_server_never_started_stops_at_once() -> None:
    # A node that fails between creating the listener and starting it still shuts down: stop() must
    # not wait for a serve loop that never ran.
    h = HealthServer("127.0.0.1", 0, live=lambda: (True, ""), ready=lambda: (True, ""))
    stopper = threading.Thread(target=h.stop, daemon=True)
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive(), "stop() of a health listener that was never started did not return"
