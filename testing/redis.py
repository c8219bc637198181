"""The shared-state tests' real ``redis-server``; skipped, with the reason, where it is not installed."""

from __future__ import annotations

import pytest

from devtools.redis import INSTALL_HINT, REDIS_SERVER, RedisServer, redis_server

needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason=INSTALL_HINT)

__all__ = ["RedisServer", "needs_redis", "redis_server"]
