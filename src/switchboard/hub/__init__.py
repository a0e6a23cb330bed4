"""Connections, routing, the workspace manager and who may do what."""
