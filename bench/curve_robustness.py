"""The curve's change verdicts and knee on real vLLM recordings of moving load (issue 55).

Each `curve-shape-*` recording (testbed/curve_record.py) is one engine through four phases that
replay the same load shape, restarted between them: roomy -> roomy (same flags) -> tiny KV ->
roomy. Its YAML holds the verdict expected of each change, written before the run
(`expected_curve`), and the engine's own truths per phase and per segment. Per recording and per
scrape interval (the native 2 s, and resampled to 15 and 30 s with testbed/recording_variants.py)
the cells are:

* one per change (same-restart: no_change, regression, improvement): `kvscope curve` over the
  window from the start of the phase before to the end of the phase after, the verdict of the
  change found between the two phases;
* the control: the first phase alone (no restart, no config change): no change may be judged a
  regression or an improvement.

A cell is right, abstained (not_comparable, or the change was not found) or wrong: a regression
or improvement where the truth differs, or no_change where the engine's own TTFT p99 moved beyond
the thresholds the curve judges with (`compare.Thresholds`) at matched load (the segments of the
same load in both phases, their weighted mean). A no_change where the engine's truth stayed
within the thresholds is right. A same-flags restart whose engine truth itself moved beyond the
thresholds (the shared box's load moved between the phases) and that kvscope judged as the
engine moved is `unheld`: the run did not hold its truth, counted apart from right and wrong.
Verdicts judged on other changes inside a change window (a `curve` shift within a phase) are
counted as spurious. The abstentions where the truth is a regression or improvement are also
counted by the shorter side's length in scrape intervals (the after side less the 30 s the curve
leaves a restarted engine to warm up): a 40 s side scraped every 15 or 30 s holds no interval
after that, which no estimate can decide on. The knee: `curve-vllm-max-num-seqs` (levels of 20 s) and
`-long` (90 s), whose saturation level is computed from the recorder's own numbers
(testbed/curve_record.py); right when the knee lies within the in-flight means of that level and
the ones before and after it (the lowest to the highest of the three), placed by a sign. With
`--seeds`, every cell is judged again at each bootstrap seed (the product's is fixed), and the
cells whose outcome moves with the seed are listed: a verdict only some replicates give. Where a
change is `not_comparable`, the traffic kvscope says would decide it ("to decide it: ...", the
CLI's words) is shown with `--detail`, and the totals count the abstentions on a real change that
say it.

    .venv/bin/python bench/curve_robustness.py [--only NAME ...] [--scrapes 2 15 30] [--detail] [--seeds N ...]
    .venv/bin/python bench/curve_robustness.py --asked 70 [--only NAME ...]  # 70 s sides, then given the ask
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvscope.diagnoser.curve import bootstrap
from kvscope.diagnoser.curve.compare import Thresholds
from kvscope.diagnoser.curve.operating import PLACING
from kvscope.diagnoser.curve.report import ENGINE_VERDICTS, SETTLE_S, change_notes, pool_curves
from kvscope.diagnoser.curve.window import read_window
from kvscope.diagnoser.sources.recording import RecordingSource

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from testbed.curve_record import saturation_level  # noqa: E402
from testbed.recording_variants import read_variant_source, resample, write_recording  # noqa: E402

RECORDINGS = REPO / "tests" / "recordings"
KNEE = "curve-vllm-max-num-seqs"  # and its -long twin: the knee recordings' prefix
SIDES = ((1, 9), (10, 19), (20, None))
"""The abstentions are counted apart by the shorter side's length in scrape intervals."""
CHANGE_NAMES = {"no_change": "same-restart", "regression": "regression", "improvement": "improvement"}


@dataclass
class Cell:
    recording: str
    scrape_s: float
    change: str  # same-restart | regression | improvement | control | knee
    truth: str
    got: str
    outcome: str  # right | abstained | wrong | unheld
    truth_shift: str = ""
    spurious: int = 0
    note: str = ""
    side_intervals: int = 0  # the shorter side (the after side less the settle time) in scrape intervals
    to_decide: str = ""  # where kvscope abstained: the traffic it says would decide it, in its own words


def _meta(name: str) -> dict:
    return yaml.safe_load((RECORDINGS / f"{name}.yaml").read_text())


def load_key(seg: dict) -> tuple:
    return (seg.get("streams"), seg.get("rate_per_s"))


def truth_shift(before: dict, after: dict) -> tuple[float | None, float | None]:
    """(relative, absolute) shift of the engine's own TTFT p99 from `before` to `after` at matched
    load: over the segments of the same load in both phases (the phases themselves where they have
    no segments), weighted by the shorter side's seconds as the curve weighs its matched buckets by
    the smaller side's intervals."""
    b_by = {load_key(s): s for s in before.get("segments", [before])}
    pairs = [(b_by[load_key(s)], s) for s in after.get("segments", [after]) if load_key(s) in b_by]
    w, vb, va = [], [], []
    for b, a in pairs:
        if b.get("engine_ttft_p99_s") is not None and a.get("engine_ttft_p99_s") is not None:
            w.append(min(b["end_s"] - b["start_s"], a["end_s"] - a["start_s"]))
            vb.append(b["engine_ttft_p99_s"])
            va.append(a["engine_ttft_p99_s"])
    if not w or sum(w) <= 0:
        return None, None
    mb = sum(x * y for x, y in zip(w, vb, strict=True)) / sum(w)
    ma = sum(x * y for x, y in zip(w, va, strict=True)) / sum(w)
    return (ma / mb - 1.0 if mb else None), ma - mb


def beyond(rel: float | None, delta: float | None, th: Thresholds) -> str | None:
    """The verdict the engine's truth alone gives on TTFT p99 (None: not read)."""
    if rel is None or delta is None:
        return None
    if rel > th.relative and delta > th.ttft_p99_s:
        return "regression"
    if rel < -th.relative and -delta > th.ttft_p99_s:
        return "improvement"
    return "no_change"


def classify(truth: str, got: str, engine_truth: str | None) -> str:
    """right | abstained | wrong against the truth written before the run; `unheld` where the
    run did not hold that truth (a same-flags restart whose engine's own TTFT p99 moved beyond the
    thresholds: the shared box's load moved) and kvscope agreed with the engine instead."""
    if got in ("not_comparable", "missed"):
        return "abstained"
    if got == truth:
        return "right"
    if truth in ENGINE_VERDICTS and got == "no_change" and engine_truth in ("no_change", None):
        return "right"  # the engine itself moved less than the thresholds: no_change is true
    if truth == "no_change" and got == engine_truth:
        return "unheld"
    return "wrong"


def _judged(source: RecordingSource, start: float, end: float) -> list:
    return [j for pc in pool_curves(read_window(source, start, end, source.natural_step())) for j in pc.changes]


def _sides(meta: dict, want: dict) -> tuple[dict, dict]:
    """The phases before and after the change `want` (an `expected_curve` entry)."""
    phases = meta["phases"]
    i = [p["name"] for p in phases].index(want["after_phase"])
    return phases[i - 1], phases[i]


def _at_change(source: RecordingSource, t0: float, before: dict, after: dict, start: float, end: float) -> tuple:
    """(the judged change found between the two phases or None, every change judged over start..end)."""
    step = source.natural_step()
    judged = _judged(source, start, end)
    lo, hi = t0 + before["end_s"] - step, t0 + after["start_s"] + 2 * step
    at = [j for j in judged if lo <= j.change.time <= hi]
    at.sort(key=lambda j: j.change.kind == "curve")  # a restart or config event over a curve shift
    return (at[0] if at else None), judged


def change_cells(name: str, meta: dict, source: RecordingSource, scrape_s: float, th: Thresholds) -> list[Cell]:
    t0 = meta["recorded_at_unix"]
    phases = meta["phases"]
    cells = []
    for want in meta["expected_curve"]["changes"]:
        before, after = _sides(meta, want)
        found, judged = _at_change(source, t0, before, after, t0 + before["start_s"], t0 + after["end_s"])
        at = [found] if found else []
        got = at[0].verdict if at else "missed"
        spurious = sum(j.verdict in ENGINE_VERDICTS for j in judged if not at or j is not at[0])
        rel, delta = truth_shift(before, after)
        engine = beyond(rel, delta, th)
        shift = "" if rel is None else f"{rel:+.0%} ({delta:+.2f} s): {engine}"
        note = ", ".join(sorted(j.change.kind for j in at)) if at else ""
        said = change_notes(at[0]).partition("; to decide it: ")[2] if at and got == "not_comparable" else ""
        cells.append(
            Cell(
                name,
                scrape_s,
                CHANGE_NAMES[want["verdict"]],
                want["verdict"],
                got,
                classify(want["verdict"], got, engine),
                shift,
                spurious,
                note,
                int(min(before["end_s"] - before["start_s"], after["end_s"] - after["start_s"] - SETTLE_S) // scrape_s),
                said,
            )
        )
    first = phases[0]
    judged = _judged(source, t0 + first["start_s"], t0 + first["end_s"])
    engine = [j for j in judged if j.verdict in ENGINE_VERDICTS]
    got = ",".join(f"{j.change.kind}:{j.verdict}" for j in judged) or "no change"
    cells.append(Cell(name, scrape_s, "control", "no engine verdict", got, "wrong" if engine else "right"))
    return cells


def asked_rows(name: str, meta: dict, source: RecordingSource, scrape_s: float, th: Thresholds, side_s: float) -> list:
    """Whether the traffic an abstention asks for decides it: per change, judged over `side_s`
    seconds of each phase next to it; where that is `not_comparable` and says how much more traffic
    each side needs, judged again with each side widened by that much (within its phase): the wall
    time at the side's mix of load where the ask says it (`more_wall_seconds`), else the seconds at
    the load asked.
    Rows: (recording, scrape, change, truth, first verdict, the ask, verdict given it, the outcome of
    the last verdict). The truth is the whole phases' (`truth_shift`): near the change the load
    differs from the phases' mix, so a real change's engine truth there is approximate."""
    t0 = meta["recorded_at_unix"]
    rows = []
    for want in meta["expected_curve"]["changes"]:
        before, after = _sides(meta, want)
        cut, start = t0 + before["end_s"], t0 + after["start_s"]
        found, _ = _at_change(source, t0, before, after, cut - side_s, start + side_s)
        first = found.verdict if found else "missed"
        ask = (found.more_traffic or [None])[0] if first == "not_comparable" else None
        # the wall time at the side's mix of load where said, else the seconds at the load asked
        more = [
            (ask[side].get("more_wall_seconds") or ask[side]["more_seconds"]) if ask else None
            for side in ("before", "after")
        ]
        engine = beyond(*truth_shift(before, after), th)
        if ask is None or None in more:
            outcome = classify(want["verdict"], first, engine)
            rows.append((name, scrape_s, CHANGE_NAMES[want["verdict"]], want["verdict"], first, "", "", outcome))
            continue
        lo = max(t0 + before["start_s"], cut - side_s - more[0])
        hi = min(t0 + after["end_s"], start + side_s + more[1])
        again, _ = _at_change(source, t0, before, after, lo, hi)
        got = again.verdict if again else "missed"
        said = f"+{more[0]:g} s before, +{more[1]:g} s after at {ask['concurrency']:g} in the engine"
        said += "" if (lo, hi) == (cut - side_s - more[0], start + side_s + more[1]) else " (cut to the phase)"
        rows.append((name, scrape_s, CHANGE_NAMES[want["verdict"]], want["verdict"], first, said, got,
                     classify(want["verdict"], got, engine)))  # fmt: skip
    return rows


def asked_table(rows: list) -> str:
    head = "| recording | scrape | cell | truth | over the short sides | asked | given it | outcome |"
    out = [head, "|" + "---|" * 8]
    out += ["| " + " | ".join(f"{x:g} s" if isinstance(x, float) else str(x) for x in r) + " |" for r in rows]
    asked = [r for r in rows if r[5]]
    n, first = Counter(r[7] for r in asked), Counter(r[7] for r in rows if not r[5])
    out.append(
        f"\nover the short sides: {first['right']} right, {len(asked) + first['abstained']} abstained "
        f"({len(asked)} with an ask), {first['wrong']} wrong; given the traffic asked: "
        f"{n['right']} right, {n['abstained']} abstained, {n['wrong']} wrong"
    )
    return "\n".join(out)


def knee_cell(name: str, meta: dict, source: RecordingSource, scrape_s: float) -> Cell:
    levels = meta["phases"]
    sat = saturation_level(levels)
    near = [lv["engine_in_flight_mean"] for lv in levels[sat - 1 : sat + 2]]  # a level's mean need not order them
    lo, hi = min(near), max(near)
    truth = f"{levels[sat]['name']}: {lo:.1f}..{hi:.1f}"
    (pc,) = pool_curves(read_window(source, None, None, source.natural_step()))
    op = pc.operating
    if op.knee_concurrency is None:
        return Cell(name, scrape_s, "knee", truth, "none", "abstained")
    got = f"{op.knee_concurrency:.1f} ({op.knee_sign})"
    ok = op.knee_sign in PLACING and lo <= op.knee_concurrency <= hi
    return Cell(name, scrape_s, "knee", truth, got, "right" if ok else "wrong")


def sources(name: str, scrapes: list[float], tmp: Path):
    """(scrape interval, source) per interval: the recording itself at its native interval, else
    resampled into `tmp`."""
    path = RECORDINGS / f"{name}.om.gz"
    native = RecordingSource(path).natural_step()
    rec = None
    for s in scrapes:
        if abs(s - native) < 0.5:
            yield s, RecordingSource(path)
            continue
        rec = rec or read_variant_source(path)
        out = tmp / f"{name}-{s:g}s.om"
        write_recording(resample(s, snap=True)(rec, {}), out)
        yield s, RecordingSource(out)


def run(names: list[str], scrapes: list[float], seeds: list[int]) -> dict[int, list[Cell]]:
    """The cells per bootstrap seed (the knee reads no bootstrap: the same at every seed)."""
    th = Thresholds()
    cells: dict[int, list[Cell]] = {seed: [] for seed in seeds}
    with tempfile.TemporaryDirectory(prefix="kvs-curve-bench-") as tmp:
        for name in names:
            meta = _meta(name)
            for s, source in sources(name, scrapes, Path(tmp)):
                for seed in seeds:
                    bootstrap.SEED = seed
                    if name.startswith(KNEE):
                        cells[seed].append(knee_cell(name, meta, source, s))
                    else:
                        cells[seed].extend(change_cells(name, meta, source, s, th))
    return cells


def over_seeds(cells: dict[int, list[Cell]]) -> str:
    """Each seed's totals, and the cells whose outcome moved with the seed: a verdict that only
    one seed's replicates give is the bootstrap's noise, not the data's."""
    out = [f"seed {seed}: " + totals(c).splitlines()[0].removeprefix("all: ") for seed, c in cells.items()]
    moved = [
        " / ".join(f"{c.got} ({c.outcome})" for c in row)
        + f": {row[0].recording.removeprefix('curve-shape-')} {row[0].scrape_s:g} s {row[0].change}"
        for row in zip(*cells.values(), strict=True)
        if len({c.outcome for c in row}) > 1
    ]
    wrong = sum(any(c.outcome == "wrong" for c in row) for row in zip(*cells.values(), strict=True))
    out.append(f"cells whose outcome moved with the seed: {len(moved)}; wrong at any seed: {wrong}")
    return "\n".join(out + [f"  {m}" for m in moved])


def table(cells: list[Cell]) -> str:
    head = "| recording | scrape | cell | truth | engine TTFT p99 shift at matched load | kvscope | outcome |"
    rows = [head, "|" + "---|" * 7]
    for c in cells:
        got = c.got + (f" ({c.note})" if c.note else "") + (f" +{c.spurious} spurious" if c.spurious else "")
        got += f"; to decide it: {c.to_decide}" if c.to_decide else ""
        short = c.recording.removeprefix("curve-shape-").removeprefix("curve-vllm-")
        rows.append(f"| {short} | {c.scrape_s:g} s | {c.change} | {c.truth} | {c.truth_shift} | {got} | {c.outcome} |")
    return "\n".join(rows)


def compact(cells: list[Cell]) -> str:
    """One row per recording and scrape, one column per cell: kvscope's verdict and its outcome;
    then the engine's own truth per change (the same at every scrape)."""
    cols = ["same-restart", "regression", "improvement", "control", "knee"]
    by: dict[tuple[str, float], dict[str, Cell]] = {}
    for c in cells:
        by.setdefault((c.recording, c.scrape_s), {})[c.change] = c
    used = [k for k in cols if any(k in row for row in by.values())]
    rows = ["| recording | scrape | " + " | ".join(used) + " |", "|" + "---|" * (2 + len(used))]
    for (rec, s), row in by.items():
        short = rec.removeprefix("curve-shape-").removeprefix("curve-vllm-")
        vals = [
            f"{row[k].got}{f' (truth {row[k].truth})' if k == 'knee' else ''} **{row[k].outcome}**" if k in row else ""
            for k in used
        ]
        rows.append(f"| {short} | {s:g} s | " + " | ".join(vals) + " |")
    truths = ["", "| recording | " + " | ".join(cols[:3]) + " |", "|" + "---|" * 4]
    for rec in dict.fromkeys(c.recording for c in cells if c.truth_shift):
        first = {c.change: c for c in cells if c.recording == rec and c.truth_shift}
        vals = [first[k].truth_shift if k in first else "" for k in cols[:3]]
        truths.append(f"| {rec.removeprefix('curve-shape-').removeprefix('curve-vllm-')} | " + " | ".join(vals) + " |")
    return "\n".join(rows + (truths if len(truths) > 3 else []))


def totals(cells: list[Cell]) -> str:
    out = []
    for label, pick in [("all", lambda c: True)] + [
        (f"{s:g} s", lambda c, s=s: c.scrape_s == s) for s in sorted({c.scrape_s for c in cells})
    ]:
        n = Counter(c.outcome for c in cells if pick(c))
        line = f"{label}: {n['right']} right, {n['abstained']} abstained, {n['wrong']} wrong"
        out.append(line + (f", {n['unheld']} unheld" if n["unheld"] else ""))
    engine = [c for c in cells if c.truth in ENGINE_VERDICTS and c.truth_shift.endswith(c.truth)]
    abst = sum(c.outcome == "abstained" for c in engine)
    out.append(
        f"abstained where the truth is a {'/'.join(ENGINE_VERDICTS)} beyond the thresholds: {abst} of {len(engine)}"
    )
    for lo, hi in SIDES:
        part = [c for c in engine if c.side_intervals >= lo and (hi is None or c.side_intervals <= hi)]
        span = f"{lo}-{hi}" if hi else f">= {lo}"
        n = sum(c.outcome == "abstained" for c in part)
        out.append(f"  of those, sides of {span} scrape intervals: {n} of {len(part)} abstained")
    missed = [c for c in engine if c.outcome == "abstained"]
    named = sum(bool(c.to_decide) for c in missed)
    out.append(f"  of the {len(missed)} abstentions, {named} say how much more traffic, at which load, decides them")
    out.append(f"spurious engine verdicts inside change windows: {sum(c.spurious for c in cells)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shapes = sorted(p.name.removesuffix(".yaml") for p in RECORDINGS.glob("curve-shape-*.yaml"))
    shapes += sorted(p.name.removesuffix(".yaml") for p in RECORDINGS.glob(f"{KNEE}*.yaml"))
    ap.add_argument("--only", nargs="+", help=f"recordings (default: {', '.join(shapes)})")
    ap.add_argument("--detail", action="store_true", help="one row per cell, with the engine truth")
    ap.add_argument(
        "--asked",
        type=float,
        metavar="SECONDS",
        help="instead: judge each change over this many seconds of each phase, and where that abstains "
        "with an ask, again with the traffic it asked for",
    )
    ap.add_argument("--scrapes", nargs="+", type=float, default=[2.0, 15.0, 30.0], help="scrape intervals, s")
    ap.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[bootstrap.SEED],
        help="bootstrap seeds: the table and totals are the first's; with more, which cells move with the seed",
    )
    a = ap.parse_args(argv)
    t = time.monotonic()
    if a.asked:
        rows = []
        with tempfile.TemporaryDirectory(prefix="kvs-curve-bench-") as tmp:
            for name in [n for n in a.only or shapes if not n.startswith(KNEE)]:
                meta = _meta(name)
                for s, source in sources(name, a.scrapes, Path(tmp)):
                    rows += asked_rows(name, meta, source, s, Thresholds(), a.asked)
        print(asked_table(rows))
        print(f"wall: {time.monotonic() - t:.0f} s")
        return 0
    by_seed = run(a.only or shapes, a.scrapes, a.seeds)
    cells = by_seed[a.seeds[0]]
    print(table(cells) if a.detail else compact(cells))
    print()
    print(totals(cells))
    if len(by_seed) > 1:
        print(over_seeds(by_seed))
    print(f"wall: {time.monotonic() - t:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
