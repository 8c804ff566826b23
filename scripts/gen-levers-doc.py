"""Write docs/levers.md from rules/levers.yaml (run after editing the levers)."""

from __future__ import annotations

from pathlib import Path

from kvscope.diagnoser.actions import levers_markdown
from kvscope.diagnoser.rulebook.levers import load_levers

OUT = Path(__file__).resolve().parents[1] / "docs" / "levers.md"

if __name__ == "__main__":
    OUT.write_text(levers_markdown(load_levers()), encoding="utf-8")
    print(OUT)
