"""Where a pool operates on its curve ("Sizing LLM Inference for Production", §8.1 and §8.3).

The knee (§8.1): the lowest concurrency from which the engine shows it is saturated, by the first
of these signs that holds there (`knee_sign`), each read from what the engine exports:

* `running_pinned`: the running batch at its limit while requests queue: mean running within one
  request of the most the window ever saw running (`running_max`, the engine's cap: vLLM
  --max-num-seqs, or what its KV cache admits) and mean waiting >= `wait_min`. The queue and the
  batch's use move before latency does (the guide's leading indicator of the knee);
* `kv_full`: KV usage at or above `kv_full` (the KV-pressure rules' "full") while requests wait or
  are preempted: admission is bound by the KV cache;
* `p99_leaves_p50`: TTFT p99 leaves p50 (p99/p50 grows by `spread_factor` over the lowest bucket's
  while p50 stays within `flat_factor` of its level) with at least one other sign: throughput
  flattening (the marginal output tokens/s per added request falls below `flat_gain` of the first
  bucket's tokens/s per request), requests starting to wait (mean waiting >= `wait_min`),
  preemptions, KV full; the divergence alone where the engine exports none of them;
* `throughput_flat`: throughput gains flatten (as above) while requests wait (mean waiting >=
  `wait_min`): queueing dominates and each added request buys little (the guide's Figure 8.1).

The signs must hold at the next measured bucket too (the knee is a region). None when the data
shows no knee, and None (with a note) when the lowest measured bucket is saturated already: the
knee is below the measured range and is never extrapolated. Where the measured buckets place none,
the signs are read over every bucket, sparse ones too, and the knee is placed where a sign holds at
every bucket above a load and at none below it, each side holding as many intervals as a point
(`_above`, with a note); where they hold fewer, no knee is placed and a note says where
saturation shows and how many more intervals, at which load, would place it.
C_max (§8.3): where TTFT p99 crosses the SLO, interpolated between the last bucket under it and
the first over it; the usable RPS is the RPS there. The Little's Law gap (§8.3): the ceiling
C_max / SLO over the usable RPS (under 2 the curve is consistent). Headroom: the window's peak
concurrency against the knee and C_max.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np

from kvscope.core.objectives import Objectives
from kvscope.diagnoser.curve.points import MIN_INTERVALS, Point

DEFAULT_SLO_TTFT_P99_S = float(Objectives().ttft or 0.0)
"""The default TTFT objective (core/objectives.py), the bound the generated SLO rules burn on."""


@dataclass(frozen=True)
class KneeParams:
    spread_factor: float = 2.0
    flat_factor: float = 1.5
    flat_gain: float = 0.5
    wait_min: float = 0.5
    kv_full: float = 0.9  # the KV-pressure rules' default kv_full (002 §9.3: target band 75-90 %)
    pinned_slack: float = 1.0  # requests below the running cap still counted as pinned


@dataclass
class Operating:
    knee_concurrency: float | None
    knee_signs: list[str]
    c_max: float | None
    c_max_note: str
    usable_rps: float | None
    littles_law_gap: float | None
    peak_concurrency: float | None
    headroom_to_knee: float | None  # knee / peak (below 1: the peak is past the knee)
    headroom_to_c_max: float | None
    notes: list[str] = field(default_factory=list)
    knee_sign: str | None = None  # the sign that placed the knee (PLACING)
    running_max: float | None = None  # the running_pinned sign's cap (None: not read)

    def to_dict(self) -> dict:
        return asdict(self)


PLACING = ("running_pinned", "kv_full", "p99_leaves_p50", "throughput_flat")
"""The signs that place a knee, in the order one is named when several hold at it."""


def _signs(points: list[Point], p: KneeParams, running_max: float | None = None) -> list[set[str]]:
    base = points[0]
    p50_0, p99_0 = base.ttft_p50_s, base.ttft_p99_s
    per_req0 = base.output_tokens_per_s / base.concurrency if base.output_tokens_per_s is not None else None
    out = []
    for prev, pt in zip([None, *points], points, strict=False):
        s = set()
        p50, p99 = pt.ttft_p50_s, pt.ttft_p99_s
        if (
            p50_0
            and p99_0
            and p50
            and p99
            and p99 / p50 >= p.spread_factor * p99_0 / p50_0
            and p50 <= p.flat_factor * p50_0
        ):
            s.add("p99_leaves_p50")
        if (
            prev is not None
            and per_req0
            and pt.output_tokens_per_s is not None
            and prev.output_tokens_per_s is not None
        ):
            gain = (pt.output_tokens_per_s - prev.output_tokens_per_s) / max(pt.concurrency - prev.concurrency, 1e-9)
            if gain < p.flat_gain * per_req0:
                s.add("throughput_flat")
        if pt.waiting is not None and pt.waiting >= p.wait_min:
            s.add("requests_wait")
        if pt.preemptions_per_s is not None and pt.preemptions_per_s > 0:
            s.add("preemptions")
        waits = "requests_wait" in s
        if waits and running_max and pt.running is not None and pt.running >= running_max - p.pinned_slack:
            s.add("running_pinned")
        if pt.kv_usage is not None and pt.kv_usage >= p.kv_full and (waits or "preemptions" in s):
            s.add("kv_full")
        out.append(s)
    return out


def _placed_by(s: set[str], others: bool) -> str | None:
    """The sign that places a knee at a bucket with signs s, or None."""
    for sign in PLACING[:2]:
        if sign in s:
            return sign
    if "p99_leaves_p50" in s and (len(s) >= 2 or not others):
        return "p99_leaves_p50"
    if "throughput_flat" in s and "requests_wait" in s:
        return "throughput_flat"
    return None


def _placements(
    points: list[Point], p: KneeParams, running_max: float | None, thin: bool = False
) -> tuple[list[Point], list[set[str]], list[str | None]]:
    """(the measured buckets, the signs at each, the sign that would place a knee there); `thin`:
    every bucket, sparse ones too."""
    dense = points if thin else [pt for pt in points if not pt.sparse]
    if len(dense) < 3:
        return [], [], []
    signs = _signs(dense, p, running_max)
    others = any(pt.output_tokens_per_s is not None or pt.waiting is not None for pt in dense)
    return dense, signs, [_placed_by(s, others) for s in signs]


class Above(NamedTuple):
    """Over every bucket, sparse ones too: the lowest bucket `at` from which a sign places the knee
    at every bucket up to the highest, where no bucket below shows one; the sign that places it
    at `at`; and the intervals the buckets from `at` up and those below it hold together."""

    at: int
    sign: str
    above: int
    below: int

    @property
    def held(self) -> bool:
        """Both sides hold MIN_INTERVALS intervals together, as many as one point needs."""
        return min(self.above, self.below) >= MIN_INTERVALS


def _above(points: list[Point], placed: list[str | None]) -> Above | None:
    """Where no knee is read from the measured buckets (`placed`: the sign that would place a knee
    at each bucket, sparse ones too): the region where saturation shows at every load the window
    visited above a bucket and at none below (a sign at a thin load below says saturation may begin
    lower: None). Each bucket alone is too thin to read, but where both sides hold as many
    intervals as a point (`Above.held`), that is the knee's region read whole."""
    at = len(placed)
    while at and placed[at - 1]:
        at -= 1
    if not 0 < at < len(placed) or any(placed[:at]):
        return None
    return Above(at, placed[at] or "", sum(pt.intervals for pt in points[at:]), sum(pt.intervals for pt in points[:at]))


def _first_placed(placed: list[str | None]) -> int | None:
    """The lowest measured bucket placed together with the next one (the knee is a region)."""
    return next((i for i in range(len(placed)) if placed[i] and (i + 1 == len(placed) or placed[i + 1])), None)


def _thin_between(points: list[Point], dense: list[Point], at: int) -> tuple[float, float, int] | None:
    lo, hi = dense[at - 1].concurrency, dense[at].concurrency
    between = sum(pt.intervals for pt in points if pt.sparse and lo < pt.concurrency < hi)
    return (lo, hi, between) if between >= MIN_INTERVALS else None


Found = tuple[Point, set[str], str, Point | None]
"""The knee's bucket, the signs there, the sign that placed it, and where it was read over buckets
each too thin alone the unsaturated bucket below it (else None)."""


class Read(NamedTuple):
    """What the knee's search found: the knee or None; whether the lowest measured bucket is
    saturated already (the knee below the measured range); where the measured buckets place a knee
    above load the window held as long as a point needs but spread over buckets each too thin to
    read, (the last unsaturated measured concurrency, the first saturated one, the intervals
    between), else None; and where the knee was sought over every bucket, what it found there
    (`_above`; a knee only where `held`)."""

    found: Found | None
    below_range: bool = False
    between: tuple[float, float, int] | None = None
    above: Above | None = None


def _knee(points: list[Point], p: KneeParams, running_max: float | None) -> Read:
    """The knee from the measured buckets, else read over every bucket (`Read`)."""
    dense, signs, placed = _placements(points, p, running_max)
    at = _first_placed(placed)
    if at == 0:
        return Read(None, below_range=True)
    between = None if at is None else _thin_between(points, dense, at)
    if at is not None and between is None:
        return Read((dense[at], signs[at], placed[at] or "", None))
    _, signs, placed = _placements(points, p, running_max, thin=True)
    above = _above(points, placed)
    if above is None or not above.held:
        return Read(None, between=between, above=above)
    i = above.at
    return Read((points[i], signs[i], placed[i] or "", points[i - 1]), between=between, above=above)


P99_FIELDS = {"ttft": "ttft_p99_s", "tpot": "tpot_p99_s", "e2e": "e2e_p99_s"}
"""The Point field each objective's p99 is read from."""


def c_max(
    points: list[Point], slo_s: float, objectives: Objectives | None = None
) -> tuple[float | None, float | None, str]:
    """(C_max, usable RPS there, note): the lowest concurrency where the p99 of an objective
    crosses its bound (TTFT at `slo_s`; TPOT and e2e at `objectives`' bounds where set and the
    points measure them), interpolated between measured buckets. The note names the objectives
    judged, and those set but not measured."""
    bounds = {"ttft": slo_s} | {k: b for k, b in (objectives.bounds() if objectives else {}).items() if k != "ttft"}
    dense = [pt for pt in points if not pt.sparse and pt.ttft_p99_s is not None]
    if not dense:
        return None, None, "no bucket with enough data"
    judged = {k: b for k, b in bounds.items() if all(getattr(pt, P99_FIELDS[k]) is not None for pt in dense)}
    missing = sorted(set(bounds) - set(judged))
    what = "TTFT p99" if len(judged) == 1 else f"the p99 of {', '.join(k.upper() for k in judged)}"
    unread = f"; {', '.join(k.upper() for k in missing)} not measured by these engines, not judged" * bool(missing)

    def over(pt: Point) -> bool:
        return any(getattr(pt, P99_FIELDS[k]) > b for k, b in judged.items())

    first = next((i for i, pt in enumerate(dense) if over(pt)), None)
    if first is None:
        top = dense[-1].concurrency
        return None, None, f"{what} stays under the SLO up to the highest measured concurrency ({top:g}){unread}"
    if first == 0:
        low = dense[0].concurrency
        return None, None, f"{what} is over the SLO already at the lowest measured concurrency ({low:g}){unread}"
    a, b = dense[first - 1], dense[first]
    fracs = []
    for k, bound in judged.items():
        va, vb = getattr(a, P99_FIELDS[k]), getattr(b, P99_FIELDS[k])
        if vb > bound:
            fracs.append((bound - va) / (vb - va) if vb != va else 0.0)
    frac = min(fracs)
    c = a.concurrency + frac * (b.concurrency - a.concurrency)
    rps = None if a.rps is None or b.rps is None else a.rps + frac * (b.rps - a.rps)
    judged_text = f" ({what})" if len(judged) > 1 else ""
    return round(c, 3), rps, f"interpolated between measured buckets{judged_text}{unread}"


def operating_point(
    points: list[Point],
    peak: float | None,
    slo_s: float,
    p: KneeParams = KneeParams(),
    running_max: float | None = None,
    objectives: Objectives | None = None,
) -> Operating:
    """Knee, C_max, usable RPS, Little's Law gap and headroom of one pool's points; `running_max`:
    the most requests the window saw running (the running_pinned sign's cap; None: not read)."""
    found, below_range, between, above = _knee(points, p, running_max)
    k, signs, placing = (None, [], None) if found is None else (found[0].concurrency, sorted(found[1]), found[2])
    c, rps, note = c_max(points, slo_s, objectives)
    gap = (c / slo_s) / rps if c is not None and rps else None
    notes = []
    if below_range:
        notes.append("saturated from the lowest measured concurrency: the knee is below the measured range")
    elif found and found[3] is not None:
        n = sum(pt.intervals for pt in points if pt.concurrency >= found[0].concurrency)
        notes.append(
            f"the knee is read over buckets each too thin to read alone: a sign of saturation holds at every load "
            f"from {k:.3g} in the engine up ({n} intervals; {placing} at {k:.3g}), not at "
            f"{found[3].concurrency:.3g}; more traffic at that load would place it closer"
        )
    elif between:
        lo, hi, n = between
        notes.append(
            f"the knee lies between {lo:.3g} and {hi:.3g} in the engine: saturated at {hi:.3g}, not at {lo:.3g}; "
            f"the {n} intervals between are spread over buckets too thin to read, and more traffic at that load "
            "would place it"
        )
    elif above is not None:
        notes.append(_unplaced(points, above))
    elif k is None and len([pt for pt in points if not pt.sparse]) >= 3:
        notes.append(
            "no knee in the measured range: the running batch is not pinned at its cap with requests waiting, "
            "the KV cache is not full, and TTFT p99 does not leave p50 with another sign of saturation"
        )
    if gap is not None and gap > 2:
        notes.append(f"Little's Law gap {gap:.1f}x > 2: the traffic's latency is far from the SLO at C_max")
    ratio = lambda x: None if x is None or not peak else round(float(x) / peak, 3)  # noqa: E731
    return Operating(k, signs, c, note, rps, gap, peak, ratio(k), ratio(c), notes, placing, running_max)


def _unplaced(points: list[Point], a: Above) -> str:
    """Why no knee is placed where saturation shows at every load from a bucket up but either side
    holds fewer intervals than a point needs, and how many more, at which load, would place it."""
    at, below = points[a.at].concurrency, points[a.at - 1].concurrency
    more = [
        f"{MIN_INTERVALS - n} more interval{'s' * (MIN_INTERVALS - n > 1)} {where}"
        for n, where in ((a.above, f"at {at:.3g} or more in the engine"), (a.below, f"under {at:.3g}"))
        if n < MIN_INTERVALS
    ]
    return (
        f"no knee placed: a sign of saturation ({a.sign}) holds at every load from {at:.3g} in the engine up, not at "
        f"{below:.3g}, but the window held {a.above} intervals from {at:.3g} up and {a.below} under it, fewer than "
        f"the {MIN_INTERVALS} a side needs; {' and '.join(more)} would place it, if the signs hold there"
    )


def peak_concurrency(conc: np.ndarray) -> float | None:
    """The window's peak per-instance concurrency: the 99th percentile of interval means."""
    v = conc[~np.isnan(conc)]
    return round(float(np.percentile(v, 99)), 3) if len(v) else None
