"""Plugins shipped with the runner."""
