"""Files the repository holds that code writes: the Grafana dashboards (``dashboards``), the Lua half
of the fast path's contract (``fast_path_contract``), the APISIX examples (``examples``) and the
docs site's reference pages with the config's JSON Schema (``reference``). Each
module's ``files()`` says what each file should hold; ``python -m devtools.generate`` writes them,
and a test fails while one is stale."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from devtools.generate import dashboards, examples, fast_path_contract, reference

GENERATORS: dict[str, Callable[[], dict[Path, str]]] = {
    "dashboards": dashboards.files,
    "fast-path-contract": fast_path_contract.files,
    "examples": examples.files,
    "reference": reference.files,
}


def stale(made: dict[Path, str]) -> list[Path]:
    """The files that differ from what they should hold."""
    return [path for path, text in made.items() if not path.is_file() or path.read_text() != text]
