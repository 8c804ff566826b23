"""PromQL that reads one canonical signal from every place it can come from.

A canonical signal (core/catalog.yaml) reaches Prometheus under its engines' own names
(old and new, Ray's `vllm_x`) or as the agent's `kvscope_<signal>`. `source_union` reads them all
as one expression, relabelled and aggregated as the Python normalizer does, native names first
(docs/alerting.md); a `fallback` name only for instances without the current ones. Rescaled
buckets and info-label values have no PromQL form (`source_terms` returns them as skipped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from kvscope.core.signals import COMMON_LABELS, KVSCOPE_PREFIX, Alias, Catalog, Dialect, Signal, signal_of

GROUP_LABELS = tuple(label for label in COMMON_LABELS if label != "job")
"""Labels a canonical series keeps. `job` is dropped: the same engine scraped directly and
through the agent sits in two jobs but must be one series."""


@dataclass(frozen=True)
class SourceTerm:
    """One way a signal reaches Prometheus: a selector plus how to relabel and scale it."""

    dialect: str | None  # None for the agent's kvscope_* series
    names: tuple[str, ...]  # wire names, joined into one `__name__=~` matcher
    matchers: tuple[tuple[str, str], ...] = ()  # (label, regex)
    renames: tuple[tuple[str, str], ...] = ()  # (upstream label, canonical label)
    scale: float = 1.0
    collapse: str | None = None  # "max": the alias's collapsing series repeat one value
    fallback: bool = False  # an old name: only where the dialect's other terms have nothing
    workers: tuple[str, ...] = ()  # labels naming the worker behind an aggregating endpoint
    sets: tuple[tuple[str, str], ...] = ()  # (label, value): constant labels the alias adds
    natives: tuple[str, ...] = ()  # labels the dialect declares under their canonical name (`pod: pod`)

    def selector(self, extra: tuple[tuple[str, str], ...] = ()) -> str:
        """The vector selector, e.g. `{__name__=~"a|b",cache_source=~"device|total"}`."""
        parts = [f'{label}=~"{quote(regex)}"' for label, regex in (*self.matchers, *extra)]
        return name_selector(self.names, parts)


def name_selector(names: tuple[str, ...], matchers: list[str] | None = None) -> str:
    """`name{m}` for one name, `{__name__=~"a|b",m}` for several."""
    matchers = matchers or []
    if len(names) == 1:
        return names[0] + ("{" + ",".join(matchers) + "}" if matchers else "")
    regex = quote("|".join(escape_re(n) for n in names))
    return "{" + ",".join([f'__name__=~"{regex}"', *matchers]) + "}"


def wire_names(declared: str, kind: str, suffix: str = "", part: str | None = None) -> tuple[str, ...]:
    """Names an upstream series has on the wire: counters gain `_total` (prometheus_client),
    histograms `_bucket/_sum/_count`, and `vllm:x` is also spelled `vllm_x` under Ray. A
    `part: sum` alias reads the `_sum` of histogram `declared`."""
    if part is not None:
        declared += "_" + part
    elif kind == "counter" and not declared.endswith("_total"):
        declared += "_total"
    name = declared + suffix
    return (name, ray_spelling(name)) if ":" in name else (name,)


def ray_spelling(name: str) -> str:
    """`vllm:x` as Ray-backed loggers (and some SGLang builds) write it, `vllm_x`; a name without
    a colon as it is."""
    return name.replace(":", "_", 1)


def source_terms(signal: Signal, catalog: Catalog, suffix: str = "") -> tuple[list[SourceTerm], list[Alias]]:
    """Native terms (aliases with the same relabelling merged into one selector, so the sum
    over old and new names matches the normalizer) and the agent term; plus skipped aliases."""
    grouped: dict[tuple, SourceTerm] = {}
    skipped: list[Alias] = []
    for alias in signal.aliases:
        if alias.info_label or alias.info_count or (signal.kind == "histogram" and alias.scale != 1.0):
            skipped.append(alias)
            continue
        dialect = catalog.dialects[alias.engine]
        renames = _renames(dialect, alias, signal)
        matchers = tuple(sorted((k, "|".join(escape_re(v) for v in vs)) for k, vs in alias.match.items()))
        sets = tuple(sorted(alias.set.items()))
        key = (alias.engine, matchers, renames, alias.scale, alias.collapse, alias.fallback, sets)
        prev = grouped.get(key)
        names = (prev.names if prev else ()) + wire_names(alias.name, signal.kind, suffix, alias.part)
        grouped[key] = SourceTerm(
            alias.engine,
            names,
            matchers,
            renames,
            alias.scale,
            alias.collapse,
            alias.fallback,
            dialect.worker_labels,
            sets,
            tuple(sorted(up for up, canon in dialect.labels.items() if up == canon)),
        )
    agent = SourceTerm(None, (KVSCOPE_PREFIX + signal.name + suffix,))
    return [*grouped.values(), agent], skipped


def _renames(dialect: Dialect, alias: Alias, signal: Signal) -> tuple[tuple[str, str], ...]:
    pairs = [(up, canon) for up, canon in dialect.labels.items() if up != canon]
    pairs += [(up, canon) for up, canon in alias.rename.items() if canon in signal.labels and up != canon]
    return tuple(pairs)


WORKER_REGEX = "(?:[a-z]+://)?([^/]+).*"
"""A worker label's value (`http://host:port/`) -> host:port, as a target's instance."""


def kept(term: SourceTerm, keep: set[str]) -> SourceTerm:
    """The term relabelling only the canonical labels in `keep` (a caller that aggregates the
    others away): renames to kept labels, `engine` and the worker's `instance` only if kept."""
    return replace(
        term,
        dialect=term.dialect if "engine" in keep else None,
        renames=tuple((u, c) for u, c in term.renames if c in keep),
        sets=tuple((k, v) for k, v in term.sets if k in keep),
        workers=term.workers if "instance" in keep else (),
    )


def relabel(expr: str, term: SourceTerm) -> str:
    """Map upstream labels to canonical ones, set `engine` to the dialect, apply the scale.
    Renames run first: vLLM's own `engine` label is the data-parallel rank (-> `dp_rank`)."""
    for upstream, canonical in term.renames:
        expr = f'label_replace({expr}, "{canonical}", "$1", "{upstream}", "(.+)")'
    for label, value in term.sets:
        expr = f'label_replace({expr}, "{label}", "{quote(value)}", "", "")'
    for worker in term.workers:
        expr = f'label_replace({expr}, "instance", "$1", "{worker}", "{WORKER_REGEX}")'
    if term.dialect is not None:
        expr = f'label_replace({expr}, "engine", "{term.dialect}", "__name__", ".*")'
    if term.scale != 1.0:
        expr = f"{expr} * {prom_number(term.scale)}"
    return expr


def source_union(signal: Signal, catalog: Catalog, suffix: str = "") -> str:
    """The canonical series `signal.name + suffix` as one expression over every source: gauges
    max-ed, the rest summed over the series that collapse onto one label set (an alias marked
    `collapse: max` max-ed); integer bucket bounds (`le="1"`) rewritten as `1.0` to line up."""
    terms, _ = source_terms(signal, catalog, suffix)
    agg = "max" if signal.kind == "gauge" else "sum"
    by = canonical_by(signal, "le") if suffix == "_bucket" else canonical_by(signal)
    clause = ", ".join(by)
    exprs = []
    for term in terms:
        expr = relabel(term.selector(), term)
        if suffix == "_bucket":
            expr = f'label_replace({expr}, "le", "$1.0", "le", "([0-9]+)")'
        exprs.append(f"{'max' if term.collapse == 'max' else agg} by ({clause}) ({expr})")
    return "\nor\n".join(prefer_current(terms, exprs))


def prefer_current(terms: list[SourceTerm], exprs: list[str]) -> list[str]:
    """`exprs` (one per term of `source_terms`, each aggregated by labels that include
    `instance`), a fallback term's as `(old unless on (instance) (current or ...))`: an engine's
    old name only for instances without any of its current ones. Engines in transition export
    both (vLLM 0.10's `gpu_prefix_cache_queries` and `prefix_cache_queries`), and `or` alone
    would keep the old where the label sets differ or the sources are summed by fewer labels.
    `terms` as `source_terms` returns them: their dialects say which terms are current."""
    parts = []
    for term, expr in zip(terms, exprs, strict=True):
        if term.fallback:
            current = [e for t, e in zip(terms, exprs, strict=True) if t.dialect == term.dialect and not t.fallback]
            if not current:  # a caller's matcher left out every current term (`_admitted`), not this one
                raise NotExpressible(f"{term.names[0]} is read where {term.dialect}'s current names are absent")
            expr = f"({expr}\nunless on (instance)\n(" + "\nor\n".join(current) + "))"
        parts.append(expr)
    return parts


def apart(terms: list[SourceTerm]) -> set[str]:
    """Labels that keep the series of different source terms apart where `or` joins them:
    `instance` (one instance exports one engine's names, the agent relays it under the same
    labels; a fallback term is read per instance, `prefer_current`), each label a term sets
    (SGLang's cache_scope, the P/D queue), and each a term renames into where another term of its
    dialect does not. An aggregation by fewer labels makes one series of every term's, and `or`
    keeps the first."""
    out = {"instance"}
    targets: dict[str | None, list[set[str]]] = {}
    for term in terms:
        out.update(label for label, _ in term.sets)
        targets.setdefault(term.dialect, []).append({canonical for _, canonical in term.renames})
    for renamed in targets.values():
        out |= set().union(*renamed) - renamed[0].intersection(*renamed[1:])
    return out


def canonical_by(signal: Signal, *extra: str) -> tuple[str, ...]:
    """Grouping labels for a canonical series: the common set, the signal's own, and `extra`."""
    return (*GROUP_LABELS, *signal.labels, *extra)


class NotExpressible(Exception):
    """The rule (or one of its parts) has no faithful PromQL form; str() says why."""


def le_regex(bound: float) -> str:
    """A regex, quoted for a PromQL string, matching a histogram bound however a client library
    spells it (`1` or `1.0`; Prometheus 3 normalises it on ingestion)."""
    spellings = {repr(float(bound)), prom_number(bound)}
    return quote("|".join(sorted(escape_re(s) for s in spellings)))


def prom_number(value: float) -> str:
    x = float(value)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def quote(text: str) -> str:
    """Escape for a double-quoted PromQL string."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def escape_re(text: str) -> str:
    return "".join("\\" + ch if ch in ".+*?()[]{}|^$\\" else ch for ch in text)


# ------------------------------------------------------------------------------ signal readers
# A range function (`rate`, `increase`, `resets`) applies to each source's raw samples before
# relabelling, as a recording rule's input would be: never to a subquery of the union.


class PromQL(str):
    """PromQL text with what its compiler knew: `by`, the labels of its result series, and
    `cost`, its rough price on the TSDB (a raw selector 1, a histogram's buckets 10, a subquery
    the inner expression again plus 10), so callers need not read the text back."""

    by: tuple[str, ...]
    cost: int

    def __new__(cls, text: str, by: tuple[str, ...] | list[str] = (), cost: int = 1) -> PromQL:
        out = super().__new__(cls, text)
        out.by, out.cost = tuple(by), cost
        return out


class Aggregated(PromQL):
    """A read its reader has already aggregated by exactly the labels `labels`, one series per
    label set (InlineSignals: each source summed or max-ed by the caller's grouping, and by the
    labels that hold the sources apart, joined with `or`; `cost` its sources). A caller's
    `sum`/`max`/`min`/`avg by` over the same labels returns it unchanged, and is left out
    (promql/series.py): Prometheus would aggregate every series again at every step."""

    labels: frozenset[str]

    def __new__(cls, text: str, labels: list[str] | tuple[str, ...], cost: int = 1) -> Aggregated:
        out = str.__new__(cls, text)
        out.by, out.cost, out.labels = tuple(labels), cost, frozenset(labels)
        return out


Matcher = tuple[str, str, str]
"""(canonical label, operator `=~` or `!=`, regex or value)."""


def _format_matchers(matchers: list[Matcher] | tuple[Matcher, ...]) -> list[str]:
    return [f'{label}{op}"{quote(value)}"' for label, op, value in matchers]


class NamedSignals:
    """Reads each canonical series by one name: `kvscope:<series>`, the recording rules `kvscope
    rules build` writes (the default, for the alert files), or with `prefix=""` the canonical name
    itself, as a finding's evidence shows what the rule computed."""

    def __init__(self, prefix: str = "kvscope:") -> None:
        self.prefix = prefix

    def read(
        self,
        series: str,
        matchers: list[Matcher],
        fn: str | None = None,
        rng: str | None = None,
        by: tuple[str, ...] | None = None,
        outer: str | None = None,
    ) -> str:
        parts = _format_matchers(matchers)
        sel = self.prefix + series + ("{" + ",".join(parts) + "}" if parts else "")
        return f"{fn}({sel}[{rng}])" if fn else sel


class InlineSignals:
    """Reads every source of a canonical series written out (`source_union` with the node's
    matchers and range function pushed into each source; a matcher on a label a source sets, as
    `engine`, decides whether that source is read, `_admitted`). Raises NotExpressible
    (promql/series.py) for a signal with sources PromQL cannot read (rescaled buckets,
    info-label values)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def read(
        self,
        series: str,
        matchers: list[Matcher],
        fn: str | None = None,
        rng: str | None = None,
        by: tuple[str, ...] | None = None,
        outer: str | None = None,
    ) -> str:
        """`by`/`outer`: the grouping and aggregation the caller applies next. When the sources'
        own aggregation can be folded into it (sums of counters, max of max), only the labels
        it needs are relabelled and kept: the same values for a fraction of the work. With more
        than one source term it also keeps the labels that hold the terms apart (`apart`), or
        `or` would keep the first term's fleet-wide sum only."""
        signal, suffix, every = self._terms(series)
        reads = _admitted(every, matchers)
        terms = [term for term, _ in reads]
        agg = "max" if signal.kind == "gauge" else "sum"
        full = canonical_by(signal, "le") if suffix == "_bucket" else canonical_by(signal)
        foldable = by is not None and (outer == agg or outer == "count_series")
        if foldable and not any(t.collapse == "max" for t in terms):
            wanted = set(by or ()) | {m[0] for m in matchers} | ({"le"} if suffix == "_bucket" else set())
            if len(terms) > 1:
                wanted |= apart(terms)
            needed = [b for b in full if b in wanted]
        else:
            needed = list(full)
        clause = ", ".join(needed)
        exprs = []
        for term, selectors in reads:
            if needed != list(full):
                term = kept(term, set(needed))
            op = "max" if term.collapse == "max" else agg
            expr = _wire_read(term.names, selectors, fn, rng)
            expr = relabel(expr, term if fn != "resets" else replace(term, scale=1.0, sets=()))
            if suffix == "_bucket":
                expr = f'label_replace({expr}, "le", "$1.0", "le", "([0-9]+)")'
            exprs.append(f"{op} by ({clause}) ({expr})")
        return Aggregated("(" + "\nor\n".join(prefer_current(terms, exprs)) + ")", needed, len(exprs))

    def raw_reads(
        self, series: str, matchers: list[Matcher], fn: str | None = None, rng: str | None = None
    ) -> list[str]:
        """The upstream series `read` relabels and aggregates, per source term as they are on the
        wire (`fn(...[rng])` with `fn`): a series present or reset upstream is so in the sum."""
        _, _, terms = self._terms(series)
        return [_wire_read(term.names, sel, fn, rng) for term, sel in _admitted(terms, matchers)]

    def _terms(self, series: str) -> tuple[Signal, str, list[SourceTerm]]:
        signal, suffix = split_series(series, self.catalog)
        if signal is None:
            raise NotExpressible(f"{series} is not a catalog signal")
        terms, skipped = source_terms(signal, self.catalog, suffix)
        if skipped:
            raise NotExpressible(
                f"{signal.name} has sources PromQL cannot read ({', '.join(sorted({a.name for a in skipped}))})"
            )
        return signal, suffix, terms


SignalReader = NamedSignals | InlineSignals
"""How the rule compiler (promql/series.py) reads a canonical series."""


def _range_read(names: tuple[str, ...], matchers: list[str], fn: str, rng: str | None) -> str:
    """`fn(selector[rng])` over `names`. A range function drops `__name__`, so two series of one
    engine under different names (llama.cpp's `prompt_tokens` and `prompt_tokens_cached`, summed
    into one signal) would leave one label set twice, which Prometheus refuses; each name is read
    apart and labelled `kvscope_name` (`or` ignores `__name__`) for the caller's aggregation to
    add up. Spellings of one name (`vllm:x`, `vllm_x` under Ray) never both exist: one selector."""
    spellings: dict[str, list[str]] = {}
    for name in names:
        spellings.setdefault(ray_spelling(name), []).append(name)
    reads = [(group[0], f"{fn}({name_selector(tuple(group), matchers)}[{rng}])") for group in spellings.values()]
    if len(reads) == 1:
        return reads[0][1]
    return "(" + "\nor\n".join(f'label_replace({r}, "kvscope_name", "{quote(n)}", "", "")' for n, r in reads) + ")"


def _wire_read(names: tuple[str, ...], alternatives: list[list[str]], fn: str | None, rng: str | None) -> str:
    """The term's series read once per alternative selector (`_admitted`), joined with `or`:
    a series two alternatives both select is one label set twice, and `or` keeps it once."""
    reads = [_range_read(names, sel, fn, rng) if fn else name_selector(names, sel) for sel in alternatives]
    return reads[0] if len(reads) == 1 else "(" + "\nor\n".join(reads) + ")"


def _admitted(terms: list[SourceTerm], matchers: list[Matcher]) -> list[tuple[SourceTerm, list[list[str]]]]:
    """The terms the caller's matchers can select from, each with its selectors' matchers (one
    list per selector, read joined with `or`, `_wire_read`): the term's own and the caller's as
    its upstream labels (a renamed label matched upstream). A matcher on a label the term sets to
    a constant (`constants_of`) is no upstream label: it is decided here, the term read without it
    where the constant matches and left out where not, as filtering the canonical series would.
    The agent's term sets none, so one term is always left (a read that matches nothing is an
    empty vector, as before). A canonical label with several upstream spellings is matched as
    `_spelled` says."""
    out = []
    for term in terms:
        constants = constants_of(term)
        if not all(label_matches(constants[label], op, value) for label, op, value in matchers if label in constants):
            continue
        spellings: dict[str, list[str]] = {"instance": ["instance", *term.workers]} if term.workers else {}
        for up, canon in term.renames:
            spellings.setdefault(canon, [canon] if canon in term.natives else []).append(up)
        alternatives: list[list[Matcher]] = [[]]
        for label, op, value in matchers:
            if label not in constants:
                ups = spellings.get(label, [label])
                choices = _spelled(ups, op, value, set(term.workers))
                alternatives = [[*alt, *choice] for alt in alternatives for choice in choices]
        own = [f'{label}=~"{quote(regex)}"' for label, regex in term.matchers]
        out.append((term, [[*own, *_format_matchers(alt)] for alt in alternatives]))
    return out


def _spelled(ups: list[str], op: str, value: str, workers: set[str]) -> list[list[Matcher]]:
    """A matcher on a canonical label with upstream spellings `ups` (DCGM's `UUID` and `uuid`,
    `pod` and `pod_name`; `instance` and a router's `worker_addr`), as upstream matchers: one list
    per spelling, read joined with `or`. The canonical value is the last spelling present
    (`relabel` renames in order, and an empty label is absent), so each list matches its spelling
    and holds every later one empty: one series is in one list, whatever its other spellings
    hold. A worker label names a URL (`http://host:port/`) whose host:port is the instance
    (`WORKER_REGEX`), so the pattern is matched inside it; one that matches a `/` or a scheme
    reads the URL's, not the instance's, text."""
    out = []
    for i, up in enumerate(ups):
        mine = (up, op, value)
        if up in workers:
            regex = value if op in ("=~", "!~") else escape_re(value)
            mine = (up, "!~" if op in ("!~", "!=") else "=~", f"(?:[a-z]+://)?(?:{regex})(?:/.*)?")
        present = [(up, "=~", ".+")] if i and label_matches("", *mine[1:]) else []
        out.append([mine, *present, *((later, "=", "") for later in ups[i + 1 :])])
    return out


def constants_of(term: SourceTerm) -> dict[str, str]:
    """Canonical labels `relabel` sets to a constant: the alias's `set` and `engine` (the dialect;
    vLLM's own `engine` label is its dp rank). The agent's term sets none."""
    return {**dict(term.sets), **({"engine": term.dialect} if term.dialect is not None else {})}


def label_matches(value: str, op: str, pattern: str) -> bool:
    """A PromQL label matcher on `value` (`=~`/`!~` anchored at both ends, as Prometheus does)."""
    if op in ("=~", "!~"):
        return (re.fullmatch(pattern, value) is not None) == (op == "=~")
    if op in ("=", "!="):
        return (value == pattern) == (op == "=")
    raise ValueError(f"unknown matcher operator {op!r}")


def split_series(series: str, catalog: Catalog) -> tuple[Signal | None, str]:
    """`request_ttft_seconds_bucket` -> (the histogram signal, "_bucket"); a signal name -> (it, "")."""
    base = signal_of(series, catalog)
    return (catalog.signals[base], series[len(base) :]) if base in catalog.signals else (None, "")
