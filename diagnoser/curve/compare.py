"""Did a change help: the curve before against the curve after, at matched load only.

Only the concurrency buckets both sides measured with enough data (neither sparse) are
compared; per metric the per-bucket deltas are averaged weighted by the smaller side's
intervals. The delta's 95 % interval is a block bootstrap over each side's intervals
(bootstrap.py): the drift between intervals on a shared machine is in it, which the
order-statistic interval of one merged histogram (independent requests) is not. A metric is worse
when its whole interval clears both thresholds in the worse direction (the relative share and the
absolute amount): the change exceeds them at 95 % confidence, not only its point estimate. Any
metric worse: regression; else any better: improvement; else no_change; no bucket in common:
not_comparable (never a verdict on different load).

Matched load is more than matched concurrency (§8.2: one curve per input/output length
combination; §8.4: compare at matched input/output lengths). Where the two sides' requests differ
in prompt or output tokens per request by more than the relative threshold (over the whole of
the difference's bootstrap interval), the sides carry
different workloads: the verdict is `not_comparable` with the reason (`offered_load`), never a
regression or an improvement of the engine. Thresholds: docs/rules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvscope.diagnoser.curve import bootstrap
from kvscope.diagnoser.curve.intervals import Intervals
from kvscope.diagnoser.curve.points import EDGES, Point, placed

METRICS = {  # name -> (direction where larger is worse, CI field)
    "ttft_p99_s": (+1, "ttft_p99_ci"),
    "itl_p99_s": (+1, "itl_p99_ci"),
    "output_tokens_per_s": (-1, "output_tokens_per_s_ci"),
}
MIX = {  # the token mix each side's requests carried: name -> (tokens counter, requests counter)
    "prompt_tokens_per_request": ("engine_prompt_tokens_total", "request_ttft_seconds_count"),
    "output_tokens_per_request": ("engine_generation_tokens_total", "engine_requests_finished_total"),
}


@dataclass(frozen=True)
class Thresholds:
    """Worse (or better) only beyond both: relative share and absolute amount (metric units)."""

    relative: float = 0.10
    ttft_p99_s: float = 0.100
    itl_p99_s: float = 0.010
    output_tokens_per_s: float = 1.0


def _stats(step: float) -> dict[str, bootstrap.Stat]:
    return {
        "ttft_p99_s": bootstrap.quantile_stat("request_ttft_seconds", 0.99),
        "itl_p99_s": bootstrap.quantile_stat("request_itl_seconds", 0.99),
        "output_tokens_per_s": bootstrap.ratio_stat("engine_generation_tokens_total", None, step),
        **{m: bootstrap.ratio_stat(num, den) for m, (num, den) in MIX.items()},
    }


def _rows(iv: Intervals, p: Point) -> np.ndarray:
    b, ok = placed(iv)
    return np.flatnonzero(ok & (b == int(np.searchsorted(EDGES, p.bucket[0]))))


def deltas(
    before: list[Point], after: list[Point], before_iv: Intervals, after_iv: Intervals
) -> tuple[dict, list[float], dict]:
    """Per metric {before, after, delta, relative, interval, relative_interval, buckets} over the
    matched buckets (the intervals from the bootstrap), the matched buckets' concurrencies, and
    the sides' offered load there: per MIX name {before, after, relative} (None where absent)."""
    b_by = {p.bucket: p for p in before if not p.sparse}
    pairs = [(b_by[p.bucket], p) for p in after if not p.sparse and p.bucket in b_by]
    if not pairs:
        return {}, [], {}
    matched = [(_rows(before_iv, b), _rows(after_iv, a), float(min(a.intervals, b.intervals))) for b, a in pairs]
    reps = bootstrap.matched_replicates(before_iv, after_iv, matched, _stats(before_iv.step))
    weights = np.array([w for _, _, w in matched])
    out = {}
    for name in METRICS:
        vb = np.array([np.nan if getattr(b, name) is None else getattr(b, name) for b, _ in pairs], dtype=float)
        va = np.array([np.nan if getattr(a, name) is None else getattr(a, name) for _, a in pairs], dtype=float)
        have = ~np.isnan(vb) & ~np.isnan(va)
        if not have.any():
            continue
        mb, ma = (float(np.average(v[have], weights=weights[have])) for v in (vb, va))
        rb, ra = reps[name]
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(rb > 0, ra / rb - 1.0, np.nan)
        out[name] = {
            "before": mb,
            "after": ma,
            "delta": ma - mb,
            "relative": (ma - mb) / mb if mb else None,
            "interval": bootstrap.interval(ra - rb),
            "relative_interval": bootstrap.interval(rel),
            "buckets": int(have.sum()),
        }
    mix: dict[str, dict | None] = {}
    for name in MIX:
        rb, ra = reps[name]
        ok_b, ok_a = ~np.isnan(rb), ~np.isnan(ra)
        if not ok_b.any() or not ok_a.any():
            mix[name] = None
            continue
        # the point estimate: the replicates' median (every replicate weighs the same buckets)
        mb, ma = float(np.median(rb[ok_b])), float(np.median(ra[ok_a]))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(rb > 0, ra / rb - 1.0, np.nan)
        mix[name] = {
            "before": mb,
            "after": ma,
            "relative": (ma - mb) / mb if mb else None,
            "relative_interval": bootstrap.interval(rel),
        }
    return out, [a.concurrency for _, a in pairs], mix


def _beyond(d: dict, sign: int, abs_min: float, rel_min: float) -> bool:
    """The whole interval beyond both thresholds in direction `sign` (+1: larger)."""
    iv, rel_iv = d.get("interval"), d.get("relative_interval")
    if iv is None or rel_iv is None:
        return False
    edge, rel_edge = (iv[0], rel_iv[0]) if sign > 0 else (-iv[1], -rel_iv[1])
    return edge > abs_min and rel_edge > rel_min


def mix_differs(mix: dict, th: Thresholds) -> list[str]:
    """The token-mix measures on which the two sides differ by more than the relative threshold
    over the whole of the difference's bootstrap interval (the test a verdict passes, the other way
    round); every measure where none could be read (the engine exports neither finished nor
    first-token requests beside its token counters, as llama.cpp: no offered load was read at all,
    and a match is not assumed). One measure read and matched is a match on what was read."""
    if mix and all(x is None for x in mix.values()):
        return list(mix)
    out = []
    for m, x in mix.items():
        iv = x and x.get("relative_interval")
        if iv and (iv[0] > th.relative or iv[1] < -th.relative):
            out.append(m)
    return out


def verdict(d: dict, th: Thresholds = Thresholds(), mix: dict | None = None) -> tuple[str, list[str], list[str]]:
    """(verdict, metrics worse, metrics better). `not_comparable` where nothing is matched, or where
    the sides' token mix differs (a different workload: `mix_differs`)."""
    if not d or (mix and mix_differs(mix, th)):
        return "not_comparable", [], []
    worse = [m for m, x in d.items() if _beyond(x, METRICS[m][0], getattr(th, m), th.relative)]
    better = [m for m, x in d.items() if _beyond(x, -METRICS[m][0], getattr(th, m), th.relative)]
    return ("regression" if worse else "improvement" if better else "no_change"), worse, better
