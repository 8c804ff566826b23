"""Each pool's curve, operating point and judged changes from one Frame; JSON, text, findings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from kvscope.core.objectives import ObjectiveSet
from kvscope.diagnoser.curve.changes import Change, raw_changes
from kvscope.diagnoser.curve.compare import (
    Thresholds,
    at_matched_rate,
    by_offered_load,
    deltas,
    gated,
    mix_differs,
    step_held,
    step_moved,
    undecided,
    verdict,
)
from kvscope.diagnoser.curve.decide import more_to_settle, more_traffic
from kvscope.diagnoser.curve.intervals import CONCURRENCY, Intervals, pool_intervals
from kvscope.diagnoser.curve.operating import DEFAULT_SLO_TTFT_P99_S, Operating, operating_point, peak_concurrency
from kvscope.diagnoser.curve.points import MIN_INTERVALS, Point, coarse_share, curve_points, placed
from kvscope.diagnoser.curve.window import CONCURRENCY_SIGNAL, curve_step, read_window
from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.diagnoser.findings import Diagnosis, EngineChange, Evidence, Finding, LeverAdvice
from kvscope.diagnoser.render import fmt_time
from kvscope.diagnoser.sources.window import Source

RULE_ID = "regression_after_change"
SETTINGS = ("config", "version")
"""The change kinds that take a regression or an improvement from the arrival rate (`_by_rate`)
where no concurrency bucket decides, or from pooled sparse buckets (`compare.deltas`, adaptive
buckets): a setting or a version changed, so the engine may hold a different number of requests at
the same rate. Not a restart with the same flags, a replica count or a shift with no event:
nothing the engine runs changed, and such a verdict would need the machine's speed held (the
step-time check at the buckets both sides hold densely), which neither the rate nor a pool of a
few intervals per bucket reads well (a warming engine's step, -48 % over [-86 %, +19 %] in one
pool, read as an improvement of output tokens/s); those take only `no_change` from them."""
ENGINE_VERDICTS = ("regression", "improvement")
UNDECIDED = "undecided"
"""The reason's first word where the matched buckets' intervals straddle a threshold."""
UNREAD_STEP = (
    "the engine's step time is not read (no ITL sum at the same batch on both sides; the curve's records keep "
    "none): at a change of no setting a regression or an improvement needs the machine's speed held, and a "
    "machine that got slower or faster (a noisy neighbour, a starved API server) is not ruled out"
)
"""The reason where a change of no setting read as a regression or improvement with no step read."""
SETTLE_S = 30.0
"""Seconds after a change left out of the 'after' side (a restarted engine warms up: §8.2)."""
FINDING_KINDS = ("config", "version", "restart")
KNOB_LEVER_IDS = {  # a config knob kvscope can see change -> (lever id, direction of the knob) it applies
    "kv_capacity_tokens": (("vllm.gpu_memory_utilization", "increase"), ("vllm.kv_cache_dtype", "increase")),
    "lora_max_adapters": (("vllm.max_loras", "increase"),),
    "prefix_caching_mode_code": (("vllm.enable_prefix_caching", "increase"),),  # off (0) -> on (1)
    "kv_cache_fp8_code": (("vllm.kv_cache_dtype", "increase"),),  # the model's dtype (0) -> FP8 (1)
    "gpu_memory_utilization_ratio": (("vllm.gpu_memory_utilization", "increase"),),
}
"""Block size has no lever (a finding never recommends it): its change is judged, not followed up.
vLLM exports no scheduler settings (max_num_seqs, chunked prefill, max_num_batched_tokens), so
their levers cannot be followed up from a change (docs/curve.md)."""
KNOB_LEVERS = {  # a config knob -> the flags that set it (the regression finding's "revisit" lever)
    "kv_capacity_tokens": "--num-gpu-blocks-override / --gpu-memory-utilization / --kv-cache-dtype",
    "lora_max_adapters": "--max-loras",
    "prefix_caching_mode_code": "--enable-prefix-caching / --no-enable-prefix-caching",
    "kv_cache_fp8_code": "--kv-cache-dtype",
    "kv_block_size_tokens": "--block-size (SGLang --page-size)",
    "gpu_memory_utilization_ratio": "--gpu-memory-utilization",
}


@dataclass
class JudgedChange:
    change: Change
    verdict: str
    deltas: dict
    worse: list[str]
    better: list[str]
    matched_concurrency: list[float]
    offered_load: dict = field(default_factory=dict)
    """The token mix each side's requests carried at the matched buckets (compare.MIX)."""
    reason: str | None = None
    """Why no verdict was given where buckets matched (the sides carried different workloads, or
    the engine's step time moved and the verdict does not hold with it divided out), or where
    neither side placed a point on the curve."""
    step_time: dict | None = None
    """The engine's step time (mean ITL) at the matched buckets before and after, and every metric's
    delta with its ratio divided out (`scaled`); None where the engines export no ITL."""
    more_traffic: list[dict] | None = None
    """Where no bucket matched: per bucket either side reached, the intervals and seconds of traffic
    at that load each side still needs to make it comparable (decide.more_traffic); else None."""
    by_arrival_rate: dict | None = None
    """Where the verdict came from the arrival rate, not from matched concurrency (`_by_rate`): how
    ({method: matched, rate_buckets, ...}: compare.at_matched_rate; {method: ordered,
    arrival_rate_per_s, pairs, level, ...}: compare.by_offered_load) and the intervals of each side
    compared; else None."""
    before: list[Point] = field(default_factory=list, repr=False)
    """The curve before the change and after it, as compared (the UI overlays them); not in the JSON."""
    after: list[Point] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        skip = ("change", "before", "after")
        return asdict(self.change) | {k: v for k, v in vars(self).items() if k not in skip}


@dataclass
class PoolCurve:
    labels: dict[str, str]
    points: list[Point]
    operating: Operating
    changes: list[JudgedChange] = field(default_factory=list)
    intervals: int = 0
    coarse_share: float | None = 0.0  # None: not measured (the curve's records)
    signal: str = CONCURRENCY_SIGNAL
    step: float = 0.0
    estimator: dict | None = None  # how the concurrency was estimated (`estimator`; the records: recorded.ESTIMATOR)

    def to_dict(self) -> dict:
        op = self.operating
        head = {"labels": self.labels, "concurrency_signal": self.signal, "points": [p.to_dict() for p in self.points]}
        return head | {
            **{k: getattr(op, k) for k in ("knee_concurrency", "c_max", "usable_rps")},
            **{"operating": op.to_dict(), "intervals": self.intervals, "coarse_share": self.coarse_share},
            "concurrency_estimator": self.estimator,
            "changes": [c.to_dict() for c in self.changes],
        }


def estimator(iv: Intervals) -> dict:
    """How the pool's interval concurrency was estimated (docs/curve.md "The curve"): `method`
    `littles_law+gauges` where the engines export a latency sum (Little's law over the interval's
    span, weighed with the gauges' mean by their standard errors) or `gauges`; `sum` the histograms
    read; `littles_law_weight` the mean weight Little's law had over the busy intervals."""
    busy = iv.gauges[CONCURRENCY] >= 0.5 if len(iv) else np.zeros(0, dtype=bool)
    weight = round(float(iv.little_weight[busy].mean()), 3) if iv.little_sum and busy.any() else None
    method = "littles_law+gauges" if iv.little_sum else "gauges"
    return {"method": method, "sum": iv.little_sum, "littles_law_weight": weight}


def judge(
    iv: Intervals,
    changes: list[Change],
    settle_s: float,
    th: Thresholds,
    points: Callable[[Intervals], list[Point]] = curve_points,
) -> list[JudgedChange]:
    """Each change's before (since the previous change) against its after (until the next one,
    less the settle time), over the buckets both sides measured: the changed instances' intervals
    where the change names instances, else the whole pool's. `points`: each side's curve from its
    intervals (the records' rows: `record_intervals.recorded_points`)."""
    times = [c.time for c in changes]
    out = []
    for i, c in enumerate(changes):
        lo = times[i - 1] + settle_s if i else -np.inf
        hi = times[i + 1] if i + 1 < len(times) else np.inf
        mine = [u for u, (instance, _) in enumerate(iv.units) if instance in c.instances]
        keep = ~iv.resets & (np.isin(iv.unit, mine) if mine else True)
        b_rows = keep & (iv.t_end > lo) & (iv.t_end < c.time)
        a_rows = keep & (iv.t_end > c.time + settle_s) & (iv.t_end < hi)
        if c.kind == "replicas" and not mine:  # the engines that neither came nor went
            stayed = np.intersect1d(iv.unit[b_rows], iv.unit[a_rows])
            b_rows, a_rows = b_rows & np.isin(iv.unit, stayed), a_rows & np.isin(iv.unit, stayed)
        before, after = iv.take(b_rows), iv.take(a_rows)
        sides = points(before), points(after)
        # where a setting changed, the prefix cache's hits and the step at the same batch are part of
        # what it did (a KV cut evicts the cache and slows the steps): neither gates the verdict
        setting = c.kind == "config"
        for pool in (True, False):
            d, matched, mix, step, unmatched = deltas(*sides, before, after, pool, th)
            gate = gated(mix, cache=not setting)
            v, worse, better = verdict(d, th, gate, None if setting else step, unmatched)
            if c.kind in SETTINGS or v not in ENGINE_VERDICTS:
                break  # a change of no setting takes only no_change from the pools (SETTINGS)
        # a change of no setting is the engine's only where the machine's speed is read held
        unread = step is None and c.kind not in SETTINGS and v in ENGINE_VERDICTS
        if unread:
            v, worse, better = "not_comparable", [], []
        by_rate = None
        if v == "not_comparable" and not unread and not mix_differs(gate, th) and (setting or not step_moved(step, th)):
            by_rate = _by_rate(before, after, th, c.kind)
            if by_rate:
                v, worse, better = by_rate["verdict"], by_rate["worse"], by_rate["better"]
                d, mix = by_rate["deltas"], by_rate["offered_load"]
        reason = UNREAD_STEP if unread else _reason(v, d, gate, None if setting else step, th, unmatched)
        totals = len(np.unique(before.t_end)), len(np.unique(after.t_end))  # each side's length in intervals
        more = more_traffic(*sides, iv.step, totals) if not d else None
        if reason and reason.startswith(UNDECIDED):
            more = more_to_settle(d, th, matched, iv.step, totals) or None
        if v == "not_comparable" and not (reason or by_rate or sides[0] or sides[1]):  # no bucket to ask for
            reason = _nothing_placed(totals, settle_s, iv.step)
        split = by_rate["split"] if by_rate else None
        at = [m.concurrency for m in matched]
        out.append(JudgedChange(c, v, d, worse, better, at, mix, reason, step, more, split, *sides))
    return out


def _by_rate(before: Intervals, after: Intervals, th: Thresholds, kind: str) -> dict | None:
    """Where matched concurrency gave no verdict: the comparison at matched arrival rate
    (compare.at_matched_rate), else, for a setting's change, the curve's order in the rate
    (compare.by_offered_load). A change of no setting (a restart with the same flags, a replica
    count, a curve shift) takes only `no_change` from the rate: a regression or improvement there
    would need the machine's speed held, which the step-time check reads at matched concurrency
    only."""
    setting = kind in SETTINGS
    matched = at_matched_rate(before, after, th, gate_cache=kind != "config")
    if matched and (matched["verdict"] == "no_change" or (setting and matched["verdict"] != "not_comparable")):
        return matched
    return by_offered_load(before, after, th, gate_cache=kind != "config") if setting else None


def _reason(
    v: str, d: dict, mix: dict, step: dict | None, th: Thresholds, unmatched: list[str] | None = None
) -> str | None:
    """Why a change that had matched buckets was given no verdict (None: it was given one)."""
    if v != "not_comparable" or not d:
        return None
    if differs := mix_differs(mix, th):
        said = ", ".join(
            f"{m} {mix[m]['before']:.0f} -> {mix[m]['after']:.0f}" if mix[m] else f"{m} not read" for m in differs
        )
        return f"different workloads at matched concurrency: {said}"
    if step is not None and step_moved(step, th):
        return (
            f"the engine's step time moved: mean ITL {step['before']:.3g} -> {step['after']:.3g} s at the "
            f"same batch ({100 * (step['relative'] or 0):+.0f}%), and a machine that got "
            f"{'slower' if step_moved(step, th) > 0 else 'faster'} (a noisy neighbour) moves the metrics that moved "
            "as a setting the engine does not export does: the window cannot tell them apart"
        )
    if step is not None and not step_held(step, th) and not undecided(d, th):
        lo, hi = _rel(step)
        return (
            f"the engine's step time may have moved: mean ITL {step['before']:.3g} -> {step['after']:.3g} s at "
            f"the same batch ({100 * lo:+.0f}..{100 * hi:+.0f}%), and with it divided out no metric clears the "
            "thresholds: a machine that got faster or slower (a noisy neighbour, a starved API server) is not ruled out"
        )
    if unmatched and not undecided(d, th):
        return (
            f"{', '.join(unmatched)} not compared: at every matched bucket the two sides held different "
            "numbers of requests in the engine (by more than the relative threshold), and below the knee "
            "throughput follows that number; the metrics compared show no change, which is not shown "
            "without it: traffic at the same load on both sides would decide it"
        )
    if open_ := undecided(d, th):
        said = ", ".join(f"{m} {100 * lo:+.0f}..{100 * hi:+.0f}%" for m in open_ for lo, hi in [_rel(d[m])])
        return (
            f"{UNDECIDED}: no metric cleared the thresholds, and the interval of {said} still reaches past "
            "them; more traffic at the matched load would decide it"
        )
    return None


def _nothing_placed(totals: tuple[int, int], settle_s: float, step: float) -> str:
    """Why a change had nothing to compare: neither side's intervals (`totals`, each side's length
    in scrape intervals) place a point on the curve; and the least traffic that could compare them
    (a bucket needs MIN_INTERVALS intervals on each side)."""
    held = [f"{n} scrape interval{'s' * (n != 1)}" + " (none placed on the curve)" * bool(n) for n in totals]
    settled = f", past the first {settle_s:g} s left out while the engine settles" if settle_s else ""
    return (
        f"nothing to compare: the window holds {held[0]} before the change and {held[1]} after it{settled}; "
        f"comparing them takes at least {MIN_INTERVALS} intervals ({MIN_INTERVALS * step:g} s) on each side at a "
        "load both share"
    )


def _rel(d: dict) -> tuple[float, float]:
    iv = d.get("relative_interval") or [float("nan"), float("nan")]
    return iv[0], iv[1]


def curve_shift(
    iv: Intervals, th: Thresholds, points: Callable[[Intervals], list[Point]] = curve_points
) -> JudgedChange | None:
    """Where no label changed: the window's first half against its second at matched load; a
    change of kind `curve` when that is a regression or an improvement and the shift holds in
    both halves of each side (`_replicated`)."""
    if len(iv) < 4:
        return None
    mid = float(np.median(iv.t_end))
    j = judge(iv, [Change(mid, "curve")], 0.0, th, points)[0]
    if j.verdict not in ENGINE_VERDICTS:
        return None
    return j if _replicated(iv, j, th, points) else None


def _replicated(iv: Intervals, j: JudgedChange, th: Thresholds, points: Callable[[Intervals], list[Point]]) -> bool:
    """A `curve` shift has no event to place it: the halves are a split the window invents, and
    within one engine the machine and the load drift (a stretch of noise, a burst), so a shift
    between the halves is noise as often as a change, and judging it on the very intervals that
    found it asks too little. A change at the split moves every part of the after side against
    every part of the before side: each side's intervals of each concurrency bucket are cut into
    their earlier and their later half (in time; the bucket held fixed, so load that climbs
    within a half stays matched), and the earlier halves against each other, then the later
    halves, must each read the same verdict on a metric the halves named. A drift or a stretch
    of noise inside one part of a side does not show in both."""
    mid = j.change.time
    b, ok = placed(iv)
    early = np.zeros(len(iv), dtype=bool)
    for side in (iv.t_end < mid, iv.t_end > mid):
        for bucket in np.unique(b[side & ok]):
            rows = np.flatnonzero(side & ok & (b == bucket))
            rows = rows[np.argsort(iv.t_end[rows], kind="stable")]
            early[rows[: len(rows) // 2]] = True
    named = set(j.worse if j.verdict == "regression" else j.better)
    for part in (early, ok & ~early):
        p = judge(iv.take(part), [Change(mid, "curve")], 0.0, th, points)[0]
        if p.verdict != j.verdict or not named & set(p.worse if j.verdict == "regression" else p.better):
            return False
    return True


def pool_curves(
    frame: Frame,
    slo_s: float = DEFAULT_SLO_TTFT_P99_S,
    th: Thresholds | None = None,
    settle_s: float = SETTLE_S,
    objectives: ObjectiveSet | None = None,
) -> list[PoolCurve]:
    """The curve of every pool in the frame, its operating point and its judged changes; C_max
    also judges each pool's TPOT and e2e objectives (`objectives`) where the engines measure them."""
    th = th or Thresholds()
    events = raw_changes(frame)
    out = []
    for (model, engine), iv in pool_intervals(frame).items():
        pts = curve_points(iv.take(~iv.resets))
        own = objectives.of(pool=model) if objectives else None
        op = operating_point(
            pts, peak_concurrency(iv.gauges[CONCURRENCY]), slo_s, running_max=iv.running_max, objectives=own
        )
        changes = events.get((model, engine), [])
        judged = judge(iv, changes, settle_s, th) if changes else [s for s in [curve_shift(iv, th)] if s]
        labels = {k: v for k, v in (("model", model), ("engine", engine)) if v}
        est = estimator(iv)
        out.append(PoolCurve(labels, pts, op, judged, len(iv), round(coarse_share(iv), 3), iv.signal, iv.step, est))
    return out


def to_json(curves: list[PoolCurve], slo_s: float) -> dict[str, Any]:
    return {"slo_ttft_p99_s": slo_s, "pools": [c.to_dict() for c in curves]}


def regression_findings(curves: list[PoolCurve], window: tuple[float, float], step: float) -> list[Finding]:
    """One `regression_after_change` finding per change to the engines (config, version, restart)
    judged a regression. Not for a replica-count change: more or fewer replicas leave the
    per-instance curve where it is (§8.5, data parallelism), so a per-instance shift then is the new
    replicas' warm-up (the cold replica rule's); nor for a `curve` shift, which has nothing to roll
    back (the rules name its mechanism). Their verdicts are still reported with the changes."""
    out = []
    for pc in curves:
        for j in pc.changes:
            if j.verdict != "regression" or j.change.kind not in FINDING_KINDS:
                continue
            c = j.change
            ev = tuple(
                Evidence(f"{m} change at matched load", j.deltas[m]["delta"], "", m, at=c.time, stat="before->after")
                for m in j.worse
            )
            knobs = [KNOB_LEVERS.get(k, k) for k in c.diff]
            levers = [
                LeverAdvice(
                    "rollback",
                    1,
                    "review",
                    "Roll back the change",
                    (EngineChange("ops", f"restore {diff_text(c.diff, 0)}"),),
                )
            ]
            if knobs:
                levers.append(
                    LeverAdvice(
                        "changed_knob",
                        2,
                        "review",
                        "Revisit the knob that changed",
                        (EngineChange("ops", ", ".join(knobs)),),
                    )
                )
            worst = ", ".join(f"{m} {100 * j.deltas[m]['relative']:+.0f}%" for m in j.worse)
            summary = f"after the {c.kind} change {diff_text(c.diff)} at matched concurrency: {worst}"
            out.append(
                Finding(
                    rule_id=RULE_ID,
                    levers_md="",
                    title="Serving got worse at the same load after a change",
                    severity="warning",
                    where=pc.labels | ({"instance": ",".join(c.instances)} if c.instances else {}),
                    since=c.time,
                    until=window[1],
                    active=True,
                    window=window,
                    step_s=step,
                    score=230.0,
                    summary=summary.replace("  ", " "),
                    evidence=ev,
                    levers=tuple(levers),
                    citations=("002 §8.5", "002 §8.1"),
                    params={"change_kind": c.kind},
                )
            )
    return out


def attach(diagnosis: Diagnosis, curves: list[PoolCurve]) -> Diagnosis:
    """The diagnosis with each pool's changes and a finding per regression (the likely cause when
    nothing else fired)."""
    changes = tuple(
        {"pool": pc.labels, **j.to_dict(), "text": f"{pool_name(pc)}: {line}"} | _follow_up(j, diagnosis)
        for pc in curves
        for j, line in zip(pc.changes, changes_text(pc), strict=True)
    )
    found = regression_findings(curves, diagnosis.window, curves[0].step if curves else 0.0)
    if diagnosis.likely_cause is None and found:
        return replace(diagnosis, likely_cause=found[0], other=diagnosis.other + tuple(found[1:]), changes=changes)
    return replace(diagnosis, other=diagnosis.other + tuple(found), changes=changes)


def with_changes(
    source: Source, diagnosis: Diagnosis, start: float | None, end: float | None, step: float
) -> Diagnosis:
    """`diagnosis` with what changed in the window and regressions at matched load, from the curve
    of the same window of `source` (docs/curve.md): what `kvscope diagnose`, the webhook and the UI
    show. The curve is read at the source's scrape interval (`curve_step`; `step`, the findings',
    where the source cannot say), as `kvscope curve` reads it without --step."""
    return attach(diagnosis, window_curves(source, start, end, step))


def window_curves(source: Source, start: float | None, end: float | None, step: float) -> list[PoolCurve]:
    """Each pool's curve and changes over the window of `source`, read at the source's scrape
    interval (`curve_step`; `step` where the source cannot say): what `with_changes` attaches."""
    return pool_curves(read_window(source, start, end, curve_step(source, start, end, step)))


def _follow_up(j: JudgedChange, diagnosis: Diagnosis) -> dict:
    """Lever follow-up: the findings before a config change whose levers it applied (a knob moved in
    the lever's direction), whether their symptom ended by the change's settle time, and the verdict
    at matched load; {} when none."""
    out: list[dict] = []
    titles: dict[str, str] = {}  # finding -> its title, as the text names it
    # the knob set by hand before the KV capacity it moves (FP8 or more memory also raise the capacity)
    for knob in sorted(j.change.diff, key=lambda k: k == "kv_capacity_tokens"):
        a, b = j.change.diff[knob]
        for lever_id, direction in KNOB_LEVER_IDS.get(knob, ()):
            if (b > a) != (direction == "increase"):
                continue
            for f in diagnosis.findings:
                seen = any(x["finding"] == f.rule_id for x in out)
                if f.since < j.change.time and not seen and any(lv.id == lever_id for lv in f.levers):
                    cleared = not f.active and f.until <= j.change.time + SETTLE_S
                    titles[f.rule_id] = f.title
                    out.append(
                        {"finding": f.rule_id, "levers_md": f.levers_md, "lever": lever_id, "symptom_cleared": cleared}
                    )
    if not out:
        return {}
    said = "; ".join(
        f"{titles[x['finding']]} ({x['lever']}): {'cleared' if x['symptom_cleared'] else 'still there'}" for x in out
    )
    return {"follow_up": out, "text_follow_up": f"lever follow-up: {said}; at matched load: {j.verdict}"}


def pool_name(pc: PoolCurve) -> str:
    """'model=tiny-llama engine=vllm', the CLI's name of a pool."""
    return " ".join(f"{k}={v}" for k, v in pc.labels.items()) or "pool"


def diff_text(diff: dict, side: int | None = None, arrow: str = "->") -> str:
    """'kv_capacity_tokens 8192 -> 640, ...' (each setting's before and after; the weekly report's
    Markdown takes `arrow` '→', where '>' would be escaped), or with `side` (0: before, 1: after)
    'kv_capacity_tokens=8192, ...': the one wording of what a change set."""
    if side is None:
        return ", ".join(f"{k} {a:g} {arrow} {b:g}" for k, (a, b) in diff.items())
    return ", ".join(f"{k}={v[side]:g}" for k, v in diff.items()) or "the previous version/config"


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


COLUMNS = [  # header, width, Point field, format, the UI's header (ui/operating.py points_table)
    ("conc", 6, "concurrency", "{:.2f}", "concurrency"),
    ("ivals", 5, "intervals", "{:d}", "intervals"),
    ("reqs", 6, "requests", "{:.0f}", "requests"),
    ("ttft p50", 9, "ttft_p50_s", "{:.3f}", "TTFT p50 (s)"),
    ("ttft p99", 9, "ttft_p99_s", "{:.3f}", "TTFT p99 (s)"),
    ("itl p50", 8, "itl_p50_s", "{:.3f}", "ITL p50 (s)"),
    ("itl p99", 8, "itl_p99_s", "{:.3f}", "ITL p99 (s)"),
    ("rps", 7, "rps", "{:.2f}", "requests/s"),
    ("tok/s", 8, "output_tokens_per_s", "{:.1f}", "output tokens/s"),
    ("kv", 5, "kv_usage", "{:.2f}", "KV usage"),
    ("wait", 5, "waiting", "{:.1f}", "waiting"),
]


def render_text(curves: list[PoolCurve], slo_s: float) -> str:
    """A readable table per pool, then its operating point and changes."""
    lines = []
    if not curves:
        return f"no pool reports {CONCURRENCY_SIGNAL} in this window: no curve"
    for pc in curves:
        how = pc.estimator or {}
        little = (
            f"Little's law on {how['sum']} sums, weight {_f(how['littles_law_weight'], '{:.2f}')}, with "
            if how.get("method") == "littles_law+gauges"  # the records' signal says how they estimate
            else ""
        )
        lines.append(f"pool {pool_name(pc)}  (concurrency per instance: {little}{pc.signal}; {pc.intervals} intervals)")
        lines.append(" ".join(f"{h:>{w}}" for h, w, *_ in COLUMNS))
        for p in pc.points:
            cells = [_f(getattr(p, attr), fmt).rjust(w) for _, w, attr, fmt, _ in COLUMNS]
            lines.append(" ".join(cells) + ("  sparse" if p.sparse else ""))
        op = pc.operating
        lines += [knee_text(op), c_max_text(op, slo_s)]
        if op.littles_law_gap is not None:
            lines.append(f"Little's Law gap: {op.littles_law_gap:.2f}x")
        lines.append(headroom_text(op))
        if (share := pc.coarse_share or 0.0) > 0.25:
            lines.append(
                f"note: {100 * share:.0f}% of busy intervals are left out: the concurrency swung "
                "faster than it was scraped (scrape more often)"
                + ("" if (pc.estimator or {}).get("sum") else ", and the engine exports no latency sum to integrate it")
            )
        lines += [f"note: {n}" for n in op.notes]
        lines += changes_text(pc)
        lines.append("")
    return "\n".join(lines).rstrip()


def knee_text(op: Operating) -> str:
    """Where the knee is, with the signs seen there, or that the data shows none (the notes say why)."""
    if op.knee_concurrency is None:
        explained = any("knee" in n for n in op.notes)  # operating_point says why it placed none
        return "Knee: none in the measured range (" + (
            "see the notes)." if explained else "fewer than 3 concurrency buckets hold enough data to read one)."
        )
    where = f"at {op.knee_concurrency:g} requests in the engine per instance"
    return f"Knee: {where} (placed by {op.knee_sign}; signs: {', '.join(op.knee_signs)})."


def c_max_text(op: Operating, slo_s: float) -> str:
    """C_max at the SLO and the usable RPS there, or why there is none."""
    if op.c_max is None:
        return f"C_max at TTFT p99 ≤ {slo_s:g} s: none ({op.c_max_note})."
    rps = f"{op.usable_rps:.2f} requests/s per instance" if op.usable_rps is not None else "absent"
    return f"C_max at TTFT p99 ≤ {slo_s:g} s: {op.c_max:g} ({op.c_max_note}); usable RPS there: {rps}."


def headroom_text(op: Operating) -> str:
    """Where the window's peak sits against the knee and C_max, in words (§8.1: size for the burst)."""
    if op.peak_concurrency is None:
        return "The window has no concurrency sample: no peak to place on the curve."
    said = [
        f"The window's peak is {op.peak_concurrency:g} requests in the engine per instance "
        "(99th percentile of the intervals)."
    ]
    for name, mark, ratio in (
        ("the knee", op.knee_concurrency, op.headroom_to_knee),
        ("C_max", op.c_max, op.headroom_to_c_max),
    ):
        if mark is None or ratio is None:
            said.append(f"Against {name}: none measured, so no headroom to it can be read.")
        elif ratio >= 1:
            said.append(f"It is below {name} ({mark:g}): {ratio:g}x headroom.")
        else:
            said.append(f"It is past {name} ({mark:g}): {name}/peak is {ratio:g}, no headroom.")
    return " ".join(said)


def changes_text(pc: PoolCurve) -> list[str]:
    """'What changed in this window' lines of one pool."""
    out = []
    for j in pc.changes:
        moved = "; ".join(
            f"{m} {d['before']:.3g} -> {d['after']:.3g} ({100 * d['relative']:+.0f}%)"
            for m, d in j.deltas.items()
            if d["relative"] is not None
        )
        out.append(f"{change_heading(j)}: {j.verdict}" + (f" [{moved}]" if moved else "") + change_notes(j))
    return out


def change_heading(j: JudgedChange) -> str:
    """'<kind> change at <time>[ on <instances>][: <setting> <before> -> <after>]': the CLI's, the
    webhook's and the UI's one wording of which change it was."""
    c = j.change
    where = f" on {', '.join(c.instances)}" if c.instances else ""
    diff = diff_text(c.diff)
    return f"{c.kind} change at {fmt_time(c.time)}{where}{': ' + diff if diff else ''}"


VERDICT_WORDS = {
    "regression": "regression: worse at matched load",
    "improvement": "improvement: better at matched load",
    "no_change": "no change at matched load: the data excludes a move beyond the thresholds",
    "not_comparable": "not comparable: no verdict",
}
METRIC_WORDS = {"ttft_p99_s": "TTFT p99", "itl_p99_s": "ITL p99", "output_tokens_per_s": "output tokens/s per instance"}
NO_OVERLAP = "the load before and after did not overlap: no concurrency level measured on both sides"


def verdict_text(j: JudgedChange) -> str:
    """The verdict in words, naming the metrics that moved where it is a regression or an
    improvement, and saying the load did not overlap where no verdict was given for that (a change
    given none for another reason says it in `change_notes`, which follows this text): the weekly
    report's and the UI's one wording."""
    words = VERDICT_WORDS[j.verdict]
    named = [w for m, w in METRIC_WORDS.items() if m in j.worse + j.better]
    if named and j.verdict in ENGINE_VERDICTS:
        words += f" ({', '.join(named)})"
    if j.verdict == "not_comparable" and not (j.reason or j.deltas or j.by_arrival_rate):
        words += f" ({NO_OVERLAP})"
    return words


def change_notes(j: JudgedChange) -> str:
    """Why a change got no verdict, how it was judged where no concurrency bucket decided, and the
    traffic that would decide it: the text after the verdict (the CLI's and the UI's one wording)."""
    return (f" ({j.reason})" if j.reason else "") + _rate_text(j.by_arrival_rate) + _more_text(j.more_traffic)


def _rate_text(split: dict | None) -> str:
    """' (judged at the arrival rate: ...)' where the verdict came from the load offered, else ''."""
    if not split:
        return ""
    said = f"{split['after_intervals']} intervals after against {split['before_intervals']} before"
    if split.get("method") == "matched":
        buckets = split["rate_buckets"]
        return f" (judged at the arrival rate: no concurrency bucket decided; {said} in {buckets} rate buckets)"
    return (
        f" (judged at the arrival rate: no concurrency bucket decided; {said} on either side of "
        f"{split['arrival_rate_per_s']:.3g} requests/s)"
    )


def _more_text(more: list[dict] | None) -> str:
    """'; to decide it: ...' from the first bucket of `more_traffic`, or '' where none is estimable."""
    if not more:
        return ""
    x = more[0]
    said = [
        f"{x[side]['more_intervals']} more intervals ({x[side]['more_seconds']:g} s) {side} it"
        for side in ("before", "after")
        if x[side]["more_intervals"]
    ]
    if not said or any(x[side]["more_intervals"] is None for side in ("before", "after")):
        return ""
    wall = [
        f"{x[side]['more_wall_seconds']:g} s {side}"
        for side in ("before", "after")
        if x[side]["more_intervals"] and x[side].get("more_wall_seconds") is not None
    ]
    shaped = f" (at the mix of load each side held so far, about {' and '.join(wall)})" if wall else ""
    return f"; to decide it: {' and '.join(said)} at {x['concurrency']:g} requests in the engine{shaped}"
