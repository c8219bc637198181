"""CI runs what the set-up installs: there, a test skipped for want of it fails (tests/conftest.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from devtools import apisix
from devtools import prometheus as prometheus_server
from devtools.etcd import ETCD_HINT
from devtools.redis import INSTALL_HINT
from devtools.redis_ha import SENTINEL_HINT
from testing.images import MISSING_TOOLS
from tests.conftest import SKIPS_KEPT_IN_CI, missing_set_up_component, why_not_skipped_in_ci
from tests.unit.test_demo_report_browser import needs_chromium
from tests.unit.test_kubernetes_manifests import KUBECTL_HINT

TESTS = Path(__file__).resolve().parents[1]
CONFTEST = (TESTS / "conftest.py").read_text()
HARNESS = TESTS.parent / "testing"


def literal_skip_reasons() -> list[str]:
    """Every reason written as a literal in a ``pytest.skip`` or ``skipif`` of the suite or of
    the harness it stands on."""
    found = []
    for path in sorted([*TESTS.rglob("*.py"), *HARNESS.glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr == "skip" and node.args and isinstance(node.args[0], ast.Constant):
                found.append(str(node.args[0].value))
            for keyword in node.keywords if node.func.attr == "skipif" else ():
                if keyword.arg == "reason" and isinstance(keyword.value, ast.Constant):
                    found.append(str(keyword.value.value))
    return found


def test_every_skip_reason_in_the_suite_is_known_to_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each is for something the set-up installs (CI fails the test) or for something CI keeps."""
    monkeypatch.setenv("SPILLWAY_APISIX_PREFIX", str(tmp_path))
    made_at_run_time = {
        apisix.missing_reason() or "": "APISIX (scripts/install-apisix.sh)",
        INSTALL_HINT: "redis-server (apt)",
        SENTINEL_HINT: "redis-sentinel (apt)",
        ETCD_HINT: "etcd (apt etcd-server)",
        prometheus_server.INSTALL_HINT: "prometheus (apt)",
        needs_chromium.kwargs["reason"]: "Chromium (apt)",
        MISSING_TOOLS: "buildah, podman and mmdebstrap (apt)",
        KUBECTL_HINT: "kubectl (apt)",
    }
    for reason, component in made_at_run_time.items():
        assert missing_set_up_component(reason) == component, reason
    literal = literal_skip_reasons()
    unknown = [r for r in literal if not missing_set_up_component(r) and why_not_skipped_in_ci(r)]
    assert not unknown, f"skip reasons CI does not know: {unknown}"
    installed = {missing_set_up_component(r) for r in literal} - {None}
    assert installed == {
        "Chromium (apt)",
        "a C compiler (apt gcc)",
        "the nvidia-pytriton wheel (pip)",
        "dnsmasq (apt dnsmasq-base)",
    }
    unused = [name for name, says in SKIPS_KEPT_IN_CI.items() if not any(says.search(r) for r in literal)]
    assert not unused, f"skips CI keeps that no test makes: {unused}"


SKIPPING = f"""
import pytest

def test_apisix():
    pytest.skip("no APISIX in /nowhere: run 'bash scripts/install-apisix.sh'")

@pytest.mark.skipif(True, reason={INSTALL_HINT!r})
def test_redis():
    pass

def test_unlisted():
    pytest.skip("a reason nobody listed")

@pytest.mark.skipif(True, reason="terraform is not installed (scripts/check-infra.sh needs it)")
def test_terraform():
    pass

@pytest.mark.xfail(reason="an expected failure is not a skip")
def test_xfail():
    assert False
"""
MODULE_SKIPPED = """
import pytest

pytest.skip("redis-server is not installed", allow_module_level=True)
"""


def test_in_ci_a_skip_fails_unless_ci_keeps_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With this suite's conftest: skips outside CI; in CI, failures for what the set-up installs
    (in the test, in its set-up, in a whole module) and for reasons listed nowhere."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_skips=SKIPPING, test_module_skipped=MODULE_SKIPPED)
    for ci in ("", "false"):
        monkeypatch.setenv("CI", ci)
        outcomes = pytester.runpytest_subprocess("-p", "no:cacheprovider").parseoutcomes()
        assert outcomes == {"skipped": 5, "xfailed": 1}, (ci, outcomes)
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--continue-on-collection-errors")
    assert result.parseoutcomes() == {"failed": 2, "errors": 2, "skipped": 1, "xfailed": 1}
    result.stdout.fnmatch_lines(["*skipped in CI, where it must run: redis-server (apt) is missing*"])
    result.stdout.fnmatch_lines(["*skipped in CI for a reason CI does not know (a reason nobody listed)*"])
