"""Did a change help: the curve before against the curve after, at matched load only.

Only the concurrency buckets both sides measured with enough data (neither sparse) are
compared; per metric the per-bucket deltas are averaged weighted by the smaller side's
intervals, with an interval from the two sides' 95 % intervals (after's low minus before's high,
after's high minus before's low). A metric is worse when its delta exceeds both the relative and
the absolute threshold in the worse direction and its interval excludes zero; better likewise.
Any metric worse: regression; else any better: improvement; else no_change; no bucket in common:
not_comparable (never a verdict on different load). Thresholds: docs/rules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.diagnoser.curve.points import Point

METRICS = {  # name -> (direction where larger is worse, CI field)
    "ttft_p99_s": (+1, "ttft_p99_ci"),
    "itl_p99_s": (+1, "itl_p99_ci"),
    "output_tokens_per_s": (-1, "output_tokens_per_s_ci"),
}


@dataclass(frozen=True)
class Thresholds:
    """Worse (or better) only beyond both: relative share and absolute amount (metric units)."""

    relative: float = 0.10
    ttft_p99_s: float = 0.100
    itl_p99_s: float = 0.010
    output_tokens_per_s: float = 1.0


def _weighted(values: list[tuple[float, float]]) -> float:
    total = sum(w for _, w in values)
    return sum(v * w for v, w in values) / total


def deltas(before: list[Point], after: list[Point]) -> tuple[dict, list[float]]:
    """Per metric {before, after, delta, relative, interval, buckets} over matched buckets, and the
    matched buckets' concurrencies."""
    b_by = {p.bucket: p for p in before if not p.sparse}
    pairs = [(b_by[p.bucket], p) for p in after if not p.sparse and p.bucket in b_by]
    out = {}
    for name, (_, ci_field) in METRICS.items():
        rows = []
        for b, a in pairs:
            vb, va = getattr(b, name), getattr(a, name)
            if vb is None or va is None:
                continue
            cb, ca = getattr(b, ci_field) or (vb, vb), getattr(a, ci_field) or (va, va)
            rows.append((vb, va, ca[0] - cb[1], ca[1] - cb[0], min(a.intervals, b.intervals)))
        if not rows:
            continue
        vb = _weighted([(r[0], r[4]) for r in rows])
        va = _weighted([(r[1], r[4]) for r in rows])
        out[name] = {
            "before": vb,
            "after": va,
            "delta": va - vb,
            "relative": (va - vb) / vb if vb else None,
            "interval": [_weighted([(r[2], r[4]) for r in rows]), _weighted([(r[3], r[4]) for r in rows])],
            "buckets": len(rows),
        }
    return out, [a.concurrency for _, a in pairs]


def _beyond(d: dict, sign: int, abs_min: float, rel_min: float) -> bool:
    lo, hi = d["interval"]
    clear = lo > 0 if sign > 0 else hi < 0
    return d["relative"] is not None and sign * d["relative"] > rel_min and sign * d["delta"] > abs_min and clear


def verdict(d: dict, th: Thresholds = Thresholds()) -> tuple[str, list[str], list[str]]:
    """(verdict, metrics worse, metrics better)."""
    if not d:
        return "not_comparable", [], []
    worse = [m for m, x in d.items() if _beyond(x, METRICS[m][0], getattr(th, m), th.relative)]
    better = [m for m, x in d.items() if _beyond(x, -METRICS[m][0], getattr(th, m), th.relative)]
    return ("regression" if worse else "improvement" if better else "no_change"), worse, better
