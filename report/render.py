"""Render a WeeklyReport as Markdown or as a self-contained HTML page with embedded plots."""

from __future__ import annotations

import base64
import html
import io
import math
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pandas as pd

from kvscope.core.objectives import ObjectiveSet
from kvscope.diagnoser.actions import lever_heading, plan
from kvscope.diagnoser.curve.report import METRIC_WORDS, change_notes, diff_text, verdict_text
from kvscope.diagnoser.findings import LeverAdvice, confidence_words
from kvscope.diagnoser.render import fmt_duration, fmt_where, where_of
from kvscope.report.weekly import TENANT_SLO, UTILISATION_TRAP, Incident, WeekChanges, WeeklyReport, WeekStats

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ABSENT = "absent"
FLEET_ROWS = (
    ("output_tokens", "Output tokens", "count"),
    ("gpu_hours", "GPU-hours", "num"),
    ("tokens_per_gpu_hour", "Output tokens / GPU-hour", "count"),
    ("gpu_util", "Mean GPU utilisation", "pct"),
    ("cost_usd", "GPU cost", "usd"),
    ("usd_per_1m_tokens", "$ / 1M output tokens", "usd"),
    ("prefill_tokens_saved", "Prefill tokens saved by prefix caching", "count"),
    ("hit_ratio", "Prefix-cache hit ratio", "pct"),
)
POOL_COLUMNS = {
    "output_tokens": ("Output tokens", "count"),
    "goodput": ("Goodput", "text"),  # its header names the objectives: _pool_columns
    "gpu_hours": ("GPU-hours", "num"),
    "tokens_per_gpu_hour": ("Tokens / GPU-h", "count"),
    "gpu_util": ("GPU util", "pct"),
    "usd_per_1m_tokens": ("$ / 1M tok", "usd"),
    "prefill_tokens_saved": ("Prefill saved", "count"),
    "hit_ratio": ("Hit ratio", "pct"),
    "ttft_slo": (f"TTFT within {TENANT_SLO.ttft_seconds:g}s (SLO {TENANT_SLO.target:.4g})", "pct"),
    "error_slo": (f"No upstream error (SLO {TENANT_SLO.error_target:.4g})", "pct"),
}
GROUP_COLUMNS = {
    "requests": ("Requests", "count"),
    "prompt_tokens": ("Prompt tokens", "count"),
    "completion_tokens": ("Completion tokens", "count"),
    "cached_tokens": ("Cached tokens", "count"),
    "hit_ratio": ("Hit ratio", "pct"),
    "ttft_p50_s": ("TTFT p50 (s)", "sec"),
    "ttft_p95_s": ("TTFT p95 (s)", "sec"),
    "itl_p50_s": ("ITL p50 (s)", "sec"),
    "itl_p95_s": ("ITL p95 (s)", "sec"),
    "goodput": ("Goodput, exact (tap)", "pct"),
    "ttft_slo": (f"TTFT within {TENANT_SLO.ttft_seconds:g}s (SLO {TENANT_SLO.target:.4g})", "pct"),
    "error_slo": (f"No upstream error (SLO {TENANT_SLO.error_target:.4g})", "pct"),
    "gpu_time_share": ("GPU-time share", "pct"),
    "cost_usd": ("GPU cost", "usd"),
}
"""The tenant and adapter tables' columns (report/weekly/groups.py); a column without data is left out."""


def pool_columns(objectives: ObjectiveSet | None = None) -> dict[str, tuple[str, str]]:
    """POOL_COLUMNS with the goodput header naming the objectives goodput was judged against
    (None: the generated rules' defaults, TENANT_SLO.objectives)."""
    default = (objectives or TENANT_SLO.objectives).default
    return {**POOL_COLUMNS, "goodput": (f"Goodput ({default.describe()})", "text")}


def fmt(value: float | None, kind: str) -> str:
    """A number for a table cell; absent stays visibly absent."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ABSENT
    if kind == "text":
        return str(value)
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "usd":
        return f"${value:,.2f}"
    if kind == "count":
        return f"{value:,.0f}"
    if kind == "sec":
        return f"{value:.3g}"
    return f"{value:,.1f}"


def _delta(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def _when(ts: float) -> str:
    return pd.to_datetime(ts, unit="s", utc=True).strftime("%Y-%m-%d %H:%M UTC")


def trap_lines(week: WeekStats, attribution: str = "") -> list[str]:
    """What the week's GPU utilisation is measured by and costs, then the utilisation trap for the
    fleet and each pool, then `attribution` (why some GPUs have no pool; '' when all have one)."""
    util = week.fleet.get("gpu_util")
    if util is None:
        return [
            "GPU utilisation is absent from this source (no DCGM/NVML series), so GPU-hours, tokens per "
            "GPU-hour and cost per token cannot be computed."
        ]
    basis = (
        "DCGM graphics-engine activity"
        if week.utilisation_signal == "gpu_graphics_engine_active_ratio"
        else "GPU utilisation as reported (DCGM GPU_UTIL / NVML: a kernel was running; it overstates real "
        "use on small decode batches)"
    )
    lines = [
        f"Mean GPU utilisation {util:.0%} ({basis}): cost per token is {1 / util:.1f}× what the same fleet "
        "would pay fully utilised (Sizing LLM Inference for Production §9.2)."
        if util > 0
        else "GPUs were idle all week."
    ]
    if util < UTILISATION_TRAP:
        lines.append(
            f"Below {UTILISATION_TRAP:.0%}: the fleet is in the utilisation trap "
            "(Sizing LLM Inference for Production §9.3). "
            "Levers: scale down faster, fill idle hours with offline batch work, colocate models "
            "(Sizing LLM Inference for Production §9.2)."
        )
    pools = week.pools
    trapped = pools.index[pools["utilisation_trap"].fillna(False).astype(bool)] if "utilisation_trap" in pools else []
    for pool in trapped:
        lines.append(
            f"Pool {pool} averages {pools.loc[pool, 'gpu_util']:.0%} GPU utilisation: below "
            f"{UTILISATION_TRAP:.0%}, in the utilisation trap (Sizing LLM Inference for Production §9.2, §9.3)."
        )
    if attribution:
        lines.append(attribution)
    return lines


def format_table(df: pd.DataFrame, columns: dict[str, tuple[str, str]], index_name: str) -> list[list[str]]:
    """`df` as rows of text: a header (`index_name`, then the label of each of `columns` that `df`
    holds), then per row its index and each value formatted by the column's kind (`fmt`)."""
    head = [index_name] + [label for c, (label, _) in columns.items() if c in df]
    return [head] + [
        [str(k)] + [fmt(r[c], kind) for c, (_, kind) in columns.items() if c in df] for k, r in df.iterrows()
    ]


def incident_text(incident: Incident) -> str:
    """The head finding, then the findings that support it (same place and mechanism)."""
    head = incident.head
    text = f"{head.title} ({head.rule_id})"
    if incident.supporting:
        text += "; supported by: " + "; ".join(f"{f.title} ({f.rule_id})" for f in incident.supporting)
    return text


_NUMERIC = re.compile(r"^[$+-]?[\d,]*\.?\d+%?$")


def is_numeric_cell(text: str) -> bool:
    """Numbers (and the absent / n/a placeholders in number columns) are right-aligned in HTML."""
    return bool(_NUMERIC.match(text)) or text in (ABSENT, "n/a")


_MD_SPECIAL = re.compile(r"([\\`\[\]|<>&])")


def md_escape(text: object) -> str:
    """Text as literal Markdown: line breaks become spaces (no heading or row of its own), and
    pipes, backticks, brackets, backslashes and HTML's < > & are backslash-escaped (a label value
    stays one table cell and makes no code span, link or tag; no HTML entities in the text)."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).splitlines()))


def _md_table(rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(map(md_escape, rows[0])) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(map(md_escape, r)) + " |" for r in rows[1:]]
    return out


def _sections(report: WeeklyReport) -> list[tuple[str, list[list[str]] | list[str]]]:
    deltas = report.deltas()
    fleet = [["Metric", "This week", "Week over week"]]
    fleet += [[label, fmt(report.this.fleet.get(k), kind), _delta(deltas.get(k))] for k, label, kind in FLEET_ROWS]
    trap = trap_lines(report.this, report.attribution)
    out: list[tuple[str, list[list[str]] | list[str]]] = [("Fleet", fleet), ("Utilisation", trap)]
    if not report.this.pools.empty:
        out.append(("Per model / pool", format_table(report.this.pools, pool_columns(report.objectives), "Pool")))
    tenants, adapters = report.this.tenants, report.this.adapters
    out.append(("Tenants", [NO_TENANTS] if tenants.empty else format_table(tenants, GROUP_COLUMNS, "Tenant")))
    out.append(
        ("Adapters", [NO_ADAPTERS] if adapters.empty else format_table(adapters, GROUP_COLUMNS, "Adapter (model)"))
    )
    out += _efficiency_sections(report)
    out.append((CHANGES_TITLE, _changes_rows(report.changes)))
    rows: list[list[str]] | list[str] = [no_findings_text(report)]
    if report.incidents:
        rows = [["Severity", "Finding", "Confidence", "Where", "Since", "Do now", "Fix for good"]] + [
            [
                i.severity,
                incident_text(i),
                confidence_words(i.head.confidence, i.head.confirm),
                where_of([i.head, *i.repeats]),
                _when(min(f.since for f in i.members)),
                *(_lever_titles(levers) for levers in plan(i.head)),
            ]
            for i in report.incidents
        ]
    out.append(("Top findings", rows))
    if report.counts:
        out.append(("Rules", [f"Diagnosis over the window: {c.text()}." for c in report.counts]))
    return out


def no_findings_text(report: WeeklyReport) -> str:
    """What the top findings say when there are none: an all-clear only when some diagnosis looked.
    No diagnosis run (--store, --no-diagnose) or none whose rules could look at the week is "not
    diagnosed", never "no findings"."""
    if not report.counts:
        return (
            "Not diagnosed: no diagnosis was run over this source (a --store report and --no-diagnose "
            "read the numbers only); not an all-clear."
        )
    blind = [
        c
        for c in report.counts
        if c.rules and not c.fired and c.rules == c.not_evaluable + c.mechanism_off + c.overruled
    ]
    if len(blind) == len(report.counts):
        return (
            "Not diagnosed: none of the rules could look at the week (the source holds none of their "
            "signals); not an all-clear."
        )
    if blind:
        return (
            f"No findings this week in the data diagnosed; {len(blind)} of {len(report.counts)} sources held "
            "none of the rules' signals (not diagnosed)."
        )
    return "No findings this week."


CHANGES_TITLE = "What changed this week and its effect at matched load"
CHANGE_METRICS = {  # deltas key -> (unit scale, unit) of its column (curve.report.METRIC_WORDS names it)
    "ttft_p99_s": (1.0, "s"),
    "itl_p99_s": (1000.0, "ms"),
    "output_tokens_per_s": (1.0, ""),
}


def _changes_rows(week: WeekChanges | None) -> list[list[str]] | list[str]:
    """One row per change (time, pool, kind, where, label diff, verdict, deltas per metric with
    the concurrency levels compared); a sentence when there are none or none could be judged."""
    if week is None:
        return [
            "Not measured: no engine in this source reports requests running (the operating curve's "
            "concurrency), so changes cannot be judged at matched load."
        ]
    changes = week.changes
    if not changes:
        return [
            "No config, version, restart or replica-count change this week, and no shift of the curve "
            f"(read from {week.intervals} scrape interval{'s' * (week.intervals != 1)} on a "
            f"{fmt_duration(week.step_s)} grid)."
        ]
    head = ["When", "Pool", "Change", "Where", "Verdict"] + [METRIC_WORDS[m] for m in CHANGE_METRICS]
    rows = [head + ["Matched concurrency"]]
    for wc in changes:
        j, c = wc.judged, wc.judged.change
        rows.append(
            [
                _when(c.time),
                fmt_where(wc.pool),
                _change_text(c.kind, c.diff),
                ", ".join(c.instances) or "pool",
                verdict_text(j) + change_notes(j),
                *(_delta_cell(j.deltas.get(key), scale, unit) for key, (scale, unit) in CHANGE_METRICS.items()),
                ", ".join(f"{x:.1f}" for x in j.matched_concurrency) or "-",
            ]
        )
    return rows


def _change_text(kind: str, diff: dict) -> str:
    if kind == "curve":
        return "curve shift (no label changed): the window's first half against its second"
    moved = diff_text(diff, arrow="→")
    return f"{kind}: {moved}" if moved else kind


def _delta_cell(d: dict | None, scale: float, unit: str) -> str:
    """'before → after (relative)' in the metric's unit; '-' where no matched level measured it."""
    if d is None:
        return "-"
    rel = "" if d["relative"] is None else f" ({d['relative']:+.0%})"
    return f"{d['before'] * scale:.3g} → {d['after'] * scale:.3g}{' ' + unit if unit else ''}{rel}"


def _lever_titles(levers: list[LeverAdvice], top: int = 2) -> str:
    """The first levers of one kind by title, each with its costs ('-' for none)."""
    return "; ".join(lever_heading(lv) for lv in levers[:top]) or "-"


NO_TENANTS = (
    "No per-tenant series in this source (tenant_* come from kvscope's request tap or trace receiver, "
    "docs/requests.md, and from SGLang with --tokenizer-metrics-allowed-custom-labels tenant; vLLM has no "
    "tenant label)."
)
NO_ADAPTERS = (
    "No per-adapter series in this source (adapter_* come from kvscope's request tap, docs/requests.md: the "
    "request's model, a LoRA adapter or the base model; engines label their series with the base model only)."
)
"""What the tenant and adapter tables say in their place where the source has none (the report, the UI)."""
NOT_EXPORTED = "not exported by these engines"
COMPUTE_COLUMNS = {
    "tflops_per_gpu": ("TFLOP/s per GPU (÷ peak = MFU)", "num"),
    "gb_per_s_per_gpu": ("GB/s per GPU (÷ peak = MBU)", "num"),
    "tokens_per_gpu_hour": ("Tokens / GPU-h", "count"),
}
"""The Compute per GPU table's columns (`Efficiency.compute`, and the pools' tokens per GPU-hour)."""


def _efficiency_sections(report: WeeklyReport) -> list[tuple[str, list[list[str]] | list[str]]]:
    """Compute per GPU (the engines' MFU estimates next to tokens per GPU-hour), the recompute tax
    of preemptions, and tokens served per KV tier; a section whose signals no engine exports says so."""
    eff = report.this.efficiency
    if eff is None:
        return []
    tph = report.this.pools.get("tokens_per_gpu_hour", pd.Series(dtype=float))
    tph = pd.concat([tph, pd.Series({"fleet": report.this.fleet.get("tokens_per_gpu_hour")})])
    compute: list[list[str]] | list[str] = [
        f"Estimated FLOP/s and memory traffic per GPU (vLLM/SGLang --enable-mfu-metrics): {NOT_EXPORTED}, "
        "or the estimate is off (its counters never moved)."
    ]
    if not eff.compute.empty:
        table = eff.compute.reindex(columns=list(COMPUTE_COLUMNS))
        table["tokens_per_gpu_hour"] = [tph.get(k) for k in table.index]
        compute = format_table(table, COMPUTE_COLUMNS, "Pool")
    recompute: list[list[str]] | list[str] = [f"Preemption counters: {NOT_EXPORTED}."]
    if not eff.recompute.empty:
        est = " (est. = preemptions × prompt tokens per request)" * bool(eff.recompute["estimated"].any())
        recompute = [["Pool", "Preemptions", "Prompt tokens recomputed" + est, "Share of prompt tokens"]] + [
            [
                str(k),
                fmt(r["preemptions"], "count"),
                fmt(r["recomputed_tokens"], "count") + (" (est.)" if r["estimated"] else ""),
                fmt(r["recompute_share"], "pct"),
            ]
            for k, r in eff.recompute.iterrows()
        ]
    tiers: list[list[str]] | list[str] = [f"Prompt tokens served per KV tier: {NOT_EXPORTED}."]
    if not eff.tiers.empty:
        tiers = [["Tier", "Prompt tokens served"]] + [[str(k), fmt(v, "count")] for k, v in eff.tiers.items()]
    return [("Compute per GPU", compute), ("Preemption recompute tax", recompute), ("Cache savings per tier", tiers)]


def render_markdown(report: WeeklyReport) -> str:
    """The report as Markdown."""
    lines = [
        f"# kvscope weekly efficiency review: {_when(report.this.start)} → {_when(report.this.end)}",
        "",
        f"Source: {md_escape(report.source)}. GPU-hour price: ${report.gpu_hour_cost:,.2f}.",
        "",
    ]
    for title, body in _sections(report):
        lines += [f"## {title}", ""]
        lines += _md_table(body) if body and isinstance(body[0], list) else [md_escape(x) for x in body]
        lines.append("")
    return "\n".join(lines)


def _html_table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(_html_cell(c) for c in r) + "</tr>" for r in rows[1:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _html_cell(text: str) -> str:
    return f'<td class="num">{html.escape(text)}</td>' if is_numeric_cell(text) else f"<td>{html.escape(text)}</td>"


TIME_PLOTS = (
    ("tokens_per_gpu_hour", "Output tokens per GPU-hour", "output tokens / GPU-hour"),
    ("output_tokens_per_s", "Output token throughput", "output tokens / s"),
    ("gpu_util", "Mean GPU utilisation", "GPU utilisation (%)"),
)
"""(timeline column, title, y-axis label with its unit) of each time plot."""


def render_figures(report: WeeklyReport) -> list[tuple[str, Figure]]:
    """(title, matplotlib Figure) per plot. Every time plot spans the report's window on one UTC
    axis, with the stretches that hold no data shaded (absent, not zero); ratios are in %."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figures: list[tuple[str, Figure]] = []
    week = report.this
    timeline = week.timeline
    step = timeline.attrs.get("step_s", 3600.0)
    for col, title, unit in TIME_PLOTS:
        if col not in timeline or not timeline[col].notna().any():
            continue
        cov = week.coverage
        zoom = 0 < cov.span_s < ZOOM_BELOW * (week.end - week.start)
        if zoom:
            fig, (ax, zax) = plt.subplots(1, 2, figsize=(10, 2.8), sharey=True, gridspec_kw={"width_ratios": [3, 1]})
        else:
            fig, ax = plt.subplots(figsize=(8, 2.8))
        _draw_series(ax, timeline, col, step)
        _time_axis(ax, week.start, week.end, cov.gaps)
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize="small")
        if zoom:
            _draw_series(zax, timeline, col, step)
            pad = max(step, 0.05 * cov.span_s)
            _time_axis(
                zax,
                cov.spans[0][0] - pad,
                cov.spans[-1][1] + pad,
                cov.gaps,
                fmt="%H:%M" if cov.span_s + 2 * pad > 1800 else "%H:%M:%S",
                ticks=(3, 7),
            )
            zax.set_title("zoom: the data held", fontsize="small")
        figures.append((title, fig))
    tenants = week.tenants
    if "hit_ratio" in tenants and tenants["hit_ratio"].notna().any():
        top = tenants.head(15)
        fig, ax = plt.subplots(figsize=(8, 0.3 * len(top) + 1.4))
        ax.barh([str(t) for t in top.index], top["hit_ratio"].to_numpy(), color="#55a868")
        ax.set_xlim(0, 1)
        _percent_axis(ax.xaxis)
        ax.set_xlabel("prefix-cache hit ratio over the week (%)")
        ax.set_title("Prefix-cache hit ratio by tenant")
        figures.append(("Prefix-cache hit ratio by tenant", fig))
    return figures


ZOOM_BELOW = 0.25
"""A time plot whose data spans less than this share of the window gets a second panel zoomed
onto the data (the first keeps the report's window)."""


def _draw_series(ax, timeline: pd.DataFrame, col: str, step: float) -> None:
    """One timeline column as points joined within runs of bins (NaN bins break the line)."""
    ax.plot(
        timeline.index.to_pydatetime(),
        timeline[col].to_numpy(),
        color="#4c72b0",
        marker="o",
        markersize=2.5,
        linewidth=1.2,
        label=f"per {_step_name(step)}",
    )
    if col == "gpu_util":
        ax.axhline(UTILISATION_TRAP, color="#d62728", linestyle="--", label="utilisation trap (40%)")
        ax.set_ylim(0, 1.05)
        _percent_axis(ax.yaxis)
    else:
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(_count_formatter())


def _step_name(step: float) -> str:
    return f"{step / 3600:g}-hour bin" if step >= 3600 else f"{step / 60:g}-minute bin"


def _count_formatter():
    from matplotlib.ticker import FuncFormatter

    def label(v: float, _pos: int) -> str:
        for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= scale:
                return f"{v / scale:g}{suffix}"
        return f"{v:g}"

    return FuncFormatter(label)


def _percent_axis(axis) -> None:
    from matplotlib.ticker import PercentFormatter

    axis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))


def _time_axis(
    ax,
    start: float,
    end: float,
    gaps: list[tuple[float, float]],
    fmt: str = "%a %d\n%H:%M",
    ticks: tuple[int, int] = (5, 8),
) -> None:
    """start..end on x (UTC), the stretches without data shaded."""
    from matplotlib import dates as mdates

    def utc(ts: float) -> datetime:
        return datetime.fromtimestamp(ts, tz=UTC)

    for i, (a, b) in enumerate(gaps):
        ax.axvspan(utc(a), utc(b), color="#bbbbbb", alpha=0.35, linewidth=0, label="no data" if i == 0 else None)
    ax.set_xlim(utc(start), utc(end))
    locator = mdates.AutoDateLocator(tz=mdates.UTC, minticks=ticks[0], maxticks=ticks[1])
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter(fmt, tz=mdates.UTC))
    ax.set_xlabel("time (UTC)")


PLOTS_NEED = "the plots need matplotlib, in kvscope's `ui` extra: pip install 'kvscope[ui]'"


def plots_available() -> bool:
    """Whether matplotlib can be imported (it is in the `ui` extra, not the base install)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def render_plots(report: WeeklyReport) -> list[tuple[str, str]]:
    """(title, base64 PNG) per plot of `render_figures`."""
    from matplotlib import pyplot as plt

    out = []
    for title, fig in render_figures(report):
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        out.append((title, base64.b64encode(buf.getvalue()).decode()))
    return out


def render_html(report: WeeklyReport) -> str:
    """The report as one self-contained HTML page (plots embedded as PNG data URIs)."""
    title = f"kvscope weekly efficiency review: {_when(report.this.start)} → {_when(report.this.end)}"
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Source: {html.escape(report.source)}. GPU-hour price: ${report.gpu_hour_cost:,.2f}.</p>",
    ]
    for name, body in _sections(report):
        parts.append(f"<h2>{html.escape(name)}</h2>")
        if body and isinstance(body[0], list):
            parts.append(_html_table(body))
        else:
            parts += [f"<p>{html.escape(str(x))}</p>" for x in body]
    plots = render_plots(report) if plots_available() else None
    if plots is None:
        parts.append(f"<p>No plots: {html.escape(PLOTS_NEED)}.</p>")
    elif plots:
        parts.append("<h2>Plots</h2>")
        parts += [
            f'<figure><img alt="{html.escape(t)}" src="data:image/png;base64,{b64}"></figure>' for t, b64 in plots
        ]
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}td.num{text-align:right}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
    )
