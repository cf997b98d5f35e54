"""Session fixtures that belong to one test folder, closed when that folder's tests are over.

A shared cluster of a folder (tests/client, tests/ops, ...) is a session fixture so that every
module of the folder reuses it, but pytest would keep it running until the whole session ends:
four idle 3-node clusters and their clients' threads then load the two cores under every later
folder (Spark, the simulator). ``close_when_folder_done`` runs its callback once the folder's last
test has been torn down (tests/conftest.py); folders run one after the other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TESTS = Path(__file__).resolve().parent
_ON_LEAVING: dict[str | None, list[Callable[[], Any]]] = {}


def folder_of(path: Any) -> str | None:
    """The folder under tests/ a test file is in (None outside tests/)."""
    try:
        return Path(path).resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None


def close_when_folder_done(conftest_file: str, close: Callable[[], Any]) -> Callable[[], None]:
    """Run ``close`` once the tests of the folder of ``conftest_file`` (the ``__file__`` of the conftest
    defining the fixture) are over; returns a callable that runs it at most once, for the fixture's
    own teardown."""
    done = False

    def once() -> None:
        nonlocal done
        if not done:
            done = True
            close()
    _ON_LEAVING.setdefault(folder_of(conftest_file), []).append(once)
    return once


def leaving(folder: str | None) -> None:
    """Close what was registered for ``folder``, newest first (clients before their cluster)."""
    for close in reversed(_ON_LEAVING.pop(folder, [])):
        try:
            close()
        except Exception:  # noqa: BLE001 - closing one must not keep the others open
            log.exception("closing a fixture of tests/%s failed", folder)
