"""Brook: replication."""
