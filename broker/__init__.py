"""Brook: broker — the process that owns partition logs and serves clients and replicas.

- ``server.py``: BrokerServer/BrokerSettings — lifecycle, registration, heartbeats, metadata watch.
- ``metadata_cache.py``: the broker's copy of the cluster metadata (WatchMetadata snapshots + deltas).
- ``replica_manager.py``: hosted partitions, roles from metadata, produce/fetch paths, ISR upkeep,
  the internal API the group coordinator uses.
- ``service.py``: the BrokerService gRPC servicer (thin; errors become codes here).
- ``producer_ids.py``: producer id blocks for idempotent producers.
- ``config.py``, ``node.py``, ``metrics.py``: node config, the ``brook-server`` main, Prometheus.
- ``group_coordinator.py``, ``group_*.py``: the consumer group coordinator.
"""
