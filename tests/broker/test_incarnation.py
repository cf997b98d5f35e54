"""A broker records its incarnation in its first log directory before it registers, and names the one it
found there (its previous process's) when it registers, so the controller takes a restart at once."""

from __future__ import annotations

from pathlib import Path

from broker.server import INCARNATION_FILE, record_incarnation


def test_each_start_returns_the_previous_incarnation_and_records_its_own(tmp_path: Path) -> None:
    assert record_incarnation(tmp_path, "aa11") == ""  # a first start
    assert (tmp_path / INCARNATION_FILE).read_text() == "aa11\n"
    assert record_incarnation(tmp_path, "bb22") == "aa11"
    assert record_incarnation(tmp_path, "cc33") == "bb22"
    assert (tmp_path / INCARNATION_FILE).read_text() == "cc33\n"
    assert not list(tmp_path.glob("*.tmp"))


def test_a_file_that_holds_no_incarnation_counts_as_a_first_start(tmp_path: Path) -> None:
    for junk in ("not an id\n", "x" * 10, "ab" * 40, "\xff\xfe"):
        (tmp_path / INCARNATION_FILE).write_bytes(junk.encode("latin-1"))
        assert record_incarnation(tmp_path, "dd44") == "", junk
        assert (tmp_path / INCARNATION_FILE).read_text() == "dd44\n"
