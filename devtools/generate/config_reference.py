"""``docs/reference/config.md`` and the published schema: every key of spillway.yaml with its type,
default and description, read from the JSON Schema the models make, so the page cannot drift from
what the runner accepts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway_plugin.config.schema import SCHEMA_PATH, json_schema, schema_text

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "config.md"

Schema = dict[str, Any]


@dataclass(frozen=True)
class Key:
    """One row of the page: a key's dotted path and what the schema says of it."""

    path: str
    kind: str
    default: str
    description: str


class _Reader:
    """Walks the schema's properties, following ``$ref`` into ``$defs`` (each model once per path)."""

    def __init__(self, schema: Schema) -> None:
        self.defs: dict[str, Schema] = schema.get("$defs", {})

    def resolve(self, node: Schema) -> Schema:
        ref = node.get("$ref")
        return self.defs[ref.rsplit("/", 1)[-1]] if ref else node

    def kind(self, node: Schema) -> str:
        """A reader's name for a type: ``list of Target``, ``map of string to number``."""
        if "$ref" in node:
            resolved = self.resolve(node)
            return self.kind(resolved) if "anyOf" in resolved else f"`{node['$ref'].rsplit('/', 1)[-1]}`"
        if "properties" in node and "title" in node:  # a model written in place (``number or Share``)
            return f"`{node['title']}`"
        if "anyOf" in node:
            kinds = [self.kind(part) for part in node["anyOf"] if part.get("type") != "null"]
            nullable = any(part.get("type") == "null" for part in node["anyOf"])
            return " or ".join(kinds) + (" or null" if nullable else "")
        if "enum" in node:
            return "one of " + ", ".join(f"`{value}`" for value in node["enum"])
        if "const" in node:
            return f"`{node['const']}`"
        kind = node.get("type", "any")
        if kind == "array":
            return f"list of {self.kind(node.get('items', {}))}"
        if kind == "object" and isinstance(node.get("additionalProperties"), dict):
            return f"map of string to {self.kind(node['additionalProperties'])}"
        return str(kind)

    def models_in(self, node: Schema) -> Iterator[tuple[str, Schema]]:
        """The models a key holds, with the path step into each (``[]`` for a list's items,
        ``.<name>`` for a map's values)."""
        if "properties" in node:
            yield "", node
        if "$ref" in node:
            yield from self.models_in(self.resolve(node))
        for part in node.get("anyOf", []):
            yield from self.models_in(part)
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            for step, model in self.models_in(node["items"]):
                yield "[]" + step, model
        if isinstance(node.get("additionalProperties"), dict):
            for step, model in self.models_in(node["additionalProperties"]):
                yield ".<name>" + step, model

    def keys(self, model: Schema, prefix: str, seen: tuple[str, ...] = ()) -> Iterator[Key]:
        required = set(model.get("required", ()))
        for name, node in model.get("properties", {}).items():
            path = f"{prefix}.{name}" if prefix else name
            yield Key(path, self.kind(node), _default(node, name in required), _description(node, self))
            for step, inner in self.models_in(node):
                title = inner.get("title", "")
                if title not in seen:
                    yield from self.keys(inner, path + step, (*seen, title))


def _default(node: Schema, required: bool) -> str:
    if required:
        return "required"
    if "default" in node:
        return f"`{json.dumps(node['default'])}`"
    return "see below" if "$ref" in node else "empty"


def _description(node: Schema, reader: _Reader) -> str:
    text = node.get("description") or reader.resolve(node).get("description", "")
    return " ".join(str(text).split()).replace("|", "\\|")


def page() -> str:
    """The reference page, one table per top-level section."""
    schema = json_schema()
    reader = _Reader(schema)
    lines = [
        "# spillway.yaml",
        "",
        "<!-- Made by `python -m devtools.generate reference` from the config models: edit their "
        "field descriptions, not this page. -->",
        "",
        "Every key the gateway's config takes, with its type, default and description, made from the "
        "models that load the file. `python -m gateway_plugin check-config FILE` validates a file and "
        "explains it; `python -m gateway_plugin config-schema` prints the "
        f"[JSON Schema](../schema/{Path(SCHEMA_PATH).name}) that editors read through the first line "
        "of each example; `examples/spillway.yaml` starts with:",
        "",
        "```yaml",
        f"# yaml-language-server: $schema=../{SCHEMA_PATH}",
        "```",
        "",
        "A path's `[]` is each item of a list and `<name>` each entry of a map.",
    ]
    for name, node in schema["properties"].items():
        about = _description(node, reader)
        lines += ["", f"## `{name}`", "", *([about, ""] if about else [])]
        lines += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        top = Key(name, reader.kind(node), _default(node, False), "")
        rows = [
            top,
            *(key for step, model in reader.models_in(node) for key in reader.keys(model, name + step)),
        ]
        lines += [f"| `{key.path}` | {key.kind} | {key.default} | {key.description} |" for key in rows]
    return "\n".join(lines) + "\n"


def files() -> dict[Path, str]:
    """The page and the schema it links to."""
    return {PAGE: page(), ROOT / SCHEMA_PATH: schema_text()}
