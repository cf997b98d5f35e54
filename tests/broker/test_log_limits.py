"""broker/log_limits.py: a client-caused WARNING at most once a period, the rest counted."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from broker.log_limits import ThrottledWarning


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines of the logger under test (caplog also takes any other thread's, e.g. one an earlier test left)."""
    return [r.getMessage() for r in caplog.records if r.name == "t.limits"]


class ByHand:
    """A ThrottledWarning whose clock and end-of-period timers the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.due: list[tuple[float, Callable[[], None]]] = []  # (delay, function) of each timer armed
        self.warning = ThrottledWarning(logging.getLogger("t.limits"), every_s=10.0, clock=lambda: self.now,
                                        after=lambda delay_s, fn: self.due.append((delay_s, fn)))


def test_a_flood_of_refusals_logs_one_line_a_period_and_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    h = ByHand()
    with caplog.at_level(logging.WARNING, logger="t.limits"):
        logged = [h.warning.warn("refused %s", i) for i in range(50_000)]
        h.now += 10.0
        logged.append(h.warning.warn("refused %s", "late"))
        assert [d for d, _fn in h.due] == [10.0], "one end-of-period check for the whole burst"
        h.due[0][1]()  # the period's end, after the late line: nothing left to tell
    assert logged.count(True) == 2 and logged[0] and logged[-1]
    assert _lines(caplog) == ["refused 0", "refused late (49999 more since the last such line)"]


def test_a_burst_that_ends_is_told_at_the_end_of_its_period(caplog: pytest.LogCaptureFixture) -> None:
    """A client that stops refused requests mid-period: its count once waited for a line that never came."""
    h = ByHand()
    with caplog.at_level(logging.WARNING, logger="t.limits"):
        assert h.warning.warn("refused %s", 0)
        h.now += 4.0
        assert not any(h.warning.warn("refused %s", i) for i in range(1, 300))
        assert [d for d, _fn in h.due] == [6.0], "the check is due when the period ends"
        h.now += 6.0
        h.due.pop()[1]()
        assert _lines(caplog) == ["refused 0", "refused 299 (298 more since the last such line)"]
        # A new period began with that line: the next call within it is held back again, and told at its end.
        h.now += 1.0
        assert not h.warning.warn("refused %s", "again")
        h.due.pop()[1]()
    assert _lines(caplog)[-1] == "refused again"


def test_the_group_coordinators_describe_refusals_share_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """53,443 refused descriptions from one client wrote 13 MB of WARNING lines in 45 s (a probe)."""
    from broker.group_coordinator import DESCRIBE_INFLIGHT_MAX_BYTES, CoordinatorConfig, GroupCoordinator

    c = GroupCoordinator(node_id=1, replica_manager=None, metadata_cache=None, config=CoordinatorConfig())
    try:
        with caplog.at_level(logging.WARNING, logger="broker.group_coordinator"):
            answers = [c.describe_refusal(f"g{i}", 1000, DESCRIBE_INFLIGHT_MAX_BYTES, lambda size: False)
                       for i in range(1000)]
        assert all(a is not None and a.error_code for a in answers)
        assert len([r for r in caplog.records if "describing group" in r.getMessage()]) == 1
    finally:
        c._loader.shutdown()


def test_a_client_chosen_string_cannot_forge_a_log_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group id of "inj\\n<timestamp> ERROR ...\\nTraceback" wrote a forged ERROR line and traceback into the
    node's log, and a NUL made the file binary to grep (audit of the Kafka listener). The nodes' formatter keeps
    each record on one line; a real traceback still follows its record."""
    import io

    from broker import node

    forged = "inj\n2026-12-01 04:00:00,000 ERROR [broker-1-loop] forged\r\nTraceback (most recent call last):\x00\u2028"
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    out = io.StringIO()
    monkeypatch.setattr(node, "report_fatal_signals", lambda: None)  # needs a real stderr descriptor
    try:
        node.setup_logging("INFO")  # the nodes' own logging
        [handler] = root.handlers
        handler.setStream(out)  # type: ignore[attr-defined]
        logging.getLogger("broker.group_state").info("group %s: a member joined", forged)
        try:
            raise ValueError("real")
        except ValueError:
            logging.getLogger("broker.service").exception("request of %s failed", forged)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = out.getvalue().splitlines()
    assert len(lines) == 6, lines  # two records, and the real traceback's four lines
    assert lines[0].endswith("group inj\\n2026-12-01 04:00:00,000 ERROR [broker-1-loop] forged\\r\\nTraceback (most "
                             "recent call last):\\x00\\u2028: a member joined"), lines[0]
    assert lines[2] == "Traceback (most recent call last):" and lines[5] == "ValueError: real", lines


def test_asyncios_ssl_eof_warning_is_dropped_and_nothing_else(caplog: pytest.LogCaptureFixture) -> None:
    """asyncio logged it for each Kafka-listener client that ended its TLS handshake early (a churn audit: over a
    hundred lines a node, telling nothing)."""
    from broker.log_limits import QuietAsyncioSslEof

    logger = logging.getLogger("asyncio")
    quiet = QuietAsyncioSslEof()
    logger.addFilter(quiet)
    try:
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            logger.warning("returning true from eof_received() has no effect when using ssl")
            logger.warning("Executing %s took %.3f seconds", "<Task>", 0.5)
    finally:
        logger.removeFilter(quiet)
    assert [r.getMessage() for r in caplog.records] == ["Executing <Task> took 0.500 seconds"]


def test_a_throttled_line_may_be_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    info = ThrottledWarning(logging.getLogger("t.limits.info"), level=logging.INFO, after=lambda _d, _fn: None)
    with caplog.at_level(logging.INFO, logger="t.limits.info"):
        assert info.warn("closing %s", "a") and not info.warn("closing %s", "b")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.INFO, "closing a")]
