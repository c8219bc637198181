"""What a member runs at once per model, read from its own model configuration.

An autoscaler adds pods, and a rollout may change what each pod runs (a new ``instance_group``, a
bigger GPU node): the capacity the policy reads is then each member's own, not one figure in the
config. Triton's ``GET /v2/models/<model>/config`` answers the configuration in force, completed by
the server: an ``instance_group`` of kind GPU lists the GPUs it runs on, so a model's instances on a
member are each group's ``count`` times its GPUs (one for a CPU or model group). I/O at the edge:
``fetch`` is the scraper's bounded GET.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from urllib.parse import quote

log = logging.getLogger("spillway.signals")

# Model configurations read per round at most, over all members (a member with more models, or a
# scale-up of many members, is read over the next rounds).
MAX_READS_PER_ROUND = 64
# Instances one group may claim: a configuration saying more is read as this.
MAX_INSTANCES = 10_000


def instances(config: object) -> float | None:
    """The instances a model configuration (Triton's JSON) runs; None when it names no usable
    ``instance_group``."""
    if not isinstance(config, Mapping):
        return None
    groups = config.get("instance_group")
    if not isinstance(groups, Sequence) or isinstance(groups, str) or not groups:
        return None
    total = 0.0
    for group in groups:
        if not isinstance(group, Mapping):
            return None
        count = group.get("count", 1)
        gpus = group.get("gpus") or ()
        if isinstance(count, bool) or not isinstance(count, int | float) or not isinstance(gpus, Sequence):
            return None
        if not math.isfinite(count) or count < 0:
            return None
        on = len(gpus) if group.get("kind") in ("KIND_GPU", None) and gpus else 1
        total += min(float(count), MAX_INSTANCES) * on
    return total


async def read_instances(
    fetch: Callable[[str], Awaitable[str]], wanted: Sequence[tuple[str, str, Sequence[str]]]
) -> dict[str, dict[str, float]]:
    """Each wanted member's (metrics URL, inference base URL, models) instances per model, read
    concurrently. A model shows on a member's metrics page once it has loaded, so a configuration
    that cannot be read then (Triton's ``--http-restricted-api`` keeping model-config behind a
    header, a proxy) will not be readable later either: it counts as one instance, said once."""
    asks = [(url, base, model) for url, base, models in wanted for model in models][:MAX_READS_PER_ROUND]
    answers = await asyncio.gather(
        *(fetch(f"{base}/v2/models/{quote(model, safe='')}/config") for _, base, model in asks),
        return_exceptions=True,
    )
    found: dict[str, dict[str, float]] = {}
    for (url, base, model), answer in zip(asks, answers, strict=True):
        if isinstance(answer, BaseException) and not isinstance(answer, OSError | TimeoutError | ValueError):
            raise answer
        count = None if isinstance(answer, BaseException) else _parsed(answer)
        if count is None:
            why = answer if isinstance(answer, BaseException) else "it names no instance_group"
            log.warning(
                "on-prem member %s: model %s's configuration not read from %s (%s); counted as 1 instance",
                url,
                model,
                base,
                why,
            )
            count = 1.0
        found.setdefault(url, {})[model] = count
    return found


def _parsed(text: str) -> float | None:
    try:
        return instances(json.loads(text))
    except (ValueError, RecursionError):
        return None
