"""Render the agent's own /metrics: canonical series as `kvscope_<signal>` plus self-health.

Prometheus text format 0.0.4 that `promtool check metrics` accepts without findings: one HELP and
TYPE per family (help from the catalog), families contiguous, histogram buckets in `le` order
ending in `+Inf` then `_sum`/`_count`, no timestamps, and a series the source lacks is absent.
The self-health families (`kvscope_target_*`, `kvscope_scrape_*`, `kvscope_samples_dropped_total`,
`kvscope_collector_*`, `kvscope_engine_info`, `kvscope_cycle*`, `kvscope_store_*`) carry their
meaning in their HELP text below."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from kvscope.agent.scrape.exposition import format_labels, format_value
from kvscope.core.signals import KVSCOPE_PREFIX, Catalog, Labels, Sample, Signal
from kvscope.core.signals import signal_of as signal_name

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

Line = tuple[str, Labels, float]  # (sample name, labels, value)


class Family:
    """One metric family being rendered."""

    def __init__(self, name: str, kind: str, help_: str) -> None:
        self.name, self.kind, self.help = name, kind, help_
        self.lines: list[Line] = []

    def add(self, labels: dict[str, str] | Labels, value: float, suffix: str = "") -> None:
        if isinstance(labels, dict):
            labels = tuple(sorted((k, v) for k, v in labels.items() if v != ""))
        self.lines.append((self.name + suffix, labels, value))

    def render(self, out: list[str]) -> None:
        if not self.lines:
            return
        out.append(f"# HELP {self.name} {_escape_help(self.help)}\n")
        out.append(f"# TYPE {self.name} {self.kind}\n")
        for name, labels, value in self.lines:
            out.append(f"{name}{format_labels(labels)} {format_value(value)}\n")


def _escape_help(text: str) -> str:
    return " ".join(text.split()).replace("\\", "\\\\")


def signal_of(name: str, catalog: Catalog) -> tuple[Signal, str] | None:
    """(signal, histogram suffix or "") for a canonical sample name, or None if not canonical."""
    base = signal_name(name, catalog)
    sig, suffix = catalog.signals.get(base), name[len(base) :]
    return (sig, suffix) if sig is not None and (sig.kind == "histogram") == bool(suffix) else None


def canonical_families(samples: Iterable[Sample], catalog: Catalog) -> list[Family]:
    """`kvscope_<signal>` families by name; non-canonical or non-finite samples are skipped, and of
    exact duplicates the first value is kept."""
    grouped: dict[str, dict[tuple[str, Labels], float]] = defaultdict(dict)
    signals: dict[str, Signal] = {}
    for s in samples:
        hit = signal_of(s.name, catalog)
        if hit is None or not math.isfinite(s.value):
            continue
        sig, suffix = hit
        signals[sig.name] = sig
        grouped[sig.name].setdefault((suffix, s.labels), s.value)
    out = []
    for name in sorted(grouped):
        sig = signals[name]
        fam = Family(KVSCOPE_PREFIX + name, sig.kind, sig.help or name)
        rows = grouped[name]
        for suffix, labels in sorted(rows, key=_histogram_key if sig.kind == "histogram" else None):
            fam.add(labels, rows[(suffix, labels)], suffix)
        out.append(fam)
    return out


def _histogram_key(row: tuple[str, Labels]) -> tuple[Labels, int, float]:
    suffix, labels = row
    base = tuple(kv for kv in labels if kv[0] != "le")
    if suffix == "_bucket":
        le = dict(labels).get("le", "+Inf")
        try:
            bound = float(le)
        except ValueError:
            bound = math.inf
        return base, 0, bound
    return base, 1 if suffix == "_sum" else 2, 0.0


def health_families(state: Any, store_stats: Any = None) -> list[Family]:
    """Self-health families from an AgentState (agent/runtime.py)."""
    fams = _target_families(state) + _collector_families(state) + [_engine_info(state)]
    fams += _counter_families(state) + _cycle_families(state)
    if store_stats is not None:
        fams += _store_families(store_stats)
    return fams


def _target_families(state: Any) -> list[Family]:
    up = Family("kvscope_target_up", "gauge", "1 if the last scrape of the target gave usable samples.")
    status = Family(
        "kvscope_target_status",
        "gauge",
        "Always 1; reason is ok or why the target is down (timeout, http_503, unknown_engine...).",
    )
    series = Family("kvscope_target_series", "gauge", "Canonical series produced by the last scrape.")
    dur = Family("kvscope_scrape_duration_seconds", "gauge", "Duration of the last scrape of the target.")
    for healths in state.health.values():
        for h in healths:
            if not h.target:
                continue
            t = {"job": state.jobs.get(h.target, h.collector), "instance": h.target}
            up.add(t, 1.0 if h.up else 0.0)
            status.add({**t, "reason": h.reason or "ok"}, 1.0)
            series.add(t, float(h.series))
            dur.add(t, h.duration_s)
    return [up, status, series, dur]


def _collector_families(state: Any) -> list[Family]:
    up = Family("kvscope_collector_up", "gauge", "1 if the collector's last run succeeded.")
    status = Family("kvscope_collector_status", "gauge", "Always 1; reason is ok or why the collector is down.")
    dur = Family("kvscope_collector_duration_seconds", "gauge", "Duration of the collector's last run.")
    for name in sorted(state.collector_status):
        ok, reason, seconds = state.collector_status[name]
        up.add({"collector": name}, 1.0 if ok else 0.0)
        status.add({"collector": name, "reason": reason or "ok"}, 1.0)
        dur.add({"collector": name}, seconds)
    return [up, status, dur]


def _engine_info(state: Any) -> Family:
    fam = Family("kvscope_engine_info", "gauge", "Always 1; labels carry the engine's dialect and configuration facts.")
    for inst in sorted(state.engines):
        engine = state.engines[inst]
        if engine is None:
            continue
        labels = {
            k: v
            for k, v in state.facts.get(inst, {}).items()
            if _LABEL_NAME.fullmatch(k) and not k.startswith("_") and k not in ("job", "instance", "engine")
        }
        labels.update(job=state.jobs.get(inst, ""), instance=inst, engine=engine)
        fam.add(labels, 1.0)
    return fam


def _counter_families(state: Any) -> list[Family]:
    errors = Family("kvscope_scrape_errors_total", "counter", "Failed scrapes by reason since the agent started.")
    for (job, inst, reason), n in sorted(state.scrape_errors.items()):
        errors.add({"job": job, "instance": inst, "reason": reason}, float(n))
    dropped = Family(
        "kvscope_samples_dropped_total",
        "counter",
        "Lines or samples dropped by reason (truncated, duplicate_series, non_finite...).",
    )
    for (coll, inst, reason), n in sorted(state.dropped.items()):
        dropped.add({"collector": coll, "instance": inst, "reason": reason}, float(n))
    resets = Family(
        "kvscope_target_resets_total",
        "counter",
        "Scrapes in which a counter of the target decreased (usually an engine restart).",
    )
    for inst, n in sorted(state.counter_resets.items()):
        resets.add({"job": state.jobs.get(inst, ""), "instance": inst}, float(n))
    closed = Family(
        "kvscope_connections_closed_total",
        "counter",
        "Client connections a kvscope listener closed unserved, by reason: max_connections (answered 503), "
        "displaced (half-open, closed at the cap for a new one), header_timeout, request_timeout (a body not whole "
        "within request_timeout_s of its head: answered 408), idle_timeout.",
    )
    for (coll, inst, reason), n in sorted(state.closed.items()):
        closed.add({"collector": coll, "instance": inst, "reason": reason}, float(n))
    return [errors, dropped, resets] + ([closed] if state.closed else []) + _export_families(state)


def _export_families(state: Any) -> list[Family]:
    """Pushes to an exporter (agent/otel/push.py) by result; absent while none is configured."""
    exports = getattr(state, "exports", None)
    if not exports:
        return []
    pushes = Family(
        "kvscope_exports_total",
        "counter",
        "Pushes of kvscope's metrics by exporter and result (ok, failed, timeout, skipped_busy, exception_*).",
    )
    for (exporter, result), n in sorted(exports.items()):
        pushes.add({"exporter": exporter, "result": result}, float(n))
    points = Family("kvscope_exported_points_total", "counter", "Data points an exporter's receiver accepted.")
    for exporter, n in sorted(state.exported_points.items()):
        points.add({"exporter": exporter}, float(n))
    return [pushes, points]


def _cycle_families(state: Any) -> list[Family]:
    dur = Family("kvscope_cycle_duration_seconds", "gauge", "Duration of the last collection cycle.")
    cycles = Family("kvscope_cycles_total", "counter", "Collection cycles completed.")
    skipped = Family(
        "kvscope_cycles_skipped_total",
        "counter",
        "Collection ticks skipped because a cycle ran longer than the scrape interval.",
    )
    if state.cycles:
        dur.add({}, state.last_cycle_s)
    cycles.add({}, float(state.cycles))
    skipped.add({}, float(getattr(state, "cycles_skipped", 0)))
    return [dur, cycles, skipped]


def _store_families(stats: Any) -> list[Family]:
    fams = []
    for attr, name, kind, help_ in (
        ("series", "kvscope_store_series", "gauge", "Series in the local store."),
        ("bytes", "kvscope_store_size_bytes", "gauge", "Size of the local store on disk."),
        ("queued", "kvscope_store_queued_samples", "gauge", "Samples waiting for the store writer."),
        ("written", "kvscope_store_samples_written_total", "counter", "Samples committed to the store."),
    ):
        fam = Family(name, kind, help_)
        fam.add({}, float(getattr(stats, attr, 0) or 0))
        fams.append(fam)
    dropped = Family("kvscope_store_samples_dropped_total", "counter", "Samples the store dropped, by reason.")
    for reason, n in sorted(getattr(stats, "dropped", {}).items()):
        dropped.add({"reason": reason}, float(n))
    errors = Family(
        "kvscope_store_write_errors_total",
        "counter",
        "Failed store writes and retention passes by reason (disk_full, io_error, corrupt, busy...).",
    )
    for reason, n in sorted(getattr(stats, "errors", {}).items()):
        errors.add({"reason": reason}, float(n))
    budget = Family(
        "kvscope_store_target_series_dropped_total",
        "counter",
        "Samples of new series the store dropped because their target (instance) used up its series "
        "budget (store.max_series_per_target); the other targets' series are still stored.",
    )
    for instance, n in sorted(getattr(stats, "over_budget", {}).items()):
        budget.add({"instance": instance}, float(n))
    return fams + [dropped, errors, budget]


def render_metrics(state: Any, catalog: Catalog) -> str:
    """The full /metrics body: canonical families then self-health families."""
    out: list[str] = []
    for fam in canonical_families(state.canonical_samples(), catalog) + health_families(state, state.store_stats):
        fam.render(out)
    return "".join(out)
