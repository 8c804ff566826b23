"""Diagnose from a Prometheus-compatible HTTP API: the full fetch (docs/architecture.md).

Range queries (through `promapi.PromClient`, split in time and in instance batches) for every
upstream name of the native series the rules need and the agent's `kvscope_<signal>` series,
mapped through the live scrape's dialects once per row (`frame_from_matrix`). Answers on
start + k x step with Prometheus' 5-minute lookback, the Frame's own sampling rule.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from typing import Any, NamedTuple

import numpy as np

from kvscope.agent.normalize.dialect import Mapper, Normalized, detect_engine
from kvscope.agent.scrape.exposition import Exposition, RawSample
from kvscope.core.rates import configured_interval
from kvscope.core.signals import KVSCOPE_PREFIX, Catalog, Labels, load_catalog, make_labels, signal_of
from kvscope.diagnoser.evaluate.frame import DEFAULT_LOOKBACK_S, Block, Frame, blocks_of, make_grid, merge_facts
from kvscope.diagnoser.evaluate.grid import ffill
from kvscope.diagnoser.promql.signals import quote, ray_spelling
from kvscope.diagnoser.sources.promapi import PromClient, as_points, matrix_on_grid

DEFAULT_WINDOW_S = 1800.0
_TARGET_LABELS = ("job", "instance")
PROBE_S = 3600.0
PROBE_INSTANCES = 3
"""`scrape_interval` reads at most this span of raw samples of at most this many instances."""
INSTANCE_BATCH = 25
"""Instances per query when a fetch is restricted to some instances (`instance=~"a|b|..."`)."""


class PrometheusSource:
    """Range queries against one Prometheus-compatible base URL."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 60.0,
        catalog: Catalog | None = None,
        client: PromClient | None = None,
        instances: list[str] | None = None,
    ) -> None:
        self.client = client or PromClient(url, timeout_s=timeout_s)
        self.url = self.client.url
        self.catalog = catalog or load_catalog()
        self.description = f"prometheus:{self.url}"
        self.notes: list[str] = []  # how queries were split is the client's (`client.notes`)
        self.instances = instances  # only these instances' series (e.g. one pool's), else every one
        self.model: str | None = None  # the model whose pools `instances` are (`scope_to_pool`)

    def natural_step(self) -> float | None:
        """None: a TSDB holds many scrape intervals (callers pick a step)."""
        return None

    def read_frame(self, names: set[str], start: float | None, end: float | None, step: float) -> Frame:
        end = time.time() if end is None else end
        start = end - DEFAULT_WINDOW_S if start is None else start
        return fetch_frame(self.client, names, start, end, step, self.instances, self.catalog)

    def scrape_interval(self, names: set[str], start: float, end: float) -> float | None:
        """The interval the series `names` were scraped at: the median gap between the raw samples
        of up to PROBE_INSTANCES instances (the first by name) over the last PROBE_S of [start, end];
        None when none has two samples there; read as the interval it was configured at
        (`configured_interval`). Index lookup plus one bounded read of raw samples."""
        lo = max(start, end - PROBE_S)
        sel = selector_for(names, self.catalog, facts=False)
        instances = self.instances or self.client.label_values("instance", [sel], lo, end)
        instances = sorted(instances)[:PROBE_INSTANCES]
        if instances:
            sel = selector_for(names, self.catalog, instances, facts=False)
        gaps = [np.diff(as_points(s.get("values"))[:, 0]) for s in self.client.raw_samples(sel, end - lo, end)]
        every = np.concatenate(gaps) if gaps else np.empty(0)
        every = every[every > 0]
        return configured_interval(float(np.median(every))) if len(every) else None


def _model_labels(catalog: Catalog) -> list[str]:
    """Every upstream label that carries the model (vLLM's and SGLang's `model_name`, Dynamo's
    `model`, ...), and kvscope's own `model`."""
    keys = {up for d in catalog.dialects.values() for up, canonical in d.labels.items() if canonical == "model"}
    return sorted(keys | {"model"})


def model_instances(client: PromClient, catalog: Catalog, model: str, start: float, end: float) -> list[str]:
    """The instances with a series of `model` in [start, end] (the index only): one model's engines."""
    matchers = [f'{{{key}="{quote(model)}"}}' for key in _model_labels(catalog)]
    return sorted(client.label_values("instance", matchers, start - DEFAULT_LOOKBACK_S, end))


def model_of(client: PromClient, catalog: Catalog, instance: str, start: float, end: float) -> str | None:
    """The one model `instance` served in [start, end] (the index only); None when it names none
    or several."""
    matcher = [f'{{instance="{quote(instance)}"}}']
    first = start - DEFAULT_LOOKBACK_S
    models = {m for key in _model_labels(catalog) for m in client.label_values(key, matcher, first, end)}
    return models.pop() if len(models) == 1 else None


def scope_to_pool(source: PrometheusSource, model: str | None, instance: str | None, start: float, end: float) -> str:
    """Narrow `source` to the engines of one pool: those of `model`, or of the one model `instance`
    served in [start, end] (both from the TSDB's index); every engine when neither is known (or the
    instance served several models). Returns which pools it reads, in words."""
    served = model or (instance and model_of(source.client, source.catalog, instance, start, end))
    source.model = served or None
    if served:
        source.instances = model_instances(source.client, source.catalog, served, start, end) or None
    return f"the pools of model {served} ({len(source.instances)} instance(s))" if source.instances else "every pool"


def fetch_frame(
    client: PromClient,
    names: set[str],
    start: float,
    end: float,
    step: float,
    instances: list[str] | None = None,
    catalog: Catalog | None = None,
) -> Frame:
    """The canonical series `names` on the grid [start, end] by `step`, of `instances` only when
    given (batched `instance=~` matchers). A fetch of every instance over BATCH_POINTS points is
    cut into instance batches too, each turned into rows as it arrives, to bound the answers held."""
    catalog = catalog or load_catalog()
    grid = make_grid(start, end, step)
    last = float(grid[-1])
    batched = instances
    if instances is None:
        batched = _every_instance_if_large(client, names, catalog, start, last, step)
    selectors = [selector_for(names, catalog, batch) for batch in _batches(batched)]
    if instances is None and batched is not None:
        selectors.append(selector_for(names, catalog, no_instance=True))
    what = f"raw series of {len(batched)} instance(s)" if batched is not None else "raw series"
    n_series = 0 if batched is None else min(len(batched), INSTANCE_BATCH) * max(1, len(names)) * 4

    def one(sel: str) -> Frame:
        result = client.range_parts(sel, start, last, step, series=n_series, what=what)
        return frame_from_matrix(result, start, end, step, names, catalog)

    return _concat_frames(client.map(one, selectors), grid)


BATCH_POINTS = 4_000_000
"""A fetch of every instance expected to answer more points than this is cut into instance batches."""


def _every_instance_if_large(
    client: PromClient, names: set[str], catalog: Catalog, first: float, last: float, step: float
) -> list[str] | None:
    """Every instance with a needed series (the index only), when fetching all at once would
    answer more than BATCH_POINTS points (about 4 series per name and instance); else None."""
    steps = int((last - first) // step) + 1
    sel = selector_for(names, catalog)
    every = client.label_values("instance", [sel], first - DEFAULT_LOOKBACK_S, last)
    if len(every) <= INSTANCE_BATCH or len(every) * 4 * max(1, len(names)) * steps <= BATCH_POINTS:
        return None
    client.note(
        f"raw series of every instance: {len(every)} instances x {steps} steps fetched in batches of {INSTANCE_BATCH}"
    )
    return sorted(every)


def _concat_frames(frames: list[Frame], grid: np.ndarray) -> Frame:
    """Frames of disjoint scrape targets -> one, rows in label order (as one answer would give)."""
    if len(frames) == 1:
        return frames[0]
    rows = (
        (name, *row) for f in frames for name, b in f.blocks.items() for row in zip(b.labels, b.values, strict=True)
    )
    out = Frame(ts=grid, blocks=blocks_of(rows))
    for frame in frames:
        out.facts.update(frame.facts)
    return out


def _batches(instances: list[str] | None) -> list[list[str] | None]:
    if instances is None:
        return [None]
    ordered = sorted(set(instances))
    return [ordered[i : i + INSTANCE_BATCH] for i in range(0, len(ordered), INSTANCE_BATCH)]


def wire_pattern(names: set[str], catalog: Catalog, facts: bool = False) -> str:
    """A regex of every name on the wire that produces the canonical sample names (native names,
    Ray's `vllm_x` spelling of `vllm:x`, the agent's `kvscope_*`; the facts' info gauges with `facts`)."""
    groups: dict[str, set[str]] = defaultdict(set)  # suffixes on the wire -> native names
    any_part = "(_total|_bucket|_sum|_count)?"
    for sig in {signal_of(n, catalog) for n in names} & catalog.signals.keys():
        signal = catalog.signals[sig]
        # a histogram's series as asked (no buckets for a mean); others as any part may map
        tails = sorted(n[len(sig) :] for n in names if signal.kind == "histogram" and signal_of(n, catalog) == sig)
        groups[f"({'|'.join(tails)})" if tails else any_part].update(a.name for a in signal.aliases)
    if facts:
        groups[any_part].update(f.name for f in catalog.facts)
    spelled = {sfx: {re.escape(w) for d in declared for w in (d, ray_spelling(d))} for sfx, declared in groups.items()}
    parts = [f"(({'|'.join(sorted(alts))}){sfx})" for sfx, alts in sorted(spelled.items())]
    kv = "|".join(sorted(re.escape(KVSCOPE_PREFIX + n) for n in names))
    return "|".join(parts or ["($^)"]) + f"|({kv})"


def selector_for(
    names: set[str],
    catalog: Catalog,
    instances: list[str] | None = None,
    no_instance: bool = False,
    facts: bool = True,
) -> str:
    """One `{__name__=~"..."}` selector for every native and kvscope_* name needed (restricted
    to `instances` when given, to series without an `instance` with `no_instance`; the facts'
    info gauges too unless `facts` is False)."""
    inst = ',instance=""' if no_instance else ""
    if instances is not None:
        inst = ',instance=~"' + "|".join(quote(re.escape(i)) for i in instances) + '"'
    return f'{{__name__=~"{quote(wire_pattern(names, catalog, facts=facts))}"{inst}}}'


# ------------------------------------------------------------------------------ matrix -> frame


def frame_from_matrix(
    result: list[dict[str, Any]],
    start: float,
    end: float,
    step: float,
    names: set[str] | None = None,
    catalog: Catalog | None = None,
    lookback_s: float = DEFAULT_LOOKBACK_S,
) -> Frame:
    """A range-query matrix on the grid [start, end] by `step` -> a Frame of canonical series:
    native series mapped per scrape target through its dialect (collapsing series combined as the
    normalizer does), a missing point carried from the previous one within the lookback."""
    catalog = catalog or load_catalog()
    grid = make_grid(start, end, step)
    n = len(grid)
    metrics, values = matrix_on_grid(result, start, step, n)
    values = np.where(np.isfinite(values), values, np.nan)  # NaN / Inf samples are dropped
    rows: dict[tuple[str, Labels], list] = {}
    exported: dict[tuple[str, Labels], list] = {}
    per_target: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, metric in enumerate(metrics):
        name = metric.pop("__name__", "")
        if name.startswith(KVSCOPE_PREFIX):
            for label in _TARGET_LABELS:
                if f"exported_{label}" in metric:
                    metric[label] = metric.pop(f"exported_{label}")
            _combine(exported, name[len(KVSCOPE_PREFIX) :], make_labels(metric), "sum", values[i])
            continue
        metric["__name__"] = name
        per_target[(metric.get("job", ""), metric.get("instance", ""))].append(i)
    facts: dict[str, dict[str, dict[str, str]]] = {}
    engines: dict[tuple[str, ...], str | None] = {}
    for (job, instance), idx in per_target.items():
        target = _Target(job, instance, [metrics[i] for i in idx], values[idx])
        _map_target(target, catalog, rows, facts, engines)
    # a TSDB scraping both the engine and the agent holds a series twice: the native one wins
    rows.update((key, row) for key, row in exported.items() if key not in rows)
    blocks = blocks_of(
        (name, labels, row) for (name, labels), (_, row) in rows.items() if names is None or name in names
    )
    limit = _carry_steps(step, lookback_s)
    frame = Frame(ts=grid, blocks={k: Block(b.labels, ffill(b.values, limit)) for k, b in blocks.items()})
    frame.facts = merge_facts(facts)
    return frame


class _Target(NamedTuple):
    """One scrape target's native series of an answer: their labels and their rows on the grid."""

    job: str
    instance: str
    metrics: list[dict[str, str]]
    values: np.ndarray


def _map_target(
    target: _Target, catalog: Catalog, rows: dict, facts: dict, engines: dict[tuple[str, ...], str | None]
) -> None:
    """One target's native series through its dialect, a plan per series. The dialect is
    detected from the names of the series holding a sample; `engines` keeps it per sequence of
    names, which the targets of one engine version share."""
    counts = np.count_nonzero(~np.isnan(target.values), axis=1)
    voters = tuple(m["__name__"] for m, count in zip(target.metrics, counts, strict=True) if count)
    if voters not in engines:
        engines[voters] = detect_engine(Exposition(samples=[RawSample(v, (), 0.0) for v in voters]), catalog)
    engine = engines[voters]
    if engine is None or engine not in catalog.dialects:
        return
    mapper = Mapper(catalog, engine, {"job": target.job, "instance": target.instance})
    values = target.values
    if mapper.sentinels:  # "no value" codes, as the normalizer drops them
        values = np.where(np.isin(values, np.array(sorted(mapper.sentinels), dtype=float)), np.nan, values)
    present = ~np.isnan(values)
    newest = values[np.arange(len(values)), values.shape[1] - 1 - np.argmax(present[:, ::-1], axis=1)]
    mine: dict[tuple[str, Labels], list] = {}
    fallback: dict[tuple[str, Labels], list] = {}
    out = Normalized(engine=engine)
    for metric, row, have, last in zip(target.metrics, values, present.any(axis=1), newest.tolist(), strict=True):
        if not have:
            continue
        labels = make_labels({k: v for k, v in metric.items() if k not in ("__name__", "job", "instance")})
        raw = RawSample(metric["__name__"], labels, last, None)
        mapper.map_sample(raw, None, {}, out)
        for plan in mapper.plans.get((raw.name, raw.labels)) or ():
            _apply_plan(plan, row, mine, fallback)
    _settle_fallbacks(mine, fallback, catalog)
    for key, (how, vals) in mine.items():
        _combine(rows, *key, how, vals)
    for rank, f in out.facts.items():
        facts.setdefault(target.instance, {}).setdefault(rank, {}).update(f)


def _apply_plan(plan: tuple, row: np.ndarray, rows: dict, fallback: dict) -> None:
    """One mapping of a native row (`Mapper.plans`: name, labels, kind, mode, factor, rank) into
    the target's canonical rows, a fallback alias (rank > 0) kept apart until settled."""
    name, labels, kind, mode, factor, rank = plan
    if name is None or not isinstance(labels, tuple):
        return
    if mode == "info":
        if factor is None or not np.isfinite(factor):
            return
        vals = np.where(np.isnan(row), np.nan, factor)
    elif mode == "raw":
        vals = row
    else:
        vals = row * factor
        vals = np.where(np.isfinite(vals), vals, np.nan)  # a factor can overflow a large value
    _combine(fallback if rank else rows, name, labels, "max" if kind == "gauge" else "sum", vals)


def _settle_fallbacks(rows: dict, fallback: dict, catalog: Catalog) -> None:
    """A fallback alias (an older name) counts only at the steps where the target has no
    sample of the same signal under a preferred name (agent/normalize/dialect.py
    `resolve_fallback`, per scrape there, per grid step here): never both added up."""
    if not fallback:
        return
    present: dict[str | None, np.ndarray] = {}
    for (name, _labels), (_how, vals) in rows.items():
        sig = signal_of(name, catalog)
        have = ~np.isnan(vals)
        present[sig] = present[sig] | have if sig in present else have
    for (name, labels), (how, vals) in fallback.items():
        shadow = present.get(signal_of(name, catalog))
        _combine(rows, name, labels, how, vals if shadow is None else np.where(shadow, np.nan, vals))


def _combine(rows: dict, name: str, labels: Labels, how: str, vals: np.ndarray) -> None:
    """Adds a row of finite values (NaN where none) to `rows[name, labels]` as `how` says: "max"
    or "sum" (NaN where both are)."""
    key = (name, labels)
    have = rows.get(key)
    if have is None:
        rows[key] = [how, vals]
        return
    prev = have[1]
    if how == "max":
        have[1] = np.fmax(prev, vals)
    else:  # NaN where both are
        have[1] = np.where(np.isnan(prev) & np.isnan(vals), np.nan, np.nan_to_num(prev) + np.nan_to_num(vals))


def _carry_steps(step: float, lookback_s: float) -> int:
    """How many grid steps a point is carried: while (t - t_point) < lookback."""
    return max(0, int(np.ceil(lookback_s / step - 1e-9)) - 1)
