"""``python -m devtools.generate``: write the files code makes (all of them, or those named)."""

from __future__ import annotations

import argparse
import sys

from devtools.generate import GENERATORS, stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.generate",
        description="Write the files the repository holds that code makes: the Grafana dashboards, the "
        "fast path's Lua contract and the APISIX examples. Tests fail while one is stale.",
    )
    parser.add_argument("what", nargs="*", help=f"which of {', '.join(GENERATORS)} (default: all)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is stale")
    args = parser.parse_args(argv)
    if unknown := sorted(set(args.what) - set(GENERATORS)):
        parser.error(f"no generator named {', '.join(unknown)}: choose from {', '.join(GENERATORS)}")
    changed = []
    for name in args.what or GENERATORS:
        made = GENERATORS[name]()
        for path in stale(made):
            changed.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(made[path])
            print(f"{'stale' if args.check else 'wrote'}: {path}", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
