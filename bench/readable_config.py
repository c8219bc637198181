"""``python -m functions serve`` with each model's configuration readable, for perf_analyzer.

perf_analyzer reads ``GET /v2/models/<model>/config`` before it sends anything, and both doors
close that route: Triton's admin lock (``model-config``) and the function's allow-list. This
launcher opens that one read-only route on both and leaves everything else as shipped, the
inference path included, so the benchmark measures the function that ships.
"""

from __future__ import annotations

import re
import sys

from functions import cli, sidecar, surface


def open_config() -> None:
    sidecar._ADMIN_APIS = tuple(api for api in sidecar._ADMIN_APIS if api != "model-config")
    surface._ROUTES = (*surface._ROUTES, (re.compile(surface._MODEL + r"/config"), "GET"))


if __name__ == "__main__":
    open_config()
    sys.exit(cli.main(sys.argv[1:]))
