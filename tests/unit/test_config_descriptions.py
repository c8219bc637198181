"""Every key of spillway.yaml carries its description on its pydantic field, so the reference page
and the editor schema made from ``model_json_schema()`` explain each one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

from pydantic import BaseModel

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.warmup import Window
from gateway_plugin.simulation.settings import MemberChange, SimulatedTarget

ROOT = SpillwayConfig


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The models a field's type holds: itself, or inside lists, dicts, unions and ``Annotated``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in get_args(annotation):
        yield from _models_in(arg)


def _walk(model: type[BaseModel], path: str, seen: set[type[BaseModel]]) -> Iterator[tuple[str, str]]:
    """(dotted path, description) of every field reachable from ``model``, each model once."""
    seen.add(model)
    for name, field in model.model_fields.items():
        where = f"{path}.{name}" if path else name
        yield where, (field.description or "").strip()
        for nested in _models_in(field.annotation):
            if nested not in seen:
                yield from _walk(nested, where, seen)


def test_the_walk_reaches_the_nested_models() -> None:
    seen: set[type[BaseModel]] = set()
    paths = {path for path, _ in _walk(ROOT, "", seen)}
    assert {Window, SimulatedTarget, MemberChange} <= seen
    assert {
        "warmup.targets.windows.start",
        "simulation.membership.at_s",
        "local.thresholds.engine.model",
    } <= paths


def test_every_field_has_a_description() -> None:
    missing = [path for path, description in _walk(ROOT, "", set()) if not description]
    assert missing == [], f"fields without a description: {', '.join(missing)}"


def test_the_schema_describes_every_property() -> None:
    schema = ROOT.model_json_schema()
    definitions: dict[str, dict[str, Any]] = {"(root)": schema, **schema.get("$defs", {})}
    missing = [
        f"{name}.{key}"
        for name, definition in definitions.items()
        for key, prop in definition.get("properties", {}).items()
        if not str(prop.get("description", "")).strip()
    ]
    assert len(definitions) > 30
    assert missing == [], f"schema properties without a description: {', '.join(missing)}"
