"""The fast path's automaton as plain set simulation, for testing the programs ``content_program``
compiles against RE2 without an APISIX: every position a match may start at, each NFA state
followed through its positions. Quadratic at worst, which tests do not mind."""

from __future__ import annotations

from gateway_plugin.content.program import ASSERT, BYTE, MATCH, SPLIT, Program
from gateway_plugin.content.syntax import ASSERTIONS, WORD


def _holds(kind: str, text: bytes, at: int) -> bool:
    before = text[at - 1] if at > 0 else None
    after = text[at] if at < len(text) else None
    word_before = before is not None and bool(WORD >> before & 1)
    word_after = after is not None and bool(WORD >> after & 1)
    return {
        "bot": at == 0,
        "eot": at == len(text),
        "bol": at == 0 or before == 10,
        "eol": at == len(text) or after == 10,
        "wb": word_before != word_after,
        "nwb": word_before == word_after,
    }[kind]


def search(program: Program, text: bytes) -> bool:
    """Whether the program matches anywhere in the text."""
    states: set[int] = set()
    for at in range(len(text) + 1):
        states.add(program.start)
        stack, seen, consuming = list(states), set(), []
        while stack:
            pc = stack.pop()
            if pc in seen:
                continue
            seen.add(pc)
            op, a, b = program.code[pc]
            if op == MATCH:
                return True
            if op == SPLIT:
                stack += [a, b]
            elif op == ASSERT and _holds(ASSERTIONS[a], text, at):
                stack.append(b)
            elif op == BYTE:
                consuming.append((a, b))
        if at == len(text):
            return False
        states = {b for a, b in consuming if program.sets[a] >> text[at] & 1}
    return False


def prefilter_holds(program: Program, text: bytes) -> bool:
    """Whether the text holds the program's prefilter (its sets one after the other) somewhere."""
    sets = [program.sets[i] for i in program.prefilter]
    return any(
        all(sets[k] >> text[at + k] & 1 for k in range(len(sets))) for at in range(len(text) - len(sets) + 1)
    )
