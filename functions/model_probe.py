"""Answers to warm-up pings: hold the instance, check or probe the models with tritonclient.

Probes build their inputs from the model's own metadata (zeros of the declared shape), never from
user data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import numpy as np


def preload() -> None:
    """Import tritonclient now, while the sidecar starts, rather than on the first ping."""
    import tritonclient.http.aio  # noqa: F401


class ModelProber:
    def __init__(self, url: str) -> None:
        self._url = url
        self._client: Any = None

    def _get_client(self) -> Any:
        if self._client is None:
            from tritonclient.http.aio import InferenceServerClient

            self._client = InferenceServerClient(self._url)
        return self._client

    async def ready_models(self, models: Iterable[str]) -> tuple[str, ...]:
        client = self._get_client()
        names = list(models)
        states = await asyncio.gather(*(client.is_model_ready(m) for m in names), return_exceptions=True)
        return tuple(m for m, ok in zip(names, states, strict=True) if ok is True)

    async def probe_models(self, models: Iterable[str]) -> tuple[str, ...]:
        names = list(models)
        results = await asyncio.gather(*(self._probe(m) for m in names), return_exceptions=True)
        return tuple(m for m, ok in zip(names, results, strict=True) if ok is True)

    async def _probe(self, model: str) -> bool:
        from tritonclient.http import InferInput
        from tritonclient.utils import triton_to_np_dtype

        client = self._get_client()
        metadata = await client.get_model_metadata(model)
        inputs = []
        for spec in metadata["inputs"]:
            shape = [1 if d < 0 else d for d in spec["shape"]]
            tensor = InferInput(spec["name"], shape, spec["datatype"])
            if spec["datatype"] == "BYTES":
                tensor.set_data_from_numpy(np.full(shape, b"", dtype=np.object_))
            else:
                tensor.set_data_from_numpy(np.zeros(shape, dtype=triton_to_np_dtype(spec["datatype"])))
            inputs.append(tensor)
        await client.infer(model, inputs)
        return True

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
