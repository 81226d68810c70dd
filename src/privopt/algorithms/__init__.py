"""Optimisation algorithms; importing this package registers the built-ins."""
