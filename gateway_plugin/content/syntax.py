"""The regex syntax an operator's content pattern may use, read into what it matches.

A content pattern runs over a text's UTF-8 bytes on both paths: in the runner on RE2 (linear in
the text, however the pattern is written), on the fast path on the plugin's own automaton, run
from the program ``content_program`` compiles from what this module reads (linear too, and
stopped by the scan's budget). No backtracking engine runs them: a pattern such as ``(a+)+$`` or
``(.*a){20}`` costs what any other does. So a pattern is held to one small syntax, read here once;
it is refused when the config is loaded, with the construct and where it is named, if it uses
anything else, and what is left means the same on both paths (RE2's reading, over bytes).

The syntax: literal characters (ASCII punctuation escaped with ``\\``), ``.``, ``^``, ``$``,
``|``, ``\\A``, ``\\z``, ``\\b``, ``\\B``, ``\\d \\D \\w \\W \\s \\S``, ``\\n \\t \\r \\f``,
``\\xhh``; classes ``[...]`` and ``[^...]`` of literals, ranges between literals and the class
escapes; groups ``(...)`` and ``(?:...)``; quantifiers ``* + ?`` and ``{n}``, ``{n,}``,
``{n,m}`` (at most 1000, and at most 1000 in all where one repeats another), greedy or lazy; and
flags ``i``, ``m``, ``s`` as ``(?ims)`` at the very start; at most ``content_program.MAX_PROGRAM``
steps once compiled. As RE2 reads them: ``$`` is the end of the text (``(?m)``: of a line; not
before a final newline, as Perl's), ``\\s`` is ``[\\t\\n\\f\\r ]`` (not ``\\v``), ``\\w``, ``\\d``,
``\\b`` and ``(?i)`` are ASCII only. Not accepted: lookarounds, backreferences, named groups,
possessive quantifiers, ``\\Z``, ``\\v``, ``{,n}``, POSIX classes, or a pattern that matches the
empty text.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

MAX_REPEAT = 1000
_FLAGS = re.compile(r"\(\?([ims]+)\)")
_REPEAT = re.compile(r"\{([0-9]+)(,([0-9]*))?\}")
_LOOKAROUNDS = ("(?=", "(?!", "(?<=", "(?<!")
_SET_OPERATORS = ("--", "&&", "~~", "||")
_PUNCTUATION = frozenset(string.punctuation + " ")
_HEX = frozenset(string.hexdigits)
_CONTROL = {"n": 10, "t": 9, "r": 13, "f": 12}
# The escapes that stand for a position, and what each is (an Assert's kind).
_ANCHORS = "bBAz"
ASSERTIONS = ("wb", "nwb", "bot", "eot", "bol", "eol")


def _bits(chars: str | bytes) -> int:
    data = chars.encode("latin-1") if isinstance(chars, str) else chars
    return sum(1 << c for c in set(data))


ALL = (1 << 256) - 1
NEWLINE = 1 << 10
DIGIT = _bits(string.digits)
WORD = _bits(string.ascii_letters + string.digits + "_")
SPACE = _bits("\t\n\f\r ")
_CLASS_ESCAPES = {"d": DIGIT, "D": ALL & ~DIGIT, "w": WORD, "W": ALL & ~WORD, "s": SPACE, "S": ALL & ~SPACE}
_LOWER, _UPPER = _bits(string.ascii_lowercase), _bits(string.ascii_uppercase)


def folded(bits: int) -> int:
    """The set with each ASCII letter's other case (``(?i)``: RE2 folds nothing else over bytes)."""
    return bits | ((bits & _LOWER) >> 32) | ((bits & _UPPER) << 32)


class NotPortable(ValueError):
    """The pattern uses syntax outside the one both paths read alike."""


@dataclass(frozen=True, slots=True)
class Byte:
    """One byte, any of the set (bit ``b`` for byte ``b``)."""

    bits: int


@dataclass(frozen=True, slots=True)
class Assert:
    """A position: ``bot``/``eot`` the text's start and end, ``bol``/``eol`` a line's, ``wb``/``nwb``
    a word boundary or not."""

    kind: str


@dataclass(frozen=True, slots=True)
class Cat:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    """``item`` at least ``low`` times and at most ``high`` (None: no limit)."""

    item: Node
    low: int
    high: int | None
    counted: bool  # written {n,m}: RE2 bounds how far these multiply when nested


Node = Byte | Assert | Cat | Alt | Repeat


class _Reader:
    """One pass over the pattern, raising ``NotPortable`` at the first construct outside the syntax."""

    def __init__(self, pattern: str) -> None:
        flags = _FLAGS.match(pattern)
        self.pattern = pattern
        self.flags = set(flags.group(1)) if flags else set()
        self.i = flags.end() if flags else 0

    def refuse(self, what: str, at: int | None = None) -> NotPortable:
        return NotPortable(f"{what}, at character {(self.i if at is None else at) + 1}")

    def read(self) -> Node:
        node = self._alternatives()
        if self.i < len(self.pattern):
            raise self.refuse("a ')' with no '(' before it")
        return node

    def _alternatives(self) -> Node:
        items = [self._sequence()]
        while self.i < len(self.pattern) and self.pattern[self.i] == "|":
            self.i += 1
            items.append(self._sequence())
        return items[0] if len(items) == 1 else Alt(tuple(items))

    def _sequence(self) -> Node:
        items: list[Node] = []
        while self.i < len(self.pattern) and self.pattern[self.i] not in "|)":
            atom, repeatable = self._atom()
            if self.i < len(self.pattern) and self.pattern[self.i] in "*+?{":
                atom = self._quantified(atom, repeatable)
            items.append(atom)
        return items[0] if len(items) == 1 else Cat(tuple(items))

    def _atom(self) -> tuple[Node, bool]:
        p, c = self.pattern, self.pattern[self.i]
        if c == "(":
            return self._group(), True
        if c == "[":
            return Byte(self._class()), True
        if c == "\\":
            kind, value = self._escape(in_class=False)
            if kind == "assert":
                return Assert(ASSERTIONS[value]), False
            return Byte(self._case(1 << value) if kind == "byte" else value), True
        if c in "*+?{":
            if c == "{" and _REPEAT.match(p, self.i) is None:
                raise self.refuse("a '{' that is not a quantifier {n}, {n,} or {n,m}: write \\{")
            raise self.refuse(f"a quantifier {c!r} with nothing to repeat")
        self.i += 1
        if c == ".":
            return Byte(ALL if "s" in self.flags else ALL & ~NEWLINE), True
        if c in "^$":
            line = "m" in self.flags
            return Assert(("bol" if line else "bot") if c == "^" else ("eol" if line else "eot")), False
        if c.isascii():
            return Byte(self._case(1 << ord(c))), True
        if self.i < len(p) and p[self.i] in "*+?{":
            raise self.refuse(
                f"a quantifier after {c!r}: a non-ASCII character is several bytes and the "
                "quantifier would repeat its last byte only; group it: (?:...)"
            )
        return Cat(tuple(Byte(1 << b) for b in c.encode())), True

    def _case(self, bits: int) -> int:
        return folded(bits) if "i" in self.flags else bits

    def _group(self) -> Node:
        p, start = self.pattern, self.i
        if p.startswith(_LOOKAROUNDS, start):
            raise self.refuse("a lookaround ((?= (?! (?<= (?<!): RE2 has none; match the text itself")
        if p.startswith("(?:", start):
            self.i += 3
        elif p.startswith("(?", start):
            raise self.refuse("a group of the form (?... other than (?: (flags go first, as (?i))")
        else:
            self.i += 1
        node = self._alternatives()
        if self.i >= len(p):
            raise self.refuse("a '(' that is never closed", start)
        self.i += 1
        return node

    def _escape(self, in_class: bool) -> tuple[str, int]:
        """The escape at a backslash: ``("byte", b)`` one literal byte, ``("set", bits)`` a class
        escape, or ``("assert", kind)`` a position (not in a class)."""
        p, i = self.pattern, self.i
        if i + 1 >= len(p):
            raise self.refuse("a trailing backslash")
        c = p[i + 1]
        self.i += 2
        if c in _CLASS_ESCAPES:
            return "set", _CLASS_ESCAPES[c]
        if c in _ANCHORS and not in_class:
            return "assert", _ANCHORS.index(c)
        if c in _CONTROL:
            return "byte", _CONTROL[c]
        if c in _PUNCTUATION:
            return "byte", ord(c)
        if c == "x" and i + 3 < len(p) and p[i + 2] in _HEX and p[i + 3] in _HEX:
            self.i += 2
            return "byte", int(p[i + 2 : i + 4], 16)
        if c == "x":
            raise self.refuse("\\x needs exactly two hex digits (\\x41)", i)
        raise self.refuse(
            f"\\{c} (not in the syntax both paths read alike; the escapes are \\d \\D \\w \\W \\s \\S "
            "\\b \\B \\A \\z \\n \\t \\r \\f \\xhh and \\ before punctuation)",
            i,
        )

    def _member(self) -> tuple[int, int | None]:
        """One member of a class: its bytes, and the byte itself when it is one literal."""
        c = self.pattern[self.i]
        if c == "[":
            raise self.refuse("'[' inside a class (POSIX classes are not in the syntax): write \\[")
        if c == "\\":
            kind, value = self._escape(in_class=True)
            return (1 << value, value) if kind == "byte" else (value, None)
        if not c.isascii():
            raise self.refuse(
                f"{c!r} inside a class: a non-ASCII character is several bytes, each of which the class "
                "would match on its own; write it outside a class"
            )
        self.i += 1
        return 1 << ord(c), ord(c)

    def _class(self) -> int:
        """The class opening at ``[``: the bytes it matches."""
        p, start = self.pattern, self.i
        self.i += 1
        negated = self.i < len(p) and p[self.i] == "^"
        self.i += negated
        if self.i < len(p) and p[self.i] == "]":
            raise self.refuse("']' first in a class: write \\]")
        bits, first = 0, True
        while self.i < len(p) and p[self.i] != "]":
            if p.startswith(_SET_OPERATORS, self.i):
                raise self.refuse(f"{p[self.i : self.i + 2]!r} inside a class: escape it")
            if p[self.i] == "-" and first:
                bits, self.i, first = bits | (1 << ord("-")), self.i + 1, False
                continue
            member, low = self._member()
            first = False
            if self.i + 1 < len(p) and p[self.i] == "-" and p[self.i + 1] != "]":
                dash = self.i
                self.i += 1
                _, high = self._member()
                if low is None or high is None:
                    raise self.refuse("a range in a class runs between two characters: put '-' last", dash)
                if high < low:
                    raise self.refuse("a range in a class whose end comes before its start", dash)
                member = ((1 << (high + 1)) - 1) & ~((1 << low) - 1)
            bits |= member
        if self.i >= len(p):
            raise self.refuse("a class that is never closed", start)
        self.i += 1
        bits = self._case(bits)
        return ALL & ~bits if negated else bits

    def _quantified(self, atom: Node, repeatable: bool) -> Node:
        p = self.pattern
        if p[self.i] == "{":
            found = _REPEAT.match(p, self.i)
            if found is None:
                raise self.refuse("a '{' that is not a quantifier {n}, {n,} or {n,m}: write \\{")
            low, high_text = int(found.group(1)), found.group(3)
            high = None if found.group(2) and not high_text else int(high_text or low)
            if low > MAX_REPEAT or (high is not None and high > MAX_REPEAT):
                raise self.refuse(f"a repeat count over {MAX_REPEAT}")
            if high is not None and high < low:
                raise self.refuse("a repeat {n,m} with m below n")
            end, counted = found.end(), True
        else:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[p[self.i]]
            end, counted = self.i + 1, False
        if not repeatable:
            raise self.refuse(f"a quantifier {p[self.i : end]!r} with nothing to repeat")
        self.i = end
        if self.i < len(p) and p[self.i] == "+":
            raise self.refuse("a possessive quantifier (*+, ++, ?+, {n}+)")
        if self.i < len(p) and p[self.i] == "?":
            self.i += 1
        return Repeat(atom, low, high, counted)


def matches_empty(node: Node) -> bool:
    """Whether the pattern matches the empty text (where every position is the start and the end of
    the text and of a line, and no word boundary is)."""
    if isinstance(node, Byte):
        return False
    if isinstance(node, Assert):
        return node.kind != "wb"
    if isinstance(node, Cat):
        return all(matches_empty(n) for n in node.items)
    if isinstance(node, Alt):
        return any(matches_empty(n) for n in node.items)
    return node.low == 0 or matches_empty(node.item)


def _nested_within(node: Node, room: int) -> bool:
    """RE2's bound on counted repeats inside counted repeats: along any path the counts (the
    largest, or the least where there is no largest) multiply to at most MAX_REPEAT."""
    if isinstance(node, Repeat):
        count = node.high if node.high is not None else node.low
        if node.counted and count > 0:
            room //= count
            if room == 0:
                return False
        return _nested_within(node.item, room)
    if isinstance(node, Cat | Alt):
        return all(_nested_within(n, room) for n in node.items)
    return True


def read(pattern: str) -> Node:
    """What the pattern matches; ``NotPortable`` naming the first construct outside the syntax."""
    node = _Reader(pattern).read()
    if not _nested_within(node, MAX_REPEAT):
        raise NotPortable(f"repeats inside repeats whose counts multiply past {MAX_REPEAT}")
    if matches_empty(node):
        raise NotPortable("it matches the empty text, so every request would match")
    return node


def check(pattern: str) -> None:
    """Raise ``NotPortable`` naming the first construct outside the syntax."""
    read(pattern)
