"""What every invoke-mode target shares: its answer, its failure and the client protocol, apart
from the SDK clients (``aws_lambda``, ``aliyun_fc``) and the pool that runs them (``invoke``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class InvokeFailed(Exception):
    """The target could not be invoked, or its answer was not a function response."""


@dataclass(frozen=True)
class FunctionAnswer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class Invoker(Protocol):
    def invoke(self, payload: bytes) -> bytes:
        """Blocking: send one event, return the function's raw answer."""
        ...
