"""Correctness guard for diagnoser speed work: dump every diagnosis, compare against a dump.

Diagnoses every recording of the incident library (tests/recordings/*.om.gz) and the synthetic
fleet of bench/diagnose_scale.py at two smaller sizes, and writes their JSON (findings with
evidence values, scores, onsets, skipped rules and reasons) to one file. `--check FILE` runs
the same diagnoses again and exits 1, naming the first differences, unless every diagnosis is
identical byte for byte. Take a dump before an optimisation and check it after.

    .venv/bin/python bench/diagnose_golden.py --write /tmp/golden.json
    .venv/bin/python bench/diagnose_golden.py --check /tmp/golden.json

Rules, recordings and sources change under a shared tree too, so a dump taken an hour ago may
differ for reasons that are not the diagnoser's. `--against REV` takes the dump with the
engine files of diagnoser/ (ENGINE_FILES) at git revision REV and everything else from the
working tree (in a child
process, through a package overlay), then checks this code against it in the same run:

    .venv/bin/python bench/diagnose_golden.py --against 4a33186
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnose_scale import build_frame  # noqa: E402
from kvscope.diagnoser.engine import diagnose, sample_names  # noqa: E402
from kvscope.diagnoser.rule import read_rules  # noqa: E402
from kvscope.diagnoser.sources.recording import RecordingSource  # noqa: E402

LIBRARY = Path(__file__).resolve().parents[1] / "tests" / "recordings"
FLEETS = ((50, 1.0), (120, 6.0))
"""(engines, hours) of the synthetic fleets: a short window and one with the KV-pressure episodes."""


ENGINE_FILES = ("engine.py", "expr.py", "grid.py", "conditions.py", "frame.py", "findings.py")
"""The evaluation engine: what --against takes from the old revision (rules, sources and the
rest of diagnoser/ come from the working tree, so only the engine differs)."""


def collect_diagnoses() -> dict[str, dict]:
    """Diagnosis JSON (as a dict) per case name: recordings first, then synthetic fleets."""
    rules = read_rules()
    names = set().union(*(sample_names(r) for r in rules))
    out: dict[str, dict] = {}
    for path in sorted(LIBRARY.glob("*.om.gz")):
        source = RecordingSource(path)
        frame = source.read_frame(names, None, None, source.natural_step())
        out[path.name] = diagnose(frame, rules, source=source.description, workers=1).to_dict()
    for engines, hours in FLEETS:
        frame = build_frame(engines, hours, 15.0)
        out[f"fleet-{engines}x{hours:g}h"] = diagnose(frame, rules, time_scale=1.0, source="bench",
                                                      workers=1).to_dict()
    return out


def compare(old: dict[str, dict], new: dict[str, dict], context: int = 3) -> list[str]:
    """Human-readable differences between two dumps (empty when identical)."""
    problems = []
    for name in sorted(set(old) | set(new)):
        if name not in new or name not in old:
            problems.append(f"{name}: only in {'the dump' if name in old else 'this run'}")
            continue
        a = json.dumps(old[name], indent=1, sort_keys=True).splitlines()
        b = json.dumps(new[name], indent=1, sort_keys=True).splitlines()
        if a != b:
            diff = list(difflib.unified_diff(a, b, "dump", "now", n=context, lineterm=""))
            problems.append(f"{name}: differs\n" + "\n".join(diff[:60]))
    return problems


@contextlib.contextmanager
def engine_at_revision(rev: str) -> Iterator[dict[str, str]]:
    """Environment for a child Python that imports kvscope with `rev`'s ENGINE_FILES and the rest
    from the working tree (a package overlay of symlinks on PYTHONPATH, ahead of the editable
    install); removed afterwards."""
    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-engine-"))
    try:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, "diagnoser"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        pkg = tmp / "overlay" / "kvscope"
        pkg.mkdir(parents=True)
        for item in (root / "kvscope").iterdir():
            if item.name != "__pycache__":
                (pkg / item.name).symlink_to(item)
        for sub in ("agent", "dashboards", "rules", "ui"):
            (pkg / sub).symlink_to(root / sub)
        (pkg / "diagnoser").mkdir()
        for item in (root / "diagnoser").iterdir():
            old = tmp / "diagnoser" / item.name
            if item.name != "__pycache__":
                (pkg / "diagnoser" / item.name).symlink_to(old if item.name in ENGINE_FILES else item)
        yield {**os.environ, "PYTHONPATH": str(tmp / "overlay")}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def dump_at_revision(rev: str, out: Path) -> None:
    """Write the dump of `rev`'s engine files with the rest of the working tree (child process)."""
    with engine_at_revision(rev) as env:
        subprocess.run([sys.executable, __file__, "--write", str(out)], check=True, env=env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE", help="write the diagnoses of this code to FILE")
    mode.add_argument("--check", metavar="FILE", help="compare this code's diagnoses with FILE")
    mode.add_argument("--against", metavar="REV", help="dump with REV's engine files, then check this code")
    args = ap.parse_args()
    if args.against:
        args.check = f"/tmp/kvscope-golden-{args.against}.json"
        dump_at_revision(args.against, Path(args.check))
    t0 = time.perf_counter()
    now = collect_diagnoses()
    took = time.perf_counter() - t0
    findings = sum(len(d["competing"]) + len(d["other"]) + (d["likely_cause"] is not None)
                   for d in now.values())
    if args.write:
        Path(args.write).write_text(json.dumps(now, indent=1, sort_keys=True))
        import kvscope.diagnoser
        print(f"wrote {len(now)} diagnoses ({findings} findings) to {args.write} in {took:.1f} s "
              f"(diagnoser from {Path(kvscope.diagnoser.__file__).parent})")
        return 0
    problems = compare(json.loads(Path(args.check).read_text()), now)
    for p in problems:
        print(p)
    print(f"{len(now)} diagnoses, {findings} findings: "
          f"{'IDENTICAL' if not problems else f'{len(problems)} DIFFER'} ({took:.1f} s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
