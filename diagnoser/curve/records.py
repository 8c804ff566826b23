"""The curve's recording rules (`kvscope-curve.yml`); recorded.py reads the curve and its changes back.

Read in full, a pool's curve needs every engine's TTFT and ITL buckets over the window: a week of
a large fleet is gigabytes through the client (docs/curve.md "From recording rules"). The TSDB can keep
the curve's sums instead, at each evaluation of one rule group (every `interval`, each rule
reading the last `interval` of samples):

1. `kvscope:curve_concurrency:avg` per engine: the time-average requests in it over the interval
   (`intervals.CONCURRENCY`), by Little's law from the first of window.LITTLE_SUMS it exports (the
   rate of the seconds its requests spent in it, where one finished in the interval), else the
   mean of the running gauge plus waiting where it exports its queue, else of running;
   `kvscope:curve_bucket:avg` the same, labelled with its concurrency bucket
   (`concurrency_bucket`: the bucket's lower edge, points.EDGES; "0" below the first: idle).
2. Per pool (model x engine) and concurrency bucket, the sums a point is computed from
   (points.BucketSums): the intervals and their concurrency, each histogram bucket's increase, each
   counter's increase and its square, the means of KV usage and of waiting (from the queue-time
   sum where a request finished, as the concurrency, else the gauge) and how many intervals had
   them, and the prompt tokens (the token mix a change is compared at). Each joins the
   engine's increases to its bucket of the same interval.
3. Per pool, `kvscope:curve_restarts:count`: the restarts (drops of an engine's counters) in the last
   RESTART_SPAN_S (a restarted engine's series has a gap that a shorter range would not span):
   where what changed is looked for, at each rise of the count.

Each evaluation's samples of step 2 are one interval of one pool bucket: recorded.py reads them as
the rows the curve's points and the block bootstrap of a change's verdict are computed from. Rules
of one group run in order at one time, so step 2 reads step 1 of the same evaluation (Prometheus;
vmalert in replay mode needs step 1 flushed first).

What differs from the curve read in full: an interval is the rule's `interval` (not the scrape
interval), its concurrency Little's law or the gauges' mean, never the two weighed by their errors
(a rule keeps no per-interval error), and no interval is left out for swinging faster than
sampled; the window's peak is the 99th percentile of the recorded concurrency buckets
(interpolated). Prometheus' `increase` extrapolates to the interval's edges; VictoriaMetrics' does
not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvscope.core.signals import Catalog
from kvscope.diagnoser.curve.intervals import QUEUE_SUM, WAITING
from kvscope.diagnoser.curve.points import EDGES
from kvscope.diagnoser.curve.window import CONCURRENCY_SIGNAL, COUNTERS, HISTOGRAMS, LITTLE_SUMS, MIX_COUNTERS
from kvscope.diagnoser.promql.signals import InlineSignals, prom_number
from kvscope.diagnoser.rulebook.rule import parse_duration

FILE = "kvscope-curve.yml"
GROUP = "kvscope-curve"
DEFAULT_INTERVAL = "1m"
"""The rules' interval, also the span each reads: it needs two scrapes in it (a scrape interval
of 30 s or less; `kvscope rules build --curve-interval 2m` for 60 s scrapes)."""
BUCKET = "concurrency_bucket"
UNIT = ("instance", "engine", "model", "dp_rank")
POOL = ("model", "engine")
GAUGES = ("engine_kv_cache_usage_ratio", WAITING)
PREFIX = "kvscope:curve_"
RESTART_SPAN_S = 300
"""Seconds `kvscope:curve_restarts:count` looks back for a counter's drop: a restart whose series
gap is longer is not seen (as a TSDB's 5-minute lookback)."""
BOUNDS = [0.0, *EDGES.tolist()]
"""The buckets' edges with the idle one ([0, first edge)) in front: bucket k spans BOUNDS[k + 1:k + 3]."""


def _this_evaluation(interval: str) -> Callable[[str], str]:
    """A record of this group as written by this evaluation only: its samples in the last half
    interval. Read as a plain instant vector, an engine's bucket of an earlier interval would stay
    visible for the TSDB's lookback (5 minutes) where no staleness marker ends it (VictoriaMetrics'
    vmalert in replay mode writes none), and the engine would count in two buckets at once."""
    half = f"{max(1, int(parse_duration(interval)) // 2)}s"
    return lambda record: f"last_over_time({record}[{half}])"


def curve_rules(catalog: Catalog, interval: str = DEFAULT_INTERVAL) -> list[dict[str, Any]]:
    """The group's rules, in evaluation order."""
    read = InlineSignals(catalog)

    def over(signal: str, fn: str, outer: str, extra: tuple[str, ...] = ()) -> str:
        return read.read(signal, [], fn=fn, rng=interval, by=(*UNIT, *extra), outer=outer)

    on = f"on ({', '.join(UNIT)})"
    # Little's law: the seconds the requests spent in the engine per second of the interval, from
    # the first of LITTLE_SUMS an engine exports, where a request finished in it (else the sum says
    # nothing of the ones in flight); the gauges' mean where it exports none (as the raw path)
    finished = [f"({over(f'{names[-1]}_count', 'increase', 'sum')} > 0)" for names in LITTLE_SUMS]
    little = [
        f"({f' + {on} '.join(over(f'{h}_sum', 'rate', 'sum') for h in names)}) and {on} {done}"
        for names, done in zip(LITTLE_SUMS, finished, strict=True)
    ]
    # the queue the same way where the engine exports its queue-time sum (intervals.QUEUE_SUM),
    # where any count it exports rose (they count the same finished requests; the raw path reads
    # the first it exports)
    queued = f"({over(f'{QUEUE_SUM}_sum', 'rate', 'sum')} and {on} ({' or '.join(finished)}))"
    running = over(CONCURRENCY_SIGNAL, "avg_over_time", "max")
    waiting = over(WAITING, "avg_over_time", "max")
    conc = " or ".join(f"({x})" for x in [*little, f"{running} + {on} {waiting}", running])
    now = _this_evaluation(interval)
    branches = [
        f'label_replace({now(f"{PREFIX}concurrency:avg")} >= {prom_number(lo)} < {prom_number(hi)}, "{BUCKET}", '
        f'"{prom_number(lo)}", "", "")'
        for lo, hi in zip(BOUNDS, BOUNDS[1:], strict=False)
    ]
    bucket = now(f"{PREFIX}bucket:avg")
    one = f"on ({', '.join(UNIT)}) group_left ({BUCKET}) ({bucket} * 0 + 1)"
    pool = ", ".join((*POOL, BUCKET))
    rules = [
        {"record": f"{PREFIX}concurrency:avg", "expr": conc},
        {"record": f"{PREFIX}bucket:avg", "expr": "\nor\n".join(branches)},
        {"record": f"{PREFIX}intervals:count", "expr": f"count by ({pool}) ({bucket})"},
        {"record": f"{PREFIX}concurrency:sum", "expr": f"sum by ({pool}) ({bucket})"},
    ]
    for h in HISTOGRAMS:
        inc = over(f"{h}_bucket", "increase", "sum", ("le",))
        rules.append({"record": f"{PREFIX}{h}_bucket:increase", "expr": f"sum by ({pool}, le) ({inc} * {one})"})
    for c in COUNTERS:
        inc = over(c, "increase", "sum")
        rules.append({"record": f"{PREFIX}{c}:increase", "expr": f"sum by ({pool}) ({inc} * {one})"})
        rules.append({"record": f"{PREFIX}{c}:increase_squared", "expr": f"sum by ({pool}) (({inc}) ^ 2 * {one})"})
        rules.append({"record": f"{PREFIX}{c}:intervals", "expr": f"count by ({pool}) ({inc} * {one})"})
    for g in GAUGES:
        mean = over(g, "avg_over_time", "max")
        mean = f"({queued} or ({mean}))" if g == WAITING else mean
        rules.append({"record": f"{PREFIX}{g}:sum", "expr": f"sum by ({pool}) ({mean} * {one})"})
        rules.append({"record": f"{PREFIX}{g}:intervals", "expr": f"count by ({pool}) ({mean} * {one})"})
    for c in MIX_COUNTERS:  # the token mix a change is compared at (compare.MIX)
        inc = over(c, "increase", "sum")
        rules.append({"record": f"{PREFIX}{c}:increase", "expr": f"sum by ({pool}) ({inc} * {one})"})
    # the restarts (an engine's counters dropped) in the last RESTART_SPAN (at least five intervals), per
    # pool, from every counter the raw path reads restarts from: a restarted engine's series has a
    # gap, and the drop is seen once its first sample after it arrives (recorded.py reads a rise
    # of this count as the restart)
    twice = f"{max(RESTART_SPAN_S, 5 * int(parse_duration(interval)))}s"
    counters = (*COUNTERS, *(f"{h}_count" for h in HISTOGRAMS))
    resets = " or ".join(f"({read.read(c, [], fn='resets', rng=twice, by=UNIT, outer='sum')})" for c in counters)
    unit, by_pool = ", ".join(UNIT), ", ".join(POOL)
    rules.append({"record": f"{PREFIX}restarts:count", "expr": f"sum by ({by_pool}) (max by ({unit}) ({resets}) > 0)"})
    return rules


def curve_file(catalog: Catalog, interval: str = DEFAULT_INTERVAL) -> tuple[str, list[dict[str, Any]]]:
    """(file name, rule groups) of `kvscope-curve.yml`."""
    return FILE, [{"name": GROUP, "interval": interval, "rules": curve_rules(catalog, interval)}]
