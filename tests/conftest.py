"""Test-wide settings.

Hypothesis runs without per-example deadlines: a shared 2-core machine makes timing flaky, not
code. Runners started by the tests get a route token, as every deployment with upstream-mode
targets must (``gateway_plugin.routing.target_header``).
"""

import os

from hypothesis import settings

settings.register_profile("spillway", deadline=None)
settings.load_profile("spillway")

os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", "test-route-token-" + os.urandom(8).hex())
