"""Test-wide settings, and the fixtures that start real things (built on ``testing``).

A real APISIX stack starts through one pair of fixtures: ``stand_ins`` (the local upstream, the
"aws" one and the Triton metrics feed; ``stand_ins.config()`` is the spillway.yaml naming them) and
``apisix_stack``, which starts APISIX for a config and routes in front of them and stops it after
the test. ``module_stand_ins`` and ``module_apisix_stack`` are the same for a module's tests at
once. A module fixture that is parametrized (one stack per parameter) or a stack that stands on
something else uses ``testing.apisix.stack`` or ``testing.apisix.gateway_for`` itself.

Hypothesis runs without per-example deadlines: a shared 2-core machine makes timing flaky, not
code. Runners started by the tests get a route token, as every deployment with upstream-mode
targets must (``gateway_plugin.books.target_header``).

In CI (``CI=true``) a test skipped because something ``scripts/setup.sh`` installs is missing
fails instead: a set-up that installed less than it should would otherwise turn the tests of real
components into skips and leave CI green. Only the skips listed in ``SKIPS_KEPT_IN_CI`` stay
skips there; a skip for a reason listed nowhere fails too, until it is listed in one or the other.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

if TYPE_CHECKING:  # imported where used: this file's CI rules load alone (tests/unit/test_ci_skips.py)
    from testing.apisix import StackStarter
    from testing.standins import StandIns

pytest_plugins = ["pytester"]

settings.register_profile("spillway", deadline=None)
settings.load_profile("spillway")

os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", "test-route-token-" + os.urandom(8).hex())

# What scripts/setup.sh installs, and how the tests' skip reasons say that it is missing.
SET_UP_INSTALLS: dict[str, re.Pattern[str]] = {
    "APISIX (scripts/install-apisix.sh)": re.compile(r"\bno APISIX in "),
    "redis-server (apt)": re.compile(r"\bredis-server is not installed"),
    "redis-sentinel (apt)": re.compile(r"\bredis-sentinel is not installed"),
    "etcd (apt etcd-server)": re.compile(r"\betcd is not installed"),
    "prometheus (apt)": re.compile(r"\bprometheus is not installed"),
    "Chromium (apt)": re.compile(r"\bchromium is not installed", re.IGNORECASE),
    "a C compiler (apt gcc)": re.compile(r"\bno C compiler\b"),
    "the nvidia-pytriton wheel (pip)": re.compile(r"\bnvidia-pytriton wheel\b.* not installed"),
    "buildah, podman and mmdebstrap (apt)": re.compile(r"\bbuildah is not installed"),
    "dnsmasq (apt dnsmasq-base)": re.compile(r"\bdnsmasq is not installed"),
    "kubectl (apt)": re.compile(r"\bkubectl is not installed"),
}


# Skips CI keeps: what the set-up does not install, and what a machine may lack whatever is installed.
SKIPS_KEPT_IN_CI: dict[str, re.Pattern[str]] = {
    # Terraform comes from HashiCorp's own releases, which no package registry the set-up uses carries.
    "Terraform": re.compile(r"\bterraform is not installed"),
    "a writable /dev/shm": re.compile(r"^/dev/shm is not writable here$"),
    "root and unshare": re.compile(r"^needs root and unshare to hide /dev/shm"),
    "mount namespaces": re.compile(r"^mount namespaces are not available here$"),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1"}


def missing_set_up_component(reason: str) -> str | None:
    """The component a skip's reason says is missing, if scripts/setup.sh is the one to install it."""
    return next((name for name, says in SET_UP_INSTALLS.items() if says.search(reason)), None)


def skip_reason(longrepr: object) -> str:
    """A skip's report carries (path, line, "Skipped: <reason>")."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def why_not_skipped_in_ci(reason: str) -> str | None:
    """Why CI fails a test skipped for ``reason``; None for a skip CI keeps."""
    component = missing_set_up_component(reason)
    if component is not None:
        return (
            f"skipped in CI, where it must run: {component} is missing ({reason}). scripts/setup.sh "
            "installs it: its output says why it could not; run it again as root with apt on Debian 12"
        )
    if any(says.search(reason) for says in SKIPS_KEPT_IN_CI.values()):
        return None
    return (
        f"skipped in CI for a reason CI does not know ({reason}): make scripts/setup.sh install what "
        "the test needs and name the reason in SET_UP_INSTALLS in tests/conftest.py, or, if no set-up "
        "can provide it, name it in SKIPS_KEPT_IN_CI there"
    )


def fail_in_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    why = why_not_skipped_in_ci(skip_reason(report.longrepr))
    if why is not None:
        report.outcome = "failed"
        report.longrepr = why


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if in_ci():
        fail_in_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if in_ci():
        fail_in_ci(report)
    return report


def _stand_ins() -> Iterator[StandIns]:
    from testing.standins import stand_ins

    with stand_ins() as trio:
        yield trio


def _starter(trio: StandIns, tmp: Path) -> Iterator[StackStarter]:
    from testing.apisix import StackStarter

    starter = StackStarter(trio, tmp)
    try:
        yield starter
    finally:
        starter.close()


@pytest.fixture
def stand_ins() -> Iterator[StandIns]:
    """The local upstream, the "aws" one (instance fn-1) and the metrics feed, for one test."""
    yield from _stand_ins()


@pytest.fixture
def apisix_stack(stand_ins: StandIns, tmp_path: Path) -> Iterator[StackStarter]:
    """Starts a real APISIX in front of ``stand_ins`` for a config and routes (one per test);
    stopped after the test."""
    yield from _starter(stand_ins, tmp_path)


@pytest.fixture(scope="module")
def module_stand_ins() -> Iterator[StandIns]:
    """``stand_ins`` for a module's tests at once."""
    yield from _stand_ins()


@pytest.fixture(scope="module")
def module_apisix_stack(
    module_stand_ins: StandIns, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StackStarter]:
    """``apisix_stack`` for a module's tests at once (one per module): stopped after its last test."""
    yield from _starter(module_stand_ins, tmp_path_factory.mktemp("apisix"))
