"""Did a change help: the curve before against the curve after, at matched load only.

The concurrency buckets both sides measured with enough data (neither sparse) are compared one
by one, and the others pooled at the same mix of load (pooled.py: adaptive buckets); per metric
the deltas are averaged weighted by the smaller side's intervals. The delta's 95 % interval is a
block bootstrap over each side's intervals (bootstrap.py): the drift between intervals on a shared
machine is in it, which the order-statistic interval of one merged histogram (independent
requests) is not. A metric is worse when its whole interval clears both thresholds in the worse
direction (the relative share and the absolute amount): the change exceeds them at 95 %
confidence, not only its point estimate. Any metric worse: regression; else any better:
improvement; else no_change where every metric's interval excludes a change beyond the thresholds
(equivalence: `undecided`), not_comparable where some interval reaches past them (the data cannot
decide); no bucket in common: not_comparable (never a verdict on different load).

Matched load is more than matched concurrency (§8.2: one curve per input/output length
combination; §8.4: compare at matched input/output lengths). Where the two sides' requests differ
in prompt or output tokens per request by more than the relative threshold (over the whole of
the difference's bootstrap interval), the sides carry
different workloads: the verdict is `not_comparable` with the reason (`offered_load`), never a
regression or an improvement of the engine. Thresholds: docs/rules.md.

The machine's speed is not the engine's (`step_time`). At matched concurrency a closed system
whose every step takes s times as long serves every request s times slower and s times fewer per
second: TTFT and ITL scale by s, tokens/s by 1/s. The engine's mean inter-token latency at the
matched buckets where both sides ran the same batch (`same_batch`: the step of the same batch
on the same model is the machine's speed) measures s. Where it moved beyond the thresholds over
its whole interval, the machine's speed is a sufficient explanation
of every metric that moved the step's way (worse on a slower machine, better on a faster one):
it moves every latency at least s-fold, and a contended machine moves the tails more than the
mean (it stalls steps unevenly), so no reading scaled by s can clear the machine of a tail that
moved further. Those metrics are not counted; where nothing else moved the verdict is
`not_comparable` with the reason (`step_time`): a step that moves is what a noisy neighbour
does, and also what a setting the engine does not export does; nothing in the window tells them
apart. A metric that moved against the step (the engine did better on a slower machine) counts
where the reading with s divided out, per bootstrap replicate (its uncertainty in the interval),
has it too. Where a setting changed (`config`), the caller passes no step: the setting moves the
step itself (a KV cut evicts the prefix cache and slows the steps of the same batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kvscope.diagnoser.curve import bootstrap
from kvscope.diagnoser.curve.bootstrap import Matched
from kvscope.diagnoser.curve.intervals import ARRIVAL_RATE, COMPUTED, Intervals
from kvscope.diagnoser.curve.operating import KneeParams
from kvscope.diagnoser.curve.points import EDGES, MIN_INTERVALS, MIN_REQUESTS, Point, placed
from kvscope.diagnoser.curve.pooled import REQUESTS, Load, load, pools

METRICS = {  # name -> (direction where larger is worse, CI field)
    "ttft_p99_s": (+1, "ttft_p99_ci"),
    "itl_p99_s": (+1, "itl_p99_ci"),
    "output_tokens_per_s": (-1, "output_tokens_per_s_ci"),
}
STEP = "itl_mean_s"
"""The metric that reads the engine's step time: its mean inter-token latency (the ITL histogram's
sum over its count: exact, where a quantile is read between the histogram's buckets)."""
SAME_BATCH = (STEP, "itl_p99_s")
"""Read only at the matched buckets where both sides ran the same batch (`same_batch`): the decode
step follows the batch the scheduler admits, and a setting moves that at the same load (a KV cut
runs fewer and keeps more waiting: shorter steps; growing it back runs them all: longer ones), so
the step and ITL at different batches read the setting's trade of TTFT for ITL, not the engine's
speed (on the bench's stairs-10, growing the KV back read ITL p99 +120 % at 3-10 in the engine
while TTFT p99 fell by 70 %)."""
SAME_LOAD = ("output_tokens_per_s",)
"""Read only at the matched buckets where both sides held the same mean requests in the engine,
within the relative threshold (`same_load`): below the knee the tokens an engine serves a second
grow with the requests it holds, and a bucket is x1.41 wide, so throughput read across a bucket
where the sides held different load reads the load (on the bench's stairs-long, 70 s each side of
a same-flags restart, one bucket held 1.35 in the engine before and 0.87 after: -34 %). Where no
matched bucket held the same load, the metric is `unmatched`: no `no_change` without it."""
MIX = {  # the token mix each side's requests carried: name -> (tokens counter, requests counter)
    "prompt_tokens_per_request": ("engine_prompt_tokens_total", "request_ttft_seconds_count"),
    "output_tokens_per_request": ("engine_generation_tokens_total", "engine_requests_finished_total"),
    "computed_prompt_tokens_per_request": (COMPUTED, "request_ttft_seconds_count"),
}
CACHE_MIX = "computed_prompt_tokens_per_request"
"""The prefill the requests asked of the engine: their prompt tokens less those its prefix cache
served. A workload measure where no setting changed (a restarted replica's cache is cold: the
same requests ask it for more prefill, not a change of the engine); where a setting changed
(`config`: prefix caching, the KV capacity that holds the cache) the hit rate is part of what the
change did, and it is reported but does not gate the verdict."""


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
        STEP: bootstrap.ratio_stat("request_itl_seconds_sum", "request_itl_seconds_count"),
        **{m: bootstrap.ratio_stat(num, den) for m, (num, den) in MIX.items()},
    }


class At(NamedTuple):
    """One matched bucket, or a pool of adjacent ones (its outer edges): the after side's mean
    requests in the engine there, and per side (before, after) its intervals and requests."""

    bucket: tuple[float, float]
    concurrency: float
    intervals: tuple[int, int]
    requests: tuple[float, float]


def _requests(iv: Intervals, rows: np.ndarray) -> float:
    count = iv.counters.get(REQUESTS)
    return 0.0 if count is None else float(np.nansum(count[rows]))


def _pool_at(
    before: Intervals, after: Intervals, buckets: tuple[np.ndarray, np.ndarray], m: Matched, a_load: Load
) -> At:
    """A pool as one matched bucket (`buckets`: each side's bucket per interval, `placed`)."""
    ks = np.concatenate([buckets[0][m.rows_b], buckets[1][m.rows_a]])
    return At(
        (float(EDGES[ks.min()]), float(EDGES[ks.max() + 1])),
        round(a_load.concurrency, 3),
        (len(m.rows_b), len(m.rows_a)),
        (_requests(before, m.rows_b), _requests(after, m.rows_a)),
    )


def _rows(iv: Intervals, p: Point) -> np.ndarray:
    b, ok = placed(iv)
    return np.flatnonzero(ok & (b == int(np.searchsorted(EDGES, p.bucket[0]))))


class Deltas(NamedTuple):
    """`deltas`' answer: per metric its delta at the matched load; the matched buckets and pools;
    the sides' token mix there; the engine's step time (None: no ITL); the metrics the engines
    export that no matched bucket held at the same load (SAME_LOAD: compared nowhere)."""

    metrics: dict
    matched: list[At]
    mix: dict
    step: dict | None
    unmatched: list[str]


def deltas(
    before: list[Point],
    after: list[Point],
    before_iv: Intervals,
    after_iv: Intervals,
    pool: bool = True,
    th: Thresholds = Thresholds(),
) -> Deltas:
    """Per metric {before, after, delta, relative, interval, relative_interval, buckets} over the
    matched buckets (the intervals from the bootstrap): the buckets both sides hold densely, and
    the pools of the others (`pooled.pools`: adaptive buckets, each side weighted to the same mix
    of load; `pool` False: none); the matched buckets and pools (`At`); the
    sides' offered load there: per MIX name {before, after, relative} (None where absent); the
    engine's step time with every metric scaled by it (`_step_time`; None: no ITL); and the
    SAME_LOAD metrics read at some matched bucket but at none that held the same load."""
    b_by = {p.bucket: p for p in before if not p.sparse}
    pairs = [(b_by[p.bucket], p) for p in after if not p.sparse and p.bucket in b_by]
    taken = {int(np.searchsorted(EDGES, a.bucket[0])) for _, a in pairs}
    pooled = pools(before_iv, after_iv, taken) if pool else []
    if not pairs and not pooled:
        return Deltas({}, [], {}, None, [])
    dense = [Matched(_rows(before_iv, b), _rows(after_iv, a), float(min(a.intervals, b.intervals))) for b, a in pairs]
    loads = [(load(before_iv, *m.side(0)), load(after_iv, *m.side(1))) for m in pooled]
    same = [same_batch(b, a) for b, a in pairs + loads]
    level = [same_load(b, a, th) for b, a in pairs + loads]
    only = {m: same for m in SAME_BATCH} | {m: level for m in SAME_LOAD}
    reps = bootstrap.matched_replicates(before_iv, after_iv, dense + pooled, _stats(before_iv.step), only=only)
    out = _rows_deltas(before_iv, after_iv, dense + pooled, tuple(METRICS), reps, only=only)
    gone = tuple(m for m in SAME_LOAD if m not in out)
    unmatched = list(_rows_deltas(before_iv, after_iv, dense + pooled, gone, reps)) if gone else []
    matched = [At(a.bucket, a.concurrency, (b.intervals, a.intervals), (b.requests or 0.0, a.requests or 0.0))
               for b, a in pairs]  # fmt: skip
    if pooled:
        buckets = placed(before_iv)[0], placed(after_iv)[0]
        matched += [_pool_at(before_iv, after_iv, buckets, m, a) for m, (_, a) in zip(pooled, loads, strict=True)]
    return Deltas(out, matched, _mix(reps), _step_time(reps, out), unmatched)


def _mix(reps: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, dict | None]:
    """Per MIX name {before, after, relative, relative_interval} from the replicates (None: absent)."""
    mix: dict[str, dict | None] = {}
    for name in MIX:
        rb, ra = reps[name]
        ok_b, ok_a = ~np.isnan(rb), ~np.isnan(ra)
        if not ok_b.any() or not ok_a.any():
            mix[name] = None
            continue
        # the point estimate: the replicates' median (every replicate weighs the same buckets)
        d = _delta(float(np.median(rb[ok_b])), float(np.median(ra[ok_a])), rb, ra)
        mix[name] = {k: d[k] for k in ("before", "after", "relative", "relative_interval")}
    return mix


def same_batch(b: Point | Load, a: Point | Load) -> bool:
    """Both sides ran the same batch at this matched bucket: the requests in the engine less those
    waiting (the waiting gauge read on both) within one request of each other (the knee's
    `pinned_slack`), and nothing preempted on either. There the decode step is the machine's and
    the model's: a KV cache too small for the load runs a smaller batch at the same running +
    waiting and mixes recomputed prefills into its steps (a smaller batch steps faster), so a step
    read at different batches measures the scheduler, not the machine. (The running gauge itself
    is not read: sampled at scrapes it misses short requests that Little's law counts.)"""
    if b.waiting is None or a.waiting is None:
        return False
    calm = not b.preemptions_per_s and not a.preemptions_per_s
    return calm and abs((b.concurrency - b.waiting) - (a.concurrency - a.waiting)) <= KneeParams().pinned_slack


def same_load(b: Point | Load, a: Point | Load, th: Thresholds = Thresholds()) -> bool:
    """Both sides held the same mean requests in the engine at this matched bucket: within the
    relative threshold of the larger (SAME_LOAD says why)."""
    return abs(b.concurrency - a.concurrency) <= th.relative * max(b.concurrency, a.concurrency)


def _delta(mb: float, ma: float, rb: np.ndarray, ra: np.ndarray, level: float = bootstrap.LEVEL) -> dict:
    """{before, after, delta, relative, interval, relative_interval}: the point estimates and the
    replicates' `level` intervals of the difference and the relative difference."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(rb > 0, ra / rb - 1.0, np.nan)
    return {
        "before": mb,
        "after": ma,
        "delta": ma - mb,
        "relative": (ma - mb) / mb if mb else None,
        "interval": bootstrap.interval(ra - rb, level),
        "relative_interval": bootstrap.interval(rel, level),
    }


def _step_time(reps: dict[str, tuple[np.ndarray, np.ndarray]], out: dict) -> dict | None:
    """The engine's step time before and after (its mean ITL at the same-batch matched buckets,
    the replicates' medians) and every metric of `out` with the step's ratio divided out per replicate
    (`scaled`: times over s, rates times s); None where the engines export no ITL."""
    rb, ra = reps[STEP]
    ok = ~np.isnan(rb) & ~np.isnan(ra) & (rb > 0)
    if not ok.any():
        return None
    mb, ma = float(np.median(rb[ok])), float(np.median(ra[ok]))
    scale = np.where(ok, ra / np.where(ok, rb, 1.0), np.nan)
    scaled = {}
    for name, d in out.items():
        b, a = reps[name]
        a = a / scale if METRICS[name][0] > 0 else a * scale
        s = mb / ma if mb and ma else 1.0
        scaled[name] = _delta(d["before"], d["after"] * (s if METRICS[name][0] > 0 else 1 / s), b, a)
    return _delta(mb, ma, rb, ra) | {"scaled": scaled}


def _beyond(d: dict, sign: int, abs_min: float, rel_min: float) -> bool:
    """The whole interval beyond both thresholds in direction `sign` (+1: larger)."""
    iv, rel_iv = d.get("interval"), d.get("relative_interval")
    if iv is None or rel_iv is None:
        return False
    edge, rel_edge = (iv[0], rel_iv[0]) if sign > 0 else (-iv[1], -rel_iv[1])
    return edge > abs_min and rel_edge > rel_min


def gated(mix: dict, cache: bool) -> dict:
    """The mix measures that gate a verdict: all of them, less the computed prefill where a setting
    changed (`cache` False: CACHE_MIX says why)."""
    return {name: x for name, x in mix.items() if cache or name != CACHE_MIX}


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


def _within(d: dict, abs_min: float, rel_min: float) -> bool:
    """The whole interval excludes a change beyond both thresholds either way (equivalence): at
    each end of it, the absolute or the relative amount stays within its threshold."""
    iv, rel_iv = d.get("interval"), d.get("relative_interval")
    if iv is None or rel_iv is None:
        return False
    up = iv[1] > abs_min and rel_iv[1] > rel_min
    down = -iv[0] > abs_min and -rel_iv[0] > rel_min
    return not up and not down


def undecided(d: dict, th: Thresholds) -> list[str]:
    """The metrics whose interval clears no threshold and yet reaches past them (a change beyond
    the thresholds is not excluded): where any is left, no_change is not shown and the verdict is
    `not_comparable` (more traffic at the matched load would decide it)."""
    return [m for m, x in d.items() if not _within(x, getattr(th, m), th.relative)]


def _read(d: dict, th: Thresholds) -> tuple[str, list[str], list[str]]:
    worse = [m for m, x in d.items() if _beyond(x, METRICS[m][0], getattr(th, m), th.relative)]
    better = [m for m, x in d.items() if _beyond(x, -METRICS[m][0], getattr(th, m), th.relative)]
    return ("regression" if worse else "improvement" if better else "no_change"), worse, better


def step_moved(step: dict | None, th: Thresholds) -> int:
    """+1 where the engine's step time (mean ITL) got longer by more than the relative threshold
    over its whole interval, -1 shorter, 0 neither (a speed is a ratio: no absolute amount is
    asked of it)."""
    if not step:
        return 0
    return next((sign for sign in (+1, -1) if _beyond(step, sign, -np.inf, th.relative)), 0)


def step_held(step: dict | None, th: Thresholds) -> bool:
    """The engine's step time shown unchanged: its whole relative interval within the relative
    threshold (True where no step or no interval was read: nothing to divide out)."""
    iv = (step or {}).get("relative_interval")
    return iv is None or (-th.relative < iv[0] and iv[1] < th.relative)


def verdict(
    d: dict,
    th: Thresholds = Thresholds(),
    mix: dict | None = None,
    step: dict | None = None,
    unmatched: list[str] | tuple[str, ...] = (),
) -> tuple[str, list[str], list[str]]:
    """(verdict, metrics worse, metrics better). `not_comparable` where nothing is matched, or where
    the sides' token mix differs (a different workload: `mix_differs`). Where the engine's step
    time moved (`step_moved`), the metrics that moved its way (worse on a slower machine, better
    on a faster one) are the machine's speed as much as the engine's and are not counted; those
    that moved against it count where the reading with the step's ratio divided out has them too.
    Where the step neither moved nor was shown held (`step_held`: its interval reaches past the
    threshold), a metric counts only where the reading with the step divided out has it too.
    None left and some explained by the step: `not_comparable` (the reason says why). `no_change`
    only where every metric's interval excludes a change beyond the thresholds (`undecided`: else
    `not_comparable`, the data cannot decide) and every metric the engines export was compared
    (`unmatched`: those no matched bucket held at the same load, SAME_LOAD)."""
    if not d or (mix and mix_differs(mix, th)):
        return "not_comparable", [], []
    v, worse, better = _read(d, th)
    if v == "no_change" and (undecided(d, th) or unmatched):
        return "not_comparable", [], []
    moved = step_moved(step, th)
    if v == "no_change" or (not moved and step_held(step, th)):
        return v, worse, better
    assert step is not None
    _, worse2, better2 = _read(step["scaled"], th)
    # slower (moved > 0): its worse metrics are explained; faster: its better ones
    worse = [m for m in worse if m in worse2] if moved <= 0 else []
    better = [m for m in better if m in better2] if moved >= 0 else []
    if worse:
        return "regression", worse, better
    return ("improvement", [], better) if better else ("not_comparable", [], [])


RATE_EDGES = np.concatenate([EDGES[0] * 2.0 ** (np.arange(-12, 0) / 2), EDGES])
"""Arrival-rate bucket edges, per second: the concurrency edges, continued below their first by
the same x1.41 steps down to 1/128 a second (below it nothing arrives). Below 0.5 in flight an
engine is idle, but not below 0.5 arrivals a second: by Little's law a rate is the requests in
flight over their latency, so an engine whose requests last 20 s holds 8 at 0.4 a second."""


ORDERED = ("ttft_p99_s",)
"""The metrics the curve orders by the load offered: the time to first token does not fall as more
requests arrive (§8.1: a request waits behind more), so a side slower at less load than the other
carries is slower at the same load. Not ITL: the decode step follows the batch the scheduler
admits, and a setting moves that at the same load (a KV cut caps the batch: fewer running, shorter
steps, more waiting), so ITL at a matched arrival rate reads the setting's trade of TTFT for ITL,
which a verdict from one metric's order would call a regression where TTFT fell by half."""


def _rate_pairs(
    before: Intervals, after: Intervals, rate_b: np.ndarray, rate_a: np.ndarray, sign: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per arrival-rate bucket (RATE_EDGES) of the after side: its rows, and the before
    side's rows in that bucket or above it (`sign` +1: the after side at the lesser load) or in it
    or below it (-1), where both hold enough data (`_enough`). Within one bucket the rates are
    matched as concurrency is (about x1.41 wide); across buckets they are ordered. Chosen from
    the rates and the counts alone, never the metrics."""
    k_a = np.searchsorted(RATE_EDGES, rate_a)
    out = []
    for k in np.unique(k_a[~np.isnan(rate_a)]):
        if k == 0 or k >= len(RATE_EDGES):
            continue  # below the first edge, or above the last: no bound on that side
        rows_a = np.flatnonzero(k_a == k)
        with np.errstate(invalid="ignore"):
            rows_b = np.flatnonzero(rate_b > RATE_EDGES[k - 1]) if sign > 0 else np.flatnonzero(rate_b <= RATE_EDGES[k])
        if _enough(before, rows_b) and _enough(after, rows_a):
            out.append((rows_b, rows_a))
    return out


def _enough(iv: Intervals, rows: np.ndarray) -> bool:
    n = iv.counters.get("request_ttft_seconds_count")
    return len(rows) >= MIN_INTERVALS and n is not None and float(np.nansum(n[rows])) >= MIN_REQUESTS


def _point(iv: Intervals, rows: np.ndarray, scale: np.ndarray | None, stat: bootstrap.Stat) -> float:
    """The metric over these rows (ascending), each weighing its `scale` (None: one)."""
    w = np.ones((1, len(rows))) if scale is None else scale[None, :]
    return float(stat(iv.take(rows), bootstrap.weighted(w))[0])


def _rows_deltas(
    before: Intervals,
    after: Intervals,
    pairs: list[Matched],
    metrics: tuple[str, ...],
    reps: dict[str, tuple[np.ndarray, np.ndarray]],
    level: float = bootstrap.LEVEL,
    only: dict[str, list[bool]] | None = None,
) -> dict:
    """Per metric, `_delta` of the pairs' point estimates averaged by weight, with the replicates'
    `level` intervals; `only`: per metric, the pairs it is read at (default every one); metrics read
    on no pair are left out."""
    stats, w, d = _stats(before.step), np.array([x.weight for x in pairs]), {}
    for m in metrics:
        at = (only or {}).get(m) or [True] * len(pairs)
        vb, va = (
            np.array([_point(iv, *x.side(s), stats[m]) if ok else np.nan for x, ok in zip(pairs, at, strict=True)])
            for s, iv in ((0, before), (1, after))
        )
        have = ~np.isnan(vb) & ~np.isnan(va)
        if have.any():
            mb, ma = (float(np.average(v[have], weights=w[have])) for v in (vb, va))
            d[m] = _delta(mb, ma, *reps[m], level) | {"buckets": int(have.sum())}
    return d


def by_offered_load(before: Intervals, after: Intervals, th: Thresholds, gate_cache: bool = True) -> dict | None:
    """A verdict for a setting's change where neither matched concurrency nor matched arrival rate
    decided, from the order of the curve in the load offered (ORDERED): the after side slower at
    an arrival rate at or below the before side's (a `regression`), or faster at one at or above it
    (an `improvement`). Per arrival-rate bucket of the after side, its intervals against the before
    side's in that bucket or above it (or in it or below it: `_rate_pairs`): if latency does not
    fall with the load offered on either side, the merged histogram of the intervals below an edge
    is no slower than the side at the edge, and that of the intervals above it no faster, so the
    pair's difference bounds the change at the edge (within one bucket the rates are taken as
    matched, as concurrency is). A pair whose whole interval clears the thresholds is the verdict;
    with K pairs tried (both claims), each interval is read at the level 1 - 0.05 / K (Bonferroni:
    the chance that any of them clears by noise stays under 5 %). The token mix must match on the
    intervals compared (the computed prefill only where `gate_cache`). None where no pair clears,
    or a metric clears both ways (the order does not hold: the load moved in a way the rate does
    not show); else {verdict, worse, better, deltas (the pair that cleared furthest), offered_load:
    its mix, split: {method: ordered, arrival_rate_per_s: the after bucket's edge, before_intervals,
    after_intervals, pairs, level}}."""
    rate_b, rate_a = before.gauges.get(ARRIVAL_RATE), after.gauges.get(ARRIVAL_RATE)
    if rate_b is None or rate_a is None:
        return None
    stats = _stats(before.step)
    claims = {sign: _rate_pairs(before, after, rate_b, rate_a, sign) for sign in (+1, -1)}
    k = sum(len(p) for p in claims.values())
    level = 1.0 - (1.0 - bootstrap.LEVEL) / max(k, 1)
    found: dict[int, dict] = {}
    for sign, pairs in claims.items():
        for rows_b, rows_a in pairs:
            reps = bootstrap.matched_replicates(before, after, [Matched(rows_b, rows_a, 1.0)], stats)
            mix = _mix(reps)
            if mix_differs(gated(mix, gate_cache), th):
                continue
            d = _rows_deltas(before, after, [Matched(rows_b, rows_a, 1.0)], ORDERED, reps, level)
            named = [m for m, x in d.items() if _beyond(x, sign, getattr(th, m), th.relative)]
            if not named:
                continue
            edge = RATE_EDGES[np.searchsorted(RATE_EDGES, rate_a[rows_a][0]) - (0 if sign > 0 else 1)]
            clear = max(sign * x["relative_interval"][0 if sign > 0 else 1] for m, x in d.items() if m in named)
            if sign not in found or clear > found[sign]["clear"]:
                split = {"method": "ordered", "arrival_rate_per_s": float(edge), "before_intervals": len(rows_b)}
                split |= {"after_intervals": len(rows_a), "pairs": k, "level": level}
                found[sign] = {"named": named, "deltas": d, "offered_load": mix, "split": split, "clear": clear}
    if not found or (len(found) == 2 and set(found[+1]["named"]) & set(found[-1]["named"])):
        return None
    sign = +1 if +1 in found else -1
    f = found[sign]
    return {
        "verdict": "regression" if sign > 0 else "improvement",
        "worse": f["named"] if sign > 0 else [],
        "better": f["named"] if sign < 0 else [],
        "deltas": f["deltas"],
        "offered_load": f["offered_load"],
        "split": f["split"],
    }


RATE_MATCHED = ("ttft_p99_s", "output_tokens_per_s")
"""The metrics compared at matched arrival rate: TTFT, and the throughput that at a matched rate
below saturation is the rate's own (so it reads the same unless the engine fell behind). Not ITL
(ORDERED says why)."""


def at_matched_rate(before: Intervals, after: Intervals, th: Thresholds, gate_cache: bool = True) -> dict | None:
    """The comparison at matched concurrency, over arrival-rate buckets instead (RATE_EDGES:
    the intervals of both sides whose rate fell in the same bucket, where both hold `_enough`),
    on RATE_MATCHED: the open loop's input held, where concurrency is partly the engine's outcome
    (a fast engine keeps every rate from 4 to 16 a second under 1.5 requests in flight, so one
    concurrency bucket mixes them and its throughput reads the rate, not the engine). The same
    bootstrap, thresholds, equivalence and token-mix test as `deltas` and `verdict`. None where no
    rate bucket is dense on both sides or the mix differs; else {verdict, worse, better, deltas,
    offered_load, split: {method: matched, rate_buckets, before_intervals, after_intervals}}."""
    rate_b, rate_a = before.gauges.get(ARRIVAL_RATE), after.gauges.get(ARRIVAL_RATE)
    if rate_b is None or rate_a is None:
        return None
    k_b, k_a = np.searchsorted(RATE_EDGES, rate_b), np.searchsorted(RATE_EDGES, rate_a)  # NaN: past the last edge
    pairs = []
    for k in range(1, len(RATE_EDGES)):
        rows_b, rows_a = np.flatnonzero(k_b == k), np.flatnonzero(k_a == k)
        if _enough(before, rows_b) and _enough(after, rows_a):
            pairs.append(Matched(rows_b, rows_a, float(min(len(rows_b), len(rows_a)))))
    if not pairs:
        return None
    stats = _stats(before.step)
    reps = bootstrap.matched_replicates(before, after, pairs, stats)
    mix = _mix(reps)
    if mix_differs(gated(mix, gate_cache), th):
        return None
    d = _rows_deltas(before, after, pairs, RATE_MATCHED, reps)
    if not d:
        return None
    v, worse, better = verdict(d, th)
    split = {"method": "matched", "rate_buckets": len(pairs)}
    split |= {"before_intervals": int(sum(len(m.rows_b) for m in pairs))}
    split |= {"after_intervals": int(sum(len(m.rows_a) for m in pairs))}
    return {"verdict": v, "worse": worse, "better": better, "deltas": d, "offered_load": mix, "split": split}
