"""Brook: replication — how a partition's replicas stay identical.

- ``isr.py``: the pure rules (follower progress, high watermark over the maximal ISR,
  who leaves and who joins the ISR, where a diverged follower truncates).
- ``partition.py``: one hosted replica — its log, its role (leader/follower per the
  latest metadata), follower progress and ISR proposals when leading.
- ``fetcher.py``: follower side — one ReplicaFetcher thread per source broker, many
  partitions per Fetch, truncation on divergence (KIP-101/279/320), out-of-range handling.
- ``purgatory.py``: delayed operations (acks=all waiting for the HW, long-polling fetches).

The broker (``broker/replica_manager.py``) wires these to metadata, gRPC and the controller.
"""
