"""AWS Lambda adapter: ``python -m awslambdaric functions.aws_lambda.handler`` (a Function URL in
``RESPONSE_STREAM`` mode runs ``python -m functions lambda-runtime`` instead: ``lambda_stream``).

Importing this module is Lambda's init phase: the sidecar starts first, the heavy imports run
while Triton loads, and a Triton that never gets ready fails the init (``/runtime/init/error``).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from functions.instance import Instance
from functions.settings import LAMBDA_MAX_BODY_BYTES, FunctionSettings
from functions.sidecar import Sidecar

_instance = Instance()
_settings = FunctionSettings.from_env(default_max_body=LAMBDA_MAX_BODY_BYTES)
_sidecar = Sidecar(_settings.sidecar_options())
_sidecar.start()

import asyncio  # noqa: E402  (after the sidecar's start, so that the two overlap)

from functions.core import FunctionCore  # noqa: E402
from functions.invocation import answer_event  # noqa: E402
from functions.loop import new_event_loop  # noqa: E402
from functions.model_probe import preload  # noqa: E402

preload()
loop: asyncio.AbstractEventLoop = new_event_loop()
core = FunctionCore.on_sidecar(_settings, _sidecar, _instance)
_sidecar.wait_ready(_settings.ready_timeout_s + 1)


def _on_sigterm(signum: int, frame: object) -> None:
    """Close the idle keep-alive connections first, or Triton waits out its exit timeout for them."""
    core.close_connections()
    _sidecar.stop()
    sys.exit(0)


signal.signal(signal.SIGTERM, _on_sigterm)


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Every invocation: an HTTP-shaped event or a warm-up ping; deadline from the context."""
    time_left = context.get_remaining_time_in_millis() / 1000 if context is not None else None
    return loop.run_until_complete(answer_event(core, event, time_left))
