"""Local N-node cluster launcher: ``LocalCluster`` for tests and demos, ``python -m deploy.local`` for people."""

from deploy.local.cluster import ClusterError, LocalCluster

__all__ = ["ClusterError", "LocalCluster"]
