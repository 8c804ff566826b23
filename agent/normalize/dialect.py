"""Engine dialects: map one engine's upstream series to canonical signals.

Everything engine-specific is data in catalog.yaml; this module only applies it: name folding
(`vllm_x` -> `vllm:x` under Ray, `sglang_x` -> `sglang:x`), `_total`/`_created` and histogram
suffixes, unit scaling (`le` bounds and `_sum` included), the label mapping, series that collapse
after dropping labels, info gauges that become facts, and the version rules of docs/collectors.md
("Engine versions": `fallback` aliases, dialect `sentinels` and `worker_labels`). A signal the
engine does not export produces no sample at all (absent, never zero).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from kvscope.agent.scrape.exposition import Exposition, RawSample, format_value
from kvscope.core.signals import HISTOGRAM_SUFFIXES, Alias, Catalog, Labels, Sample, load_catalog, signal_of

_FACT_SKIP_LABELS = {"engine", "model_name", "__name__"}
_UNKNOWN_INFO = ("", "None")  # an info label with this value is not known: the alias gives nothing


@dataclass
class Normalized:
    """Canonical samples and facts from one exposition of one target."""

    engine: str | None
    samples: list[Sample] = field(default_factory=list)
    facts: dict[str, dict[str, str]] = field(default_factory=dict)  # dp_rank -> facts
    unmapped: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    fallback: frozenset[str] = frozenset()  # signals whose samples came from fallback aliases only
    pending: dict[tuple[str, Labels, float | None], float] = field(default_factory=dict, repr=False)
    newest: dict[tuple[str, Labels, float | None], float] = field(default_factory=dict, repr=False)


def fold_name(name: str, catalog: Catalog) -> str:
    """Ray-backed loggers and some SGLang builds spell `vllm:x` as `vllm_x`: fold it back."""
    for dialect in catalog.dialects.values():
        for prefix in dialect.prefixes:
            if prefix.endswith(":") and name.startswith(prefix[:-1] + "_"):
                return prefix + name[len(prefix) :]
    return name


def detect_engine(expo: Exposition, catalog: Catalog | None = None) -> str | None:
    """The dialect whose detection prefixes match the most sample names, or None. A dialect that is
    another voted dialect's companion (its series ride along in that one's payload) never wins."""
    catalog = catalog or load_catalog()
    votes: Counter[str] = Counter()
    for raw_name, count in Counter(sample.name for sample in expo.samples).items():
        name = fold_name(raw_name, catalog)
        for dialect in catalog.dialects.values():
            if name.startswith(dialect.detect):
                votes[dialect.name] += count
    riders = {c for d in votes for c in catalog.dialects[d].companions}  # LMCache inside vLLM: vLLM's payload
    votes = Counter({d: n for d, n in votes.items() if d not in riders}) or votes
    return votes.most_common(1)[0][0] if votes else None


def normalize(
    expo: Exposition,
    engine: str | None,
    target_labels: dict[str, str],
    timestamp: float | None = None,
    catalog: Catalog | None = None,
    memo: MappingMemo | None = None,
) -> Normalized:
    """Map every sample of one exposition to canonical samples of `engine`'s dialect, each with
    `target_labels` added and `timestamp` unless it carries its own. `memo` (one per target, kept
    across scrapes) makes a series seen before cost a dict lookup; the result is the same."""
    catalog = catalog or load_catalog()
    out = Normalized(engine=engine)
    if engine is None or engine not in catalog.dialects:
        out.unmapped = len(expo.samples)
        return out
    mapper = memo.mapper(catalog, engine, target_labels) if memo else Mapper(catalog, engine, target_labels)
    acc: dict[tuple[str, Labels, float | None], float] = {}
    for raw in expo.samples:
        mapper.map_sample(raw, timestamp, acc, out)
    if out.pending:
        out.fallback = resolve_fallback(acc, out.pending, catalog)
        out.pending = {}
    out.samples = [Sample(n, lab, v, ts) for (n, lab, ts), v in acc.items()]
    return out


def resolve_fallback(acc: dict, pending: dict, catalog: Catalog) -> frozenset[str]:
    """Move fallback outputs (`pending`, same keys as `acc`: name and labels first) into `acc`
    for the signals `acc` has no sample of; returns those signals. The rest are dropped: the
    engine exported the signal under a preferred name in this scrape."""
    primary = {signal_of(key[0], catalog) for key in acc}
    kept: set[str] = set()
    for key, value in pending.items():
        sig = signal_of(key[0], catalog)
        if sig not in primary:
            acc[key] = value
            kept.add(sig)
    return frozenset(kept)


_NO_MATCH = "no_match"
_KIND_MISMATCH = "<kind>"  # resolve(): the name is an alias's, its kind is not
_BAD_LE = "bad_le"


class MappingMemo:
    """How each upstream series of one target maps to canonical series, kept across scrapes, for
    one (catalog, engine, target labels): a change starts it afresh. Cleared past `max_series`."""

    def __init__(self, max_series: int = 50_000) -> None:
        self.max_series = max_series
        self._mapper: Mapper | None = None
        self._key: tuple[int, str, tuple[tuple[str, str], ...]] | None = None

    def mapper(self, catalog: Catalog, engine: str, target_labels: dict[str, str]) -> Mapper:
        key = (id(catalog), engine, tuple(sorted(target_labels.items())))
        if self._mapper is None or key != self._key or self._mapper.catalog is not catalog:
            self._mapper = Mapper(catalog, engine, target_labels)
            self._key = key
        elif len(self._mapper.plans) > self.max_series:
            self._mapper.plans.clear()
        return self._mapper


class Mapper:
    """Applies one dialect to raw samples; caches name resolution across samples."""

    def __init__(self, catalog: Catalog, engine: str, target_labels: dict[str, str]) -> None:
        self.catalog = catalog
        # (raw name, raw labels) -> per alias: (name, labels, kind, mode, factor, rank)
        self.plans: dict[tuple[str, Labels], list[tuple]] = {}
        self.dialect = catalog.dialects[engine]
        self.sentinels = self.dialect.sentinels
        self.index = catalog.aliases_for(engine)
        self.fact_sources = catalog.fact_sources(engine)
        self.base = {**target_labels, "engine": engine}
        self._resolved: dict[str, tuple[str, str, list[Alias]]] = {}

    def resolve(self, raw_name: str) -> tuple[str, str, list[Alias]]:
        """(declared name, suffix, aliases) for a raw sample name."""
        hit = self._resolved.get(raw_name)
        if hit is None:
            hit = self._resolved[raw_name] = self._resolve(fold_name(raw_name, self.catalog))
        return hit

    def _resolve(self, name: str) -> tuple[str, str, list[Alias]]:
        if name in self.index:
            kinds = {self.catalog.signals[a.signal].kind for a in self.index[name] if a.part is None}
            if kinds & {"gauge", "counter"}:
                return name, "", self.index[name]
            return name, _KIND_MISMATCH, []  # a bare series where the aliases read a histogram
        for suffix in ("_total", *HISTOGRAM_SUFFIXES):
            if name.endswith(suffix) and name[: -len(suffix)] in self.index:
                return name[: -len(suffix)], suffix, self.index[name[: -len(suffix)]]
        return name, "", []

    def map_sample(
        self,
        raw: RawSample,
        timestamp: float | None,
        acc: dict[tuple[str, Labels, float | None], float],
        out: Normalized,
    ) -> None:
        if raw.name.endswith("_created"):
            return  # creation timestamps of counters: not a signal
        declared, suffix, aliases = self.resolve(raw.name)
        if declared in self.fact_sources:
            self._record_fact(declared, raw, out)
        if not aliases:
            if suffix == _KIND_MISMATCH:
                out.dropped["kind_mismatch"] += 1  # e.g. SGLang <= 0.5.8's gauge of a later histogram
            elif declared not in self.fact_sources:
                out.unmapped += 1
            return
        if self.sentinels and raw.value in self.sentinels:
            out.dropped["sentinel"] += 1  # the engine's "no value" code, not a measurement
            return
        ts = raw.timestamp if raw.timestamp is not None else timestamp
        plan = self.plans.get((raw.name, raw.labels))
        if plan is None:
            plan = self.plans[(raw.name, raw.labels)] = [self._plan(a, suffix, raw) for a in aliases]
        for name, labels, kind, mode, factor, rank in plan:
            if labels is _NO_MATCH:
                continue
            value = factor if mode == "info" else raw.value if mode == "raw" else raw.value * factor
            reason = "bad_value" if value is None else "non_finite" if not math.isfinite(value) else ""
            if reason or name is None:  # a bad `le` leaves no name
                out.dropped[reason or "bad_le"] += 1
                continue
            # series that collapse into one: max for gauges, the largest raw value's for `latest`, else summed
            into, key = out.pending if rank else acc, (name, labels, ts)
            prev = into.get(key)
            if kind == "latest":
                if prev is None or raw.value >= out.newest[key]:
                    into[key], out.newest[key] = value, raw.value
            elif prev is None:
                into[key] = value
            elif kind == "gauge":
                into[key] = max(prev, value)
            else:
                into[key] = prev + value

    def _plan(self, alias: Alias, suffix: str, raw: RawSample) -> tuple:
        """How `map_sample` maps this series with this alias, minus the value: (name, labels, kind,
        mode, factor, rank); name None when the alias does not match or the `le` is bad."""
        signal = self.catalog.signals[alias.signal]
        upstream = dict(raw.labels)
        if not _matches(alias, suffix, upstream):
            return None, _NO_MATCH, signal.kind, "", 0.0, alias.rank
        if alias.info_label or alias.info_count:
            mode, factor = "info", self._info_value(alias, upstream)
            if factor is _UNKNOWN:
                return None, _NO_MATCH, signal.kind, "", 0.0, alias.rank
        elif signal.kind == "histogram" and suffix in ("_bucket", "_count"):
            mode, factor = "raw", 1.0
        else:
            mode, factor = "scale", alias.scale
        labels = self._labels(alias, signal.labels, signal.kind, suffix, upstream)
        if labels is None:
            return None, _BAD_LE, signal.kind, mode, factor, alias.rank
        name = signal.name + (suffix if signal.kind == "histogram" else "")
        # how series that collapse into one combine: `collapse: max` (a count each TP rank repeats)
        # as a gauge, `collapse: latest` the newest series, else by the signal's kind
        kind = {"max": "gauge", "latest": "latest"}.get(alias.collapse or "", signal.kind)
        return name, labels, kind, mode, factor, alias.rank

    @staticmethod
    def _info_value(alias: Alias, upstream: dict[str, str]) -> float | None:
        """An info gauge's value, from its labels (None: not a number, _UNKNOWN: not known)."""
        if alias.info_count:  # distinct names in comma-joined labels (vLLM lora_requests_info)
            return float(len({n for label in alias.info_count for n in upstream.get(label, "").split(",") if n}))
        texts = [upstream.get(label, "") for label in alias.info_label]  # their product; unknown when one is absent
        if any(t in _UNKNOWN_INFO for t in texts):
            return _UNKNOWN
        if alias.info_values:  # a label that names a setting: its value when the catalog lists the text
            return alias.info_values.get(texts[0], _UNKNOWN)
        try:
            return math.prod(float(t) for t in texts) * alias.scale
        except ValueError:
            return None

    def _labels(
        self, alias: Alias, keep: tuple[str, ...], kind: str, suffix: str, upstream: dict[str, str]
    ) -> Labels | None:
        labels = dict(self.base)
        for up, canon in self.dialect.labels.items():
            if up in upstream and upstream[up] != "":
                labels[canon] = upstream[up]
        for up in self.dialect.worker_labels:  # an aggregating endpoint: one instance per worker
            if upstream.get(up):
                labels["instance"] = worker_instance(upstream[up])
        for up, value in upstream.items():
            canon = alias.rename.get(up, up)
            if canon in keep:
                labels[canon] = value
        labels.update(alias.set)
        if kind == "histogram" and suffix == "_bucket":
            le = upstream.get("le")
            if le is None:
                return None
            if alias.scale != 1.0:
                try:
                    le = format_value(float(le) * alias.scale)
                except ValueError:
                    return None
            labels["le"] = le
        return tuple(sorted(labels.items()))

    def _record_fact(self, declared: str, raw: RawSample, out: Normalized) -> None:
        source = self.fact_sources[declared]
        upstream = dict(raw.labels)
        rank = upstream.get("engine") or upstream.get("dp_rank") or "0"
        facts = out.facts.setdefault(rank, {})
        if source.fact:
            facts[source.fact] = format_value(raw.value)
            return
        keys = source.labels or tuple(k for k in upstream if k not in _FACT_SKIP_LABELS)
        for k in keys:
            if k in upstream and not k.startswith("_"):
                facts[k] = upstream[k]


_UNKNOWN = float("nan")  # identity-compared marker: an info label the alias reads is not known


def _matches(alias: Alias, suffix: str, upstream: dict[str, str]) -> bool:
    """The alias reads this series: its `match` labels (an absent label reads as "", as in
    Prometheus) and, for a `part: sum` alias, the histogram's `_sum` only."""
    if alias.part is not None and suffix != "_" + alias.part:
        return False
    return all(upstream.get(k, "") in allowed for k, allowed in alias.match.items())


def worker_instance(address: str) -> str:
    """`http://10.0.0.5:8000/` -> `10.0.0.5:8000`: a worker URL as an instance, like a target's."""
    return address.split("://", 1)[-1].split("/", 1)[0]
