"""Per-target memo of parse + normalize, one metric family block at a time.

Between two scrapes most families are byte-identical. `BlockCache.normalize` splits a text payload
into family blocks (each starts at a `# HELP`) and parses and normalizes only the blocks whose text
changed; the result's samples are a `Stamped` (agent/scrape/stamped.py) whose unchanged blocks are
the same objects as last scrape. The result equals parse + normalize of the whole payload: blocks
are combined as the dialect collapses series (gauges max, the rest summed; a signal a block has
only under a `fallback` name yields to another block's preferred name). The whole-payload path is
taken for OpenMetrics, an incomplete payload, a series in two blocks, own timestamps, a payload
over `max_cached_bytes` (the memo holds one payload), or more than `max_miss_fraction` of the
blocks changed (every `refresh_every`-th such scrape still refreshes the memo). Parse issues'
line numbers are relative to their block.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import chain, compress, repeat
from operator import attrgetter, is_, is_not

from kvscope.agent.normalize.blockvalues import ValueTemplate
from kvscope.agent.normalize.dialect import MappingMemo, Normalized, normalize
from kvscope.agent.scrape.exposition import NO_LIMITS, Limits, ParseIssue, parse_exposition
from kvscope.agent.scrape.stamped import Stamped
from kvscope.agent.signals import Catalog, Labels, Sample, signal_of

MAX_LABEL_CACHE = 20_000
_facts, _dropped, _unmapped, _issues, _heads, _fallback = map(
    attrgetter, ("facts", "dropped", "unmapped", "issues", "samples", "fallback")
)


@dataclass(eq=False)  # compared by identity only (list.count(None) would call a generated __eq__)
class _Block:
    samples: list[tuple[str, Labels, float]]  # canonical (name, labels, value), stamped per scrape
    facts: dict[str, dict[str, str]]
    dropped: Counter[str]
    issues: list[ParseIssue]
    unmapped: int
    keys: set[tuple[str, Labels]] = field(default_factory=set)  # parsed series, for duplicate checks
    timestamped: bool = False  # a sample carried its own timestamp: take the whole-payload path
    canonical: frozenset[tuple[str, Labels]] = frozenset()  # output series, to spot collapses
    template: ValueTemplate | None = None  # re-reads the block's next text when only values moved
    fallback: frozenset[str] = frozenset()  # signals this block has only under a fallback (old) name
    signals: frozenset[str] = frozenset()  # signals of its outputs

    def without(self, signals: frozenset[str], catalog: Catalog) -> _Block:
        """The block minus the outputs of `signals` (another block has them under a preferred name)."""
        heads = [h for h in self.samples if signal_of(h[0], catalog) not in signals]
        canonical = frozenset(k for k in self.canonical if signal_of(k[0], catalog) not in signals)
        return replace(
            self,
            samples=heads,
            canonical=canonical,
            template=None,
            fallback=self.fallback - signals,
            signals=self.signals - signals,
        )


class BlockCache:
    """Memo of one target's previous payload, by family block."""

    def __init__(
        self,
        catalog: Catalog,
        max_cached_bytes: int = 4 << 20,
        max_miss_fraction: float = 0.3,
        refresh_every: int = 16,
        limits: Limits = NO_LIMITS,
    ) -> None:
        self.catalog = catalog
        self.limits = replace(limits, sample_limit=0)  # the label limits; the caller counts samples
        self._deadline: float | None = None
        self.max_cached_bytes = max_cached_bytes
        self.max_miss_fraction = max_miss_fraction
        self.refresh_every = refresh_every
        self._blocks: dict[BlockKey, _Block] = {}
        self._skipped = 0
        self.memo = MappingMemo()  # label mapping of each upstream series, for both paths
        self._label_cache: dict[str, Labels | str] = {}  # label body text -> parsed labels
        # The previous scrape's block layout (series per block) and what it implied, so that a
        # scrape whose blocks hold the same series (values moved) skips the cross-block checks.
        self._layout: list[_Block] = []
        self._layout_whole = False
        self._layout_disjoint = True
        self.hits = self.misses = self.whole = 0  # blocks reused, blocks parsed, whole-payload parses
        self.values = 0  # changed blocks re-read by their value template

    def normalize(
        self, text: str, engine: str, target_labels: dict[str, str], timestamp: float, deadline: float | None = None
    ) -> tuple[Normalized, list[ParseIssue]]:
        """Canonical samples of `text` for `engine`, and the parse issues of the payload. Past
        `deadline` (time.monotonic) the blocks left are not parsed: one parse_timeout issue."""
        self._deadline = deadline
        if len(text) > self.max_cached_bytes or not text.endswith("\n") or text.rstrip().endswith("# EOF"):
            return self._whole(text, engine, target_labels, timestamp)
        keys = block_keys(text)
        ordered: list[_Block | None] = list(map(self._blocks.get, keys))  # one C-level pass of lookups
        changed = ordered.count(None)
        if changed and len(self._layout) == len(keys):
            changed -= self._reread_values(keys, ordered)
        if self._blocks and changed > self.max_miss_fraction * len(keys) and self._skipped < self.refresh_every:
            self._skipped += 1  # most families changed: one whole parse is cheaper than many small ones
            return self._whole(text, engine, target_labels, timestamp)
        self._skipped = 0
        self.hits += len(keys) - changed
        if changed:
            made: dict[BlockKey, _Block] = {}
            for i, hit in enumerate(ordered):
                if hit is None:
                    key = keys[i]
                    hit = made.get(key)
                    if hit is None:
                        if self._deadline is not None and time.monotonic() > self._deadline:
                            self._blocks, self._layout = {}, []
                            return Normalized(engine=engine), [ParseIssue(0, "parse_timeout", "")]
                        self.misses += 1
                        hit = made[key] = self._normalize_block(block_text(key), engine, target_labels)
                    else:
                        self.hits += 1
                    ordered[i] = hit
        blocks: list[_Block] = ordered  # type: ignore[assignment]  # every None was filled
        same = self._same_layout(blocks)
        self._layout = blocks
        self._blocks = dict(zip(keys, blocks, strict=True))
        blocks = self._shadow(blocks)
        if not same:
            self._layout_whole = _needs_whole_path(blocks)
            self._layout_disjoint = _disjoint_outputs(blocks)
        if self._layout_whole:
            self._blocks = {}
            self._layout = []
            return self._whole(text, engine, target_labels, timestamp)
        return self._combine(blocks, engine, timestamp)

    def _shadow(self, blocks: list[_Block]) -> list[_Block]:
        """Drop what blocks hold only under a fallback name of a signal another block holds under
        a preferred one (vLLM <= 0.11 exports old and new names in separate families)."""
        if not any(map(_fallback, blocks)):
            return blocks
        preferred = set().union(*(b.signals - b.fallback for b in blocks))
        return [b.without(b.fallback & preferred, self.catalog) if b.fallback & preferred else b for b in blocks]

    def _reread_values(self, keys: list[BlockKey], ordered: list[_Block | None]) -> int:
        """Fill the misses whose block at the same place last scrape re-reads them (only values
        moved: agent/normalize/blockvalues.py); returns how many it filled."""
        filled = 0
        prev = self._layout
        for i in compress(range(len(keys)), map(is_, ordered, repeat(None))):
            tpl = prev[i].template
            if tpl is not None:
                heads = tpl.apply(block_text(keys[i]))
                if heads is not None:
                    ordered[i] = replace(prev[i], samples=heads)
                    filled += 1
        self.values += filled
        return filled

    def _labels_memo(self) -> dict[str, Labels | str]:
        if len(self._label_cache) > MAX_LABEL_CACHE:
            self._label_cache.clear()
        return self._label_cache

    def _same_layout(self, blocks: list[_Block]) -> bool:
        """Same blocks in the same order as last scrape, or blocks whose series are the same."""
        prev = self._layout
        if len(prev) != len(blocks):
            return False
        for i in compress(range(len(blocks)), map(is_not, prev, blocks)):  # the blocks that changed
            a, b = prev[i], blocks[i]
            if (
                len(a.samples) != len(b.samples)
                or (a.keys is not b.keys and a.keys != b.keys)
                or (a.canonical is not b.canonical and a.canonical != b.canonical)
                or a.timestamped
                or b.timestamped
            ):  # `is`: a re-read block shares its sets
                return False
        return True

    def _whole(
        self, text: str, engine: str, labels: dict[str, str], timestamp: float
    ) -> tuple[Normalized, list[ParseIssue]]:
        self.whole += 1
        expo = parse_exposition(text, label_cache=self._labels_memo(), limits=self.limits, deadline=self._deadline)
        return normalize(expo, engine, labels, timestamp, self.catalog, self.memo), expo.issues

    def _normalize_block(self, block: str, engine: str, labels: dict[str, str]) -> _Block:
        expo = parse_exposition(block, openmetrics=False, label_cache=self._labels_memo(), limits=self.limits)
        norm = normalize(expo, engine, labels, None, self.catalog, self.memo)
        keys = {(s.name, s.labels) for s in expo.samples}
        timestamped = any(s.timestamp is not None for s in expo.samples)
        canonical = frozenset((s.name, s.labels) for s in norm.samples)
        heads = [(s[0], s[1], s[2]) for s in norm.samples]
        template = None
        mapper = self.memo.mapper(self.catalog, engine, labels)
        if not (norm.facts or norm.dropped or timestamped):
            template = ValueTemplate.build(block, expo, mapper.linear_plan(expo.samples), heads, mapper.sentinels)
        signals = frozenset(signal_of(name, self.catalog) for name, _ in canonical)
        return _Block(
            heads,
            norm.facts,
            norm.dropped,
            expo.issues,
            norm.unmapped,
            keys,
            timestamped,
            canonical,
            template,
            norm.fallback,
            signals,
        )

    def _combine(self, blocks: list[_Block], engine: str, timestamp: float) -> tuple[Normalized, list[ParseIssue]]:
        out = Normalized(engine=engine)
        # a hundred blocks per target, few with facts or drops: select those in C-level passes
        for b in compress(blocks, map(_facts, blocks)):
            for rank, facts in b.facts.items():
                out.facts.setdefault(rank, {}).update(facts)
        for b in compress(blocks, map(_dropped, blocks)):
            out.dropped.update(b.dropped)
        out.unmapped = sum(map(_unmapped, blocks))
        issues = list(chain.from_iterable(map(_issues, blocks)))
        if self._layout_disjoint:  # no series in two blocks: the blocks as they are, one stamp for all
            out.samples = Stamped(list(map(_heads, blocks)), timestamp)  # type: ignore[assignment]
        else:
            out.samples = self._collapse_all(blocks, timestamp)
        return out, issues

    def _collapse_all(self, blocks: list[_Block], timestamp: float) -> list[Sample]:
        """Old and new upstream names of one signal, in two families: collapse like the dialect."""
        acc: dict[tuple[str, Labels], float] = {}
        for b in blocks:
            for name, labels, value in b.samples:
                key = (name, labels)
                prev = acc.get(key)
                if prev is None:
                    acc[key] = value
                else:
                    sig = self.catalog.signals.get(signal_of(name, self.catalog))
                    acc[key] = max(prev, value) if sig is not None and sig.kind == "gauge" else prev + value
        return [Sample(n, lab, v, timestamp) for (n, lab), v in acc.items()]


BlockKey = str | tuple[str, str]
"""A block's memo key: the text between two `\n# HELP ` separators for a middle block (no copy
of the payload is made), ("first" | "last" | "whole", its text) for the others."""


def block_keys(text: str) -> list[BlockKey]:
    """The memo keys of `text`'s blocks, in order; `block_text(key)` is the block."""
    parts: list[BlockKey] = text.split("\n# HELP ")  # type: ignore[assignment]
    if len(parts) == 1:
        return [("whole", text)] if text else []
    parts[0] = ("first", parts[0])  # type: ignore[assignment]
    parts[-1] = ("last", parts[-1])  # type: ignore[assignment]
    return parts


def block_text(key: BlockKey) -> str:
    """The text of the block a `block_keys` key stands for."""
    if isinstance(key, str):
        return "# HELP " + key + "\n"
    tag, part = key
    if tag == "first":
        return part + "\n"
    return "# HELP " + part if tag == "last" else part


def _disjoint_outputs(blocks: list[_Block]) -> bool:
    """No canonical series comes out of two blocks (else they are collapsed like the dialect)."""
    total = sum(len(b.samples) for b in blocks)
    return len(set().union(*(b.canonical for b in blocks))) == total


def _needs_whole_path(blocks: list[_Block]) -> bool:
    """A series in two blocks (a duplicate only the whole parse reports), or own timestamps."""
    seen: set[tuple[str, Labels]] = set()
    for b in blocks:
        if b.timestamped or not seen.isdisjoint(b.keys):
            return True
        seen |= b.keys
    return False
