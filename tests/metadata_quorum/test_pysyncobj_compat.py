"""Importing the quorum (and so pysyncobj) leaves socket.inet_ntop working: pysyncobj replaces it on every
platform with a Windows-only function that raises TypeError. A fresh interpreter, as a node's is."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import socket
import {module}
print(socket.inet_ntop(socket.AF_INET, bytes([127, 0, 0, 2])), socket.inet_ntop(socket.AF_INET6, bytes(15) + b"\\1"))
"""


@pytest.mark.parametrize("module", ["metadata_quorum.raft", "metadata_quorum.quorum_journal",
                                    "metadata_quorum.journal_repair", "metadata_quorum.raft_transport"])
def test_socket_inet_ntop_still_works_once_the_quorum_is_imported(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHECK.format(module=module)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["127.0.0.2", "::1"]
