"""Local N-node cluster launcher."""
