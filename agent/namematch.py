"""Name patterns from outside (the agent API's `match=`) matched in linear time, never by a
backtracking regex engine.

A pattern is one or more alternatives separated by `|`, optionally wrapped in one pair of
parentheses, each anchored at both ends like a Prometheus `=~` matcher. An alternative is a
sequence of literal name characters (`[A-Za-z0-9_:]`, or any other character escaped with `\\`)
and the wildcards `.*` (any run) and `.+` (any non-empty run). Anything else (classes, groups,
nested quantifiers) is refused with a message saying what is supported: `([a-z_]+)+Z` is a 400,
not hours of backtracking. Matching an alternative is a leftmost-first scan of its literal pieces
(`str.find`), which is exact for patterns of literals and wildcard runs and takes at most
O(len(name) x len(alternative)); alternatives without wildcards are one set lookup.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MAX_PATTERN_CHARS = 2048
_NAME_CHAR = re.compile(r"[A-Za-z0-9_:]")
SUPPORTED = "exact names, '|' alternatives and the wildcards '.*' and '.+' (e.g. engine_kv_.*|kvscope_target_up)"


@dataclass(frozen=True)
class _Glob:
    """Literal pieces; gaps[i] is the least number of characters before pieces[i] (pieces[0] is
    the prefix, gaps[0] == 0); `open_end`: a wildcard follows the last piece, `tail_min` its least
    length."""

    pieces: tuple[str, ...]
    gaps: tuple[int, ...]
    open_end: bool
    tail_min: int

    def match(self, name: str) -> bool:
        pieces, gaps = self.pieces, self.gaps
        if not name.startswith(pieces[0]):
            return False
        pos = len(pieces[0])
        last = len(pieces) - 1
        for i in range(1, last + (1 if self.open_end else 0)):
            found = name.find(pieces[i], pos + gaps[i])
            if found < 0:
                return False
            pos = found + len(pieces[i])
        if self.open_end:
            return len(name) - pos >= self.tail_min
        if last == 0:
            return len(name) == pos
        # the last piece is a suffix, after the gap that precedes it
        return name.endswith(pieces[last]) and len(name) - len(pieces[last]) >= pos + gaps[last]


class NameMatcher:
    """A compiled pattern; `matches(name)` and `filter(names)`. Build with `compile_pattern`."""

    def __init__(self, exact: frozenset[str], globs: tuple[_Glob, ...]) -> None:
        self.exact, self.globs = exact, globs

    def matches(self, name: str) -> bool:
        return name in self.exact or any(g.match(name) for g in self.globs)

    def filter(self, names: Iterable[str]) -> list[str]:
        """The matching names, sorted."""
        return sorted(n for n in names if self.matches(n))


def compile_pattern(raw: str) -> NameMatcher:
    """Compile `raw`; ValueError saying what is wrong and what is supported."""
    if len(raw) > MAX_PATTERN_CHARS:
        raise ValueError(f"longer than {MAX_PATTERN_CHARS} characters")
    body = raw[1:-1] if raw.startswith("(") and raw.endswith(")") and not raw.endswith("\\)") else raw
    exact: set[str] = set()
    globs: list[_Glob] = []
    for alt in _split_alternatives(body, raw):
        glob = _parse_alternative(alt)
        if len(glob.pieces) == 1 and not glob.open_end:
            exact.add(glob.pieces[0])
        else:
            globs.append(glob)
    return NameMatcher(frozenset(exact), tuple(globs))


def _split_alternatives(body: str, raw: str) -> list[str]:
    out, cur, i = [], [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            cur.append(body[i : i + 2])
            i += 2
            continue
        if c == "|":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    if any(not alt for alt in out):
        raise ValueError(f"an empty alternative in {_short(raw)}; supported: {SUPPORTED}")
    return out


def _parse_alternative(alt: str) -> _Glob:
    pieces: list[str] = [""]
    gaps: list[int] = [0]
    wild = False  # a wildcard run is open (pieces[-1] not yet started)
    gap = 0
    i = 0
    while i < len(alt):
        c = alt[i]
        if c == "." and i + 1 < len(alt) and alt[i + 1] in "*+":
            wild = True
            gap += alt[i + 1] == "+"
            i += 2
            continue
        if c == "\\" and i + 1 < len(alt) and not alt[i + 1].isalnum():
            lit, i = alt[i + 1], i + 2
        elif _NAME_CHAR.fullmatch(c):
            lit, i = c, i + 1
        else:
            raise ValueError(
                f"{c!r} at position {i + 1} of {_short(alt)} is not supported "
                f"(no regular expressions: they may run in exponential time); supported: {SUPPORTED}"
            )
        if wild:
            pieces.append("")
            gaps.append(gap)
            wild, gap = False, 0
        pieces[-1] += lit
    return _Glob(tuple(pieces), tuple(gaps), open_end=wild, tail_min=gap)


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")
