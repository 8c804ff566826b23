"""`kvscope demo`: replay a real vLLM incident recording through the agent's replay path, the
diagnoser and the triage UI. No GPU, no Prometheus needed."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvscope.commands._checks import check_port_free, check_recording
from kvscope.commands._common import add_command, fail

REPO = Path(__file__).resolve().parents[2]
RECORDINGS = REPO / "tests" / "recordings"
BUNDLED = REPO / "ui" / "recordings" / "vllm-0.32.0-cpu-kv-pressure.om.gz"
"""Real vLLM KV-pressure incident shipped with the UI (ui/recordings/README.md), the fallback."""
DEMO = "kv-pressure-tenants"
"""The library incident the demo shows: a KV-pressure cascade on real vLLM recorded behind kvscope's
request tap with several tenants, so the Tenants page has data too (tests/recordings/README.md)."""
PREFERRED = ("kv-pressure", "preempt", "cascade", "evict")
"""Without DEMO, library recording names are matched against these, in order."""

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
    recording_help = f"recording to replay (default: tests/recordings/{DEMO}.om.gz, else {BUNDLED.name})"
    p.add_argument("--recording", type=Path, help=recording_help)
    p.add_argument("--port", type=int, default=8501, help="UI port on 127.0.0.1 (a free one if taken)")
    check_help = "print the diagnosis and exit without starting the UI"
    p.add_argument("--check", "--once", action="store_true", dest="check", help=check_help)
    p.set_defaults(func=run)


def default_recording(folder: Path = RECORDINGS, bundled: Path = BUNDLED) -> Path | None:
    """The incident to show: DEMO from the incident library, else a KV-pressure recording from it
    (never a healthy baseline), else the recording bundled with the UI."""
    found = (
        sorted(p for p in folder.glob("*.om*") if p.is_file() and not p.name.startswith("healthy"))
        if folder.is_dir()
        else []
    )
    for path in found:
        if path.name.split(".")[0] == DEMO:
            return path
    for word in PREFERRED:
        for path in found:
            if word in path.name:
                return path
    return bundled if bundled.is_file() else None


def run(args: argparse.Namespace) -> int:
    from kvscope.diagnoser.render import render_diagnosis
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
    render_diagnosis(data.diagnosis)
    if args.check:
        return 0 if data.diagnosis.likely_cause is not None else 1
    from kvscope.commands.ui import serve_ui
    from kvscope.ui.server import free_port

    try:
        check_port_free("--port", "127.0.0.1", args.port)
    except ValueError:
        args.port = free_port()  # taken: any free one
    return serve_ui("demo", spec, args.port)
