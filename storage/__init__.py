"""Brook: storage."""
