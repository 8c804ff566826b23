"""What the Operating point page says, computed without Streamlit from the diagnoser's own curve.

Every number here is read off `diagnoser.curve.report.pool_curves` (what `kvscope curve` prints):
the points, the knee, C_max and usable RPS (re-read at another SLO with the same
`operating_point`, over the same points and peak), and each change's before and after curves as
they were compared. Nothing is interpolated or smoothed here; sparse buckets stay flagged.
Method: docs/curve.md ("Sizing LLM Inference for Production" §8.1-8.5).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from kvscope.core.objectives import Objectives, ObjectiveSet
from kvscope.diagnoser.curve.operating import DEFAULT_SLO_TTFT_P99_S, Operating, operating_point
from kvscope.diagnoser.curve.points import Point
from kvscope.diagnoser.curve.report import (
    COLUMNS,
    METRIC_WORDS,
    JudgedChange,
    PoolCurve,
    change_heading,
    change_notes,
    pool_name,
    verdict_text,
)

METRIC_UNITS = {"ttft_p99_s": "s", "itl_p99_s": "s", "output_tokens_per_s": "tokens/s"}


def at_slo(pc: PoolCurve, slo_s: float, objectives: Objectives | None = None) -> Operating:
    """The pool's operating point at another TTFT p99 SLO, its TPOT and e2e objectives judged too
    where `objectives` sets them: `operating_point` over the same points and peak (what `kvscope
    curve --slo-ttft-p99 --slo-tpot ...` computes); the curve's own at the default TTFT alone."""
    if slo_s == DEFAULT_SLO_TTFT_P99_S and not set(objectives.bounds() if objectives else ()) - {"ttft"}:
        return pc.operating
    return operating_point(
        pc.points, pc.operating.peak_concurrency, slo_s, running_max=pc.operating.running_max, objectives=objectives
    )


def pool_objectives(objectives: ObjectiveSet, pc: PoolCurve, ttft_s: float) -> Objectives:
    """The objectives the pool's C_max is judged at: its own (`objectives.of` its model) with the
    page's TTFT input over them where the input differs from the fleet's TTFT (or the pool sets none)."""
    own = objectives.of(pool=pc.labels.get("model"))
    if ttft_s != fleet_ttft(objectives) or own.ttft is None:
        own = replace(own, ttft=ttft_s)
    return own


def fleet_ttft(objectives: ObjectiveSet) -> float:
    """The TTFT input's start value: the fleet's TTFT objective (the rules' default where none is set)."""
    return objectives.default.ttft if objectives.default.ttft is not None else DEFAULT_SLO_TTFT_P99_S


def curve_rows(points: list[Point], side: str = "") -> pd.DataFrame:
    """Long rows for the chart: one per bucket and statistic (TTFT p50, TTFT p99) with the p99's 95 %
    interval, the bucket's intervals and requests, and whether it is sparse. Absent values are left
    out (never zero)."""
    rows = []
    for p in points:
        for stat, value, ci in (("TTFT p50", p.ttft_p50_s, None), ("TTFT p99", p.ttft_p99_s, p.ttft_p99_ci)):
            if value is None:
                continue
            rows.append(
                {
                    "concurrency": p.concurrency,
                    "statistic": stat,
                    "seconds": value,
                    "ci_low": ci[0] if ci else None,
                    "ci_high": ci[1] if ci else None,
                    "intervals": p.intervals,
                    "requests": p.requests,
                    "data": "sparse (not used)" if p.sparse else "enough data",
                    "side": side,
                    "series": f"{stat} {side}".strip(),
                }
            )
    return pd.DataFrame(rows)


def points_table(points: list[Point]) -> pd.DataFrame:
    """The points as `kvscope curve` prints them (its COLUMNS, under their UI headers), one row per
    concurrency bucket, with the bucket's edges and whether it is sparse."""
    table = pd.DataFrame(
        [[getattr(p, attr) for _, _, attr, _, _ in COLUMNS] for p in points], columns=[c[4] for c in COLUMNS]
    )
    table.insert(1, "bucket", [f"{p.bucket[0]:g}-{p.bucket[1]:g}" for p in points])
    return table.assign(sparse=[p.sparse for p in points])


@dataclass(frozen=True)
class ChangeView:
    """One change as the page shows it."""

    heading: str
    verdict: str
    verdict_words: str  # curve.report.verdict_text
    notes: str  # why no verdict, how it was judged, what would decide it (curve.report.change_notes)
    deltas: pd.DataFrame
    rows: pd.DataFrame  # before and after curves, long (curve_rows with side)


def change_view(j: JudgedChange) -> ChangeView:
    """Heading (time, kind, where, diff, verdict), the deltas at matched load, and both curves."""
    heading = f"{change_heading(j)} — {j.verdict}"
    deltas = pd.DataFrame(
        [
            {
                "metric": METRIC_WORDS.get(m, m),
                "before": d["before"],
                "after": d["after"],
                "change": d["delta"],
                "relative": None if d["relative"] is None else f"{100 * d['relative']:+.0f}%",
                "95 % interval": _interval(d.get("interval")),
                "unit": METRIC_UNITS.get(m, ""),
                "buckets compared": d.get("buckets"),
            }
            for m, d in j.deltas.items()
        ]
    )
    rows = pd.concat([curve_rows(j.before, "before"), curve_rows(j.after, "after")], ignore_index=True)
    notes = change_notes(j).strip().removeprefix(";").strip()
    return ChangeView(heading, j.verdict, verdict_text(j), notes, deltas, rows)


def _interval(iv: list[float] | None) -> str | None:
    return None if iv is None else f"{iv[0]:.3g} … {iv[1]:.3g}"


@dataclass(frozen=True)
class MeasuredSizing:
    """C_max and usable RPS for the sizing page, from one pool's measured curve, and where from."""

    c_max: float | None
    usable_rps: float | None
    provenance: str


def measured_sizing(pc: PoolCurve, slo_s: float, source: str, objectives: Objectives | None = None) -> MeasuredSizing:
    """The pool's C_max and usable RPS at the SLO (and `objectives`' TPOT and e2e where set), with a
    sentence saying where they come from (or why the curve gives none, so the typed values stand)."""
    op = at_slo(pc, slo_s, objectives)
    where = f"the measured operating curve of {pool_name(pc)} ({source}; per instance, `kvscope curve`)"
    at = f"TTFT p99 ≤ {slo_s:g} s" + "".join(
        f", {k.upper()} p99 ≤ {b:g} s" for k, b in (objectives.bounds() if objectives else {}).items() if k != "ttft"
    )
    if op.c_max is None or op.usable_rps is None:
        return MeasuredSizing(None, None, f"From {where}: no C_max at {at} ({op.c_max_note}); typed values used.")
    return MeasuredSizing(
        op.c_max,
        op.usable_rps,
        f"From {where}: C_max {op.c_max:g} and usable RPS {op.usable_rps:.2f} at {at} "
        f"({op.c_max_note}). Type over them to override.",
    )
