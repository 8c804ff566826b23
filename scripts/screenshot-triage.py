"""Screenshot the triage UI's first screen (1400x900) in headless Debian Chromium.

Usage: python scripts/screenshot-triage.py OUT.png [RECORDING]
Serves RECORDING (default: the demo recording) with `kvscope ui`'s server on a free port, loads
the page in headless Chromium and writes the first screen to OUT.png (docs/img/ keeps them).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from kvscope.commands.demo import default_recording
from kvscope.ui.data import SourceSpec
from kvscope.ui.server import UiServer, free_port

FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def main() -> int:
    out = Path(sys.argv[1])
    recording = Path(sys.argv[2]) if len(sys.argv) > 2 else default_recording()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = UiServer(SourceSpec("recording", str(recording)), free_port(), log_path=Path(tmp) / "ui.log")
        with server:
            server.wait_healthy(120)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=FLAGS)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(server.url)
                page.wait_for_selector("text=Likely cause", timeout=120_000)
                page.wait_for_function(
                    "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000
                )
                page.wait_for_timeout(2000)
                page.screenshot(path=str(out))
                browser.close()
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
