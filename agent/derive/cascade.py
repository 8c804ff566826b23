"""Eviction-cascade detector: one incident per engine instead of four unrelated alerts.

The memory-pressure cascade of seeds/002 §7.4 in stages (docs/requests.md §5): 1 `kv_high` the
KV pool fills (or anything is evicted: engines evict only from a full pool); 2 `evicting` blocks
evicted / requests preempted (by counter, or read from the queues as kv_pressure_cascade does:
`evicting_from`); 3 `queueing` requests wait; 4 `latency` TTFT grows while requests queue, or GPU
utilisation drops while the pool is full. A stage the source cannot show is `not_evaluable`,
never healthy. The current stage is the deepest holding at the last point while stage 1 holds;
the lead time is onset(4) - onset(1). `evaluate_cascade` is the offline detector and
`CascadeWindow` the live derive hook; both evaluate an instance's window the same way."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvscope.core.rates import deltas
from kvscope.core.signals import Sample, make_labels

STAGES = ("healthy", "kv_high", "evicting", "queueing", "latency")
"""Stage number -> name (002 §7.4, Figure 7.4)."""

_KV = "engine_kv_cache_usage_ratio"
_WAITING = "engine_requests_waiting"
_GPU = "gpu_utilization_ratio"
_RUNNING = "engine_requests_running"
_EVICTION_COUNTERS = (
    "engine_preemptions_total",
    "engine_kv_evicted_tokens_total",
    "kv_blocks_evicted_recomputed_total",
)
_TTFT = "request_ttft_seconds"
_TTFT_SUM, _TTFT_COUNT = _TTFT + "_sum", _TTFT + "_count"
CASCADE_SIGNALS = frozenset({_KV, _WAITING, _GPU, _RUNNING, *_EVICTION_COUNTERS, _TTFT_SUM, _TTFT_COUNT})
"""Every canonical series the detector reads."""


@dataclass(frozen=True)
class CascadeConfig:
    """Thresholds. Defaults follow 002 §9.3: KV above 90% leaves no headroom."""

    kv_high_ratio: float = 0.90
    queue_min: float = 1.0  # waiting requests that count as a queue, in queue_samples consecutive
    queue_samples: int = 2  # samples (a request between arrival and its first step is no queue)
    queue_min_s: float = 0.0  # spanning this many seconds, like an alert's `for:`
    ttft_factor: float = 2.0  # windowed mean TTFT >= factor x baseline -> symptom
    ttft_min_delta_s: float = 0.05  # ... and at least this much above baseline (noise floor)
    gpu_drop_ratio: float = 0.2  # GPU utilisation this far below its baseline -> symptom
    # stage 2 without an eviction counter (kv_pressure_cascade's held_queue / max_running_growth)
    smooth_s: float = 60.0  # KV read as its max, queue and batch as their mean over this
    slope_s: float = 120.0  # ... the batch's growth as the slope of its mean over this
    reference_window_s: float = 900.0  # shorter windows scale both down (>= 1/50), as rules scale
    held_queue: float = 1.0  # waiting requests (mean) that hold
    max_running_growth: float = 0.005  # running requests per second the batch may grow by


@dataclass
class CascadeReport:
    """The cascade state of one engine instance over the evaluated window."""

    instance: str
    stage: int = 0  # current stage 0..4
    onsets: dict[int, float] = field(default_factory=dict)  # stage -> first time its condition held
    evidence: dict[str, float | None] = field(default_factory=dict)
    signals_missing: list[str] = field(default_factory=list)
    not_evaluable: list[str] = field(default_factory=list)  # stage names the signals cannot show
    evicting_from: str | None = None  # stage 2 first shown by "counter" or "queues"

    @property
    def lead_time_s(self) -> float | None:
        """Seconds from the root (KV high) to the latency symptom; None until both happened."""
        if 1 in self.onsets and 4 in self.onsets:
            return self.onsets[4] - self.onsets[1]
        return None


class _Series(dict[str, list[tuple[float, float]]]):
    """Time-ordered points of one instance per cascade signal; a signal it lacks reads as []."""

    def __missing__(self, name: str) -> list[tuple[float, float]]:
        return []


def _evictions(ser: _Series) -> list[list[tuple[float, float]]]:
    return [ser[name] for name in _EVICTION_COUNTERS if ser[name]]


def evaluate_cascade(samples: Iterable[Sample], config: CascadeConfig | None = None) -> dict[str, CascadeReport]:
    """Cascade report per `instance` label; samples without a timestamp or instance are ignored.
    Series of several DP ranks / models of one instance are combined (max of KV and GPU
    utilisation, sum of request counts and counters): the cascade is a property of the process."""
    cfg = config or CascadeConfig()
    return {inst: _evaluate_instance(inst, s, cfg) for inst, s in sorted(_group(samples).items())}


def _group(samples: Iterable[Sample]) -> dict[str, _Series]:
    raw: dict[str, dict[str, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    for s in samples:
        inst = s.label("instance")
        if s.timestamp is None or inst is None or s.value != s.value:
            continue
        by_name = raw[inst]
        if s.name in (_KV, _GPU):
            by_name[s.name][s.timestamp] = max(by_name[s.name].get(s.timestamp, float("-inf")), s.value)
        elif s.name in CASCADE_SIGNALS:
            by_name[s.name][s.timestamp] = by_name[s.name].get(s.timestamp, 0.0) + s.value
    return {inst: _Series({n: sorted(pts.items()) for n, pts in by_name.items()}) for inst, by_name in raw.items()}


def _evaluate_instance(instance: str, ser: _Series, cfg: CascadeConfig) -> CascadeReport:
    report = CascadeReport(instance=instance)
    report.signals_missing = _missing(ser)
    if not ser[_KV]:
        return report  # without KV usage there is no root to attribute: absent, not healthy
    report.not_evaluable = _not_evaluable(ser)
    grid = [t for t, _ in ser[_KV]]
    conditions, by_counter = _stage_conditions(ser, grid, cfg, report)
    for stage in range(1, 5):
        i = next((i for i, ok in enumerate(conditions[stage]) if ok), None)
        if i is not None:
            report.onsets[stage] = grid[i]
            if stage == 2:
                report.evicting_from = "counter" if by_counter[i] else "queues"
    report.stage = _current_stage(conditions)
    return report


def _missing(ser: _Series) -> list[str]:
    names = (_KV, "|".join(_EVICTION_COUNTERS), _WAITING, _RUNNING, _TTFT, _GPU)
    present = (ser[_KV], _evictions(ser), ser[_WAITING], ser[_RUNNING], ser[_TTFT_COUNT], ser[_GPU])
    return [name for name, points in zip(names, present, strict=True) if not points]


def _not_evaluable(ser: _Series) -> list[str]:
    """Stages no signal of this source can show (stage 1 always can: KV usage is there)."""
    out = {
        "evicting": not _evictions(ser) and not (ser[_WAITING] and ser[_RUNNING]),
        "queueing": not ser[_WAITING],
        "latency": not (ser[_TTFT_COUNT] and ser[_WAITING]) and not ser[_GPU],
    }
    return [name for name, blind in out.items() if blind]


def _current_stage(conditions: dict[int, list[bool]]) -> int:
    """The deepest stage whose condition holds at the last sample, while the root (1) holds too."""
    if not conditions[1] or not conditions[1][-1]:
        return 0
    return max(k for k in range(1, 5) if conditions[k][-1])


def _stage_conditions(
    ser: _Series, grid: list[float], cfg: CascadeConfig, report: CascadeReport
) -> tuple[dict[int, list[bool]], list[bool]]:
    """Each stage's condition at every grid point, and whether a counter showed the eviction."""
    evict = _evicting(ser, grid)
    # An engine evicts / preempts only when an allocation found the pool exhausted, so an eviction
    # interval is itself evidence of a full pool; the sampled usage gauge can miss that instant.
    kv = [v >= cfg.kv_high_ratio or e for (_, v), e in zip(ser[_KV], evict, strict=True)]
    held, slope = _batch_held(ser, grid, cfg)
    waiting = _sustained(
        [v is not None and v >= cfg.queue_min for v in _at(ser[_WAITING], grid)],
        grid,
        cfg.queue_samples,
        cfg.queue_min_s,
    )
    first_high = next((t for t, ok in zip(grid, kv, strict=True) if ok), None)
    ttft_bad, ttft_base, ttft_now = _ttft_degraded(ser, grid, first_high, cfg)
    gpu_bad, gpu_base, gpu_now = _gpu_dropped(ser, grid, first_high, cfg)
    # The symptom counts as this cascade's stage 4 only alongside its mechanism: TTFT grows while
    # requests queue, GPU utilisation drops while the pool is full or evicting. A TTFT rise
    # without a queue (prefill interference, a starved host) is another problem for other rules.
    latency = [
        (t and q) or (g and (k or e)) for t, q, g, k, e in zip(ttft_bad, waiting, gpu_bad, kv, evict, strict=True)
    ]
    stage2 = [e or h for e, h in zip(evict, held, strict=True)]
    report.evidence = {
        "kv_usage_ratio": ser[_KV][-1][1],
        "kv_usage_ratio_max": max(v for _, v in ser[_KV]),
        "waiting_max": max((v for _, v in ser[_WAITING]), default=None),
        "ttft_baseline_s": ttft_base,
        "ttft_last_s": ttft_now,
        "gpu_utilization_baseline_ratio": gpu_base,
        "gpu_utilization_last_ratio": gpu_now,
        "evictions_window_total": _total_increase(ser),
        "running_growth_per_s": slope,
    }
    return {1: kv, 2: stage2, 3: waiting, 4: latency}, evict


def _batch_held(ser: _Series, grid: list[float], cfg: CascadeConfig) -> tuple[list[bool], float | None]:
    """Stage 2 read from the queues at each grid point (pool full, requests waiting, batch not growing:
    see CascadeConfig), and the last batch slope (None: fewer than three points)."""
    scale = max(0.02, min(1.0, (grid[-1] - grid[0]) / cfg.reference_window_s))
    smooth, slope_s = cfg.smooth_s * scale, cfg.slope_s * scale
    kv = _over(ser[_KV], grid, smooth, max)
    waiting = _over(ser[_WAITING], grid, smooth, _mean)
    running = [(t, v) for t, v in zip(grid, _over(ser[_RUNNING], grid, smooth, _mean), strict=True) if v is not None]
    slopes = dict(zip([t for t, _ in running], _over(running, [t for t, _ in running], slope_s, None), strict=True))
    held = [
        k is not None
        and k >= cfg.kv_high_ratio
        and w is not None
        and w >= cfg.held_queue
        and (g := slopes.get(t)) is not None
        and g <= cfg.max_running_growth
        for t, k, w in zip(grid, kv, waiting, strict=True)
    ]
    return held, slopes.get(grid[-1])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _over(
    points: list[tuple[float, float]], grid: list[float], width_s: float, agg: Callable[[list[float]], float] | None
) -> list[float | None]:
    """`agg` of the point values in (t - width_s, t] at each grid time, at least the last point;
    with agg None, the least-squares slope of those points, at least the last three (a range
    scaled below the interval reads them, as the diagnoser's does). None: too few points yet."""
    times, need = [t for t, _ in points], 1 if agg else 3
    out: list[float | None] = []
    for t in grid:
        hi = bisect_right(times, t)
        window = points[max(0, min(bisect_right(times, t - width_s), hi - need)) : hi]
        if len(window) < need:
            out.append(None)
        elif agg is not None:
            out.append(agg([v for _, v in window]))
        else:
            mx, my = _mean([x for x, _ in window]), _mean([y for _, y in window])
            den = sum((x - mx) ** 2 for x, _ in window)
            out.append(sum((x - mx) * (y - my) for x, y in window) / den if den > 0 else None)
    return out


def _sustained(flags: list[bool], times: list[float], n: int, min_s: float = 0.0) -> list[bool]:
    """True from the first sample of every run of at least n consecutive True samples whose last
    sample is at least `min_s` seconds after its first."""
    out = [False] * len(flags)
    start, held = 0, False
    for i, f in enumerate(flags):
        if not f:
            start, held = i + 1, False
            continue
        if held:
            out[i] = True
        elif i - start + 1 >= n and times[i] - times[start] >= min_s:
            out[start : i + 1] = [True] * (i + 1 - start)
            held = True
    return out


def _at(points: list[tuple[float, float]], grid: list[float]) -> list[float | None]:
    """Last value at or before each grid time (step interpolation); None before the first point."""
    times = [t for t, _ in points]
    return [points[i - 1][1] if (i := bisect_right(times, t)) else None for t in grid]


def _evicting(ser: _Series, grid: list[float]) -> list[bool]:
    """True at grid points whose preceding interval saw any eviction / preemption."""
    hot = sorted({t for pts in _evictions(ser) for t, inc in deltas(pts) if inc > 0})
    out, prev_t = [], float("-inf")
    for t in grid:
        i = bisect_right(hot, prev_t)
        out.append(i < len(hot) and hot[i] <= t)
        prev_t = t
    return out


def _total_increase(ser: _Series) -> float | None:
    return sum(inc for pts in _evictions(ser) for _, inc in deltas(pts)) if _evictions(ser) else None


def _window_means(ser: _Series) -> list[tuple[float, float]]:
    """Mean TTFT of the requests that finished in each scrape interval (from _sum/_count deltas)."""
    sums = dict(deltas(ser[_TTFT_SUM]))
    return [(t, sums[t] / n) for t, n in deltas(ser[_TTFT_COUNT]) if n > 0 and t in sums]


def _ttft_degraded(
    ser: _Series, grid: list[float], first_high: float | None, cfg: CascadeConfig
) -> tuple[list[bool], float | None, float | None]:
    means = _window_means(ser)
    base_pts = [v for t, v in means if first_high is None or t <= first_high]
    if not means or not base_pts:
        return [False] * len(grid), None, (means[-1][1] if means else None)
    base = min(base_pts)
    # a grid point is bad when the latest TTFT window at or before it was
    bad = [(t, float(v >= base * cfg.ttft_factor and v - base >= cfg.ttft_min_delta_s)) for t, v in means]
    return [v == 1.0 for v in _at(bad, grid)], base, means[-1][1]


def _gpu_dropped(
    ser: _Series, grid: list[float], first_high: float | None, cfg: CascadeConfig
) -> tuple[list[bool], float | None, float | None]:
    base_pts = [v for t, v in ser[_GPU] if first_high is None or t <= first_high]
    if not base_pts:
        return [False] * len(grid), None, (ser[_GPU][-1][1] if ser[_GPU] else None)
    base = max(base_pts)
    vals = _at(ser[_GPU], grid)
    bad = [
        v is not None
        and base > 0
        and v <= base * (1 - cfg.gpu_drop_ratio)
        and first_high is not None
        and t > first_high
        for t, v in zip(grid, vals, strict=True)
    ]
    return bad, base, ser[_GPU][-1][1]


def render_cascade_samples(reports: Mapping[str, CascadeReport], timestamp: float | None = None) -> list[Sample]:
    """The kvscope-produced cascade series (core/catalog.yaml): the stage code for every
    instance with KV usage, onsets and lead time only once reached (absent, never zero)."""
    out: list[Sample] = []
    for inst, rep in reports.items():
        if "engine_kv_cache_usage_ratio" in rep.signals_missing:
            continue
        out.append(Sample("engine_cascade_stage_code", make_labels({"instance": inst}), float(rep.stage), timestamp))
        for stage, onset in sorted(rep.onsets.items()):
            labels = make_labels({"instance": inst, "stage": STAGES[stage]})
            out.append(Sample("engine_cascade_stage_onset_timestamp_seconds", labels, onset, timestamp))
        if rep.lead_time_s is not None:
            out.append(
                Sample("engine_cascade_lead_seconds", make_labels({"instance": inst}), rep.lead_time_s, timestamp)
            )
    return out


class CascadeWindow:
    """The live derive hook: each cycle's `CASCADE_SIGNALS` join their instance's window of the last
    `window_s` of data time, and the cycle's instances are evaluated over it. Bounded by `max_points`
    per series and `max_instances` (silent for a window, then least recently seen, go first). Points
    out of order and instances whose evaluation raised are counted in `dropped` (shown as
    `kvscope_samples_dropped_total{collector="derive_cascade"}`)."""

    __name__ = "cascade"

    def __init__(
        self,
        window_s: float = 900.0,
        config: CascadeConfig | None = None,
        max_instances: int = 1024,
        max_points: int = 4096,
    ) -> None:
        self.window_s, self.config = window_s, config or CascadeConfig()
        self.max_instances, self.max_points = max_instances, max_points
        self.series: dict[str, _Series] = {}
        self.dropped: Counter[str] = Counter()

    def __call__(self, cycle: Sequence[Sample]) -> list[Sample]:
        new = _group([s for s in cycle if s.name in CASCADE_SIGNALS])
        now = max((pts[-1][0] for ser in new.values() for pts in ser.values() if pts), default=None)
        if now is None:
            return []
        for inst, ser in new.items():  # each trimmed by its own newest point: a skewed clock skews only itself
            since = max((p[-1][0] for p in ser.values() if p), default=now) - self.window_s
            old = self.series.setdefault(inst, _Series())
            for name in old.keys() | ser.keys():
                self._append(old.setdefault(name, []), ser[name], since)
        last = {inst: max((p[-1][0] for p in ser.values() if p), default=-1.0) for inst, ser in self.series.items()}
        for inst in sorted(last, key=last.__getitem__)[: max(0, len(last) - self.max_instances)]:
            del self.series[inst]  # the least recently seen past max_instances (hostile labels)
        for inst in [i for i, t in last.items() if t < now - self.window_s and i in self.series]:
            del self.series[inst]  # silent for a whole window: gone
        out: list[Sample] = []
        for inst in sorted(new.keys() & self.series.keys()):
            ser = self.series[inst]
            try:
                rep = _evaluate_instance(inst, ser, self.config)
                out += render_cascade_samples({inst: rep}, ser[_KV][-1][0] if ser[_KV] else None)
            except Exception as e:  # noqa: BLE001 - one instance's bad data must not silence the others
                self.dropped[f"exception_{type(e).__name__}"] += 1
        return out

    def _append(self, old: list[tuple[float, float]], new: list[tuple[float, float]], since: float) -> None:
        """Append the points after old's last, keep those from `since` on (at most max_points)."""
        fresh = [p for p in new if not old or p[0] > old[-1][0]]
        if len(fresh) < len(new):
            self.dropped["out_of_order"] += len(new) - len(fresh)
        old += fresh
        del old[: max(bisect_left(old, (since,)), len(old) - self.max_points)]
