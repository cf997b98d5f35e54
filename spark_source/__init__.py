"""Brook's Spark data source ``brook`` (PySpark 4 Python data source API).

    import spark_source
    spark_source.register(spark)
    spark.readStream.format("brook").option("bootstrap.servers", "...").option("subscribe", "t").load()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any


def register(spark: Any) -> None:
    """Register the ``brook`` format with a SparkSession (imports pyspark lazily)."""
    from spark_source.source import register as _register

    _register(spark)


def local_session(app_name: str, master: str = "local[2]", conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession on this machine only, for the demo, the benchmark and the tests.

    Spark's Python workers run this interpreter (the one with Brook installed); the driver binds
    to loopback; no UI; 2 shuffle partitions. ``conf`` adds or overrides settings.

    Call it before this process opens any gRPC channel (Brook's client). PySpark starts its JVM
    with ``Popen(..., preexec_fn=...)``, a fork() that runs Python in the child before exec, and
    grpcio 1.81+ can crash that child while gRPC threads run (grpc/grpc#43055): the session then
    fails with JAVA_GATEWAY_EXITED.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # nothing may listen beyond loopback
    settings = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", **(conf or {})}
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
