"""Brook: deploy."""
