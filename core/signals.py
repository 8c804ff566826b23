"""Canonical samples and the signal catalog (core/catalog.yaml).

A sample is one point of one series: a name, a sorted tuple of labels, a value and an optional
timestamp in seconds. Histograms are flattened the Prometheus way (`<name>_bucket{le=..}`,
`<name>_sum`, `<name>_count`) so every stage can store and ship plain series.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, NamedTuple

import yaml

Labels = tuple[tuple[str, str], ...]

COMMON_LABELS = tuple(
    "instance job engine model dp_rank role tenant node gpu gpu_uuid gpu_model pod namespace container"
    " mig_instance mig_profile".split()
)
"""Labels every canonical signal may carry (see docs/architecture.md, 'Canonical labels')."""

KINDS = ("gauge", "counter", "histogram")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
KVSCOPE_PREFIX = "kvscope_"
"""The agent re-exports canonical signal S as `kvscope_S`; its own health series share the prefix."""


class Sample(NamedTuple):
    """One point of one series. `labels` is sorted by label name."""

    name: str
    labels: Labels
    value: float
    timestamp: float | None = None

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None


def make_labels(mapping: dict[str, str]) -> Labels:
    """Sorted, hashable label tuple from a dict."""
    return tuple(sorted(mapping.items()))


class NameTest(dict[str, bool]):
    """name -> `test(name)`, decided once per name (`__missing__`) so that a hit is a C-level dict
    lookup; cleared past `limit` names (they come from outside)."""

    def __init__(self, test: Callable[[str], bool], limit: int) -> None:
        super().__init__()
        self.test, self.limit = test, limit

    def __missing__(self, name: str) -> bool:
        if len(self) > self.limit:
            self.clear()
        hit = self[name] = self.test(name)
        return hit


class CatalogError(ValueError):
    """The catalog file is malformed; the message names the entry."""


@dataclass(frozen=True)
class Alias:
    """One upstream name that produces a canonical signal."""

    signal: str
    engine: str
    name: str
    scale: float = 1.0
    rename: dict[str, str] = field(default_factory=dict)
    match: dict[str, tuple[str, ...]] = field(default_factory=dict)
    info_label: tuple[str, ...] = ()  # value = product of these labels of an info gauge
    info_count: tuple[str, ...] = ()  # value = distinct comma-joined names in these labels
    info_values: dict[str, float] = field(default_factory=dict)  # info_label's text -> value (others unknown)
    collapse: str | None = None  # "max" | "latest" (see catalog.yaml)
    fallback: bool = False  # an old name: read only when the scrape has none of the others
    part: str | None = None  # "sum": a counter read from the `_sum` of histogram `name`
    set: dict[str, str] = field(default_factory=dict)  # constant labels every sample of the alias gets
    buckets: tuple[float, ...] = ()  # a histogram's default `le` bounds on this engine (canonical unit)

    @property
    def rank(self) -> int:
        """Precedence among one signal's aliases of one engine: 0 first, then 1 (fallback)."""
        return 1 if self.fallback else 0


@dataclass(frozen=True)
class Signal:
    """A canonical signal: `<subject>_<quantity>_<unit>` in base units."""

    name: str
    kind: str
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    producers: tuple[str, ...] = ()
    aliases: tuple[Alias, ...] = ()

    def series_names(self) -> tuple[str, ...]:
        """The sample names this signal produces."""
        if self.kind == "histogram":
            return tuple(self.name + s for s in HISTOGRAM_SUFFIXES)
        return (self.name,)


@dataclass(frozen=True)
class Dialect:
    """How one engine spells its metrics: name prefixes and the label mapping."""

    name: str
    prefixes: tuple[str, ...]
    detect: tuple[str, ...]
    labels: dict[str, str]
    sentinels: frozenset[float] = frozenset()  # raw values that mean "no value" (dropped, counted)
    worker_labels: tuple[str, ...] = ()  # labels naming the engine behind an aggregating endpoint
    companions: tuple[str, ...] = ()  # dialects whose series ride along in this one's payload


@dataclass(frozen=True)
class FactSource:
    """An info-style or static gauge whose labels/value become facts about an engine."""

    engine: str
    name: str
    fact: str | None = None
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Catalog:
    """All canonical signals, dialects and fact sources, indexed for the normalizer."""

    signals: dict[str, Signal]
    dialects: dict[str, Dialect]
    facts: tuple[FactSource, ...]

    def aliases_for(self, engine: str) -> dict[str, list[Alias]]:
        """Upstream declared name -> aliases, for one dialect."""
        return _alias_index(self, engine)

    def fact_sources(self, engine: str) -> dict[str, FactSource]:
        return {f.name: f for f in self.facts if f.engine == engine}

    def series_names(self) -> set[str]:
        """Every canonical sample name (histogram suffixes included)."""
        return {n for s in self.signals.values() for n in s.series_names()}

    def buckets(self, signal: str, engine: str) -> tuple[float, ...]:
        """The default bucket bounds of histogram `signal` on `engine`; () where the catalog has none."""
        return next((a.buckets for a in self.signals[signal].aliases if a.engine == engine and a.buckets), ())

    def __hash__(self) -> int:  # catalogs are immutable after load; identity is enough
        return id(self)


@lru_cache(maxsize=8)
def _alias_index(catalog: Catalog, engine: str) -> dict[str, list[Alias]]:
    index: dict[str, list[Alias]] = {}
    engines = {engine, *catalog.dialects[engine].companions} if engine in catalog.dialects else {engine}
    for sig in catalog.signals.values():
        for alias in sig.aliases:
            if alias.engine in engines:
                index.setdefault(alias.name, []).append(alias)
    return index


def signal_of(series_name: str, catalog: Catalog) -> str:
    """The signal a canonical sample name belongs to (histogram suffixes removed)."""
    if series_name in catalog.signals:
        return series_name
    for suffix in HISTOGRAM_SUFFIXES:
        if series_name.endswith(suffix) and series_name[: -len(suffix)] in catalog.signals:
            return series_name[: -len(suffix)]
    return series_name


def parse_catalog(text: str, source: str = "catalog.yaml") -> Catalog:
    """Parse and validate catalog YAML text. Raises CatalogError naming the bad entry."""
    doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}  # noqa: S506 - safe
    dialects = {n: _parse_dialect(n, d) for n, d in (doc.get("dialects") or {}).items()}
    signals = {n: _parse_signal(n, d, dialects, source) for n, d in (doc.get("signals") or {}).items()}
    facts = tuple(_parse_fact(f, dialects, source) for f in doc.get("facts") or [])
    return Catalog(signals=signals, dialects=dialects, facts=facts)


def _parse_dialect(name: str, d: dict[str, Any]) -> Dialect:
    try:
        sentinels = frozenset(float(v) for v in d.get("sentinels") or ())
    except (TypeError, ValueError):
        raise CatalogError(f"catalog: dialect {name}: sentinels must be numbers, got {d.get('sentinels')!r}") from None
    lists = {k: tuple(d.get(k) or ()) for k in ("prefixes", "detect", "worker_labels", "companions")}
    return Dialect(name=name, labels=dict(d.get("labels") or {}), sentinels=sentinels, **lists)


def _parse_signal(name: str, d: dict[str, Any], dialects: dict[str, Dialect], source: str) -> Signal:
    kind = d.get("kind")
    if kind not in KINDS:
        raise CatalogError(f"{source}: signal {name}: kind {kind!r} is not one of {KINDS}")
    if kind == "counter" and not name.endswith("_total"):
        raise CatalogError(f"{source}: signal {name}: counters must end in _total")
    aliases = tuple(_parse_alias(name, a, dialects, source) for a in d.get("aliases") or [])
    labels = tuple(d.get("labels") or ())
    for alias in aliases:
        if set(alias.set) - set(labels) - set(COMMON_LABELS):
            raise CatalogError(f"{source}: signal {name}: alias {alias.name!r} sets a label the signal does not keep")
        if alias.part is not None and kind != "counter":
            raise CatalogError(
                f"{source}: signal {name}: alias {alias.name!r}: part reads a histogram's _sum "
                f"as a counter; {name} is a {kind}"
            )
        if alias.buckets and kind != "histogram":
            raise CatalogError(f"{source}: signal {name}: alias {alias.name!r}: buckets are for histograms")
        if alias.fallback and not any(a.engine == alias.engine and not a.fallback for a in aliases):
            raise CatalogError(
                f"{source}: signal {name}: alias {alias.name!r} is a fallback but {alias.engine} "
                f"has no other alias to prefer"
            )
    return Signal(
        name=name,
        kind=kind,
        unit=str(d.get("unit", "")),
        help=str(d.get("help", "")).strip(),
        labels=labels,
        producers=tuple(d.get("producers") or ()),
        aliases=aliases,
    )


def _parse_alias(signal: str, a: dict[str, Any], dialects: dict[str, Dialect], source: str) -> Alias:
    if a.get("engine") not in dialects:
        raise CatalogError(
            f"{source}: signal {signal}: alias engine {a.get('engine')!r} is not a dialect ({sorted(dialects)})"
        )
    match = {k: tuple(str(x) for x in v) for k, v in (a.get("match") or {}).items()}
    collapse = a.get("collapse")
    if collapse not in (None, "max", "latest"):
        raise CatalogError(
            f"{source}: signal {signal}: alias {a.get('name')!r}: collapse must be 'max' "
            f"(series that collapse repeat one value) or 'latest', not {collapse!r}"
        )
    part = a.get("part")
    if part not in (None, "sum"):
        raise CatalogError(f"{source}: signal {signal}: alias {a.get('name')!r}: part must be 'sum', not {part!r}")
    info = a.get("info_label")
    info_label = () if info is None else (str(info),) if isinstance(info, str) else tuple(str(x) for x in info)
    values = a.get("info_values") or {}
    if values and (len(info_label) != 1 or not isinstance(values, dict)):
        raise CatalogError(
            f"{source}: signal {signal}: alias {a.get('name')!r}: info_values maps the text of one "
            "info_label to numbers, e.g. {info_label: enable_prefix_caching, info_values: {'True': 1, 'False': 0}}"
        )
    try:
        info_values = {str(k): float(v) for k, v in values.items()}
        buckets = tuple(float(b) for b in a.get("buckets") or ())
    except (TypeError, ValueError):
        raise CatalogError(
            f"{source}: signal {signal}: alias {a.get('name')!r}: info_values and buckets must be numbers"
        ) from None
    if any(lo >= hi for lo, hi in zip(buckets, buckets[1:], strict=False)):
        raise CatalogError(f"{source}: signal {signal}: alias {a.get('name')!r}: buckets must increase")
    return Alias(
        signal=signal,
        engine=a["engine"],
        name=str(a["name"]),
        scale=float(a.get("scale", 1.0)),
        rename=dict(a.get("rename") or {}),
        match=match,
        info_label=info_label,
        info_count=tuple(str(x) for x in a.get("info_count") or ()),
        info_values=info_values,
        collapse=collapse,
        fallback=bool(a.get("fallback", False)),
        part=part,
        set={str(k): str(v) for k, v in (a.get("set") or {}).items()},
        buckets=buckets,
    )


def _parse_fact(f: dict[str, Any], dialects: dict[str, Dialect], source: str) -> FactSource:
    if f.get("engine") not in dialects:
        raise CatalogError(f"{source}: fact {f.get('name')}: unknown engine {f.get('engine')!r}")
    return FactSource(engine=f["engine"], name=str(f["name"]), fact=f.get("fact"), labels=tuple(f.get("labels") or ()))


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """The catalog shipped with the package."""
    text = resources.files("kvscope.core").joinpath("catalog.yaml").read_text()
    return parse_catalog(text)
