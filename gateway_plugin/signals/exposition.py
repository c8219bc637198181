"""Triton's metrics page read as the Prometheus parser reads it, at a fraction of its cost.

A scrape round reads every member's page on the runner's event loop, so the parser is the round's
main cost: prometheus_client's took 1.1 ms for a Triton page of four models, 0.34 s a round at
300 members (bench/members_round.py). This reads the exposition format's sample lines alone (the
families' TYPE lines only for the name a counter's samples take), into the same samples.
"""

from __future__ import annotations

import re

from prometheus_client.samples import Sample

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+-?[0-9]+)?[ \t]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|$)')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def samples_of(text: str) -> list[Sample]:
    """Every sample of Triton's Prometheus text (the exposition format's sample lines; comments
    skipped), as the Prometheus parser reads them, at a fraction of its cost: a round reads every
    member's page on the event loop. A line it cannot read fails the page (``ValueError``)."""
    samples = []
    counter = None
    for line in text.split("\n"):
        if not line or line.isspace():
            continue
        if line[0] == "#":
            # The parser names the samples of the counter family just declared name_total.
            words = line.split()
            if len(words) == 4 and words[1] == "TYPE":
                counter = words[2] if words[3] == "counter" else None
            continue
        found = _SAMPLE.fullmatch(line)
        if found is None:
            raise ValueError(f"not a metrics sample line: {line[:100]!r}")
        name, labels_text, value = found.groups()
        labels: dict[str, str] = {}
        if labels_text:
            at = 0
            while at < len(labels_text):
                label = _LABEL.match(labels_text, at)
                if label is None or label.end() == at:
                    raise ValueError(f"unreadable labels: {line[:100]!r}")
                raw = label.group(2)
                labels[label.group(1)] = _ESCAPE.sub(lambda m: _ESCAPED.get(m[1], "\\" + m[1]), raw)
                at = label.end()
        if name == counter and not name.endswith("_total"):
            name += "_total"
        samples.append(Sample(name, labels, float(value)))
    return samples
