"""`kvscope demo`: replay a real vLLM incident recording through the agent's replay path, the
diagnoser and the triage UI. No GPU, no Prometheus needed."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from kvscope.commands._checks import check_port_free, check_recording
from kvscope.commands._common import add_command, fail

REPO = Path(__file__).resolve().parents[2]
RECORDINGS = REPO / "tests" / "recordings"
BUNDLED = REPO / "ui" / "recordings" / "vllm-0.32.0-cpu-kv-pressure.om.gz"
"""Real vLLM KV-pressure incident shipped with the UI (ui/recordings/README.md), the fallback."""
PREFERRED = ("kv-pressure", "preempt", "cascade", "evict")
"""Library recording names are matched against these, in order, to pick the default incident."""

HELP = """\
Replay a bundled incident recorded from a real vLLM server (tests/recordings/) through the same
path as live scrapes (dialect detection, normalisation), run the diagnoser, print the likely
cause, and serve the triage UI on 127.0.0.1. Ctrl-C stops it.

  kvscope demo                      # the default incident, UI on http://127.0.0.1:8501
  kvscope demo --check              # print the diagnosis and exit (CI, no UI)
  kvscope demo --recording FILE     # any recording
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "demo", "replay a real incident through the diagnoser and the UI", HELP)
    recording_help = (
        f"recording to replay (default: a KV-pressure incident from tests/recordings/, else {BUNDLED.name})"
    )
    p.add_argument("--recording", type=Path, help=recording_help)
    p.add_argument("--port", type=int, default=8501, help="UI port on 127.0.0.1 (a free one if taken)")
    check_help = "print the diagnosis and exit without starting the UI"
    p.add_argument("--check", "--once", action="store_true", dest="check", help=check_help)
    p.set_defaults(func=run)


def default_recording(folder: Path = RECORDINGS, bundled: Path = BUNDLED) -> Path | None:
    """The incident to show: a KV-pressure recording from the incident library if there is
    one (never a healthy baseline), else the recording bundled with the UI."""
    found = (
        sorted(p for p in folder.glob("*.om*") if p.is_file() and not p.name.startswith("healthy"))
        if folder.is_dir()
        else []
    )
    for word in PREFERRED:
        for path in found:
            if word in path.name:
                return path
    return bundled if bundled.is_file() else None


def render_diagnosis(diagnosis) -> str:
    """The diagnosis as terminal text: likely cause first, with levers and citations. Values carry
    the units `kvscope diagnose` prints (ratios as %, seconds as ms/s, rates as /s)."""
    from kvscope.diagnoser.render import fmt_duration, fmt_value
    from kvscope.ui.data import render_when

    f = diagnosis.likely_cause
    lines = [
        f"source {diagnosis.source}: {diagnosis.rules_evaluated} rules, {len(diagnosis.findings)} fired, "
        f"{len(diagnosis.skipped)} not evaluable (missing signals; kvscope diagnose -v lists them)"
    ]
    if f is None:
        return "\n".join(lines + ["no rule fired"])
    state = "still active" if f.active else f"until {render_when(f.until)}"
    lines += [
        f"LIKELY CAUSE [{f.severity}] {f.title} (rule {f.rule_id}, LEVERS {f.levers_md})",
        f"  where: {_where(f.where)}",
        f"  since: {render_when(f.since)} ({state}, {fmt_duration(f.until - f.since)})",
        f"  what:  {f.summary}",
    ]
    if f.cascade:
        lead = (
            ""
            if f.cascade.lead_time_s is None
            else f"; the root led the latency symptom by {fmt_duration(f.cascade.lead_time_s)}"
        )
        lines.append(f"  cascade stage {f.cascade.stage}/{f.cascade.stages_total}: {f.cascade.stage_name}{lead}")
    for e in f.evidence:
        bound = (
            ""
            if e.threshold is None or e.op is None
            else f" (threshold {e.op} {fmt_value(replace(e, value=e.threshold))})"
        )
        lines.append(f"  evidence: {e.name} = {fmt_value(e)}{bound}  [{e.series}]")
    for lever in sorted(f.levers, key=lambda x: x.rank):
        lines.append(f"  lever {lever.rank}: {lever.id} ({lever.direction}) {lever.title}")
        lines += [f"      {c.system}: {c.change}" for c in lever.changes]
    if f.citations:
        lines.append("  sources: " + "; ".join(f.citations))
    lines += [f"  also fired (same mechanism and levers): {g.title} ({g.rule_id})" for g in diagnosis.supporting]
    lines += [f"competing: {c.title} ({c.rule_id}) on {_where(c.where)}" for c in diagnosis.hypotheses]
    return "\n".join(lines)


def _where(labels: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "whole fleet"


def run(args: argparse.Namespace) -> int:
    from kvscope.ui.data import SourceError, SourceSpec, load_triage

    path = args.recording or default_recording()
    if path is None:
        return fail("demo", f"no recording in {RECORDINGS}; pass --recording FILE", 4)
    try:
        check_recording(path)
    except (ValueError, OSError) as exc:
        return fail("demo", exc, 4)
    print(f"kvscope demo: replaying {path}", flush=True)
    spec = SourceSpec("recording", str(Path(path).resolve()))
    try:
        data = load_triage(spec)
    except SourceError as exc:
        return fail("demo", exc, 4)
    print(render_diagnosis(data.diagnosis), flush=True)
    if args.check:
        return 0 if data.diagnosis.likely_cause is not None else 1
    from kvscope.commands.ui import serve_ui
    from kvscope.ui.server import free_port

    try:
        check_port_free("--port", "127.0.0.1", args.port)
    except ValueError:
        args.port = free_port()  # taken: any free one
    return serve_ui("demo", spec, args.port)
