"""Re-reading a family block whose values moved and nothing else.

`ValueTemplate` remembers, for one parsed block, every line up to its last space and how each
canonical output is made from the sample values (dialect.py `linear_plan`); `apply` takes the
block's next text and, if every line but the values matches, returns the new canonical (name,
labels, value) triples in C-level passes, without regex or label mapping. It returns None (the
caller takes the general path) whenever the answer could differ from parse + normalize: another
line differs, or a value is not a float, not finite or a dialect sentinel. No template is built
for a block with parse issues, drops, facts, timestamps, a `#` in a sample line, a collapse or an
info gauge, and `build` checks its plan against the general path on the block it comes from.
"""

from __future__ import annotations

import math
from itertools import repeat
from operator import itemgetter, mul

from kvscope.agent.scrape.exposition import Exposition, parse_values
from kvscope.agent.signals import Labels

_key, _tail = itemgetter(0), itemgetter(2)
_rpartition = str.rpartition


class ValueTemplate:
    """The fixed part of one family block and the map from its sample values to its outputs."""

    __slots__ = ("factors", "fixed", "fixed_lines", "keys", "labels", "names", "samples", "sentinels", "sources")

    def __init__(
        self,
        keys: list[str],
        fixed: list[int],
        fixed_lines: list[str],
        samples: list[int],
        plan: list[tuple[int, float, str, Labels]],
        sentinels: frozenset[float] = frozenset(),
    ) -> None:
        self.keys = keys  # every line up to its last space ("" when it has none)
        self.fixed = fixed  # lines that are not samples: they must match whole
        self.fixed_lines = fixed_lines
        self.samples = samples  # line index of each sample, in order
        self.sources = [k for k, _, _, _ in plan]  # per output: which sample's value
        self.factors = [f for _, f, _, _ in plan]
        self.names = [n for _, _, n, _ in plan]
        self.labels = [lab for _, _, _, lab in plan]
        self.sentinels = sentinels  # raw values the dialect drops as "no value"

    @classmethod
    def build(
        cls,
        text: str,
        expo: Exposition,
        plan: list[tuple[int, float, str, Labels]] | None,
        heads: list[tuple[str, Labels, float]],
        sentinels: frozenset[float] = frozenset(),
    ) -> ValueTemplate | None:
        """A template for `text`, whose parse is `expo` and canonical output `heads` (in order),
        or None when the block does not qualify (see the module docstring)."""
        if plan is None or expo.issues or not expo.complete or expo.openmetrics:
            return None
        lines = text.split("\n")
        parts = list(map(_rpartition, lines, repeat(" ")))
        samples = [i for i, ln in enumerate(lines) if ln and ln[0] != "#" and not ln.isspace()]
        if len(samples) != len(expo.samples):
            return None
        for i, raw in zip(samples, expo.samples, strict=True):
            key, _, tail = parts[i]
            if not key or "#" in lines[i] or raw.timestamp is not None or parse_values([tail]) != [raw.value]:
                return None
        sample_set = set(samples)
        fixed = [i for i in range(len(lines)) if i not in sample_set]
        tpl = cls(list(map(_key, parts)), fixed, [lines[i] for i in fixed], samples, plan, sentinels)
        if tpl.outputs([raw.value for raw in expo.samples]) != heads:
            return None  # the plan does not reproduce the general path: never use it
        return tpl

    def apply(self, text: str) -> list[tuple[str, Labels, float]] | None:
        """The canonical outputs of `text` (the block's new text), or None (general path)."""
        lines = text.split("\n")
        parts = list(map(_rpartition, lines, repeat(" ")))
        if list(map(_key, parts)) != self.keys:
            return None
        if list(map(lines.__getitem__, self.fixed)) != self.fixed_lines:
            return None
        tails = list(map(_tail, parts))
        values = parse_values(list(map(tails.__getitem__, self.samples)))
        return None if values is None else self.outputs(values)

    def outputs(self, values: list[float]) -> list[tuple[str, Labels, float]] | None:
        """(name, labels, value) per output from the samples' values; None if one is not finite
        or a sentinel."""
        if self.sentinels and not self.sentinels.isdisjoint(values):
            return None
        out = list(map(mul, map(values.__getitem__, self.sources), self.factors))
        if not math.isfinite(sum(out)):  # NaN or ±Inf among them (or an overflow): general path
            return None
        return list(zip(self.names, self.labels, out, strict=True))
