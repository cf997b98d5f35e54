"""Brook's Spark data source ``brook`` (PySpark 4 Python data source API).

    import spark_source
    spark_source.register(spark)
    spark.readStream.format("brook").option("bootstrap.servers", "...").option("subscribe", "t").load()
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the ``brook`` format with a SparkSession (imports pyspark lazily)."""
    from spark_source.source import register as _register

    _register(spark)
