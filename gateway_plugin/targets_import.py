"""``terraform output -json spillway_targets`` → the ``targets:`` section of spillway.yaml."""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import ValidationError

from gateway_plugin.config import ConfigError, Target


def import_targets(raw: str) -> str:
    try:
        data: Any = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"expected the JSON of `terraform output -json spillway_targets`: {exc}") from None
    if isinstance(data, dict) and "value" in data:
        data = data["value"]
    if not isinstance(data, list):
        raise ConfigError("expected a JSON list of targets")
    targets = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ConfigError(f"targets[{i}] is not an object")
        clean = {k: v for k, v in item.items() if v is not None}
        try:
            targets.append(Target.model_validate(clean).model_dump(mode="json", exclude_defaults=True))
        except ValidationError as exc:
            bad = "; ".join(f"targets[{i}].{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(bad) from None
    return str(yaml.safe_dump({"targets": targets}, sort_keys=False))
