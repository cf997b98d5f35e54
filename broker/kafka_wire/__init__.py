"""Kafka's wire protocol on a broker listener, so unmodified Kafka clients work against Brook."""
