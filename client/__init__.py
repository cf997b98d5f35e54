"""Brook: client."""
