"""What the UI shows, computed without Streamlit: a diagnosis plus the series behind it.

`load_triage(source)` reads one source (a recording, Prometheus, or a running agent), puts the
canonical series on the diagnoser's grid, runs the rule engine, and keeps the frame so evidence
charts show the very numbers the rules saw. Everything here is plain data and testable alone.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from kvscope.core.objectives import ObjectiveSet
from kvscope.core.resolve import in_daemon
from kvscope.core.signals import Labels, load_catalog, signal_of
from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.findings import Diagnosis, Finding, same_place
from kvscope.diagnoser.render import fmt_clock, fmt_time
from kvscope.diagnoser.sources import SourceError  # what every loader here raises, with the reason
from kvscope.diagnoser.sources.window import DEFAULT_STEP_S, Span, lattice_end, read_window
from kvscope.report.render import GROUP_COLUMNS as REPORT_COLUMNS
from kvscope.report.weekly.groups import group_table as shared_group_table
from kvscope.report.weekly.series import GROUP_COUNTERS, columns

if TYPE_CHECKING:
    from kvscope.diagnoser.curve.report import PoolCurve
    from kvscope.diagnoser.evaluate.expr import Grouped
    from kvscope.diagnoser.sources.recording import RecordingSource

KINDS = ("recording", "prometheus", "agent")
ENV = {"recording": "KVSCOPE_UI_RECORDING", "prometheus": "KVSCOPE_UI_PROMETHEUS", "agent": "KVSCOPE_UI_AGENT"}
ENV_SINCE = "KVSCOPE_UI_SINCE_S"
ENV_END = "KVSCOPE_UI_END"
ENV_SERVE = "KVSCOPE_UI_SERVE_URL"
"""The `kvscope serve` address (`kvscope ui --serve-url`): ui/alert_link.py reads stored diagnoses there."""
ENV_OBJECTIVES = "KVSCOPE_UI_OBJECTIVES"
"""`kvscope ui`'s --objectives FILE and --slo-* flags as JSON ({"file": path or null, "flags": {kind:
text}}): the pages read them through the same parser (`objectives_from_env`); the file is read
again, not copied, so no size limit of the environment applies."""
MAX_CHART_SERIES = 8
SPREAD_ABOVE = 4
"""Evidence charts with more series than this show their min / mean / max instead."""


@dataclass(frozen=True)
class SourceSpec:
    """Where the UI reads from: kind is recording | prometheus | agent."""

    kind: str
    location: str
    since_s: float = 1800.0
    end: float | None = None  # live sources: window end (unix seconds); None = now

    def describe(self) -> str:
        return f"{self.kind}: {self.location}"


def source_from_env(env: Mapping[str, str] | None = None) -> SourceSpec | None:
    """The source `kvscope ui` passed to the Streamlit process through the environment."""
    env = os.environ if env is None else env
    since = float(env.get(ENV_SINCE, "1800"))
    end = float(env[ENV_END]) if env.get(ENV_END) else None
    for kind, var in ENV.items():
        if env.get(var):
            return SourceSpec(kind, env[var], since, end)
    return None


def objectives_from_env(env: Mapping[str, str] | None = None) -> ObjectiveSet:
    """The latency objectives `kvscope ui` was started with (the defaults without any): the file's
    `objectives:` section with the flags set over it, through core/objectives.py's one parser, as
    `kvscope ui` checked them before starting. ValueError when the file no longer reads or the
    variable is not what `kvscope ui` writes."""
    from kvscope.agent.config import read_objectives

    raw = (os.environ if env is None else env).get(ENV_OBJECTIVES)
    if not raw:
        return ObjectiveSet()
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ENV_OBJECTIVES}: not JSON ({exc})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("flags") or {}, dict):
        raise ValueError(f'{ENV_OBJECTIVES}: expected {{"file": ..., "flags": {{...}}}}')
    return read_objectives(spec.get("file"), spec.get("flags") or {})


@dataclass
class TriageData:
    """A diagnosis and the frame it was computed on."""

    source: SourceSpec
    diagnosis: Diagnosis
    frame: Frame
    cascades: dict = field(default_factory=dict)  # instance -> agent.derive.cascade.CascadeReport
    series: Frame | None = None  # the report's window (report/weekly.py), for the efficiency page
    notes: list[str] = field(default_factory=list)  # what reading the source left out, and why
    routers: list[dict] | None = None  # diagnoser/routing.py; None: read from `frame`
    curves: list[PoolCurve] | None = None  # diagnoser/curve: each pool's curve; None: not read (live_curves)

    def router_rows(self) -> list[dict]:
        """What each router in the window decided (empty when no router exports decisions)."""
        from kvscope.diagnoser.routing import router_decisions

        return self.routers if self.routers is not None else router_decisions(self.frame)


def load_triage(source: SourceSpec, step_s: float | None = None) -> TriageData:
    """Read the source and diagnose it. Raises SourceError with a readable reason."""
    if source.kind == "recording":
        return _from_recording(source, step_s)
    if source.kind in ("prometheus", "agent"):
        return _from_remote(source, step_s or DEFAULT_STEP_S)
    raise SourceError(f"unknown source kind {source.kind!r}; use one of {KINDS}")


LIVE_TTL_S = 60.0
"""How long a live source's read stands: the page's cache keeps it this long, and a read started
at launch is shown if the page asks within this time (its caption says the window)."""

_PRELOADED: dict[SourceSpec, tuple[float, Future]] = {}
"""Source -> (when its read started, its TriageData being read by a background thread)."""


def start_preload(source: SourceSpec | None) -> None:
    """Start reading and diagnosing `source` in a background thread, so the first page view finds
    it done (or under way) instead of waiting seconds while Streamlit starts and the browser
    connects. A recording is read whole; a live source over the window ending now, which the
    first view takes only while it is younger than LIVE_TTL_S (`take_preloaded`)."""
    if source is None or _key(source) in _PRELOADED:
        return
    _PRELOADED[_key(source)] = (time.time(), in_daemon(load_triage, source, name="kvscope-preload"))


def _key(source: SourceSpec) -> SourceSpec:
    """A recording is read whole: its window fields do not tell two reads apart."""
    return SourceSpec(source.kind, source.location) if source.kind == "recording" else source


def take_preloaded(source: SourceSpec) -> TriageData | None:
    """The preloaded read of `source` (waiting for it if still running), once; None if none was
    started, or if a live source's read (window ending "now") started more than LIVE_TTL_S ago.
    Raises what load_triage raised (SourceError for a bad source)."""
    started, future = _PRELOADED.pop(_key(source), (0.0, None))
    if future is None:
        return None
    if source.kind != "recording" and source.end is None and time.time() - started > LIVE_TTL_S:
        return None  # stale: the page reads the window ending now
    return future.result()


def _from_recording(source: SourceSpec, step_s: float | None) -> TriageData:
    from kvscope.diagnoser.sources.recording import RecordingSource

    if not Path(source.location).is_file():
        raise SourceError(f"recording {source.location} does not exist")
    return triage_from_recording(source, RecordingSource(source.location), step_s)


def triage_from_recording(source: SourceSpec, recording: RecordingSource, step_s: float | None = None) -> TriageData:
    """Diagnose a recording as `kvscope diagnose --recording` does: the same frame (its scrape
    interval as the step unless `step_s`; failed scrapes, vanished series and removed targets
    marked) and rules. The frame keeps every recorded series, for the pages' charts and tables."""
    from kvscope.agent.derive.cascade import evaluate_cascade
    from kvscope.diagnoser.curve.report import attach, window_curves
    from kvscope.diagnoser.evaluate.evaluator import diagnose
    from kvscope.diagnoser.sources.samples import SamplesSource
    from kvscope.report.weekly import report_window

    path = recording.path
    try:
        replay = recording.replay()
        if replay.start is None or replay.end is None or replay.end <= replay.start:
            raise SourceError("it holds fewer than two scrapes")
        names = {s.name for s in replay.samples}
        frame = read_window(recording, names, Span(), step_s)
        # what `kvscope diagnose` does (curve.report.with_changes), keeping the curves for the Operating point page
        curves = window_curves(recording, None, None, step_s or DEFAULT_STEP_S)
        diagnosis = attach(diagnose(frame, source=recording.description), curves)
    except (SourceError, ValueError) as exc:  # ValueError: over the grid's bounds (diagnoser/evaluate/frame.py)
        raise SourceError(f"recording {path} could not be read: {exc}") from exc
    return TriageData(
        source,
        diagnosis,
        frame,
        evaluate_cascade(replay.samples),
        report_window(SamplesSource(replay.samples, recording.description, carry=False)),
        list(replay.notes),
        curves=curves,
    )


def live_curves(source: SourceSpec, recorded: bool = False) -> list[PoolCurve]:
    """Each pool's curve over a Prometheus source's window (the triage page's: the last `since_s`
    seconds ending at `end` or now), read as `kvscope curve --prometheus` reads it: the curve's
    series in full through the one window reader, at the TSDB's scrape interval (`curve_step`,
    DEFAULT_STEP_S where it cannot say); with `recorded`, from kvscope's curve records as `kvscope curve
    --recorded` (changes judged from the records). The fleet path reads none with the diagnosis; an agent's and a
    recording's are read with it (`TriageData.curves`). Raises SourceError with a readable reason."""
    from kvscope.diagnoser.curve.recorded import recorded_curves, settings_reader
    from kvscope.diagnoser.curve.report import window_curves
    from kvscope.diagnoser.sources.prometheus import PrometheusSource

    end = source.end or lattice_end(DEFAULT_STEP_S)
    try:
        prometheus = PrometheusSource(source.location)
        if recorded:
            return recorded_curves(prometheus.client, end - source.since_s, end, settings=settings_reader(prometheus))
        return window_curves(prometheus, end - source.since_s, end, DEFAULT_STEP_S)
    except (SourceError, OSError, ValueError) as exc:
        raise SourceError(f"{source.describe()} could not be read for the curve: {exc}") from exc


def _from_remote(source: SourceSpec, step_s: float) -> TriageData:
    """A live source: the last `since_s` seconds of Prometheus (kvscope:/native series) or an agent."""
    from kvscope.diagnoser.curve.report import attach, window_curves
    from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
    from kvscope.diagnoser.routing import SIGNALS as ROUTER_SIGNALS
    from kvscope.diagnoser.routing import router_decisions
    from kvscope.diagnoser.rulebook.rule import shipped_rules
    from kvscope.diagnoser.sources.agent import AgentSource
    from kvscope.diagnoser.sources.prometheus import PrometheusSource

    reader: PrometheusSource | AgentSource
    rules = list(shipped_rules().values())
    names = set().union(*(sample_names(r) for r in rules)) | set(GOODPUT_COUNTS)  # the Tenants page's goodput
    # Prometheus: on the step's lattice, as `diagnose --prometheus` asks
    end = source.end or (lattice_end(step_s) if source.kind == "prometheus" else time.time())
    try:
        if source.kind == "prometheus":  # the fleet path: candidates from the TSDB, evidence where they held
            from kvscope.diagnoser.pushdown.run import diagnose_fleet

            reader = PrometheusSource(source.location)
            diagnosis, report = diagnose_fleet(
                reader.client,
                end - source.since_s,
                end,
                step_s,
                rules,
                source=reader.description,
                catalog=reader.catalog,
            )
            assert report.fetched is not None
            routers = read_window(reader, ROUTER_SIGNALS, Span.last(source.since_s, end), step_s)
            return TriageData(source, diagnosis, report.fetched.whole(), routers=router_decisions(routers))
        reader = AgentSource(source.location)
        frame = read_window(reader, names | set(ROUTER_SIGNALS) | GROUP_SAMPLES, Span.last(source.since_s, end), step_s)
    except (SourceError, OSError, ValueError) as exc:
        raise SourceError(f"{source.describe()} could not be read: {exc}") from exc
    diagnosis = diagnose(frame, rules, source=reader.description)
    # what `kvscope diagnose --agent` does (curve.report.with_changes, the findings kept when the curve
    # cannot be read), keeping the curves for the Operating point page
    try:
        curves = window_curves(reader, end - source.since_s, end, step_s)
    except (SourceError, OSError, ValueError) as exc:
        return TriageData(source, diagnosis, frame, notes=[f"what changed in the window could not be read: {exc}"])
    return TriageData(source, attach(diagnosis, curves), frame, curves=curves)


# ------------------------------------------------------------------------------ evidence series


def _matches(labels: Labels, where: Mapping[str, str]) -> bool:
    return same_place(dict(labels), dict(where))


def signal_frame(frame: Frame, signal: str, where: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One signal on the grid as a DataFrame (index: UTC time; columns: series labels, at most
    MAX_CHART_SERIES). Counters become per-second rates step to step (the evaluator's
    `grid.counter_rate`: resets handled, gaps bridged), histograms their mean (sum rate over count
    rate), gauges stay as they are. Rows are filtered to `where` (labels a row lacks do not exclude it).
    """
    from kvscope.diagnoser.evaluate.grid import counter_rate

    step = frame.step or 1.0
    sig = load_catalog().signals[signal]
    names = [signal + "_sum", signal + "_count"] if sig.kind == "histogram" else [signal]
    blocks = [b for b in map(frame.block, names) if b is not None]
    if len(blocks) < len(names):
        return pd.DataFrame()
    where = where or {}
    keep = [i for i, lab in enumerate(blocks[0].labels) if _matches(lab, where)]
    values, labels = blocks[0].values[keep], [blocks[0].labels[i] for i in keep]
    if sig.kind == "histogram":
        num, den = counter_rate(values, 1, step), counter_rate(blocks[1].values[keep], 1, step)
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    elif sig.kind == "counter":
        values = counter_rate(values, 1, step)
    index = pd.to_datetime(frame.ts, unit="s", utc=True)
    cols = {_column(lab, where): values[i] for i, lab in enumerate(labels[:MAX_CHART_SERIES])}
    return pd.DataFrame(cols, index=index)


def _column(labels: Labels, where: Mapping[str, str]) -> str:
    shown = [f"{k}={v}" for k, v in labels if k not in ("job", "engine") and k not in where]
    return ", ".join(shown) or "value"


def evidence_series(data: TriageData, finding: Finding, key: str, series: Callable[[str], Grouped]) -> pd.DataFrame:
    """The rule's own series `key` on the grid, at the finding's place: the evaluator's values
    (`series`: the rule's series by name from `evaluated_series`), one column per group of the
    series' grouping that agrees with the finding's labels. Empty when it cannot be evaluated."""
    from kvscope.diagnoser.rulebook.grammar import ExprError

    try:
        g = series(key)
    except (ExprError, KeyError, ValueError):
        return pd.DataFrame()
    where = finding.where or {}
    rows = [i for i, k in enumerate(g.keys) if _matches(tuple(zip(g.by, k, strict=True)), where)]
    cols = {_column(tuple(zip(g.by, g.keys[i], strict=True)), where): g.values[i] for i in rows}
    return pd.DataFrame(cols, index=pd.to_datetime(data.frame.ts, unit="s", utc=True))


def evidence_charts(data: TriageData, finding: Finding) -> list[tuple[str, str, pd.DataFrame]]:
    """(evidence name, axis unit, series) per series the finding's evidence reads, in evidence
    order: the evaluator's own values for the rule's series at the finding's place, so each
    evidence number (max, mean, first... over the finding's period) is read off its chart. One
    evaluator serves all of them, over the rows the finding's place reads (`place_frame`: its
    model's engines, not the fleet's): the series they share are evaluated once. Empty for a rule
    this install does not ship (a diagnosis from other rules)."""
    from kvscope.diagnoser.evaluate.evaluator import evaluated_series
    from kvscope.diagnoser.pushdown.evidence import place_frame
    from kvscope.diagnoser.rulebook.rule import shipped_rules

    rule = shipped_rules().get(finding.rule_id)
    if rule is None:
        return []
    frame = place_frame(rule, data.frame, finding.where or {})
    series = evaluated_series(rule, frame, data.diagnosis.time_scale or 1.0)
    out, seen = [], set()
    for ev in finding.evidence:
        if not ev.key or ev.key in seen or ev.key not in rule.tree.series:
            continue
        seen.add(ev.key)
        df = evidence_series(data, finding, ev.key, series)
        if not df.empty and df.notna().any().any():
            out.append((ev.name, evidence_unit(ev.unit), spread(df)))
    return out


def spread(df: pd.DataFrame, most: int = SPREAD_ABOVE) -> pd.DataFrame:
    """More than `most` series (a fleet finding over 8 or 100 GPUs) become their min, mean and
    max per step, computed over all of them: a fleet average is read off one line, not off a
    tangle of the first eight. Up to `most` series are returned as they are."""
    if df.shape[1] <= most:
        return df
    n = df.shape[1]
    with np.errstate(all="ignore"):
        return pd.DataFrame(
            {
                f"max of {n} series": df.max(axis=1),
                f"mean of {n} series": df.mean(axis=1),
                f"min of {n} series": df.min(axis=1),
            },
            index=df.index,
        )


_UNIT_WORDS = {
    "ratio": "ratio (0-1)",
    "bytes_per_second": "bytes/s",
    "per_second": "per second",
    "tokens_per_second": "tokens/s",
    "duration": "seconds",
}
"""Axis words for catalog and evidence units; any other unit is its name with spaces."""


def evidence_unit(unit: str) -> str:
    """The y-axis title for an evidence unit of a rule ('per_second' -> 'per second')."""
    return _UNIT_WORDS.get(unit, unit.replace("_", " ") or "value")


def axis_unit(signal: str) -> str:
    """The y-axis title of a signal as signal_frame plots it: 'per second' for counted events,
    'tokens/s' for token counters, 'seconds (mean)' for a latency histogram."""
    sig = load_catalog().signals[signal]
    unit = _UNIT_WORDS.get(sig.unit, sig.unit.replace("_", " "))
    if sig.kind == "counter":
        return "per second" if sig.unit == "count" else f"{unit}/s"
    if sig.kind == "histogram":
        return f"{unit} (mean)"
    return unit


EVIDENCE_COLUMNS = ["evidence", "value", "threshold", "taken (UTC)", "series"]


def evidence_table(finding: Finding) -> pd.DataFrame:
    """The finding's evidence as the UI shows it: `kvscope diagnose`'s rows (`render.evidence_rows`:
    value and threshold with their units, absent as "absent", how and when each value was taken),
    with the series each came from in full."""
    from kvscope.diagnoser.render import evidence_rows

    return pd.DataFrame(evidence_rows(finding), columns=EVIDENCE_COLUMNS)


def counts_caption(diagnosis: Diagnosis) -> str:
    """'55 rules, 3 fired, 29 not evaluable, 1 with the mechanism off' for the page header: the
    numbers and words of `kvscope diagnose`'s header (`findings.count`)."""
    from kvscope.diagnoser.findings import count

    text = count(diagnosis).text()
    return text + (" (every skipped rule and why: at the bottom)" if diagnosis.skipped else "")


def timeline(diagnosis: Diagnosis) -> pd.DataFrame:
    """One row per finding: rule, severity, place, active period; likely cause first."""
    from kvscope.diagnoser.render import fmt_where

    found = diagnosis.findings
    return pd.DataFrame(
        {
            "rank": range(1, len(found) + 1),
            "rule": [f.rule_id for f in found],
            "severity": [f.severity for f in found],
            "where": [fmt_where(f.where) for f in found],
            "since": pd.to_datetime([f.since for f in found], unit="s", utc=True),
            "until": pd.to_datetime([f.until for f in found], unit="s", utc=True),
            "active": [f.active for f in found],
            "title": [f.title for f in found],
        }
    )


def window_text(start: float, end: float) -> str:
    """'2026-11-22 07:25:13 → 07:27:25 UTC (2m12s)': the span numbers on a page are totals over."""
    from kvscope.diagnoser.render import fmt_duration

    first, last = fmt_time(start), fmt_time(end)
    if first[:10] == last[:10]:
        last = last[11:]
    return f"{first.removesuffix(' UTC')} → {last} ({fmt_duration(end - start)})"


def when_text(f: Finding) -> str:
    """When a finding held (`window_text`, the date said again where it ends on another day) and
    whether it still does: a card's **When**."""
    state = "still active at the end of the window" if f.active else "ended"
    return f"{window_text(f.since, f.until)}, {state}"


def _latest(frame: Frame, name: str, group: str) -> pd.Series:
    """`group_keys`' key (group value, NUL, instance) -> the gauge's latest value, averaged over the
    pair's series (a ratio is never summed)."""
    block = frame.block(name)
    found: dict[str, list[float]] = {}
    for labels, row in zip(block.labels, block.values, strict=True) if block is not None else ():
        have, present = dict(labels), row[~np.isnan(row)]
        if group in have and present.size:
            found.setdefault(f"{have[group]}\0{have.get('instance', '')}", []).append(float(present[-1]))
    return pd.Series({k: sum(v) / len(v) for k, v in found.items()}, dtype=float)


def _natural(text: str) -> tuple:
    """'tenant-2' before 'tenant-10'."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


GROUP_COLUMNS = {
    "requests": "requests/s",
    "prompt_tokens": "prompt tok/s",
    "completion_tokens": "completion tok/s",
    "cached_tokens": "cached tok/s",
    "prefix_hit_ratio": "hit ratio (latest)",
    "lost_reuse_ratio": "lost reuse (latest)",
    "ttft_mean_s": "mean TTFT (s)",
    "ttft_p50_s": "TTFT p50 (s)",
    "ttft_p95_s": "TTFT p95 (s)",
    "itl_p50_s": "ITL p50 (s)",
    "itl_p95_s": "ITL p95 (s)",
    "ttft_slo": REPORT_COLUMNS["ttft_slo"][0],
    "error_slo": REPORT_COLUMNS["error_slo"][0],
    "goodput": "goodput (exact)",
    "gpu_time_share": "GPU-time share",
}
"""The shared table's column (report/weekly/groups.py `group_table`), or a LATEST gauge, -> the
UI's header; the RATES counts are shown per second of the window."""
RATES = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens")
LATEST = ("prefix_hit_ratio", "lost_reuse_ratio")
"""The ratio gauges (after `<group>_`) shown at the window's end (tenants only)."""
GROUP_SAMPLES = {
    f"{group}_{name}"
    for group in ("tenant", "adapter")
    for name in (*GROUP_COUNTERS, *LATEST)
    if signal_of(f"{group}_{name}", load_catalog()) in load_catalog().signals
}
"""The sample names the tenant and adapter tables read (those the catalog has), read from a live
agent beside the rules'."""
GOODPUT_COUNTS = ("goodput_requests_total", "goodput_good_requests_total")
"""The request tap's per-request goodput counts (docs/goodput.md): exact goodput per tenant, and per
adapter through their `model` label (the request's adapter: GOODPUT_KEY)."""


def group_table(frame: Frame, group: str = "tenant") -> pd.DataFrame:
    """Per value of the grouping label `group` (`tenant`, `adapter`) from the `<group>_*` series:
    the weekly report's table (`group_table` there) over the frame's window, its counts as mean
    rates, with the hit ratio and lost reuse at the window's end (tenants); one row per value, or
    per value and instance when the source has several (two taps, two routing policies): ratios
    of different instances are not added up. Empty if the source has no such series; a column no
    row has is left out."""
    start, end = float(frame.ts[0]), float(frame.ts[-1])
    shared = shared_group_table(columns(frame), start, end, group, by_instance=True)
    got = {col: shared[col] for col in shared} | {name: _latest(frame, f"{group}_{name}", group) for name in LATEST}
    cols = {
        head: got[col] / ((end - start) or 1.0) if col in RATES else got[col]
        for col, head in GROUP_COLUMNS.items()
        if col in got and got[col].notna().any()
    }
    keys = sorted({k for v in cols.values() for k in v.index}, key=lambda k: tuple(map(_natural, k.split("\0"))))
    if not keys:
        return pd.DataFrame()
    pairs = [tuple(k.split("\0", 1)) for k in keys]
    several = len({inst for _, inst in pairs}) > 1
    rows = [
        {group: value, **({"instance": inst} if several else {}), **{head: v.get(k) for head, v in cols.items()}}
        for k, (value, inst) in zip(keys, pairs, strict=True)
    ]
    return pd.DataFrame(rows)


def cascade_rows(cascades: Mapping) -> pd.DataFrame:
    """One row per engine instance of agent.derive.cascade reports: the deepest stage the
    window reached (what the incident was) next to the stage at its end (whether it is over),
    each stage's first onset by name (stage 2: from a counter or from the queues), the stages the
    source's signals cannot show, and the lead of the root over the latency symptom."""
    from kvscope.agent.derive.cascade import STAGES

    def stage(n: int) -> str:
        return f"{n} {STAGES[n]}"

    rows = []
    for inst, r in sorted(cascades.items()):
        deepest = max(r.onsets, default=0)
        rows.append(
            {
                "instance": inst,
                "deepest stage reached": stage(deepest),
                "stage at end of window": stage(r.stage),
                "root led latency by": "not reached" if r.lead_time_s is None else f"{r.lead_time_s:.0f} s",
                "onsets (UTC)": " · ".join(
                    f"{STAGES[n]}{f' (from {r.evicting_from})' if n == 2 else ''} {fmt_clock(t)}"
                    for n, t in sorted(r.onsets.items())
                ),
                "stages not evaluable": ", ".join(r.not_evaluable) or "none",
                "signals missing": ", ".join(r.signals_missing) or "none",
            }
        )
    return pd.DataFrame(rows)
