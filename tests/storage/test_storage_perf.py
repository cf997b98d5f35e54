"""The storage benchmark command runs end to end (figures are printed, never asserted)."""

from __future__ import annotations

from pathlib import Path

from storage import perf


def test_perf_main_prints_append_raw_and_read_figures(tmp_path: Path, capsys) -> None:
    assert perf.main(["--dir", str(tmp_path), "--total-mb", "1", "--batch-kb", "16,64", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "append/raw" in out and "read MB/s" in out
    rows = [line for line in out.splitlines() if line.strip().endswith(tuple("0123456789"))]
    assert len(rows) == 2, out
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself
