"""The base of every section of spillway.yaml: frozen, no unknown keys, no NaN or infinity."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
