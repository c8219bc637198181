"""Hypothesis without per-example deadlines: a shared 2-core machine makes timing flaky, not code."""

from hypothesis import settings

settings.register_profile("spillway", deadline=None)
settings.load_profile("spillway")
