"""The runner as it read operators' content patterns before they ran on RE2: Python's ``re``, for
``bench/content_checks.py``'s before/after (``--engines``). Bench only: it swaps the compile in
``content_detectors.pattern_detector`` and runs ``python -m gateway_plugin`` with its arguments.

    python bench/content_engine_re.py run --config spillway.yaml
"""

from __future__ import annotations

import re
import sys

from gateway_plugin.cli import main
from gateway_plugin.content import checks as content
from gateway_plugin.content import detectors as content_detectors
from gateway_plugin.content.program import program


def pattern_detector(name: str, pattern: str) -> content_detectors.Detector:
    """The detector as it was: the pattern compiled by Python's re (its program still made, so the
    fast path's table is the same)."""
    compiled = program(pattern)
    regex = re.compile(pattern.encode())
    return content_detectors.Detector(name, "pattern", pattern, regex=regex, program=compiled.encoded())


def use_re() -> None:
    content_detectors.pattern_detector = pattern_detector
    content.pattern_detector = pattern_detector  # content_policy's own reference


if __name__ == "__main__":
    use_re()
    sys.exit(main(sys.argv[1:]))
