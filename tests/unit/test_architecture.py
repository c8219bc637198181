"""The boundaries ARCHITECTURE.md draws, held by test: who may import whom, what ships, how big."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from testing.paths import ROOT

SHIPPED = ("functions", "gateway_plugin", "warmup")
MAX_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function (a lazy import still counts)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


SOURCE_ONLY = ("devtools", "testing", "tests", "bench")


def _ours(name: str) -> bool:
    return name.split(".")[0] in (*SHIPPED, *SOURCE_ONLY)


def _within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


# The rooms the routing lives in, the lowest first.
ROOMS = ("policy", "content", "health", "signals", "shared", "books", "request")
ROUTING = tuple(f"gateway_plugin.{room}" for room in ROOMS)
# For each part: the modules of ours it may import (prefixes). Everything else of ours is refused.
RULES: dict[str, tuple[str, ...]] = {
    "functions": ("functions",),
    "gateway_plugin.protocol": ("gateway_plugin.protocol",),
    "gateway_plugin.runner": ("gateway_plugin.runner", "gateway_plugin.protocol", "gateway_plugin.plugin"),
    # The rooms of the routing, each importing only those below it (ROOMS).
    "gateway_plugin.policy": ("gateway_plugin.policy", "gateway_plugin.config", "gateway_plugin.costs"),
    "gateway_plugin.content": ("gateway_plugin.content", "gateway_plugin.policy", "gateway_plugin.config"),
    "gateway_plugin.health": ("gateway_plugin.health", "gateway_plugin.policy", "gateway_plugin.config"),
    "gateway_plugin.signals": (
        "gateway_plugin.signals",
        "gateway_plugin.health",
        "gateway_plugin.policy",
        "gateway_plugin.config",
    ),
    "gateway_plugin.shared": (
        "gateway_plugin.shared",
        "gateway_plugin.health",
        "gateway_plugin.policy",
        "gateway_plugin.config",
    ),
    "gateway_plugin.books": (
        "gateway_plugin.books",
        "gateway_plugin.shared",
        "gateway_plugin.signals",
        "gateway_plugin.health",
        "gateway_plugin.content",
        "gateway_plugin.policy",
        "gateway_plugin.config",
        "gateway_plugin.costs",
        "gateway_plugin.targets",
        "functions.contract",
    ),
    "gateway_plugin.request": (
        "gateway_plugin.request",
        "gateway_plugin.books",
        "gateway_plugin.content",
        "gateway_plugin.policy",
        "gateway_plugin.plugin",
        "gateway_plugin.config",
        "gateway_plugin.targets",
        "functions.contract",
        "functions.signature",
    ),
    "gateway_plugin.targets": (
        "gateway_plugin.targets",
        "gateway_plugin.config",
        "functions.contract",
        "functions.signature",
    ),
    "gateway_plugin.fast_path": (
        "gateway_plugin.fast_path",
        *ROUTING,
        "gateway_plugin.config",
        "gateway_plugin.costs",
        "gateway_plugin.targets",
        "gateway_plugin.apisix_route",
        "functions.contract",
    ),
    "gateway_plugin.simulation": (
        "gateway_plugin.simulation",
        *ROUTING,
        "gateway_plugin.config",
        "gateway_plugin.costs",
    ),
    "gateway_plugin": ("gateway_plugin", "functions.contract", "functions.signature"),
    "warmup": (
        "warmup",
        "gateway_plugin.config",
        "gateway_plugin.costs",
        "gateway_plugin.targets",
        "functions.contract",
    ),
}


def _rule_for(module: str) -> tuple[str, tuple[str, ...]]:
    part = max((p for p in RULES if _within(module, p)), key=len)
    return part, RULES[part]


@pytest.mark.parametrize("package", SHIPPED)
def test_each_part_imports_only_what_its_boundary_allows(package: str) -> None:
    broken = []
    for path in _modules(package):
        module = _module_name(path)
        part, allowed = _rule_for(module)
        for imported in sorted(_imports(path)):
            if _ours(imported) and not _within(imported, *allowed):
                broken.append(f"{module} imports {imported} (part {part} may import {', '.join(allowed)})")
    assert not broken, "\n".join(broken)


def test_runner_and_routing_meet_only_through_the_plugin_api() -> None:
    """Said twice on purpose: the one boundary the layout is for."""
    for path in _modules("gateway_plugin/runner"):
        assert not any(_within(i, *ROUTING) for i in _imports(path)), path
    for path in (p for room in ROOMS for p in _modules(f"gateway_plugin/{room}")):
        assert not any(
            _within(i, "gateway_plugin.runner", "gateway_plugin.protocol", "gateway_plugin.fast_path")
            for i in _imports(path)
        ), path


def test_importing_the_shipped_packages_loads_no_dev_tool() -> None:
    code = (
        "import sys, functions, gateway_plugin, warmup\n"
        "import functions.cli, functions.core, functions.serve, functions.aliyun_fc\n"
        "import gateway_plugin.app, gateway_plugin.cli, warmup.cli\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {SOURCE_ONLY!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.parametrize("package", SHIPPED)
def test_no_production_module_is_over_400_lines(package: str) -> None:
    long = {
        _module_name(p): n for p in _modules(package) if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


@pytest.mark.parametrize("package", SHIPPED)
def test_no_shipped_function_is_over_60_lines(package: str) -> None:
    """A function that does one thing reads on one screen; a longer one is several, to be named."""
    long = {
        f"{_module_name(path)}:{node.lineno} {node.name}": n
        for path in _modules(package)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    }
    assert not long, long


def test_each_room_imports_only_the_rooms_below_it() -> None:
    for upper, room in enumerate(ROOMS):
        allowed = RULES[f"gateway_plugin.{room}"]
        above = [r for r in ROUTING[upper + 1 :] if r in allowed]
        assert not above, (room, above)


def test_no_import_circle() -> None:
    """A module that needs another's types needs them below it, not beside it (also for a lazy or
    type-checking import: it is read either way)."""
    modules = {_module_name(p): p for package in SHIPPED for p in _modules(package)}
    edges = {
        name: {i for i in _imports(path) if i in modules and i != name} for name, path in modules.items()
    }
    circles = []
    for start in modules:
        seen, stack = set(), [(start, (start,))]
        while stack:
            name, trail = stack.pop()
            for nxt in edges[name]:
                if nxt == start:
                    circles.append(" -> ".join((*trail, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*trail, nxt)))
    assert not circles, circles[:5]


def test_no_two_modules_of_one_name() -> None:
    """Within the gateway, one name, one module; ``config/`` is named after the file's sections, and
    each package has its own ``cli``."""
    named: dict[str, list[str]] = {}
    for path in _modules("gateway_plugin"):
        if path.stem not in ("__init__", "__main__", "cli") and "config" not in path.parts:
            named.setdefault(path.stem, []).append(_module_name(path))
    assert not {n: m for n, m in named.items() if len(m) > 1}


def test_the_shipped_distribution_holds_no_dev_tool() -> None:
    import tomllib

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert sorted(found["include"]) == sorted(f"{p}*" for p in SHIPPED)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"devtools", "testing"} <= set(ignored)


@pytest.mark.parametrize("package", ["bench", "devtools", "testing"])
def test_the_harness_the_benchmarks_and_the_dev_tools_import_no_test_module(package: str) -> None:
    """What tests, benchmarks and tools share lives in ``testing``: a test module is never what
    another part stands on (moving or renaming one breaks nothing outside ``tests``)."""
    found = sorted(
        {
            f"{path.relative_to(ROOT)} imports {'.'.join(imported.split('.')[:2])}"
            for path in _modules(package)
            for imported in _imports(path)
            if _within(imported, "tests")
        }
    )
    assert not found, "\n".join(found)


def test_nothing_that_decides_or_keeps_books_reads_the_environment() -> None:
    """Secrets and settings reach routing from its edge (``config.secrets``), read once per config:
    a module here that imported ``os`` could read a key where no review looks for one."""
    readers = [
        _module_name(path)
        for room in ROOMS
        for path in _modules(f"gateway_plugin/{room}")
        if {"os", "os.environ", "os.getenv"} & _imports(path)
    ]
    assert not readers, readers


def test_no_lua_module_of_the_plugins_is_over_400_lines() -> None:
    lua = ROOT / "gateway_plugin" / "fast_path" / "lua"
    long = {
        str(p.relative_to(lua)): n
        for p in sorted(lua.rglob("*.lua"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long
