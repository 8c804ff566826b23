"""Benchmark driver: one of this checkout's benches, timed on this code and on another commit's.

    .venv/bin/python bench/against.py 3cea3a5 --figure 'diagnose=diagnose +([0-9.]+) s' -- \\
        bench/diagnose_fleet.py --victoria 1000x6 --repeat 5

REF is checked out at $KVSCOPE_BENCH_CACHE/tree-<commit> (kept between runs) with a virtual
environment that imports kvscope from that checkout and every dependency from this checkout's
.venv, so both trees run on the same pinned libraries. The bench then runs `--rounds` times on
each tree, the two alternating and the first of each round swapped, with KVSCOPE_BENCH_TREE naming
REF's checkout for REF's runs: the fleet benches (diagnose_fleet, ui_fleet, webhook_fleet,
report_weekly_fleet) then time REF's commands and UI, with the records of REF's rule files, on
the same data, harness and baselines as this checkout's runs. Each `--figure NAME=REGEX` is read
from every run's output (the last match of its one group, a number of seconds); the figures'
medians per tree and this checkout's over REF's are printed at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("KVSCOPE_BENCH_CACHE", "/tmp/kvscope-bench-fleet3"))
FINDER = "__editable___kvscope_0_1_0_finder.py"
"""This checkout's editable install maps each `kvscope.*` package onto its folder; REF's copy maps
them onto REF's folders."""


def checkout(ref: str) -> Path:
    """REF's tree with a .venv whose `kvscope` and `python` run REF's code on this checkout's
    dependencies (built once)."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = CACHE / f"tree-{commit[:12]}"
    venv = tree / ".venv"
    if (venv / "bin" / "kvscope").exists():
        return tree
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True)
    ours = next((ROOT / ".venv" / "lib").glob("python3.*/site-packages"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True)
    site = venv / "lib" / ours.parent.name / "site-packages"
    (site / "kvscope-deps.pth").write_text(f"{ours}\n")
    (site / FINDER).write_text((ours / FINDER).read_text().replace(f"'{ROOT}/", f"'{tree}/"))
    (site / "__editable__.kvscope-0.1.0.pth").write_text((ours / "__editable__.kvscope-0.1.0.pth").read_text())
    script = venv / "bin" / "kvscope"
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom kvscope.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return tree


def run(name: str, tree: Path | None, bench: list[str]) -> str:
    """One run of the bench, its output echoed line by line with the tree's name before it."""
    env = dict(os.environ)
    env.pop("KVSCOPE_BENCH_TREE", None)
    if tree is not None:
        env["KVSCOPE_BENCH_TREE"] = str(tree)
    proc = subprocess.Popen(
        [sys.executable, *bench], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        print(f"[{name}] {line}", end="", flush=True)
    if proc.wait() != 0:
        print(f"[{name}] the bench exited {proc.returncode}", flush=True)
    return "".join(lines)


def figure(pattern: re.Pattern, out: str) -> float | None:
    found = pattern.findall(out)
    return float(found[-1]) if found else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ref", help="the commit to time against (the code before a change)")
    ap.add_argument("--rounds", type=int, default=1, help="runs on each tree")
    ap.add_argument(
        "--figure", action="append", default=[], metavar="NAME=REGEX", help="a number to read from each run's output"
    )
    ap.usage = "%(prog)s REF [--rounds N] [--figure NAME=REGEX ...] -- BENCH.py [ITS ARGUMENTS]"
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, bench = ap.parse_args(argv[:cut]), argv[cut + 1 :]
    if not bench:
        ap.error("name the bench after --")
    figures = {}
    for spec in args.figure:
        name, sep, regex = spec.partition("=")
        if not sep or re.compile(regex).groups != 1:
            ap.error(f"--figure {spec!r}: expected NAME=REGEX with one group")
        figures[name] = re.compile(regex)
    ref = checkout(args.ref)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    names = {"ref": f"{args.ref}", "head": f"this checkout ({head.stdout.strip()})"}
    got: dict[str, dict[str, list[float]]] = {k: {f: [] for f in figures} for k in names}
    for i in range(max(1, args.rounds)):
        for side in ("ref", "head") if i % 2 == 0 else ("head", "ref"):
            out = run(names[side], ref if side == "ref" else None, bench)
            for name, pattern in figures.items():
                value = figure(pattern, out)
                if value is None:
                    print(f"[{names[side]}] no {name} figure in the output", flush=True)
                else:
                    got[side][name].append(value)
    print(f"\n{' '.join(bench)}: {names['head']} against {names['ref']}, {max(1, args.rounds)} round(s)")
    for name in figures:
        ref_runs, head_runs = got["ref"][name], got["head"][name]
        if not ref_runs or not head_runs:
            print(f"  {name}: not read on both trees (ref {ref_runs}, head {head_runs})")
            continue
        a, b = statistics.median(ref_runs), statistics.median(head_runs)
        print(
            f"  {name}: {names['ref']} {a:.2f} s {ref_runs}, this checkout {b:.2f} s {head_runs}: "
            f"this / ref {b / a:.2f}x"
        )


if __name__ == "__main__":
    main()
