"""Durations as PromQL writes them, and the one way kvscope writes a range (`[r]`, `[r:step]`).

Prometheus 2.x selects the samples of a range in [t - r, t]; Prometheus 3 in (t - r, t]. On
samples that sit on the evaluation grid (recording rules read by an alert of the same group,
subquery steps, promtool tests, backfilled blocks) 3.x drops the sample exactly r old: a
`rate(x[1m])` over 15 s records reads 4 samples on 3.x and 5 on 2.x, and a short window's
value, and an alert on it, differ between the two. `range_text` writes every range one
millisecond longer than the rule's, which holds the sample r old on both: the generated rules
read the same samples on either server, and the same as the evaluator's windows (a window of k
grid steps holds k + 1 points, diagnoser/evaluate/grid.py). Off the grid (a live scrape's
jittered timestamps) the extra millisecond almost never adds a sample (docs/rules.md).
"""

from __future__ import annotations

from typing import Any

from kvscope.core.scalars import UNIT_S, parse_duration

RANGE_EDGE_S = 0.001
"""How much longer than the rule's range every PromQL range is written (`range_text`)."""


EXACT_UNITS = ("y", "w")
"""Units written only where they divide the whole duration (years and weeks: `90d`, not `12w6d`)."""


def prom_duration(value: Any) -> str:
    """A rule duration (`2m`, `90s`, or seconds as a number) written as Prometheus writes it
    (`model.Duration.String`, what /api/v1/format_query prints), to the millisecond: `2m`,
    `1m30s`, `1h5m`, `1d`, `200ms`, `7s500ms`."""
    ms = int(round(parse_duration(value) * 1000))
    left, parts = ms, []
    for unit, size in sorted(((u, round(sec * 1000)) for u, sec in UNIT_S.items()), key=lambda us: -us[1]):
        if unit in EXACT_UNITS and ms % size:
            continue
        n, left = divmod(left, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


def range_text(duration: Any) -> str:
    """A range for `[...]` (a selector's or a subquery's): `duration` plus RANGE_EDGE_S, so that
    Prometheus 2.x and 3.x read the same samples (`1m` -> `1m1ms`)."""
    return prom_duration(parse_duration(duration) + RANGE_EDGE_S)
