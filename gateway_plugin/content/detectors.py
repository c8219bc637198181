"""What counts as sensitive text: the built-in detectors and the operator's patterns.

Each detector says whether any of a request's texts (UTF-8 bytes) holds what it looks for; the
``spillway`` Lua plugin (``fast_path/lua/.../spillway/detect.lua``) runs the same detectors the same
way on the fast path. Everything is defined over bytes with ASCII classes, so that Python's ``re``
and PCRE agree: the regexes below are plain ones whose match, wherever it starts, both engines
find, and the checksums are arithmetic.

- ``card``: 13 to 19 digits, written together or in groups split by single separators
  (``4111 1111 1111 1111``): a space, hyphen, tab, line break (``\\r\\n`` too), no-break or other
  Unicode space, zero-width or other invisible character, or Unicode dash (``CARD_SEPARATOR``), that
  pass the Luhn check; a run of groups counts whole, and each of its groups on its own.
- ``iban``: two letters, two check digits and 11 to 30 letters or digits (15 to 34 in all), written
  together or in groups of four split by single spaces, whose ISO 13616 mod-97 checksum is 1.
- ``email``: ``local@domain.tld``, internationalised ones too (``jürgen@bücher.de``,
  ``用户@例子.广告``: any non-ASCII UTF-8 byte counts as a letter; labels split by ASCII dots).
- ``phone``: ``+`` and 8 to 15 digits (single spaces, dots, hyphens or parentheses between them);
  ``(555) 123-4567``-style ten-digit numbers; and national numbers that start with a trunk 0
  (``020 7946 0958``).

Operator patterns (``content.patterns``) run on each text on its own, in the syntax both paths
read alike (``content_syntax``), on RE2 here (``google-re2``, over bytes as Latin-1: each byte one
character) and on the program ``content_program`` compiles on the fast path: both linear in the
text, whatever the pattern. Built-ins run once over every text joined by NUL bytes, which none of
them matches across.

A scan has a CPU budget (``content.scan_budget_ms``): ``Budget`` is told how much text each step
read and looks at the clock once per ``CHECK_BYTES`` of it, between detectors and between texts;
past the budget the scan stops (``OverBudget``) and the request stays home. One step is one
detector over the joined texts, or one pattern over one text, each linear in at most
``max_scan_bytes``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import re2

from gateway_plugin.content.program import program

# Between two texts when built-ins read them at once: no built-in pattern matches a NUL (a card's
# separators include line breaks).
JOIN = b"\x00"

# Anchored on the "@" (a character before it looked back at): a regex that starts with a class
# of many characters is tried at nearly every position of a text.
# Any byte of a non-ASCII character (UTF-8: 0x80 and up) counts as a letter, so internationalised
# addresses are found; the dots between labels are ASCII ones.
EMAIL = (
    r"@(?<=[A-Za-z0-9._%+\x80-\xff-]@)[A-Za-z0-9\x80-\xff-]+(?:\.[A-Za-z0-9\x80-\xff-]+)*"
    r"\.[A-Za-z\x80-\xff]{2,}"
)
PHONE = (
    r"\+[0-9](?:[ .()-]{0,2}[0-9]){7,14}(?![0-9])"
    r"|(?<![0-9])(?:\([0-9]{3}\) ?|[0-9]{3}[ .-])[0-9]{3}[ .-][0-9]{4}(?![0-9])"
    r"|(?<![0-9])0[0-9]{2,4}[ .-][0-9]{3,4}[ .-]?[0-9]{3,4}(?![0-9])"
)
# What may stand between two digits of a card (one of them, as UTF-8): ASCII spaces and line breaks
# (CR LF as one), the hyphen, U+0085, no-break space, soft hyphen, U+1680, U+180E, U+2000-U+2015
# (spaces, zero-width characters, marks, dashes), U+2028-U+202F (separators, embeddings, narrow
# no-break space), U+205F-U+206F (medium space, word joiner, invisible operators, isolates), minus
# sign, ideographic space, small and full-width hyphens, U+FEFF.
# The ASCII ones, one byte each; the others (CR LF too), each a branch of its own first byte.
CARD_SEPARATOR_ASCII = r"[\t\n\x0b\x0c\x1c-\x1f -]"
CARD_SEPARATOR_WIDE = (
    r"(?:\r\n?|\xc2[\x85\xa0\xad]|\xe1(?:\x9a\x80|\xa0\x8e)|\xe2(?:\x80[\x80-\x95\xa8-\xaf]|\x81[\x9f-\xaf]|\x88\x92)"
    r"|\xe3\x80\x80|\xef(?:\xb9[\x98\xa3]|\xbc\x8d|\xbb\xbf))"
)
CARD_SEPARATOR = rf"(?:{CARD_SEPARATOR_ASCII}|{CARD_SEPARATOR_WIDE})"
# A run of 13 digits or more, one separator allowed between two of them. Only the byte that starts
# a wide one sends the engine to try them: text is mostly ASCII, and PCRE tries this after every
# digit.
CARD_RUN = (
    rf"[0-9](?:{CARD_SEPARATOR_ASCII}?[0-9]|(?=[\r\xc2\xe1-\xe3\xef]){CARD_SEPARATOR_WIDE}[0-9]){{12,}}"
)
# From a word that starts like an IBAN (country, check digits) to the end of its run of words.
IBAN_RUN = r"(?<![A-Za-z0-9])[A-Za-z]{2}[0-9]{2}(?: ?[A-Za-z0-9])+"

_CARD_RUN = re.compile(CARD_RUN.encode())
_IBAN_RUN = re.compile(IBAN_RUN.encode())
_PHONE = re.compile(PHONE.encode())
_EMAIL = re.compile(EMAIL.encode())
# Python's re tries a regex at every position a match may start from, slowly; these find, in one
# cheaper pass, the stretches every match lies within (or a part every match holds), and the
# detector runs on those alone. What it finds is the same: a stretch ends where a match could not
# go on, at a character no match holds. (PCRE, on the fast path, runs the regexes whole.)
# 13 or more of the bytes a card run is made of (every byte of every separator among them).
_CARD_STRETCH = re.compile(rb"[0-9][0-9\t-\r\x1c-\x1f \-\x80-\xbf\xc2\xe1-\xe3\xef]{11,}[0-9]")
_PHONE_STRETCH = re.compile(rb"[+(0-9][0-9 .()+-]{7,}[0-9]")  # the shortest phone match is 9 long
_IBAN_PART = re.compile(rb"[0-9][0-9](?<=[A-Za-z]{2}[0-9]{2})")  # two letters, two digits
_IBAN_HEAD = re.compile(rb"[A-Z]{2}[0-9]{2}")
_NOT_DIGIT = re.compile(rb"[^0-9]")
_DIGIT_GROUP = re.compile(rb"[0-9]+")
_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)


def luhn(digits: bytes) -> bool:
    """The Luhn check of a run of ASCII digits: from the right, every second digit doubled."""
    total = 0
    for i, c in enumerate(reversed(digits)):
        total += _DOUBLED[c - 48] if i % 2 else c - 48
    return total % 10 == 0


def _card_number(digits: bytes) -> bool:
    return 13 <= len(digits) <= 19 and luhn(digits)


def card(blob: bytes) -> bool:
    return any(_card_in(stretch.group()) for stretch in _CARD_STRETCH.finditer(blob))


def _card_in(stretch: bytes) -> bool:
    for run in _CARD_RUN.finditer(stretch):
        text = run.group()
        digits = _NOT_DIGIT.sub(b"", text)
        if _card_number(digits):
            return True
        if len(digits) != len(text) and any(_card_number(g) for g in _DIGIT_GROUP.findall(text)):
            return True
    return False


def mod97(iban: bytes) -> bool:
    """ISO 13616: the first four characters moved to the end, letters read as 10 to 35, mod 97 is 1."""
    remainder = 0
    for c in iban[4:] + iban[:4]:
        # A digit shifts the remainder by one decimal place, a letter (two digits) by two.
        shift, value = (10, c - 48) if c <= 57 else (100, c - 55)
        remainder = (remainder * shift + value) % 97
    return remainder == 1


def _iban_from(tokens: Sequence[bytes], start: int) -> bool:
    """An IBAN starting at word ``start``: that word alone, or it and the groups of four after it
    (the last of 1 to 4 characters)."""
    head = tokens[start]
    if 15 <= len(head) <= 34 and mod97(head):
        return True
    if len(head) != 4:
        return False
    joined = head
    for group in tokens[start + 1 :]:
        if not 1 <= len(group) <= 4 or len(joined) + len(group) > 34:
            return False
        joined += group
        if len(joined) >= 15 and mod97(joined):
            return True
        if len(group) < 4:
            return False
    return False


def iban(blob: bytes) -> bool:
    if _IBAN_PART.search(blob) is None:
        return False
    for run in _IBAN_RUN.finditer(blob):
        tokens = run.group().upper().split(b" ")
        if any(_IBAN_HEAD.match(t) and _iban_from(tokens, i) for i, t in enumerate(tokens)):
            return True
    return False


def phone(blob: bytes) -> bool:
    return any(_PHONE.search(stretch.group()) for stretch in _PHONE_STRETCH.finditer(blob))


def email(blob: bytes) -> bool:
    return _EMAIL.search(blob) is not None


# Each built-in: its kind as the fast path runs it, the regex it carries there, and the runner's check.
BUILT_IN: dict[str, tuple[str, str | None, Callable[[bytes], bool]]] = {
    "card": ("card", None, card),
    "iban": ("iban", None, iban),
    "email": ("search", EMAIL, email),
    "phone": ("search", PHONE, phone),
}


# How much text a scan reads between two looks at the clock (one costs about a microsecond).
CHECK_BYTES = 8192


class OverBudget(Exception):
    """The scan ran past its CPU budget."""


class Budget:
    """What is left of one scan's CPU time (``clock``: this thread's CPU seconds)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self.deadline = clock() + seconds
        self.unchecked = 0

    def read(self, size: int) -> None:
        """``size`` more bytes read; ``OverBudget`` once the clock, looked at every CHECK_BYTES, is past."""
        self.unchecked += size
        if self.unchecked >= CHECK_BYTES:
            self.unchecked = 0
            if self.clock() > self.deadline:
                raise OverBudget


def _latin1() -> Any:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1  # bytes as they are, classes and (?i) ASCII only
    options.never_capture = True
    options.log_errors = False
    return options


_RE2_OPTIONS = _latin1()


@dataclass(frozen=True)
class Detector:
    """One detector: ``kind`` is ``card`` or ``iban`` (a checksum), ``search`` (a built-in regex,
    over every text at once) or ``pattern`` (an operator's regex, over each text on its own)."""

    name: str
    kind: str
    pattern: str | None = None
    check: Callable[[bytes], bool] | None = field(default=None, compare=False, repr=False)
    regex: Any = field(default=None, compare=False, repr=False)  # an RE2 regex
    # The pattern as the fast path runs it (content_program.Program.encoded).
    program: str | None = field(default=None, compare=False, repr=False)

    def finds(self, texts: Sequence[bytes], blob: bytes, budget: Budget) -> bool:
        if self.check is not None:
            found = self.check(blob)
            budget.read(len(blob))
            return found
        for text in texts:
            if self.regex.search(text) is not None:
                return True
            budget.read(len(text))
        return False


def pattern_detector(name: str, pattern: str) -> Detector:
    """An operator's pattern: read (``content_syntax``, which refused it when the config was loaded
    if it is outside the syntax), compiled for RE2 and for the fast path."""
    compiled = program(pattern)
    regex = re2.compile(pattern.encode(), _RE2_OPTIONS)
    return Detector(name, "pattern", pattern, regex=regex, program=compiled.encoded())


def built_in(name: str) -> Detector:
    kind, pattern, check = BUILT_IN[name]
    return Detector(name, kind, pattern, check)


def first_found(
    detectors: Sequence[Detector], texts: Sequence[bytes], budget: Budget | None = None
) -> str | None:
    """The first detector, in order, that finds something in any text; None when none does;
    ``OverBudget`` when the budget ran out before one found something or all had looked."""
    if not texts:
        return None
    blob = JOIN.join(texts)
    budget = budget or Budget(float("inf"))
    return next((d.name for d in detectors if d.finds(texts, blob, budget)), None)
