"""The published JSON Schema of spillway.yaml: what editors and a JSON-Schema validator check is what
the runner checks. Every example names the schema on its first line and passes both; a mistake
planted anywhere in an example (an unknown key, a number written as a word, a value not among the
choices) is refused by both."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.schema import SCHEMA_PATH, schema_text
from testing.paths import ROOT

SCHEMA_FILE = ROOT / SCHEMA_PATH
SCHEMA_LINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")
# Every spillway.yaml the repository ships, as an example or in the Kubernetes manifests.
EXAMPLES = [
    ROOT / "examples" / "spillway.yaml",
    ROOT / "examples" / "simulation" / "bursty.yaml",
    ROOT / "examples" / "kubernetes" / "spillway-local.yaml",
    ROOT / "deploy" / "kubernetes" / "base" / "config" / "spillway.yaml",
]
Path_ = tuple[str | int, ...]


def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _pydantic_refuses(data: Any) -> bool:
    try:
        SpillwayConfig.model_validate(data)
    except ValidationError:
        return True
    return False


def test_the_command_prints_the_published_schema() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "gateway_plugin", "config-schema"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert printed == schema_text() == SCHEMA_FILE.read_text(), "run python -m devtools.generate reference"
    assert json.loads(printed)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_names_the_schema_and_passes_both_checks(example: Path) -> None:
    first = example.read_text().splitlines()[0]
    named = SCHEMA_LINE.match(first)
    assert named, f"{example.name}: the first line names no schema for editors"
    assert (example.parent / named.group(1)).resolve() == SCHEMA_FILE.resolve()
    data = yaml.safe_load(example.read_text())
    assert not list(_validator().iter_errors(data))
    assert not _pydantic_refuses(data)


def test_every_shipped_config_example_is_in_the_list() -> None:
    """A new example with the schema line is checked here too (the list is the examples with it)."""
    shipped = [*(ROOT / "examples").rglob("*.yaml"), *(ROOT / "deploy").rglob("*.yaml")]
    named = {p for p in shipped if SCHEMA_LINE.match(p.read_text().split("\n")[0])}
    assert named == set(EXAMPLES)


def _mappings(node: Any, path: Path_ = ()) -> Iterator[Path_]:
    """The paths of the example's mappings that are a model's fields (not a map of names)."""
    if isinstance(node, dict):
        yield path
        for key, value in node.items():
            yield from _mappings(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _mappings(value, (*path, index))


def _leaves(node: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    else:
        yield path, node


def _with(data: Any, path: Path_, change: Any) -> Any:
    planted = copy.deepcopy(data)
    node = planted
    for step in path[:-1]:
        node = node[step]
    change(node, path[-1])
    return planted


def _refused_by_both(data: Any, where: str) -> None:
    assert list(_validator().iter_errors(data)), f"the schema accepts {where}"
    assert _pydantic_refuses(data), f"the runner accepts {where}"


def _concrete(schema: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    """What a schema node stands for, through refs and unions."""
    if "$ref" in node:
        return _concrete(schema, schema["$defs"][node["$ref"].rsplit("/", 1)[-1]])
    if "anyOf" in node:
        return [found for part in node["anyOf"] for found in _concrete(schema, part)]
    return [node]


def _models(schema: dict[str, Any], node: dict[str, Any], step: str | int) -> list[dict[str, Any]]:
    """The schema nodes a value at ``step`` below ``node`` may match."""
    if len(concrete := _concrete(schema, node)) != 1 or concrete[0] is not node:
        return [found for part in concrete for found in _models(schema, part, step)]
    if isinstance(step, int):
        return [node["items"]] if "items" in node else []
    if step in node.get("properties", {}):
        return [node["properties"][step]]
    extra = node.get("additionalProperties")
    return [extra] if isinstance(extra, dict) else []


def _is_model(path: Path_) -> bool:
    """Whether the mapping at ``path`` is a model's (fixed keys), not a map of the user's names: its
    keys are what the schema lists, so one more is a mistake both must see."""
    schema = json.loads(SCHEMA_FILE.read_text())
    nodes = [schema]
    for step in path:
        nodes = [found for node in nodes for found in _models(schema, node, step)]
    return any("properties" in found for node in nodes for found in _concrete(schema, node))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_unknown_key_anywhere_is_refused_by_both(example: Path) -> None:
    data = yaml.safe_load(example.read_text())
    checked = 0
    for path in _mappings(data):
        if not _is_model(path):
            continue
        planted = copy.deepcopy(data)
        node = planted
        for step in path:
            node = node[step]
        node["lantency_target_ms"] = 200
        _refused_by_both(planted, f"an unknown key at {path or 'the top'}")
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_number_written_as_a_word_is_refused_by_both(example: Path) -> None:
    data = yaml.safe_load(example.read_text())
    numbers = [
        path
        for path, value in _leaves(data)
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    assert numbers
    for path in numbers:
        planted = _with(data, path, lambda node, key: node.__setitem__(key, "many"))
        _refused_by_both(planted, f"'many' at {path}")


def test_a_choice_not_offered_is_refused_by_both() -> None:
    data = yaml.safe_load(EXAMPLES[0].read_text())
    data["tenants"] = {"source": "cookie"}
    _refused_by_both(data, "tenants.source: cookie")
    data = yaml.safe_load(EXAMPLES[0].read_text())
    data["rules"][0]["action"] = "spill"
    _refused_by_both(data, "a rule's action: spill")


def test_a_bare_number_limit_passes_both_checks_where_the_runner_takes_one() -> None:
    """``gpu_memory: 0.9`` and an engine's ``waiting: 5`` / ``kv_cache: 0.8`` (the docs' own
    examples) are limits to both; a share past 1 is refused by both, and a gauge by name needs its
    metric."""
    data = yaml.safe_load(EXAMPLES[0].read_text())
    data["local"]["thresholds"] = {
        "gpu_memory": 0.9,
        "gpu_utilization": {"limit": 0.95, "exit": 0.8},
        "engine": {"backend": "vllm", "waiting": 5, "kv_cache": 0.8},
    }
    assert not list(_validator().iter_errors(data))
    assert not _pydantic_refuses(data)
    data["local"]["thresholds"]["engine"]["kv_cache"] = 1.5
    _refused_by_both(data, "a KV-cache share of 1.5")
    data["local"]["thresholds"] = {"gauges": [3]}
    _refused_by_both(data, "a gauge limit with no metric")


def _docs_snippets() -> Iterator[tuple[str, dict[str, Any]]]:
    """The docs' YAML blocks that are spillway.yaml (every top-level key one of its keys)."""
    keys = set(json.loads(SCHEMA_FILE.read_text())["properties"])
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for block in re.findall(r"```ya?ml\n(.*?)```", page.read_text(), re.S):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and data and set(data) <= keys:
                yield str(page.relative_to(ROOT)), data


def test_every_spillway_yaml_snippet_in_the_docs_passes_the_schema() -> None:
    """What a reader copies from the docs into an editor is not flagged there: each snippet passes
    the published schema (a part of a file: names it uses may be declared elsewhere in it)."""
    snippets = list(_docs_snippets())
    assert len(snippets) >= 10, snippets
    failing = [(page, e.message) for page, data in snippets for e in _validator().iter_errors(data)]
    assert not failing
