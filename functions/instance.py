"""This process's identity as a function instance (standard library only: read at process start)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Instance:
    """The id lets the gateway and warm-up count distinct instances; ``started_at`` times the cold start."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    started_at: float = field(default_factory=time.monotonic)
