"""Brook: spark_source."""
