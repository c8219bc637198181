"""The function images built and run for real: buildah builds them on stand-in bases made from
Debian's packages (scripts/build-images.sh --standin), podman runs them.

Everything lives in a store of its own under ``.cache/images`` (CONTAINERS_STORAGE_CONF): the
stand-in bases stay there between runs (their tags carry their recipe's hash), each test's images
and containers are removed when it is done, and so are the build's intermediate layers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testing.terraform import load_module

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / ".cache" / "images"
TOOLS = ("buildah", "podman", "runc", "mmdebstrap", "slirp4netns")
MISSING_TOOLS = "buildah is not installed with podman, runc, slirp4netns and mmdebstrap (apt)"
BUILD_TIMEOUT_S = 900


def missing_reason() -> str | None:
    """Why the images cannot be built and run here, or None."""
    if any(shutil.which(tool) is None for tool in TOOLS):
        return MISSING_TOOLS
    return None


def engine_env() -> dict[str, str]:
    """buildah's and podman's settings for the tests' own store.

    runc and cgroupfs: crun refuses this kind of machine's hybrid cgroup layout. No default
    ulimits: the container keeps the host's, which it may not raise. No network unless a test
    names one: podman's default bridge would route to private addresses and turn on forwarding.
    """
    STORE.mkdir(parents=True, exist_ok=True)
    storage, engine = STORE / "storage.conf", STORE / "containers.conf"
    storage.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{STORE / "storage"}"\nrunroot = "{STORE / "run"}"\n'
    )
    engine.write_text(
        '[containers]\ndefault_ulimits = []\nnetns = "none"\n'
        '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
    )
    return {
        **os.environ,
        "CONTAINERS_STORAGE_CONF": str(storage),
        "CONTAINERS_CONF": str(engine),
        "BUILDAH_ISOLATION": "chroot",
    }


def engine(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One buildah or podman command against the tests' store."""
    result = subprocess.run(
        args, env=engine_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


@dataclass(frozen=True)
class Built:
    """One image built by scripts/build-images.sh: its name, what the script printed, how long it took."""

    tag: str
    output: str
    seconds: float

    def size(self) -> int:
        """Uncompressed bytes, as podman counts them (Docker's ``.Size``)."""
        return int(engine("podman", "image", "inspect", "--format", "{{.Size}}", self.tag).stdout)

    def config(self) -> dict[str, Any]:
        out = engine("podman", "image", "inspect", "--format", "{{json .Config}}", self.tag).stdout
        return json.loads(out)  # type: ignore[no-any-return]


def build(
    which: str, tag: str, *extra: str, timeout: float = BUILD_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """``scripts/build-images.sh --standin WHICH`` with the tests' store; returns the finished process."""
    return subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "build-images.sh"),
            "--standin",
            "--engine",
            "buildah",
            "-t",
            tag,
            *extra,
            which,
        ],
        cwd=ROOT,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def built_image(which: str, tag: str, *extra: str) -> Iterator[Built]:
    """An image built for the duration of a test module, removed with its build's leftovers after."""
    start = time.monotonic()
    result = build(which, tag, *extra)
    try:
        if result.returncode != 0:
            raise RuntimeError(
                f"building the {which} image failed:\n{(result.stdout + result.stderr)[-6000:]}"
            )
        yield Built(tag, result.stdout + result.stderr, time.monotonic() - start)
    finally:
        remove_image(tag)


def remove_image(tag: str) -> None:
    """The image and the dangling layers its build left (the stand-in bases stay: they are tagged)."""
    engine("podman", "rmi", "--force", tag, check=False)
    engine("buildah", "rmi", "--prune", check=False, timeout=300)


@contextmanager
def container(image: str, name: str, options: Sequence[str], command: Sequence[str] = ()) -> Iterator[str]:
    """``podman run -d`` with the given options; yields the container's name, removed after."""
    engine("podman", "rm", "--force", name, check=False)
    engine("podman", "run", "-d", "--name", name, *options, image, *command)
    try:
        yield name
    finally:
        engine("podman", "rm", "--force", "--time", "10", name, check=False, timeout=60)


def logs(name: str) -> str:
    result = engine("podman", "logs", name, check=False)
    return result.stdout + result.stderr


def running(name: str) -> bool:
    out = engine("podman", "inspect", "--format", "{{.State.Running}}", name, check=False).stdout
    return out.strip() == "true"


def exec_in(name: str, *command: str) -> str:
    """A command in the running container, as its own user."""
    return engine("podman", "exec", name, *command).stdout


def terraform_environment(module: str, **values: Any) -> dict[str, str]:
    """The environment a module under infra/terraform/modules sets on the function, for these inputs."""
    loaded = load_module(ROOT / "infra" / "terraform" / "modules" / module)
    required = {
        "aws_function": {"name": "fn", "reserved_concurrent_executions": 4},
        "aliyun_function": {
            "name": "fn",
            "reserved_concurrency": 8,
            "image": "registry-vpc.cn-hangzhou.aliyuncs.com/spillway/aliyun-fc:0.1.0",
        },
    }[module]
    environment = loaded.evaluator(**{**required, **values}).local("environment")
    return {str(k): str(v) for k, v in environment.items()}
