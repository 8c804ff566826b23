"""Terminal rendering of a Diagnosis (rich): the likely-cause card first, then the rest."""

from __future__ import annotations

import time

from kvscope.diagnoser.findings import Diagnosis, Evidence, Finding
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}


def fmt_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + " UTC"


def fmt_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    m, s = divmod(seconds, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def fmt_value(ev: Evidence) -> str:
    """A number with its unit, readable (ratios as percent)."""
    v = ev.value
    if v is None:
        return "absent"
    if ev.unit == "ratio":
        return f"{v:.1%}"
    if ev.unit == "seconds":
        return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if ev.unit == "bytes" or ev.unit == "bytes_per_second":
        suffix = "/s" if ev.unit.endswith("second") else ""
        for unit in ("B", "KB", "MB", "GB", "TB"):
            if abs(v) < 1000:
                return f"{v:.1f} {unit}{suffix}"
            v /= 1000
        return f"{v:.1f} PB{suffix}"
    text = f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    unit = {"per_second": "/s", "tokens_per_second": "tokens/s", "count": "", "tokens": "tokens"}.get(ev.unit, ev.unit)
    return f"{text} {unit}".strip()


def render_card(f: Finding, heading: str) -> Panel:
    """One finding as a card: what, where, since when, evidence, levers, citations."""
    where = ", ".join(f"{k}={v}" for k, v in sorted(f.where.items())) or "whole fleet"
    state = "still active" if f.active else f"until {fmt_time(f.until)}"
    head = Text.assemble((f"[{f.severity.upper()}] ", _STYLE.get(f.severity, "")), (f.title, "bold"),
                         f"  ({f.levers_md} {f.rule_id})")
    rows: list = [head, Text(f.summary),
                  Text(f"where: {where}    since: {fmt_time(f.since)} ({state}, {fmt_duration(f.until - f.since)})")]
    if f.cascade:
        c = f.cascade
        lead = ""
        if c.lead_time_s is not None:
            lead = f"; the root led the latency symptom by {fmt_duration(c.lead_time_s)}"
        rows.append(Text(f"cascade stage {c.stage}/{c.stages_total}: {c.stage_name}{lead}", style="bold"))
    rows.append(_evidence_table(f))
    rows.append(_lever_table(f))
    rows.append(Text("sources: " + ", ".join(f.citations), style="dim"))
    return Panel(Group(*rows), title=heading, title_align="left", border_style=_STYLE.get(f.severity, ""))


def _evidence_table(f: Finding) -> Table:
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("evidence")
    t.add_column("value", justify="right")
    t.add_column("threshold", justify="right")
    t.add_column("series", style="dim", overflow="fold")
    for ev in f.evidence:
        thr = "" if ev.threshold is None else f"{ev.op} {fmt_value(Evidence('', ev.threshold, ev.unit, ''))}"
        t.add_row(ev.name, fmt_value(ev), thr, ev.series)
    return t


def _lever_table(f: Finding) -> Table:
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("#")
    t.add_column("lever")
    t.add_column("how", overflow="fold")
    for lv in f.levers:
        how = "\n".join(f"{c.system}: {c.change}" for c in lv.changes)
        t.add_row(str(lv.rank), f"{lv.title}\n[dim]{lv.id} ({lv.direction})[/dim]", how)
    return t


def render_diagnosis(d: Diagnosis, console: Console | None = None, verbose: bool = False) -> None:
    """Print the diagnosis: header, likely cause card, competing hypotheses, other findings."""
    console = console or Console()
    start, end = d.window
    scale = f", durations scaled x{d.time_scale:.2f}" if d.time_scale < 1 else ""
    console.print(f"[bold]kvscope diagnose[/bold]  {d.source}  {fmt_time(start)} -> {fmt_time(end)} "
                  f"({fmt_duration(end - start)}{scale}); {d.rules_evaluated} rules, "
                  f"{len(d.findings)} fired, {len(d.skipped)} not evaluable")
    if d.likely_cause is None:
        console.print("[green]No rule fired: nothing to act on in this window.[/green]")
    else:
        console.print(render_card(d.likely_cause, "LIKELY CAUSE"))
    for f in d.competing:
        console.print(render_card(f, "COMPETING HYPOTHESIS"))
    if d.other:
        console.print("[bold]Other findings[/bold]")
        for f in d.other:
            where = ", ".join(f"{k}={v}" for k, v in sorted(f.where.items())) or "fleet"
            console.print(f"  [{_STYLE.get(f.severity, '')}]{f.severity:8}[/] {f.levers_md:4} {f.title} "
                          f"({where}) - {f.summary}")
    if verbose and d.skipped:
        console.print("[bold]Not evaluable[/bold]")
        for s in d.skipped:
            console.print(f"  {s.rule_id}: {s.reason}", style="dim")
