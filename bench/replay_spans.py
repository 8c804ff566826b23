"""What replaying a recording's spans sidecar costs `kvscope diagnose --recording`, in one run.

For every real recording in tests/recordings/ that has a `.spans.jsonl.gz`, the frame the
diagnoser reads is built twice from the same file, best of --repeat each:

* baseline: the metrics only (`RecordingSource(path, spans=False)`);
* with spans: the sidecar read, stitched (agent/traces/stitch.py) and rendered at every scrape.

Printed per recording: spans, seconds for each, and the ratio with / without (1.0 = free).

    .venv/bin/python bench/replay_spans.py --repeat 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvscope.diagnoser.evaluate.evaluator import sample_names
from kvscope.diagnoser.rulebook.rule import read_rules
from kvscope.diagnoser.sources.recording import RecordingSource

LIBRARY = Path(__file__).resolve().parents[1] / "tests" / "recordings"


def _time_frame(path: Path, spans: bool, names: set[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    src = RecordingSource(path, spans=None if spans else False)
    src.read_frame(names, None, None, src.natural_step())
    return time.perf_counter() - t0, src.replay().span_stats.get("spans", 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant; the best is kept")
    a = ap.parse_args(argv)
    names = set().union(*(sample_names(r) for r in read_rules())) | {
        "request_phase_seconds_bucket",
        "request_phase_seconds_sum",
        "request_phase_seconds_count",
    }
    recordings = sorted(
        p for p in LIBRARY.glob("*.om.gz") if p.with_name(p.name.replace(".om.gz", ".spans.jsonl.gz")).exists()
    )
    print(f"{'recording':34s} {'spans':>6s} {'metrics only s':>15s} {'with spans s':>13s} {'ratio':>6s}")
    total = [0.0, 0.0]
    for path in recordings:
        base = min(_time_frame(path, False, names)[0] for _ in range(a.repeat))
        runs = [_time_frame(path, True, names) for _ in range(a.repeat)]
        with_spans, n_spans = min(r[0] for r in runs), runs[0][1]
        total[0] += base
        total[1] += with_spans
        print(f"{path.name:34s} {n_spans:6d} {base:15.3f} {with_spans:13.3f} {with_spans / base:6.2f}")
    if recordings:
        print(f"{'all':34s} {'':6s} {total[0]:15.3f} {total[1]:13.3f} {total[1] / total[0]:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
