"""The regex syntax an operator's content pattern may use: what Python's ``re`` and PCRE read alike.

A content pattern runs in the runner on Python's ``re`` and in APISIX (the fast path) on PCRE, both
over the text's UTF-8 bytes. The two engines agree on what a plain regular expression matches, but
not on every piece of syntax: PCRE reads ``[[:alpha:]]`` as a POSIX class where Python reads a set
and a ``]``, ``\\Z`` and ``\\v`` mean other things, ``{,3}`` is a quantifier to Python and three
characters to PCRE, and backreferences, named groups and possessive quantifiers differ in detail.
So a pattern is held to a small common core, checked when the config is loaded, and refused with
the construct named otherwise; whatever is left matches the same texts on both paths.

The core: literal characters (ASCII punctuation escaped with ``\\``), ``.``, ``^``, ``$``, ``|``,
``\\A``, ``\\b``, ``\\B``, ``\\d \\D \\w \\W \\s \\S``, ``\\n \\t \\r \\f``, ``\\xhh``; classes
``[...]`` and ``[^...]`` of literals, ranges between literals and the class escapes; groups
``(...)``, ``(?:...)`` and lookarounds ``(?=...)``, ``(?!...)``, ``(?<=...)``, ``(?<!...)``;
quantifiers ``* + ?`` and ``{n}``, ``{n,}``, ``{n,m}`` (at most 1000), greedy or lazy; and flags
``i``, ``m``, ``s`` as ``(?ims)`` at the very start. Letters match ASCII case-insensitively under
``i`` on both engines; ``\\w`` and ``\\s`` are ASCII only.
"""

from __future__ import annotations

import re
import string

MAX_REPEAT = 1000
_CLASS_ESCAPES = frozenset("dDwWsS")
_ANCHOR_ESCAPES = frozenset("bBA")
_CONTROL_ESCAPES = frozenset("ntrf")
_PUNCTUATION = frozenset(string.punctuation + " ")
_HEX = frozenset(string.hexdigits)
_FLAGS = re.compile(r"\(\?[ims]+\)")
_REPEAT = re.compile(r"\{([0-9]+)(,([0-9]*))?\}")
_GROUP_OPENERS = ("(?:", "(?=", "(?!", "(?<=", "(?<!")
_SET_OPERATORS = ("--", "&&", "~~", "||")


class NotPortable(ValueError):
    """The pattern uses syntax PCRE and Python's re read differently (or not at all)."""


_LITERAL, _SET, _ANCHOR = "literal", "set", "anchor"


def _escape(pattern: str, i: int, in_class: bool) -> tuple[int, str]:
    """The escape at ``pattern[i]`` (a backslash): where it ends, and whether it stands for one
    literal character, a set of them (``\\d``) or a position (``\\b``)."""
    if i + 1 >= len(pattern):
        raise NotPortable("a trailing backslash")
    c = pattern[i + 1]
    if c in _CLASS_ESCAPES:
        return i + 2, _SET
    if c in _ANCHOR_ESCAPES and not in_class:
        return i + 2, _ANCHOR
    if c in _CONTROL_ESCAPES or c in _PUNCTUATION:
        return i + 2, _LITERAL
    if c == "x" and len(pattern) >= i + 4 and pattern[i + 2] in _HEX and pattern[i + 3] in _HEX:
        return i + 4, _LITERAL
    if c == "x":
        raise NotPortable("\\x needs exactly two hex digits (\\x41)")
    raise NotPortable(
        f"\\{c} (PCRE and Python's re read it differently or not at all; the escapes both read alike are "
        "\\d \\D \\w \\W \\s \\S \\b \\B \\A \\n \\t \\r \\f \\xhh and \\ before punctuation)"
    )


def _class_atom(pattern: str, i: int) -> tuple[int, bool]:
    """One member of a class at ``i``: where it ends and whether it is a literal."""
    c = pattern[i]
    if c == "[":
        raise NotPortable("'[' inside a class (PCRE reads '[:' as a POSIX class): write \\[")
    if c == "\\":
        end, kind = _escape(pattern, i, in_class=True)
        return end, kind == _LITERAL
    if not c.isascii():
        raise NotPortable(
            f"{c!r} inside a class: a non-ASCII character is several bytes, each of which the class "
            "would match on its own; write it outside a class"
        )
    return i + 1, True


def _class(pattern: str, i: int) -> int:
    """The class opening at ``i``; where it ends."""
    i += 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        raise NotPortable("']' first in a class: write \\]")
    first = True
    while i < len(pattern) and pattern[i] != "]":
        if pattern.startswith(_SET_OPERATORS, i):
            raise NotPortable(f"{pattern[i : i + 2]!r} inside a class (Python reserves it): escape it")
        if pattern[i] == "-" and first:
            i, first = i + 1, False
            continue
        i, literal = _class_atom(pattern, i)
        first = False
        if i + 1 < len(pattern) and pattern[i] == "-" and pattern[i + 1] != "]":
            end, literal_end = _class_atom(pattern, i + 1)
            if not (literal and literal_end):
                raise NotPortable("a range in a class must run between two characters: put '-' last")
            i = end
    if i >= len(pattern):
        raise NotPortable("a class that is never closed")
    return i + 1


def _quantifier(pattern: str, i: int, repeatable: bool) -> int:
    """The quantifier at ``i`` (``*``, ``+``, ``?`` or ``{``), after something it may repeat."""
    if pattern[i] == "{":
        found = _REPEAT.match(pattern, i)
        if found is None:
            raise NotPortable("a '{' that is not a quantifier {n}, {n,} or {n,m}: write \\{")
        low, high = int(found.group(1)), found.group(3)
        if low > MAX_REPEAT or (high and int(high) > MAX_REPEAT):
            raise NotPortable(f"a repeat count over {MAX_REPEAT}")
        end = found.end()
    else:
        end = i + 1
    if not repeatable:
        raise NotPortable(f"a quantifier {pattern[i:end]!r} with nothing to repeat")
    if end < len(pattern) and pattern[end] == "+":
        raise NotPortable("a possessive quantifier (*+, ++, ?+, {n}+)")
    if end < len(pattern) and pattern[end] == "?":
        end += 1
    return end


def check(pattern: str) -> None:
    """Raise ``NotPortable`` naming the first construct outside the common core."""
    flags = _FLAGS.match(pattern)
    i = flags.end() if flags else 0
    repeatable = False
    while i < len(pattern):
        c = pattern[i]
        if c in "*+?{":
            i, repeatable = _quantifier(pattern, i, repeatable), False
            continue
        if c == "\\":
            i, kind = _escape(pattern, i, in_class=False)
            repeatable = kind != _ANCHOR
        elif c == "[":
            i, repeatable = _class(pattern, i), True
        elif c == "(":
            opener = next((o for o in _GROUP_OPENERS if pattern.startswith(o, i)), "(")
            if opener == "(" and pattern.startswith("(?", i):
                raise NotPortable(
                    "a group of the form (?... other than (?: (?= (?! (?<= (?<! (flags go first, as (?i))"
                )
            i, repeatable = i + len(opener), False
        elif c == ")":
            i, repeatable = i + 1, True
        elif c in "^$|":
            i, repeatable = i + 1, False
        else:
            if not c.isascii() and i + 1 < len(pattern) and pattern[i + 1] in "*+?{":
                raise NotPortable(
                    f"a quantifier after {c!r}: a non-ASCII character is several bytes and the "
                    "quantifier would repeat its last byte only; group it: (?:...)"
                )
            i, repeatable = i + 1, True


def compiled(pattern: str) -> re.Pattern[bytes]:
    """The pattern checked and compiled over bytes, as the runner runs it; ``ValueError`` saying what
    is wrong otherwise."""
    check(pattern)
    try:
        regex = re.compile(pattern.encode())
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    if regex.search(b"") is not None:
        raise ValueError("it matches the empty text, so every request would match")
    return regex
