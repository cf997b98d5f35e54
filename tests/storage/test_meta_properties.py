"""meta.properties: a data directory names its cluster and node; another node or cluster is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto import errors
from storage import meta_properties


def test_first_start_writes_it_and_later_starts_check_it(tmp_path: Path) -> None:
    d = tmp_path / "data"
    meta_properties.check_or_write(d, "c1", 3)
    assert (d / "meta.properties").read_text() == "cluster.id=c1\nnode.id=3\n"
    meta_properties.check_or_write(d, "c1", 3)  # the same node again: fine
    meta_properties.check_or_write(d, "", 3)  # no cluster id configured: only the node is checked
    with pytest.raises(errors.InvalidConfigError, match=r"node.id is '3', this node is configured with '4'"):
        meta_properties.check_or_write(d, "c1", 4)
    with pytest.raises(errors.InvalidConfigError, match=r"cluster.id is 'c1', .* 'c2' .*another cluster"):
        meta_properties.check_or_write(d, "c2", 3)
    assert (d / "meta.properties").read_text() == "cluster.id=c1\nnode.id=3\n"  # refusals change nothing


def test_a_file_without_the_keys_or_unreadable_is_refused(tmp_path: Path) -> None:
    (tmp_path / "meta.properties").write_text("# nothing here\n")
    with pytest.raises(errors.InvalidConfigError, match="names no cluster.id"):
        meta_properties.check_or_write(tmp_path, "c1", 1)
    (tmp_path / "meta.properties").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(errors.InvalidConfigError, match="unreadable"):
        meta_properties.check_or_write(tmp_path, "c1", 1)


def test_it_says_when_the_directory_was_new_and_the_broker_when_it_holds_no_log(tmp_path: Path) -> None:
    """What a broker tells the controller at registration (storage_created): its log directory had no
    meta.properties and no partition log, so it is new (a first start, a replaced or wiped disk)."""
    from broker.server import _holds_logs

    d = tmp_path / "data"
    assert meta_properties.check_or_write(d, "c1", 3) is True and not _holds_logs(d)
    assert meta_properties.check_or_write(d, "c1", 3) is False
    old = tmp_path / "older"  # logs written before meta.properties existed: not new
    (old / "orders-0").mkdir(parents=True)
    assert meta_properties.check_or_write(old, "c1", 3) is True and _holds_logs(old)


def test_a_new_log_directory_is_reported_until_the_controller_has_taken_it(tmp_path: Path) -> None:
    """A broker stopped after it made its new log directory's meta.properties, but before the controller took
    its registration, must still say at its next start that its storage is new (a review: the signal was
    lost, and the empty broker, last in an ISR, was elected cleanly at the next start)."""
    from broker.server import check_log_dirs, storage_registered

    dirs = [tmp_path / "a", tmp_path / "b"]
    (dirs[1] / "orders-0").mkdir(parents=True)  # an older broker's logs, no meta.properties: not new
    meta_properties.check_or_write(dirs[1], "c1", 3)
    assert check_log_dirs(dirs, "c1", 3) is True  # "a" is new
    assert check_log_dirs(dirs, "c1", 3) is True, "a start before the registration was taken says it again"
    storage_registered(dirs)
    assert check_log_dirs(dirs, "c1", 3) is False
