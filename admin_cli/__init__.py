"""Brook: admin_cli."""
