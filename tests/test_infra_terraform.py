"""infra/terraform checked by Terraform itself, offline, on a provider-free rendering
(scripts/tf_render.py): its type checks, variable validations, preconditions and plans."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from scripts.tf_offline import check, terraform_binary

ROOT = Path(__file__).resolve().parent.parent
TF = ROOT / "infra" / "terraform"

pytestmark = pytest.mark.skipif(terraform_binary() is None, reason="terraform is not installed")

# The RAM statements for the signing key written as one conditional: its results, no statements
# and two statements of different shapes, are tuples of different types.
MISMATCHED_CONDITIONAL = """      local.signing_key_oss == null ? [] : [
        {
          Effect   = "Allow"
          Action   = ["oss:GetObject"]
          Resource = ["${local.signing_key_oss.bucket_arn}/${local.signing_key_oss.prefix}*"]
        },
        {
          Effect    = "Allow"
          Action    = ["oss:ListObjects"]
          Resource  = [local.signing_key_oss.bucket_arn]
          Condition = { StringLike = { "oss:Prefix" = [local.signing_key_oss.prefix] } }
        },
      ],
"""


def write_mismatched_conditional(tree: Path) -> int:
    """Put MISMATCHED_CONDITIONAL into the FC role policy of a copy of infra/terraform; its line."""
    main = tree / "modules" / "aliyun_function" / "main.tf"
    text = main.read_text()
    anchor = "      local.signing_key_statements,\n"
    assert text.count(anchor) == 1, "the FC role policy no longer ends with the key statements"
    main.write_text(text.replace(anchor, MISMATCHED_CONDITIONAL))
    return text[: text.index(anchor)].count("\n") + 1


def test_offline_terraform_accepts_every_module_and_example() -> None:
    assert check(TF) == []


def test_offline_check_rejects_a_conditional_whose_results_differ_in_type(tmp_path: Path) -> None:
    tree = tmp_path / "terraform"
    shutil.copytree(TF, tree, ignore=shutil.ignore_patterns(".terraform*"))
    line = write_mismatched_conditional(tree)
    problems = check(tree)
    assert problems
    for problem in problems:
        assert "Inconsistent conditional result types" in problem, problem
        assert f"modules/aliyun_function/main.tf:{line}:" in problem, problem
    # The module as a root, and the example through its module call.
    assert {p.split(":", 1)[0] for p in problems} == {
        "validate modules/aliyun_function",
        "validate examples/hybrid",
    }


def test_check_infra_script_fails_on_a_conditional_whose_results_differ_in_type(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for part in ("scripts", "infra", "images"):
        ignore = shutil.ignore_patterns(".terraform*", "__pycache__")
        shutil.copytree(ROOT / part, repo / part, ignore=ignore)
    shutil.copy2(ROOT / "requirements-infra.txt", repo / "requirements-infra.txt")
    if (ROOT / ".venv").exists():
        (repo / ".venv").symlink_to(ROOT / ".venv")
    write_mismatched_conditional(repo / "infra" / "terraform")
    env = {**os.environ, "SPILLWAY_INFRA_VENV": str(ROOT / ".cache" / "infra-venv")}
    result = subprocess.run(
        ["bash", str(repo / "scripts" / "check-infra.sh")],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "Inconsistent conditional result types" in result.stderr
    assert "check-infra: FAILED: Terraform rejects infra/terraform" in result.stderr
