"""Correctness guard for diagnoser work: the same inputs diagnosed by two versions of the code.

Diagnoses every recording of the incident library (tests/recordings/*.om.gz) and the synthetic
fleet of bench/diagnose_scale.py at two smaller sizes, and dumps their JSON (findings with
evidence values, scores, onsets, skipped rules and reasons). Two dumps are compared input by
input: each is `identical` or `differs`, and a difference is told finding by finding (rule,
place, onset as seconds into the window, the evidence whose value moved), not as a JSON diff;
changes only to descriptive fields (summary, levers, series text, a field a revision added) are
counted per input (`differs in text only`) and listed with `--verbose`.

    .venv/bin/python bench/diagnose_golden.py --write /tmp/golden.json   # this code's dump
    .venv/bin/python bench/diagnose_golden.py --check /tmp/golden.json   # this code against it
    .venv/bin/python bench/diagnose_golden.py --against 6ca33c5          # a git revision against it
    .venv/bin/python bench/diagnose_golden.py --against 6ca33c5 --new HEAD   # two commits

`--against REV` extracts REV (`git archive`) into a temporary directory, lays it out as the
`kvscope` package the way REV's pyproject.toml `package-dir` maps the top-level directories
(symlinks, nothing installed), and runs this script's `--write` in a child Python with that
package first on PYTHONPATH: REV's whole diagnoser, rules and agent code, fed the inputs of the
working tree (recordings, and the fleet generator of bench/diagnose_scale.py). Then it
diagnoses the same inputs with the working tree (or, with `--new REV2`, with a second revision
extracted the same way) and compares. The directories are removed after.

Exit status: 0 every input identical, 1 some differ, 2 error (bad revision, the other code
failed to import or run, unreadable dump).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "tests" / "recordings"
FLEETS = ((50, 1.0), (120, 6.0))
"""(engines, hours) of the synthetic fleets: a short window and one with the KV-pressure episodes."""

EXPECT_ENV = "KVSCOPE_GOLDEN_EXPECT"
"""Set for the child: the directory its `kvscope.diagnoser` must be imported from."""

ROLES = ("likely_cause", "competing", "other")
EVIDENCE_SHOWN = 6
"""At most this many changed evidence values are printed per finding."""
VERDICT_FIELDS = ("since", "until", "active", "severity", "score", "step_s", "cascade")
"""Fields of a finding that are its verdict; the others (title, summary, levers, params, ...) describe it."""
EVIDENCE_NUMBERS = ("value", "at", "threshold", "op")
"""Fields of an evidence entry that are numbers of the finding; series text, unit, ... describe them."""
TEXT_ONLY = "text only, "
"""Start of the line that sums up changes to descriptive fields only."""


# --- the dump --------------------------------------------------------------------------------


def case_names() -> list[str]:
    """Names of the inputs, in dump order: recordings first, then synthetic fleets."""
    return [p.name for p in sorted(LIBRARY.glob("*.om.gz"))] + [
        f"fleet-{engines}x{hours:g}h" for engines, hours in FLEETS
    ]


def collect_diagnoses(label: str) -> dict[str, dict]:
    """Diagnosis JSON (as a dict) per input, diagnosed by whichever `kvscope` is imported."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from diagnose_scale import build_frame

    from kvscope.diagnoser.sources.recording import RecordingSource

    try:
        from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
        from kvscope.diagnoser.rulebook.rule import read_rules
    except ImportError:  # a revision before the per-stage layout (diagnoser/engine.py, rule.py)
        from kvscope.diagnoser.engine import diagnose, sample_names  # type: ignore[no-redef]
        from kvscope.diagnoser.rule import read_rules  # type: ignore[no-redef]

    rules = read_rules()
    names = set().union(*(sample_names(r) for r in rules))
    # One thread where the engine can run rules side by side (older revisions cannot).
    serial = {"workers": 1} if "workers" in inspect.signature(diagnose).parameters else {}
    out: dict[str, dict] = {}
    recordings = sorted(LIBRARY.glob("*.om.gz"))
    with tqdm(total=len(recordings) + len(FLEETS), desc=label, unit="input", file=sys.stderr) as bar:
        for path in recordings:
            source = RecordingSource(path)
            frame = source.read_frame(names, None, None, source.natural_step())
            out[path.name] = diagnose(frame, rules, source=source.description, **serial).to_dict()
            bar.update()
        for engines, hours in FLEETS:
            frame = build_frame(engines, hours, 15.0)
            out[f"fleet-{engines}x{hours:g}h"] = diagnose(
                frame, rules, time_scale=1.0, source="bench", **serial
            ).to_dict()
            bar.update()
    return out


def check_import_root() -> str:
    """Directory `kvscope.diagnoser` was imported from; in the child, fail unless it is REV's."""
    import kvscope.diagnoser

    where = Path(kvscope.diagnoser.__file__).resolve().parent
    expect = os.environ.get(EXPECT_ENV)
    if expect and not where.is_relative_to(Path(expect).resolve()):
        raise RuntimeError(f"kvscope.diagnoser was imported from {where}, not from {expect}")
    return str(where)


# --- the other revision ----------------------------------------------------------------------


def parse_package_dirs(pyproject: str) -> dict[str, str]:
    """`[tool.setuptools] package-dir` of a pyproject.toml text: package name -> directory."""
    table = tomllib.loads(pyproject).get("tool", {}).get("setuptools", {})
    dirs = dict(table.get("package-dir", {}))
    if "kvscope" not in dirs:
        dirs["kvscope"] = "kvscope"
    return dirs


def link_packages(tree: Path, dirs: dict[str, str], overlay: Path) -> None:
    """Make `overlay/kvscope` the package `dirs` describes, by symlinks into `tree`.

    The top package links to its directory; each mapped subpackage (`kvscope.agent` ->
    `agent`) becomes a link inside it (the tree is a throwaway copy, so it may be written).
    """
    for name in sorted(dirs, key=lambda n: n.count(".")):
        target = (tree / dirs[name]).resolve()
        if not target.is_dir():
            raise RuntimeError(f"package-dir maps {name} to {dirs[name]!r}, which the revision lacks")
        if name == "kvscope":
            (overlay / "kvscope").symlink_to(target, target_is_directory=True)
            continue
        parent, _, leaf = name.rpartition(".")
        link = overlay.joinpath(*parent.split(".")) / leaf
        if link.exists():
            raise RuntimeError(f"{name}: {link} already exists in the revision's tree")
        link.symlink_to(target, target_is_directory=True)


@contextlib.contextmanager
def revision_package(rev: str) -> Iterator[tuple[dict[str, str], Path]]:
    """Environment for a child Python whose `kvscope` is revision `rev`, and REV's root.

    Extracts the revision with `git archive` into a temporary directory (removed afterwards)
    and builds the package layout from that revision's pyproject.toml.
    """
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-golden-"))
    try:
        tree, overlay = tmp / "tree", tmp / "overlay"
        tree.mkdir()
        overlay.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True)
        if archive.returncode:
            raise RuntimeError(f"git archive {rev}: {archive.stderr.decode(errors='replace').strip()}")
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        link_packages(tree, parse_package_dirs((tree / "pyproject.toml").read_text()), overlay)
        path = os.pathsep.join(p for p in (str(overlay), os.environ.get("PYTHONPATH", "")) if p)
        yield {**os.environ, "PYTHONPATH": path, EXPECT_ENV: str(tree), "PYTHONDONTWRITEBYTECODE": "1"}, tree
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def engine_at_revision(rev: str) -> Iterator[dict[str, str]]:
    """Environment for a child Python that imports `kvscope` from revision `rev` (all of it:
    engine, rules, sources; removed afterwards). Used by bench/diagnose_scale.py --against."""
    with revision_package(rev) as (env, _tree):
        yield env


def dump_at_revision(rev: str, out: Path) -> None:
    """Write `rev`'s diagnoses of the working tree's inputs to `out` (child process)."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", f"{rev}^{{commit}}"], capture_output=True, text=True
    )
    if commit.returncode:
        raise RuntimeError(f"unknown revision {rev!r}: {commit.stderr.strip()}")
    with revision_package(rev) as (env, _tree):
        child = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--write", str(out), "--label", commit.stdout.strip()],
            env=env,
        )
        if child.returncode:
            raise RuntimeError(f"diagnosing with {rev} failed (exit {child.returncode}; see above)")


# --- the comparison (pure) -------------------------------------------------------------------


def parse_findings(diagnosis: dict[str, Any]) -> dict[tuple, tuple[str, dict]]:
    """Findings of one diagnosis keyed by (rule_id, place, n): role and finding.

    `n` tells apart two findings of the same rule at the same place (0 for the first).
    """
    out: dict[tuple, tuple[str, dict]] = {}
    lc = diagnosis.get("likely_cause")
    ranked = [("likely_cause", lc)] if lc else []
    ranked += [(role, f) for role in ROLES[1:] for f in diagnosis.get(role) or ()]
    for role, f in ranked:
        place = tuple(sorted((f.get("where") or {}).items()))
        n = 0
        while (f["rule_id"], place, n) in out:
            n += 1
        out[f["rule_id"], place, n] = (role, f)
    return out


def describe_key(key: tuple, finding: dict) -> str:
    """`P3 hit_collapse_after_scaling {instance=a:8000}` for a finding key."""
    rule_id, place, n = key
    where = ",".join(f"{k}={v}" for k, v in place)
    row = finding.get("levers_md") or "?"
    return f"{row} {rule_id} {{{where}}}" + (f" #{n + 1}" if n else "")


def _offset(t: Any, window_start: float) -> str:
    return f"{t - window_start:+.1f} s" if isinstance(t, int | float) else str(t).lower()


class _Absent:
    """A field one side does not have (a field added with a null is still a change)."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT = _Absent()


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def describe_change(old: Any, new: Any, keep: int = 24) -> str:
    """`old -> new`; two long strings (series expressions) are cut to the part that differs,
    with `keep` characters of context on each side."""
    if not (isinstance(old, str) and isinstance(new, str)) or max(len(old), len(new)) <= 80:
        return f"{_num(old)} -> {_num(new)}"
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    start = max(0, head - keep)

    def cut(text: str) -> str:
        end = min(len(text), len(text) - tail + keep)
        return ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")

    return f"{cut(old)} -> {cut(new)}"


def compare_evidence(
    old: list[dict], new: list[dict], old_start: float = 0.0, new_start: float = 0.0, verbose: bool = False
) -> tuple[list[str], Counter]:
    """Evidence entries whose numbers (value, read time, threshold, op) changed, added or gone.

    Read times are told as seconds into each side's window. Other fields (the series text, unit,
    fields a revision added) are descriptive: listed too when `verbose`, else only counted in
    the returned tally ("evidence series": 3).
    """
    a = {e["name"]: e for e in old}
    b = {e["name"]: e for e in new}
    lines, tally = [], Counter()
    for name in list(a) + [n for n in b if n not in a]:
        if name not in b:
            lines.append(f"evidence {name}: only in old ({_num(a[name].get('value'))})")
        elif name not in a:
            lines.append(f"evidence {name}: only in new ({_num(b[name].get('value'))})")
        elif a[name] != b[name]:
            x, y = a[name], b[name]
            rest = sorted((set(x) | set(y)) - {"name", *EVIDENCE_NUMBERS})
            numbers = [k for k in EVIDENCE_NUMBERS if x.get(k, ABSENT) != y.get(k, ABSENT)]
            wording = [k for k in rest if x.get(k, ABSENT) != y.get(k, ABSENT)]
            shown = numbers + (wording if verbose else [])
            tally.update(() if verbose else (f"evidence {k}" for k in wording))
            if shown:
                lines.append(
                    f"evidence {name}: "
                    + ", ".join(
                        f"at {_offset(x.get(k, ABSENT), old_start)} -> {_offset(y.get(k, ABSENT), new_start)}"
                        if k == "at"
                        else f"{k} {describe_change(x.get(k, ABSENT), y.get(k, ABSENT))}"
                        for k in shown
                    )
                )
    if len(lines) > EVIDENCE_SHOWN:
        lines = lines[:EVIDENCE_SHOWN] + [f"... and {len(lines) - EVIDENCE_SHOWN} more evidence changes"]
    return lines, tally


def compare_finding(
    old: dict, new: dict, old_role: str, new_role: str, old_start: float, new_start: float, verbose: bool = False
) -> tuple[list[str], Counter]:
    """What changed in one finding present on both sides: lines for its verdict (rank, onset,
    end, severity, score, cascade, evidence numbers) and a tally of descriptive fields (summary,
    levers, params, series text) that changed, listed as lines instead when `verbose`."""
    lines = []
    if old_role != new_role:
        lines.append(f"ranked {old_role} -> {new_role}")
    for key in VERDICT_FIELDS:
        a, b = old.get(key, ABSENT), new.get(key, ABSENT)
        if a == b:
            continue
        if key in ("since", "until"):
            lines.append(f"{key} {_offset(a, old_start)} -> {_offset(b, new_start)}")
        elif isinstance(a, dict) and isinstance(b, dict):
            lines.append(
                f"{key}: "
                + ", ".join(
                    f"{k} {_num(a.get(k, ABSENT))} -> {_num(b.get(k, ABSENT))}"
                    for k in sorted(set(a) | set(b))
                    if a.get(k, ABSENT) != b.get(k, ABSENT)
                )
            )
        else:
            lines.append(f"{key} {_num(a)} -> {_num(b)}")
    ev_lines, tally = compare_evidence(
        old.get("evidence") or [], new.get("evidence") or [], old_start, new_start, verbose
    )
    lines += ev_lines
    rest = sorted(
        k
        for k in set(old) | set(new)
        if k not in {*VERDICT_FIELDS, "evidence"} and old.get(k, ABSENT) != new.get(k, ABSENT)
    )
    if verbose and rest:
        lines.append("also changed: " + ", ".join(rest))
    elif rest:
        tally.update(rest)
    return lines, tally


def compare_diagnosis(old: dict, new: dict, verbose: bool = False) -> list[str]:
    """Readable differences between two diagnoses of the same input (empty when identical).

    Changes to what a finding says (onset, rank, evidence numbers, findings added or gone,
    skipped rules) are listed finding by finding; changes only to descriptive fields are
    summed up in one line starting with TEXT_ONLY (all listed when `verbose`).
    """
    if old == new:
        return []
    old_start, new_start = (d.get("window", [0.0])[0] for d in (old, new))
    a, b = parse_findings(old), parse_findings(new)
    lines, tally, touched = [], Counter(), 0
    for key in list(a) + [k for k in b if k not in a]:
        if key not in b:
            role, f = a[key]
            lines.append(f"- only in old: {describe_key(key, f)} ({role}, since {_offset(f.get('since'), old_start)})")
        elif key not in a:
            role, f = b[key]
            lines.append(f"+ only in new: {describe_key(key, f)} ({role}, since {_offset(f.get('since'), new_start)})")
        elif a[key] != b[key]:
            changes, wording = compare_finding(
                a[key][1], b[key][1], a[key][0], b[key][0], old_start, new_start, verbose
            )
            tally += wording
            touched += bool(wording)
            if changes:
                lines.append(f"~ {describe_key(key, b[key][1])}:")
                lines += [f"    {c}" for c in changes]
    lines += _compare_skipped(old.get("skipped") or [], new.get("skipped") or [])
    rest = sorted(
        k for k in set(old) | set(new) if k not in {*ROLES, "skipped"} and old.get(k, ABSENT) != new.get(k, ABSENT)
    )
    for k in rest:
        lines.append(f"{k}: {_num(old.get(k, ABSENT))} -> {_num(new.get(k, ABSENT))}")
    if tally:
        lines.append(
            f"{TEXT_ONLY}{touched} finding(s): "
            + ", ".join(f"{k} x{n}" for k, n in sorted(tally.items(), key=lambda kv: (-kv[1], kv[0])))
            + " (--verbose lists them)"
        )
    if not lines:  # same findings, same fields: only the order within a role moved
        lines.append("findings reordered within competing/other")
    return lines


def _compare_skipped(old: list[dict], new: list[dict]) -> list[str]:
    a = {s["rule_id"]: s.get("reason", "") for s in old}
    b = {s["rule_id"]: s.get("reason", "") for s in new}
    lines = [f"- skipped only in old: {r} ({a[r]})" for r in a if r not in b]
    lines += [f"+ skipped only in new: {r} ({b[r]})" for r in b if r not in a]
    lines += [f"~ skipped {r}: reason {a[r]!r} -> {b[r]!r}" for r in a if r in b and a[r] != b[r]]
    return lines


def compare(old: dict[str, dict], new: dict[str, dict], verbose: bool = False) -> dict[str, list[str]]:
    """Per input name: its differences (an empty list = identical)."""
    out = {}
    for name in list(old) + [n for n in new if n not in old]:
        if name not in new:
            out[name] = ["input only in the old dump"]
        elif name not in old:
            out[name] = ["input only in the new dump"]
        else:
            out[name] = compare_diagnosis(old[name], new[name], verbose)
    return out


def text_only(diffs: list[str]) -> bool:
    """Whether an input's differences are all in descriptive fields (its findings say the same)."""
    return bool(diffs) and all(d.startswith(TEXT_ONLY) for d in diffs)


def render_comparison(result: dict[str, list[str]], old_label: str, new_label: str) -> str:
    """One line per input (identical / differs / differs in text only), each difference
    indented under it, and a total."""
    lines = [f"old = {old_label}, new = {new_label}"]
    for name, diffs in result.items():
        status = "identical" if not diffs else "differs in text only" if text_only(diffs) else "differs"
        lines.append(f"{name}: {status}")
        lines += [f"  {d}" for d in diffs]
    wording = sum(1 for d in result.values() if text_only(d))
    findings = sum(1 for d in result.values() if d) - wording
    same = len(result) - findings - wording
    lines.append(
        f"{len(result)} inputs: "
        + (
            "all IDENTICAL"
            if same == len(result)
            else f"{findings} DIFFER in findings, {wording} in text only, {same} identical"
        )
    )
    return "\n".join(lines)


def count_findings(dump: dict[str, dict]) -> int:
    """Findings in a whole dump (likely cause, competing and other of every input)."""
    return sum(
        len(d.get("competing") or ()) + len(d.get("other") or ()) + (d.get("likely_cause") is not None)
        for d in dump.values()
    )


# --- the command -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """The chosen mode; raises on errors (main turns them into exit status 2)."""
    if args.write:
        where = check_import_root()
        t0 = time.perf_counter()
        dump = collect_diagnoses(args.label or "this tree")
        Path(args.write).write_text(json.dumps(dump, indent=1, sort_keys=True))
        print(
            f"wrote {len(dump)} diagnoses ({count_findings(dump)} findings) to {args.write} in "
            f"{time.perf_counter() - t0:.1f} s (diagnoser from {where})",
            file=sys.stderr,
        )
        return 0
    if args.against:
        old, old_label = read_revision_dump(args.against), f"revision {args.against}"
    else:
        old, old_label = json.loads(Path(args.check).read_text()), f"dump {args.check}"
    t0 = time.perf_counter()
    if args.new:
        new, new_label = read_revision_dump(args.new), f"revision {args.new}"
    else:
        new, new_label = collect_diagnoses("working tree"), f"working tree ({check_import_root()})"
    took = time.perf_counter() - t0
    result = compare(old, new, args.verbose)
    print(render_comparison(result, old_label, new_label))
    print(f"{count_findings(old)} findings old, {count_findings(new)} new; the new side took {took:.1f} s")
    return 1 if any(result.values()) else 0


def read_revision_dump(rev: str) -> dict[str, dict]:
    """`rev`'s diagnoses of the working tree's inputs (through a child process and a temporary file)."""
    with tempfile.TemporaryDirectory(prefix="kvscope-golden-dump-") as tmp:
        dump_at_revision(rev, Path(tmp) / "dump.json")
        return json.loads((Path(tmp) / "dump.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE", help="write the diagnoses of the imported kvscope to FILE")
    mode.add_argument("--check", metavar="FILE", help="compare the working tree's diagnoses with FILE")
    mode.add_argument(
        "--against",
        metavar="REV",
        help="diagnose with git revision REV (extracted to a temporary directory), "
        "then with the working tree, and compare",
    )
    ap.add_argument(
        "--new",
        metavar="REV",
        help="with --against/--check: the new side is git revision REV instead of the working "
        "tree (compares two commits, unaffected by uncommitted edits)",
    )
    ap.add_argument(
        "--verbose",
        action="store_true",
        help="list changes to descriptive fields (summary, levers, series text) finding by "
        "finding instead of counting them",
    )
    ap.add_argument("--label", help="progress bar label (set for the child of --against)")
    args = ap.parse_args()
    if args.new and args.write:
        ap.error("--new compares; use it with --against or --check")
    try:
        return run(args)
    except (RuntimeError, OSError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
