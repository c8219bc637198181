"""Where the sidecar's ``tritonserver`` comes from.

Images put it on ``PATH``; development machines use the server bundled in the
``nvidia-pytriton`` wheel, laid out once the way pytriton itself lays it out.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path


class TritonNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class TritonInstall:
    """A runnable server: the binary, its backend directory and the environment it needs."""

    binary: Path
    backend_dir: Path | None = None
    cache_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def args(self) -> list[str]:
        args = [str(self.binary)]
        if self.backend_dir is not None:
            args.append(f"--backend-directory={self.backend_dir}")
        if self.cache_dir is not None:
            args.append(f"--cache-directory={self.cache_dir}")
        return args


def locate() -> TritonInstall:
    """``$SPILLWAY_TRITONSERVER``, else ``tritonserver`` on ``PATH``, else the pytriton wheel."""
    explicit = os.environ.get("SPILLWAY_TRITONSERVER")
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise TritonNotFound(f"SPILLWAY_TRITONSERVER={explicit} is not an executable file")
        return TritonInstall(binary=path)
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(binary=Path(on_path))
    return from_pytriton_wheel()


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spillway"


def from_pytriton_wheel() -> TritonInstall:
    purelib = Path(sysconfig.get_paths()["purelib"])
    bundle = purelib / "pytriton" / "tritonserver"
    libs = purelib / "nvidia_pytriton.libs"
    if not (bundle / "bin" / "tritonserver").exists():
        raise TritonNotFound(
            "no tritonserver found: set SPILLWAY_TRITONSERVER, put tritonserver on PATH, "
            "or install the development server with: pip install 'spillway[triton]'"
        )
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = bundle / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonNotFound(f"the pytriton wheel has no Python backend stub for Python {version}")
    tree = _lay_out(bundle, stub)
    interpreter_bin = str(Path(sys.executable).parent)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(
            p for p in (str(libs), libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p
        ),
        "PATH": os.pathsep.join((interpreter_bin, os.environ.get("PATH", ""))),
    }
    return TritonInstall(
        binary=tree / "bin" / "tritonserver",
        backend_dir=tree / "backends",
        cache_dir=tree / "caches",
        env=env,
    )


def _lay_out(bundle: Path, stub: Path) -> Path:
    """Copy the bundle once into a cache folder with the stub where the Python backend looks."""
    stamp = f"{bundle.stat().st_mtime_ns}-{stub.parent.name}"
    tree = _cache_root() / f"tritonserver-{stamp}"
    if (tree / ".complete").exists():
        return tree
    staging = tree.with_name(tree.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    for part in ("bin", "backends", "caches"):
        shutil.copytree(bundle / part, staging / part, symlinks=True)
    shutil.copy2(stub, staging / "backends" / "python" / stub.name)
    (staging / ".complete").touch()
    try:
        staging.rename(tree)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (tree / ".complete").exists():
            raise
    return tree
