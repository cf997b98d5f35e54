"""Loaded at start-up by a node launched with this folder on PYTHONPATH (tests/wall_clock.py): the node's wall
clock (``time.time`` and ``time.time_ns``, what Python code reads) runs offset by the seconds written in the file
named by FAKE_WALL_CLOCK_FILE, read again at most every 50 ms, as an NTP step or an operator's ``date -s`` would
move it. The monotonic clock is left alone. C code (OpenSSL, gRPC) keeps the real time."""

import os
import time

_PATH = os.environ.get("FAKE_WALL_CLOCK_FILE", "")
if _PATH:
    _real_time, _real_time_ns, _steady = time.time, time.time_ns, time.monotonic
    _offset = [0.0, float("-inf")]  # seconds, when read (monotonic)

    def _offset_s() -> float:
        now = _steady()
        if now - _offset[1] >= 0.05:
            try:
                with open(_PATH) as f:
                    _offset[0] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                _offset[0] = 0.0
            _offset[1] = now
        return _offset[0]

    def _time() -> float:
        return _real_time() + _offset_s()

    def _time_ns() -> int:
        return _real_time_ns() + int(_offset_s() * 1e9)

    time.time, time.time_ns = _time, _time_ns
