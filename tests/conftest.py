"""Suite-wide test setup.

Test folders are not packages; pytest's default (prepend) import mode puts each
conftest's folder on sys.path, so this file makes the shared helpers in tests/ (such as
``waiting.wait_for``) importable from every folder.
"""

import pytest
from folder_scope import folder_of, leaving


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a folder (its fixtures torn down), close that folder's session fixtures
    registered with ``folder_scope.close_when_folder_done``."""
    here = folder_of(item.path)
    if nextitem is None or folder_of(nextitem.path) != here:
        leaving(here)
