"""The fast path's contract exists once: the Lua half's copy is generated and current, and no Lua
file spells one of its values itself."""

from __future__ import annotations

import re
from pathlib import Path

from devtools.generate import fast_path_contract, stale
from gateway_plugin.fast_path import contract, table_model
from gateway_plugin.fast_path.route import lua_path

GENERATED = {"contract.lua", "table_schema.lua"}


def test_the_generated_lua_is_what_the_python_side_says() -> None:
    old = stale(fast_path_contract.files())
    assert not old, f"regenerate with: python -m devtools.generate fast-path-contract ({old})"


def test_a_change_on_the_python_side_makes_the_lua_stale(monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(contract, "FAIL_SAFE", "table_old")
    assert fast_path_contract.OUT / "contract.lua" in stale(fast_path_contract.files())


def _lua_sources() -> dict[Path, str]:
    root = lua_path() / "apisix" / "plugins"
    return {p: p.read_text() for p in root.rglob("*.lua") if p.name not in GENERATED}


def _values(value: object) -> list[str]:
    """Every text the contract holds, nested or not."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _values(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _values(v)]
    return []


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r"}


def _literals(code: str) -> list[str]:
    """The Lua string literals of ``code`` (comments gone), but a table's field named as one
    (``tbl["local"]``: the table's shape, which its generated schema checks)."""
    code = "\n".join(line.split("--", 1)[0] for line in code.splitlines())
    found = []
    for match in re.finditer(r"""(\[?)\s*(["'])((?:\\.|(?!\2).)*)\2""", code):
        if not match.group(1):
            found.append(re.sub(r"\\(.)", lambda e: _ESCAPES.get(e.group(1), e.group(1)), match.group(3)))
    return found


def test_no_lua_file_spells_a_value_of_the_contract() -> None:
    """Header names, variables, reasons, states, the summary's key formats, the dict's keys: a
    Lua file takes each from ``spillway/contract.lua``. Header names compare folded, as nginx
    compares them."""
    values = {v.lower() for v in _values(contract.constants())}
    found = []
    for path, text in _lua_sources().items():
        spelled = {literal for literal in _literals(text) if literal.lower() in values}
        found += [f"{path.name}: {literal!r}" for literal in sorted(spelled)]
        code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        if re.search(r"FORMAT\s*=\s*\d|#token\s*<\s*\d", code):
            found.append(f"{path.name}: a number the contract holds")
    assert not found, "use require('apisix.plugins.spillway.contract') instead: " + ", ".join(found)


def test_the_schema_is_in_the_form_apisix_checks() -> None:
    """APISIX's jsonschema library reads draft 4: no references, no nulls, tuples as items."""
    text = str(fast_path_contract.lua_schema(table_model.json_schema()))
    for absent in ("$ref", "$defs", "prefixItems", "'null'", "anyOf"):
        assert absent not in text, absent
