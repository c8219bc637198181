"""Check infra/terraform with Terraform itself, offline: no provider is downloaded.

Renders a provider-free copy of the tree (``scripts/tf_render.py``: resources become
``terraform_data``, references to them unknown values), then runs ``terraform init
-backend=false`` and ``terraform validate`` in every module and example, and ``terraform plan``
in every example. Errors are reported at the source lines they come from. What this cannot
check is what needs the providers' schemas: resource argument names and types.

Usage, from the repository root: python -m scripts.tf_offline [infra/terraform]
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.tf_render import Output, Unsupported, cases_root, hcl_literal, render_tree

__all__ = [
    "UNKNOWN",
    "Diagnostic",
    "TerraformFailed",
    "Workspace",
    "cases_root",
    "check",
    "hcl_literal",
    "planned_inputs",
    "planned_outputs",
    "terraform_binary",
]


# -- running Terraform --


@dataclass(frozen=True)
class Diagnostic:
    severity: str
    summary: str
    detail: str
    where: str
    code: str
    context: str

    def __str__(self) -> str:
        code = f"\n    {self.code.strip().splitlines()[0]}" if self.code.strip() else ""
        return f"{self.where}: {self.summary}: {' '.join(self.detail.split())}{code}"


class TerraformFailed(RuntimeError):
    def __init__(self, what: str, diagnostics: list[Diagnostic], output: str = "") -> None:
        self.diagnostics = diagnostics
        lines = [str(d) for d in diagnostics] or [output.strip()]
        super().__init__(f"{what}:\n" + "\n".join(lines))


def terraform_binary() -> str | None:
    return shutil.which("terraform")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0"}
    binary = terraform_binary() or "terraform"
    return subprocess.run(
        [binary, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _diagnostics(
    raw: Iterable[Mapping[str, Any]], cwd: Path, origins: Mapping[Path, Output]
) -> list[Diagnostic]:
    found = []
    for item in raw:
        where = "?"
        span = item.get("range")
        if span:
            path = (cwd / span["filename"]).resolve()
            line = int(span["start"]["line"])
            output = origins.get(path.parent)
            in_range = output is not None and 0 < line <= len(output.origins)
            where = (
                output.origins[line - 1] if output is not None and in_range else f"{span['filename']}:{line}"
            )
        snippet = item.get("snippet") or {}
        found.append(
            Diagnostic(
                item.get("severity", "error"),
                item.get("summary", ""),
                item.get("detail", ""),
                where,
                snippet.get("code", ""),
                snippet.get("context") or "",
            )
        )
    return found


@dataclass
class Workspace:
    """A rendered tree in ``dest``, and Terraform runs on its directories."""

    source: Path
    dest: Path
    data_values: Mapping[str, Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.outputs = render_tree(self.source, self.dest, self.data_values)

    def _origins(self) -> dict[Path, Output]:
        return {(self.dest / rel).resolve(): out for rel, out in self.outputs.items()}

    def init(self, root: Path) -> None:
        result = _run(["init", "-backend=false", "-input=false", "-no-color"], root)
        if result.returncode != 0:
            raise TerraformFailed(f"terraform init in {root}", [], result.stdout + result.stderr)

    def validate(self, root: Path) -> list[Diagnostic]:
        """Errors and warnings of ``terraform validate`` (after init)."""
        self.init(root)
        result = _run(["validate", "-json", "-no-color"], root)
        try:
            report = json.loads(result.stdout)
        except json.JSONDecodeError:
            raise TerraformFailed(
                f"terraform validate in {root}", [], result.stdout + result.stderr
            ) from None
        return _diagnostics(report.get("diagnostics", []), root, self._origins())

    def plan(self, root: Path) -> dict[str, Any]:
        """``terraform show -json`` of a fresh plan; raises TerraformFailed with its errors."""
        self.init(root)
        result = _run(["plan", "-json", "-input=false", "-lock=false", "-out=offline.tfplan"], root)
        events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        raw = [e["diagnostic"] for e in events if e.get("type") == "diagnostic"]
        errors = [d for d in _diagnostics(raw, root, self._origins()) if d.severity == "error"]
        if result.returncode != 0 or errors:
            raise TerraformFailed(f"terraform plan in {root}", errors, result.stdout + result.stderr)
        shown = _run(["show", "-json", "offline.tfplan"], root)
        plan: dict[str, Any] = json.loads(shown.stdout)
        return plan


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


def known(after: Any, unknown: Any) -> Any:
    """A planned value with ``UNKNOWN`` where Terraform's ``after_unknown`` marks it."""
    if unknown is True:
        return UNKNOWN
    if isinstance(after, dict) and isinstance(unknown, dict):
        return {k: known(v, unknown.get(k, False)) for k, v in after.items()} | {
            k: UNKNOWN for k, u in unknown.items() if u is True and k not in after
        }
    if isinstance(after, list) and isinstance(unknown, list):
        return [known(v, unknown[i] if i < len(unknown) else False) for i, v in enumerate(after)]
    return after


def planned_outputs(plan: Mapping[str, Any]) -> dict[str, Any]:
    """Root outputs of a plan, ``UNKNOWN`` where only apply would tell."""
    changes = plan.get("output_changes", {})
    return {name: known(c.get("after"), c.get("after_unknown", False)) for name, c in changes.items()}


def planned_inputs(plan: Mapping[str, Any], address: str) -> list[Any]:
    """The ``input`` of each planned instance of a rendered resource, e.g.
    ``module.c0.terraform_data.r__aws_lambda_permission__invoke``, in address order."""
    found = []
    for change in plan.get("resource_changes", []):
        if re.sub(r"\[[^\]]*\]$", "", change["address"]) == address:
            after = change["change"]
            found.append((change["address"], known(after.get("after"), after.get("after_unknown"))))
    return [value.get("input") if isinstance(value, dict) else value for _, value in sorted(found)]


def check(source: Path) -> list[str]:
    """Problems Terraform finds in ``source`` without providers: validate every directory, plan
    every example with its defaults."""
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tf-offline-") as tmp:
        workspace = Workspace(source, Path(tmp))
        for relative in workspace.outputs:
            root = workspace.dest / relative
            try:
                diagnostics = workspace.validate(root)
                problems.extend(f"validate {relative}: {d}" for d in diagnostics)
                if not diagnostics and relative.parts[:1] == ("examples",):
                    workspace.plan(root)
            except TerraformFailed as failure:
                problems.append(f"{relative}: {failure}")
    return problems


def main(argv: Sequence[str]) -> int:
    source = Path(argv[0] if argv else "infra/terraform").resolve()
    if terraform_binary() is None:
        print("tf_offline: terraform not found on PATH", file=sys.stderr)
        return 2
    try:
        problems = check(source)
    except Unsupported as exc:
        print(f"tf_offline: cannot render {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
