"""Tools from the distribution's packages that some tests and benchmarks need (promtool, Chromium,
nats-server): found on PATH, or installed with apt-get when running as root (as CI does)."""

from __future__ import annotations

import os
import shutil
import subprocess

APT_TIMEOUT_S = 900


def debian_tool(binary: str, package: str) -> tuple[str | None, str]:
    """(path of ``binary``, "") or (None, why it is missing); installs Debian's ``package`` when root."""
    found = shutil.which(binary)
    if found:
        return found, ""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None, f"{binary} is missing and cannot be installed here (needs root and apt-get): apt-get install {package}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S)
    if proc.returncode != 0:  # package lists may be missing on a fresh machine
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=APT_TIMEOUT_S)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S)
    found = shutil.which(binary)
    if not found:
        return None, f"{binary} could not be installed with apt-get: {proc.stderr.strip()[-300:]}"
    return found, ""
