"""Benchmark: the UI's triage page for a fleet in a real TSDB, rendered in headless Chromium.

The user's path: `kvscope ui --prometheus URL --since 6h`, a browser opens the triage page, and the
likely cause's card shows. The fleet and its candidate records are bench/diagnose_fleet.py's
VictoriaMetrics dataset (N vLLM engines from the real vLLM 0.32 capture, 15 s scrapes, a tenth of
them through a KV-pressure episode, the records replayed by vmalert; kept between runs under
$KVSCOPE_BENCH_CACHE). The page's window is the dataset's window (`--end`), so the records cover it.

Measured in one run, against the same VictoriaMetrics (its rollup cache emptied before each):
* first view: from the browser's request of the page until the likely cause's card is whole (its
  "Sources:" line) or the page says no rule fired, requested as soon as the UI's Streamlit process
  answers /healthz; and from the UI's launch to the card (the launcher starts reading the source
  at launch, so this is the user's whole wait from `kvscope ui` with a browser already open);
* second view: a new page in the same browser after the first (Streamlit's cache holds the data
  for 60 s: what a reload costs);
* baseline: `kvscope diagnose --prometheus URL --start S --end E --json` over the same window, a
  subprocess (the fleet path alone, what the page adds is the routers' read and the rendering);
* with --raw, the raw fetch of every engine's series (bench/diagnose_fleet.py `baseline_fetch`).

    .venv/bin/python bench/ui_fleet.py --engines 1000 --hours 6
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from diagnose_fleet import (  # noqa: E402
    KVSCOPE,
    TREE,
    VM_FLAGS,
    VM_SHIFT_S,
    baseline_fetch,
    load,
    run_child,
    span,
    vm_dataset,
)

from kvscope.ui.data import SourceSpec  # noqa: E402
from kvscope.ui.server import UiServer, free_port  # noqa: E402
from testbed.victoria import reset_cache, running_victoria  # noqa: E402

GOAL_S = 6.0  # issue 37: the triage page at 1000 engines x 6 h rendered in headless Chromium
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
LIMIT_MS = 600_000


class TreeUi(UiServer):
    """The UI as diagnose_fleet.TREE's checkout serves it: its interpreter, its app."""

    def command(self) -> list[str]:
        argv = super().command()
        return [str(TREE / ".venv" / "bin" / "python"), *argv[1:4], str(TREE / "ui" / "app.py"), *argv[5:]]


def time_view(browser, url: str) -> tuple[float, str]:
    """Seconds from the page's request until the likely cause's card is whole or the page says
    no rule fired, and which of the two it showed."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        t0 = time.perf_counter()
        page.goto(url)
        done = page.get_by_text("Sources: ").or_(page.get_by_text("No rule fired in this window"))
        done.first.wait_for(timeout=LIMIT_MS)
        took = time.perf_counter() - t0
        body = page.inner_text("body")
        shown = "likely cause" if "Likely cause" in body else "no rule fired"
        return took, shown
    finally:
        page.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=1000)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--raw", action="store_true", help="also time the raw fetch of every engine's series")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    data = vm_dataset(args.engines, args.hours)
    _, start, end = span(args.hours, VM_SHIFT_S)
    with running_victoria(data, *VM_FLAGS, log_path=data.parent / "vm-ui.log", cache=True) as vm:
        reset_cache(vm.url)
        l0 = load()
        cli = run_child(
            [KVSCOPE, "diagnose", "--prometheus", vm.url, "--start", f"{start:.0f}", "--end", f"{end:.0f}", "--json"]
        )
        print(f"  diagnose --prometheus: {cli['wall_s']:.2f} s (exit {cli['exit']}), load {l0:.1f}", flush=True)
        source = SourceSpec("prometheus", vm.url, since_s=end - start, end=end)
        log = data.parent / "streamlit-bench.log"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            reset_cache(vm.url)
            l1 = load()
            launched = time.perf_counter()
            ui = TreeUi(source, free_port(), log_path=log).start()
            try:
                ui.wait_healthy(90)
                healthy = time.perf_counter() - launched
                first, shown = time_view(browser, ui.url)
                whole = time.perf_counter() - launched
                print(
                    f"  first view: {first:.2f} s ({shown}) from the page's request; {whole:.2f} s from launch "
                    f"(healthy after {healthy:.2f} s), load {l1:.1f}",
                    flush=True,
                )
                second, _ = time_view(browser, ui.url)
                print(f"  second view: {second:.2f} s, load {load():.1f}", flush=True)
            finally:
                ui.stop()
                browser.close()
        raw = None
        if args.raw:
            reset_cache(vm.url)
            raw = baseline_fetch(vm.url, start, end, args.engines)
    print(
        f"triage page {args.engines} engines x {args.hours:g} h on VictoriaMetrics: first view {first:.2f} s "
        f"({shown}), second {second:.2f} s, launch to card {whole:.2f} s; goal < {GOAL_S:g} s: first view "
        f"{first / GOAL_S:.2f}x, launch to card {whole / GOAL_S:.2f}x of it"
    )
    ratio = first / cli["wall_s"]
    print(f"baseline diagnose --prometheus {cli['wall_s']:.2f} s, {cli['rss_gb']:.2f} GB: page / CLI {ratio:.2f}x")
    if raw is not None:
        print(f"baseline raw fetch {raw['baseline_s']:.1f} s: page / raw fetch {first / raw['baseline_s']:.3f}x")
    print(f"load {l0:.1f}-{load():.1f}")


if __name__ == "__main__":
    main()
