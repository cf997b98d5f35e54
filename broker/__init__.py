"""Brook: broker."""
