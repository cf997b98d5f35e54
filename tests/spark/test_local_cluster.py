"""The source with executors in separate processes (Spark's local-cluster master)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_executors_in_separate_processes_read_from_leaders(brook) -> None:  # type: ignore[no-untyped-def]
    topic = "local-cluster"
    brook.create_topic(topic, 2)
    acked = brook.produce(topic, [b"lc%d" % i for i in range(300)])
    job = Path(__file__).with_name("local_cluster_job.py")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    # Its own driver process: this session's SparkContext (local[2]) cannot coexist with another.
    proc = subprocess.run([sys.executable, str(job), brook.bootstrap, topic],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # local-cluster gives the driver no executor of its own: every task ran in the executor's process.
    assert out["executors"] == 1, out["executors"]
    assert {(p, o): v.encode() for p, o, v in out["batch"]} == acked
    assert len(out["batch"]) == len(acked)
