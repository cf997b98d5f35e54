"""The demo's streaming aggregation (what `make demo` runs) over a real cluster."""

from __future__ import annotations

import io

import pytest

from spark_source.demo_job import run_demo

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_demo_counts_records_per_key(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic = "demo-events"
    brook.create_topic(topic, 3)
    keys = [b"user-%d" % (i % 4) for i in range(400)]
    brook.produce(topic, [b"e" * (i % 9) for i in range(400)], keys=keys)
    out = io.StringIO()
    result = run_demo(spark, brook.bootstrap, topic, checkpoint_dir=tmp_path / "cp", out=out)
    expected = [(f"user-{k}", 100, sum(i % 9 for i in range(400) if i % 4 == k)) for k in range(4)]
    assert result == expected
    assert "total" in out.getvalue() and "user-3" in out.getvalue()
