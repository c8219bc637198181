"""The JSON Schema of spillway.yaml, made from the models that load it, so that an editor (through
the ``yaml-language-server`` comment in each example) and CI catch the mistakes the runner refuses.

What a schema cannot say, the models still check on load: regular expressions that compile,
``exit_ratio`` not above ``enter_ratio``, rules that name declared targets, and the like."""

from __future__ import annotations

import json
from typing import Any

from gateway_plugin.config import SpillwayConfig

DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Where the examples find the schema (relative to the repository's root); the docs site serves it too.
SCHEMA_PATH = "docs/schema/spillway.schema.json"


def json_schema() -> dict[str, Any]:
    """The schema of a whole spillway.yaml, as ``python -m gateway_plugin config-schema`` prints it."""
    schema = SpillwayConfig.model_json_schema(mode="validation")
    return {
        "$schema": DIALECT,
        "title": "spillway.yaml",
        "description": "Spillway's gateway config: the on-prem cluster, the cloud targets, the rules "
        "and what may leave the premises. Validate one with `python -m gateway_plugin check-config`.",
        **{key: value for key, value in schema.items() if key != "title"},
    }


def schema_text() -> str:
    """The schema as the file and the command hold it: indented, keys in the models' order."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
