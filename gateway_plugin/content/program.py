"""An operator's pattern as the fast path runs it: a program for a linear-time automaton.

PCRE, the regex engine APISIX's Lua has, backtracks: its match limit stops a search only after
work that grows with the text (a pattern like ``(.*a){20}`` holds an nginx worker for seconds on
64 KiB), so the fast path does not run operators' patterns on it. The runner reads each pattern
once (``content_syntax``) and compiles it here into a Thompson NFA; the ``spillway`` plugin's
``spillway/dfa.lua`` runs that program as a DFA built lazily, state by state, over the text's
bytes: every byte costs one step, or one new state (bounded by the program's size), whatever the
pattern and the text, and the scan's budget is checked as it goes. RE2, which the runner runs, is
such an automaton too; the two read the same syntax the same way (``tests/test_content_patterns``
and the equivalence test hold them to it).

The program, as the decision table carries it (``encoded``): the byte sets, 64 hex digits each
(digit ``k`` holds bytes ``4k`` to ``4k+3``, its lowest bit the lowest byte), then ``:``, the
start instruction, ``:``, and the
instructions, three numbers each: ``0 set next`` (one byte of the set), ``1 x y`` (either way),
``2 assertion next`` (a position, ``content_syntax.ASSERTIONS``'s index), ``3 0 0`` (a match).
Instruction 0 is the match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway_plugin.content.syntax import (
    ASSERTIONS,
    Alt,
    Assert,
    Byte,
    Cat,
    Node,
    NotPortable,
    Repeat,
    read,
)

BYTE, SPLIT, ASSERT, MATCH = 0, 1, 2, 3
# The most instructions one pattern compiles to: a new state of the automaton costs a pass over
# them, and RE2's own program is about as large.
MAX_PROGRAM = 1000
# The longest prefilter: a run of byte sets longer than this says little more.
MAX_PREFILTER = 32


@dataclass(frozen=True, slots=True)
class Program:
    sets: tuple[int, ...]
    code: tuple[tuple[int, int, int], ...]
    start: int
    # Byte sets (indices into ``sets``) every match holds one after the other: none, or at least
    # a byte's worth of them.
    prefilter: tuple[int, ...] = ()

    def encoded(self) -> str:
        sets = "".join(f"{bits:064x}"[::-1] for bits in self.sets)
        code = " ".join(f"{op} {a} {b}" for op, a, b in self.code)
        return f"{sets}:{self.start}:{code}:{' '.join(map(str, self.prefilter))}"


class _Compiler:
    def __init__(self) -> None:
        self.code: list[tuple[int, int, int]] = [(MATCH, 0, 0)]
        self.sets: dict[int, int] = {}

    def emit(self, op: int, a: int, b: int) -> int:
        if len(self.code) >= MAX_PROGRAM:
            raise NotPortable(
                f"too large: more than {MAX_PROGRAM} steps once compiled (lower its repeat counts)"
            )
        self.code.append((op, a, b))
        return len(self.code) - 1

    def node(self, node: Node, out: int) -> int:
        """The instructions matching ``node`` then going on to ``out``; where they start."""
        if isinstance(node, Byte):
            return self.emit(BYTE, self.sets.setdefault(node.bits, len(self.sets)), out)
        if isinstance(node, Assert):
            return self.emit(ASSERT, ASSERTIONS.index(node.kind), out)
        if isinstance(node, Cat):
            for item in reversed(node.items):
                out = self.node(item, out)
            return out
        if isinstance(node, Alt):
            entries = [self.node(item, out) for item in node.items]
            entry = entries[-1]
            for other in reversed(entries[:-1]):
                entry = self.emit(SPLIT, other, entry)
            return entry
        return self.repeat(node, out)

    def repeat(self, node: Repeat, out: int) -> int:
        if node.high is None:
            loop = self.emit(SPLIT, 0, out)  # its first branch set once the body exists
            self.code[loop] = (SPLIT, self.node(node.item, loop), out)
            tail = loop
        else:
            tail = out
            for _ in range(node.high - node.low):
                tail = self.emit(SPLIT, self.node(node.item, tail), out)
        for _ in range(node.low):
            tail = self.node(node.item, tail)
        return tail


def _flat(items: tuple[Node, ...]) -> list[Node]:
    return [n for item in items for n in (_flat(item.items) if isinstance(item, Cat) else [item])]


def _runs(node: Node) -> list[list[int]]:
    """Runs of byte sets every match holds one after the other (positions, being no byte, ignored)."""
    if isinstance(node, Repeat):
        return _runs(node.item) if node.low >= 1 else []
    if not isinstance(node, Cat | Byte):
        return []
    runs: list[list[int]] = [[]]
    for item in _flat(node.items) if isinstance(node, Cat) else [node]:
        if isinstance(item, Byte):
            runs[-1].append(item.bits)
        elif isinstance(item, Repeat) and isinstance(item.item, Byte) and item.low >= 1:
            runs[-1] += [item.item.bits] * min(item.low, MAX_PREFILTER)
            if item.high != item.low:
                runs.append([])
        elif not isinstance(item, Assert):
            runs += [*_runs(item), []]
    return [r for r in runs if r]


def _bits_of(run: list[int]) -> float:
    """How much a run says: a byte of one set in 256 is 8 bits, of any byte none."""
    return sum(8 - math.log2(max(1, bits.bit_count())) for bits in run)  # an empty set: [^\x00-\xff]


def prefilter(node: Node) -> list[int]:
    """The run of byte sets (at most MAX_PREFILTER) every match holds that says the most, if it says
    at least a byte's worth; else none."""
    best = max((run[:MAX_PREFILTER] for run in _runs(node)), key=_bits_of, default=[])
    return best if _bits_of(best) >= 8 else []


def program(pattern: str) -> Program:
    """The pattern read and compiled; ``NotPortable`` saying what is wrong otherwise."""
    compiler = _Compiler()
    node = read(pattern)
    start = compiler.node(node, 0)
    first = tuple(compiler.sets.setdefault(bits, len(compiler.sets)) for bits in prefilter(node))
    sets = tuple(sorted(compiler.sets, key=compiler.sets.__getitem__))
    return Program(sets, tuple(compiler.code), start, first)
