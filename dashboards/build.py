"""Write the dashboards' JSON, or compare it with the checked-in golden files."""

from __future__ import annotations

from pathlib import Path

from kvscope.dashboards.board import render_json
from kvscope.dashboards.registry import BOARDS, file_name


def build_dashboards(out: Path) -> list[Path]:
    """Write every dashboard to `out`, removing JSON files no dashboard produces."""
    out.mkdir(parents=True, exist_ok=True)
    wanted = {file_name(b): render_json(b) for b in BOARDS}
    for stray in out.glob("*.json"):
        if stray.name not in wanted:
            stray.unlink()
    for name, text in wanted.items():
        (out / name).write_text(text)
    return [out / name for name in wanted]


def check_golden(folder: Path) -> list[str]:
    """File names under `folder` that differ from what the sources generate (missing or stray too)."""
    wanted = {file_name(b): render_json(b) for b in BOARDS}
    stale = [n for n, text in wanted.items() if not (folder / n).is_file() or (folder / n).read_text() != text]
    stale += [p.name for p in folder.glob("*.json") if p.name not in wanted]
    return sorted(stale)
