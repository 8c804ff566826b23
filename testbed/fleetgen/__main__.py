"""`python -m testbed.fleetgen [NAME ...]`: regenerate fleet recordings into tests/recordings/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from testbed.fleetgen.sim import all_scenarios, generate

OUT = Path(__file__).resolve().parents[2] / "tests" / "recordings"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m testbed.fleetgen",
        description=(
            "Generate synthetic fleet recordings (P/D, 8 replicas, DCGM, SGLang DP) with the exact upstream "
            "metric names, calibrated on the real vLLM recordings (testbed/fleetgen/calibration.yaml)."
        ),
    )
    scenarios = all_scenarios()
    ap.add_argument("names", nargs="*", help="scenarios (default: all): " + ", ".join(scenarios))
    ap.add_argument("--out", type=Path, default=OUT, help="output directory")
    a = ap.parse_args(argv)
    unknown = [n for n in a.names if n not in scenarios]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    for name in tqdm(a.names or list(scenarios), unit="scenario"):
        tqdm.write(f"wrote {generate(name, a.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
