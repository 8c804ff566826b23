"""Write the dashboards' JSON, or compare it with the checked-in golden files."""

from __future__ import annotations

import json
from pathlib import Path

from kvscope.dashboards.board import render_json
from kvscope.dashboards.registry import BOARDS, file_name


def build_dashboards(out: Path) -> list[Path]:
    """Write every dashboard to `out`, removing kvscope dashboards it no longer produces (a JSON file
    whose uid starts with `kvscope-`); other files in the folder, other dashboards too, are kept."""
    out.mkdir(parents=True, exist_ok=True)
    wanted = {file_name(b): render_json(b) for b in BOARDS}
    for stray in out.glob("*.json"):
        if stray.name not in wanted and _is_kvscope_dashboard(stray):
            stray.unlink()
    for name, text in wanted.items():
        (out / name).write_text(text)
    return [out / name for name in wanted]


def _is_kvscope_dashboard(path: Path) -> bool:
    """True for a dashboard JSON file that kvscope wrote (its uid starts with `kvscope-`)."""
    try:
        if path.stat().st_size > MAX_DASHBOARD_BYTES:
            return False
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get("uid", "")).startswith("kvscope-")


MAX_DASHBOARD_BYTES = 16 << 20
"""A larger file is no dashboard kvscope wrote: it is left alone, unread."""


def check_golden(folder: Path) -> list[str]:
    """File names under `folder` that differ from what the sources generate (missing or stray too)."""
    wanted = {file_name(b): render_json(b) for b in BOARDS}
    stale = [n for n, text in wanted.items() if not (folder / n).is_file() or (folder / n).read_text() != text]
    stale += [p.name for p in folder.glob("*.json") if p.name not in wanted]
    return sorted(stale)
