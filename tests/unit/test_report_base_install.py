"""Issue 41 N14: `kvscope report weekly` on the base install (no `ui` extra, so no matplotlib)
writes the report without its plots and says which extra brings them, never a
ModuleNotFoundError traceback. The base install is reproduced by making matplotlib unimportable
in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "kv-pressure-cascade.om.gz"

_RUN = """
import sys
sys.modules["matplotlib"] = None  # as on the base install: `import matplotlib` raises ImportError
from kvscope.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_report_weekly_without_matplotlib_writes_the_html_without_plots_and_names_the_extra(tmp_path):
    html, md = tmp_path / "week.html", tmp_path / "week.md"
    argv = ["report", "weekly", "--recording", str(RECORDING), "--html", str(html), "--markdown", str(md)]
    out = subprocess.run(
        [sys.executable, "-c", _RUN, *argv, "--no-progress"], capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "ModuleNotFoundError" not in out.stderr
    assert "pip install 'kvscope[ui]'" in out.stderr
    page = html.read_text()
    assert "No plots: the plots need matplotlib" in page and "data:image/png" not in page
    assert md.read_text().startswith("#")
