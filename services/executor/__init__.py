"""Executor service: runs an episode end to end and streams its events."""
