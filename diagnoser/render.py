"""Terminal rendering of a Diagnosis (rich): the likely-cause card first, then the rest."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvscope.diagnoser.actions import KIND_HELP, KIND_LABEL, change_text, lever_heading, plan
from kvscope.diagnoser.findings import (
    CascadeInfo,
    Diagnosis,
    Evidence,
    Finding,
    ScaleChange,
    confidence_words,
    count,
    not_evaluable,
)
from kvscope.diagnoser.rulebook.rule import Rule, grid_seconds
from kvscope.diagnoser.rulebook.tree import Baseline, Tree
from kvscope.diagnoser.values import fmt_value

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


def fmt_clock(ts: float) -> str:
    """Time of day (UTC), for values inside a window whose date the header already gives."""
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def fmt_where(where: Mapping[str, str]) -> str:
    """Where a finding is: its labels, or "fleet" for a fleet-wide one (no labels at all)."""
    return ", ".join(f"{k}={v}" for k, v in sorted(where.items())) or "fleet"


def _shipped() -> dict[str, Rule]:
    """The shipped rules by id (their facts, baselines and summaries); empty when unreadable."""
    from kvscope.diagnoser.rulebook.rule import RuleError, shipped_rules

    try:
        return shipped_rules()
    except (OSError, RuleError):
        return {}


def _tree(f: Finding) -> Tree | None:
    """The finding's rule parsed with the finding's parameters; None for an unknown rule."""
    from kvscope.diagnoser.rulebook.rule import RuleError

    rule = _shipped().get(f.rule_id)
    try:
        return rule.with_params(f.params).tree if rule else None
    except RuleError:
        return None


def render_taken(f: Finding, ev: Evidence) -> str:
    """'peak at 07:26:47', 'mean 07:25:53-07:26:57', 'at onset 07:25:53': how a value was read."""
    if ev.value is None:
        return ""
    if ev.stat == "mean" or ev.at is None:
        return f"mean {fmt_clock(f.since)}-{fmt_clock(f.until)}"
    label = {"max": "peak at", "min": "lowest at", "first": "at onset", "last": "latest at"}.get(ev.stat or "", "at")
    return f"{label} {fmt_clock(ev.at)}"


def fact_rows(f: Finding) -> list[tuple[str, str, str]]:
    """The engine facts (startup configuration) a rule conditions on, as (name, value, how):
    they held for the finding to fire."""
    rows = []
    for fact in t.facts if (t := _tree(f)) else ():
        shown = fact.value if fact.op == "==" else f"{fact.op} {fact.value}"
        rows.append((f"engine fact {fact.fact}", shown, "from the engine's startup config"))
    return rows


def baseline_lines(f: Finding, time_scale: float = 1.0) -> list[str]:
    """What "rising" / "fell" is measured against: each baseline condition of the rule, its ranges
    as evaluated (scaled, whole grid steps) and clipped to the data held while the finding fired."""
    t = _tree(f)
    if t is None:
        return []
    names = {i.series: i.name for i in t.evidence} | {e.key: e.name for e in f.evidence if e.key}  # as evaluated
    blocks = [t.when] + list(t.cascade.stages if t.cascade else ())
    out = []
    for c in (c for b in blocks if b for c in b.conds if isinstance(c.right, Baseline)):
        spec = c.right
        assert isinstance(spec, Baseline)
        rng = grid_seconds(spec.rng, time_scale, f.step_s, 1)
        off = grid_seconds(spec.offset, time_scale, f.step_s, 0)
        factor = "" if c.times == 1.0 else f"{c.times:g} x "
        of = "its" if (spec.of or c.series) == c.series else f"the {_series_words(names, str(spec.of))}"
        start, end = f.window
        out.append(
            f"{_series_words(names, c.series)} {c.op} {factor}{of} {spec.agg} "
            + _baseline_window(rng, off, end - start, f.since - start, f.until - start)
        )
    return out


def _series_words(names: dict[str, str], series: str) -> str:
    """The evidence name of a rule series, or for a series the card does not show, its id in
    words ("hit times n same workload (derived)"): never a bare identifier in user text."""
    return names.get(series) or f"{series.replace('_', ' ')} (derived)"


def _baseline_window(rng: float, off: float, held: float, onset: float, last: float) -> str:
    """'over the 10m00s ending 2m00s earlier', clipped to the `held` seconds of data (a comparison
    `t` seconds in averages at most `t - off` of them); `onset` and `last` are the seconds into
    the data of the finding's first and last firing point."""
    last = max(last, onset)
    if off >= held:
        return (
            f"ending {fmt_duration(off)} earlier: none held, the window is only {fmt_duration(held)} "
            "long (the comparison cannot hold)"
        )
    if rng <= onset - off:
        return f"over the {fmt_duration(rng)} ending {fmt_duration(off)} earlier"
    if rng <= last - off:
        return (
            f"over the {fmt_duration(rng)} ending {fmt_duration(off)} earlier (at the onset only "
            f"{fmt_duration(max(0.0, onset - off))} of it was held: the data starts later)"
        )
    if last <= off:
        return (
            f"ending {fmt_duration(off)} earlier: none held while it fired (it ended "
            f"{fmt_duration(last)} into the {fmt_duration(held)} held; the comparison cannot hold)"
        )
    return (
        f"over all data held up to {fmt_duration(off)} earlier (at most the first {fmt_duration(last - off)} "
        f"of the {fmt_duration(held)} held; the rule's {fmt_duration(rng)} range reaches back before the data)"
    )


_ENGINES = ("vllm", "sglang", "dcgm", "nvml")


def shown_evidence(f: Finding) -> list[Evidence]:
    """The evidence rows worth printing: an absent value that is one engine's alternative
    ("draft acceptance (SGLang)") is dropped when a sibling ("draft acceptance") has a value."""
    present = {_base_name(e.name)[0] for e in f.evidence if e.value is not None}
    return [
        e
        for e, (base, qualifier) in ((e, _base_name(e.name)) for e in f.evidence)
        if e.value is not None or base not in present or qualifier.lower() not in _ENGINES
    ]


def _base_name(name: str) -> tuple[str, str]:
    if name.endswith(")") and " (" in name:
        base, _, rest = name.rpartition(" (")
        return base, rest[:-1]
    return name, ""


def cascade_text(c: CascadeInfo) -> str:
    """'cascade stage 4/4: latency; the root led the latency symptom by 42s': the stage a cascade
    reached and how long its root led the symptom (`kvscope diagnose`'s card, the triage card's and
    the Cascade page's one wording)."""
    lead = "" if c.lead_time_s is None else f"; the root led the latency symptom by {fmt_duration(c.lead_time_s)}"
    return f"cascade stage {c.stage}/{c.stages_total}: {c.stage_name}{lead}"


def render_card(f: Finding, heading: str, supporting: tuple[Finding, ...] = (), time_scale: float = 1.0) -> Panel:
    """One finding as a card: what, where, since when, evidence, levers, citations, and the
    findings that corroborate it (same mechanism) as one-liners."""
    state = "still active" if f.active else f"until {fmt_time(f.until)}"
    head = Text.assemble(
        (f"[{f.severity.upper()}] ", _STYLE.get(f.severity, "")), (f.title, "bold"), f"  (rule {f.rule_id})"
    )
    rows: list = [head]
    rows.append(Text(confidence_text(f), style="bold" if f.confidence != "high" else ""))
    if f.summary.strip() != f.title.strip():
        rows.append(Text(f.summary))
    rows.append(
        Text(f"where: {fmt_where(f.where)}    since: {fmt_time(f.since)} ({state}, {fmt_duration(f.until - f.since)})")
    )
    if f.cascade:
        rows.append(Text(cascade_text(f.cascade), style="bold"))
    rows.append(_evidence_table(f))
    for line in baseline_lines(f, time_scale):
        rows.append(Text(f"compared with its earlier level: {line}", style="dim"))
    rows.extend(_action_rows(f))
    rows.append(Text("sources: " + sources_text(f), style="dim"))
    if supporting:
        rows.append(Text("also fired (supporting evidence, same mechanism and levers):", style="bold"))
        rows.extend(Text("  " + render_line(g)) for g in supporting)
    return Panel(Group(*rows), title=heading, title_align="left", border_style=_STYLE.get(f.severity, ""))


def sources_text(f: Finding) -> str:
    """'Sizing LLM Inference for Production §7.4, vLLM issue #45325 <https://...>': the finding's
    citations as a user reads them, each public URL after its title."""
    if not f.sources:
        return ", ".join(f.citations)
    return ", ".join(f"{c.text} <{c.url}>" if c.url else c.text for c in f.sources)


def confidence_text(f: Finding) -> str:
    """How sure the finding is, with what would confirm it (`findings.confidence_words`)."""
    return confidence_words(f.confidence, f.confirm)


def render_line(f: Finding) -> str:
    """One finding as one line: severity, row, title, its first evidence and how it was taken."""
    text = f"{f.severity:8} {f.title}"
    if f.confidence != "high":
        text += f" [{f.confidence} confidence]"
    if f.summary.strip() != f.title.strip():
        text += f": {f.summary}"
    return text + f"  (since {fmt_clock(f.since)}, {fmt_duration(f.until - f.since)})"


SERIES_INLINE = 30
"""A series (PromQL) up to this many characters is shown whole in the evidence table; a longer
one is a note number there, written in full under the table (`series_cells`): a query folded into
a narrow column read as one row of twelve lines."""


def series_cells(f: Finding) -> tuple[list[str], list[str]]:
    """The evidence table's series column (one line each) and the notes under the table that give
    each shortened series whole: '[1] sum by (instance) (rate(...[8s]))'."""
    cells: list[str] = []
    notes: list[str] = []
    for ev in shown_evidence(f):
        if len(ev.series) <= SERIES_INLINE:
            cells.append(ev.series)
            continue
        notes.append(f"[{len(notes) + 1}] {ev.series}")
        cells.append(f"[{len(notes)}]")
    return cells, notes


def threshold_text(ev: Evidence) -> str:
    """'>= 90.0%': the evidence's comparison and threshold in its unit ('' where it has none)."""
    if ev.threshold is None:
        return ""
    return f"{ev.op or ''} {fmt_value(replace(ev, value=ev.threshold))}".strip()


def evidence_rows(f: Finding) -> list[tuple[str, str, str, str, str]]:
    """(evidence, value, threshold, taken, series) per shown evidence (`shown_evidence`): the
    evidence table `kvscope diagnose` prints (its series shortened: `series_cells`) and the UI
    shows."""
    return [(ev.name, fmt_value(ev), threshold_text(ev), render_taken(f, ev), ev.series) for ev in shown_evidence(f)]


def _evidence_table(f: Finding) -> Group:
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("evidence")
    t.add_column("value", justify="right")
    t.add_column("threshold", justify="right")
    t.add_column("taken")
    t.add_column("series", style="dim", overflow="fold")
    cells, notes = series_cells(f)
    for (*row, _), series in zip(evidence_rows(f), cells, strict=True):
        t.add_row(*row, series)
    for name, value, how in fact_rows(f):
        t.add_row(name, value, "", how, "")
    return Group(t, *(Text(note, style="dim") for note in notes))


def _action_rows(f: Finding) -> list:
    """'Do now' then 'Fix for good': each lever with its costs, then one line per system and
    product with the exact setting."""
    rows: list = []
    for kind, levers in zip(KIND_LABEL, plan(f), strict=True):
        if not levers:
            continue
        rows.append(Text(f"{KIND_LABEL[kind].upper()}: {KIND_HELP[kind]}", style="bold"))
        for lv in levers:
            rows.append(Text(f"  {lv.rank}. {lever_heading(lv)}"))
            rows.extend(Text(f"       {change_text(c)}", style="cyan") for c in lv.changes)
    return rows


def group_repeats(findings: tuple[Finding, ...]) -> list[tuple[Finding, list[Finding]]]:
    """Findings of one rule that differ only by instance, as (worst, all of them) in rank order:
    the same symptom on several replicas is one line, not one per replica."""
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        rest = tuple(sorted((k, v) for k, v in f.where.items() if k != "instance"))
        key = (f.rule_id, rest) if "instance" in f.where else (f.rule_id, rest, id(f))
        groups.setdefault(key, []).append(f)
    return [(members[0], members) for members in groups.values()]


def missing_summary(d: Diagnosis, top: int = 4) -> str:
    """'missing signals: gpu_utilization_ratio (7 rules), ...': the absent signals that kept the
    most rules from being evaluated; empty when no rule was skipped for an absent signal."""
    absent = (s.reason.split(":", 1)[1] for s in d.skipped if s.reason.startswith("signal(s) absent:"))
    missing = Counter(x.strip() for reason in absent for x in reason.split(","))
    if not missing:
        return ""
    common = ", ".join(f"{name} ({n} rules)" for name, n in missing.most_common(top))
    return f"missing signals: {common}{', ...' if len(missing) > top else ''}"


def render_not_fired(d: Diagnosis, top: int = 4) -> str:
    """Why nothing fired: how many rules could look, and which missing signals blinded the rest."""
    blind = not_evaluable(d.skipped)
    evaluable = max(0, d.rules_evaluated - len(blind))
    also = _overruled_text(d).replace(",", ";").lstrip("; ")
    also = f" ({also})" if also else ""
    if not blind:
        return f"No rule fired among {evaluable} evaluable rules{also}: nothing to act on in this window."
    why = f" ({missing})" if (missing := missing_summary(d, top)) else ""
    return (
        f"No rule fired among {evaluable} evaluable{also}; {len(blind)} could not be evaluated{why}. "
        "Missing signals are unknown, not healthy: -v lists every skipped rule."
    )


def scale_text(d: Diagnosis, top: int = 3) -> str:
    """What a time-scaled window did to the verdicts, the one wording of the CLI header and the UI's
    note: empty when the window was not scaled or when the shortening changed no rule's verdict
    (`Diagnosis.scale_changes`); where that was not compared (the fleet path) the shortening is
    said without its effect. `top` changes are named, the rest counted."""
    if d.time_scale >= 1 or d.scale_changes == ():
        return ""
    shortened = (
        "shorter than the 15 minutes the rules are written for, so rule durations and ranges were "
        f"shortened to {d.time_scale:.0%} of their usual length"
    )
    if d.scale_changes is None:
        return f"{shortened} (the series shown are the ranges used)"
    changes = d.scale_changes
    named = "; ".join(_scale_change(c) for c in changes[:top])
    more = f"; {len(changes) - top} more (-v lists them)" if len(changes) > top else ""
    verdicts = "1 verdict" if len(changes) == 1 else f"{len(changes)} verdicts"
    return f"{shortened}, which changed {verdicts}: {named}{more}"


def scale_note(d: Diagnosis) -> str:
    """The short-window note as a sentence, the line under `kvscope diagnose`'s header and the UI's
    caption: 'This window is only 2m12s: shorter than ...'; empty where `scale_text` is."""
    text = scale_text(d)
    if not text:
        return ""
    start, end = d.window
    return f"This window is only {fmt_duration(end - start)}: {text}."


_VERDICT_WORDS = {"fired": "fired", "did not fire": "did not fire", "not evaluable": "could not be evaluated"}


def _scale_change(c: ScaleChange) -> str:
    if c.shortened == c.full == "fired":
        return f"{c.title} fired {c.detail}"
    return f"{c.title} {_VERDICT_WORDS[c.shortened]} (at the usual length it {_VERDICT_WORDS[c.full]})"


def _scale_verbose(d: Diagnosis) -> str:
    """-v's line on a shortened window: every changed verdict, or that none changed."""
    changes = d.scale_changes or ()
    head = (
        f"Rule durations and ranges were shortened to {d.time_scale:.0%} of their usual length "
        "(a window under 15 minutes)"
    )
    if not changes:
        return f"{head}; judged at their usual length, every rule reached the same verdict."
    return f"{head}; judged at their usual length: " + "; ".join(_scale_change(c) for c in changes)


def render_diagnosis(d: Diagnosis, console: Console | None = None, verbose: bool = False) -> None:
    """Print the diagnosis: header, likely cause card with its supporting findings, competing
    hypotheses (other mechanisms), other findings (repeats per replica collapsed)."""
    console = console or Console()
    start, end = d.window
    console.print(
        f"[bold]kvscope diagnose[/bold]  {d.source}  {fmt_time(start)} -> {fmt_time(end)} "
        f"({fmt_duration(end - start)}); {count(d).text()}"
    )
    if note := scale_note(d):
        console.print(note, style="yellow", markup=False)
    if d.likely_cause is None:
        console.print(render_not_fired(d), style="yellow" if d.skipped else "green")
    else:
        console.print(render_card(d.likely_cause, "LIKELY CAUSE", d.supporting, d.time_scale))
    for f in d.hypotheses:
        console.print(render_card(f, "COMPETING HYPOTHESIS (different mechanism)", (), d.time_scale))
    _print_other(console, d.other_than_supporting)
    _print_changes(console, d)
    if verbose and d.time_scale < 1 and d.scale_changes is not None:
        console.print(_scale_verbose(d), style="dim")
    if verbose and d.skipped:
        console.print("[bold]Not evaluable[/bold]")
        for s in d.skipped:
            console.print(f"  {s.rule_id}: {s.reason}", style="dim")


def _print_other(console: Console, other: tuple[Finding, ...]) -> None:
    """The other findings, one line per rule and place (repeats per replica collapsed)."""
    if other:
        console.print("[bold]Other findings[/bold]")
        for worst, members in group_repeats(other):
            console.print(
                f"  [{_STYLE.get(worst.severity, '')}]{worst.severity:8}[/] "
                f"{worst.title} ({where_of(members)}) - {_other_detail(worst, len(members))}"
            )


def _print_changes(console: Console, d: Diagnosis) -> None:
    """What changed in the window, each change's verdict and its follow-up."""
    if d.changes:
        console.print("[bold]What changed in this window[/bold] (the curve before against after, at matched load)")
        for change in d.changes:
            console.print(f"  {change['text']}", markup=False)
            if "text_follow_up" in change:
                console.print(f"    {change['text_follow_up']}", markup=False)


def _overruled_text(d: Diagnosis) -> str:
    c = count(d)
    return (f", {c.overruled} overruled by direct evidence" if c.overruled else "") + (
        f", {c.mechanism_off} with the mechanism off" if c.mechanism_off else ""
    )


def where_of(members: Sequence[Finding]) -> str:
    """Where a rule fired: one finding's place, or for several instances how many and which."""
    if len(members) == 1:
        return fmt_where(members[0].where)
    rest = ", ".join(f"{k}={v}" for k, v in sorted(members[0].where.items()) if k != "instance")
    names = ", ".join(m.where["instance"] for m in members)
    return f"{len(members)} instances: {names}" + (f"; {rest}" if rest else "")


def what_text(f: Finding) -> str:
    """The summary, or the first evidence value when the summary only repeats the title."""
    if f.summary.strip() != f.title.strip():
        return f.summary
    ev = next((e for e in shown_evidence(f) if e.value is not None), None)
    return f"{ev.name} {fmt_value(ev)} ({render_taken(f, ev)})" if ev else "no evidence value"


def _other_detail(worst: Finding, n: int) -> str:
    return (f"worst ({fmt_where(worst.where)}): " if n > 1 else "") + what_text(worst)
