"""Memory."""
