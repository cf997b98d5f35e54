"""Brook: metadata_quorum."""
