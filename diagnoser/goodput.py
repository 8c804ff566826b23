"""Each pool's goodput over a window, from the engines' per-objective histograms (docs/goodput.md).

Per pool (the `model` label) and objective (core/objectives.py), the requests within the bound
are read from the increase of the objective's histogram over the window (summed over the pool's
instances, per engine, since engines' bucket layouts differ); core/goodput.py turns the
per-objective shares into lower and upper bounds. An objective whose histogram the pool does
not export is not evaluable: named, never read as zero, and the lower bound is then unknown.
Good requests/s is the bounds times the pool's request rate; good output tokens/s is the bounds
times its output tokens/s (it assumes good requests are as long as the rest; the request tap's
exact counters do not, `exact_goodput`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from kvscope.core.goodput import Attainment, Goodput, attainment, frechet
from kvscope.core.objectives import HISTOGRAMS, Objectives, ObjectiveSet
from kvscope.diagnoser.evaluate.frame import Frame, increases

TOKENS = "engine_generation_tokens_total"
GPU_JOIN = "engine_gpu_memory_used_bytes"  # the engine-GPU join: one series per (instance, gpu_uuid)

EXACT_REQUESTS = "goodput_requests_total"
EXACT_GOOD = "goodput_good_requests_total"
EXACT_GOOD_TOKENS = "goodput_good_output_tokens_total"
"""The request tap's per-request counters (catalog.yaml): exact goodput where the tap sees requests."""

SIGNALS = frozenset(
    {f"{h}_bucket" for h in HISTOGRAMS.values()} | {TOKENS, GPU_JOIN, EXACT_REQUESTS, EXACT_GOOD, EXACT_GOOD_TOKENS}
)
"""The canonical sample names `pool_goodput` reads (read_window's `signals`)."""


@dataclass(frozen=True)
class PoolGoodput:
    """One pool's goodput over a window: bounds (share of requests), rates and what was read."""

    pool: str
    objectives: Objectives
    goodput: Goodput
    requests_per_s: float | None
    output_tokens_per_s: float | None
    gpus: int | None
    unaligned: tuple[str, ...] = ()
    exact: float | None = None
    """Share of the requests the request tap saw that met every objective (None: no tap counts)."""
    exact_requests_per_s: float | None = None
    exact_good_tokens_per_s: float | None = None

    def good_requests_per_s(self) -> tuple[float | None, float | None]:
        return _times(self.goodput, self.requests_per_s)

    def outside_engine(self) -> str | None:
        """Why the tap's exact share lies outside the engine histograms' bounds, or None where it
        lies inside (or either is unknown). The engine times a request from its own arrival to its
        own last token; the tap times it as the client sees it, so time spent outside the engine
        (its API server tokenizing and streaming, the network, a queue in front) fails objectives
        the engine's histograms count as met; a client that hangs up early the other way round."""
        g, exact = self.goodput, self.exact
        if exact is None or g.upper is None:
            return None
        if exact < (g.lower if g.lower is not None else 0.0) - 1e-9:
            return (
                f"the tap saw {exact:.1%} of requests meet every objective, under the engine histograms' "
                f"{g.lower:.1%}: requests lose time outside the engine (its API server, the network, a "
                "queue in front of it), which the engine's own histograms do not count"
            )
        if exact > g.upper + 1e-9:
            return (
                f"the tap saw {exact:.1%} of requests meet every objective, over the engine histograms' "
                f"{g.upper:.1%}: the engine counts requests the tap did not see (other clients, or "
                "requests the tap's labels assign to another pool, such as LoRA adapters by name)"
            )
        return None

    def good_tokens_per_s(self) -> tuple[float | None, float | None]:
        return _times(self.goodput, self.output_tokens_per_s)

    def good_tokens_per_gpu_hour(self) -> tuple[float | None, float | None]:
        if not self.gpus:
            return None, None
        lo, hi = self.good_tokens_per_s()
        per = 3600.0 / self.gpus
        return (None if lo is None else lo * per), (None if hi is None else hi * per)

    def to_dict(self) -> dict:
        g = self.goodput
        return {
            "pool": self.pool,
            "objectives": asdict(self.objectives),
            "goodput": {"lower": g.lower, "upper": g.upper, "exact": self.exact},
            "tap_requests_per_s": self.exact_requests_per_s,
            "tap_good_output_tokens_per_s": self.exact_good_tokens_per_s,
            "objectives_read": list(g.read),
            "objectives_not_evaluable": list(g.not_evaluable),
            "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "good_requests_per_s": list(self.good_requests_per_s()),
            "good_output_tokens_per_s": list(self.good_tokens_per_s()),
            "gpus": self.gpus,
            "good_output_tokens_per_gpu_hour": list(self.good_tokens_per_gpu_hour()),
            "unaligned": list(self.unaligned),
            "outside_engine": self.outside_engine(),
        }


def _times(g: Goodput, rate: float | None) -> tuple[float | None, float | None]:
    if rate is None:
        return None, None
    return (None if g.lower is None else g.lower * rate), (None if g.upper is None else g.upper * rate)


def _per_pool(rows: Iterable[tuple[dict[str, str], float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for labels, v in rows:
        out[labels.get("model", "")] += v
    return dict(out)


def _attainments(frame: Frame, kind: str, objectives: ObjectiveSet, cols: np.ndarray) -> dict[str, Attainment]:
    """Pool -> requests within its bound of `kind`, summed over its engines' histograms."""
    buckets: dict[tuple[str, str], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, v in increases(frame, f"{HISTOGRAMS[kind]}_bucket", cols):
        try:
            le = float(labels.get("le", "nan"))
        except ValueError:
            continue
        buckets[(labels.get("model", ""), labels.get("engine", ""))][le] += v
    out: dict[str, Attainment] = {}
    for (pool, _engine), counts in sorted(buckets.items()):
        bound = getattr(objectives.of(pool=pool), kind)
        if bound is None:
            continue
        got = attainment(list(counts.items()), bound)
        if got is not None:
            out[pool] = out[pool] + got if pool in out else got
    return out


def pool_goodput(
    frame: Frame, objectives: ObjectiveSet | None = None, window: tuple[float, float] | None = None
) -> list[PoolGoodput]:
    """Each pool's goodput over the frame's grid points in `window` (None: all), one entry per pool
    that counted requests on any objective's histogram (or on the tap's exact counters), by pool."""
    objectives = objectives or ObjectiveSet()
    cols = np.ones(len(frame.ts), dtype=bool) if window is None else (frame.ts >= window[0]) & (frame.ts <= window[1])
    if int(cols.sum()) < 2:
        return []  # no increase without two grid points
    ts = frame.ts[cols]
    span = float(ts[-1] - ts[0]) if len(ts) > 1 else 0.0
    per_kind = {kind: _attainments(frame, kind, objectives, cols) for kind in HISTOGRAMS}
    exact = {k: _per_pool(increases(frame, k, cols)) for k in (EXACT_REQUESTS, EXACT_GOOD, EXACT_GOOD_TOKENS)}
    tokens = _per_pool(increases(frame, TOKENS, cols))
    engines: dict[str, set[str]] = defaultdict(set)
    for kind in HISTOGRAMS.values():
        hist = frame.block(f"{kind}_bucket")
        for labels in hist.labels if hist is not None else ():
            d = dict(labels)
            engines[d.get("model", "")].add(d.get("engine", ""))
    # the engine-GPU join names the instance, not its model: the pool is the instance's model
    model_of = {
        d["instance"]: d["model"]
        for name in (TOKENS, *(f"{h}_bucket" for h in HISTOGRAMS.values()))
        if (b := frame.block(name)) is not None
        for d in map(dict, b.labels)
        if d.get("instance") and d.get("model")
    }
    gpus: dict[str, set[str]] = defaultdict(set)
    block = frame.block(GPU_JOIN)
    for labels in block.labels if block is not None else ():
        d = dict(labels)
        pool = d.get("model") or model_of.get(d.get("instance", ""))
        if d.get("gpu_uuid") and pool is not None:
            gpus[pool].add(d["gpu_uuid"])
    pools = sorted(
        {p for got in per_kind.values() for p in got} | {p for p, n in exact[EXACT_REQUESTS].items() if n > 0}
    )
    out = []
    for pool in pools:
        obj = objectives.of(pool=pool)
        wanted = obj.bounds()
        read = {k: per_kind[k][pool].share for k in wanted if pool in per_kind[k]}
        missing = [k for k in wanted if k not in read]
        n_exact = exact[EXACT_REQUESTS].get(pool, 0.0)
        g = frechet(read, missing)
        requests = next((per_kind[k][pool].total for k in wanted if pool in per_kind[k]), None)
        out.append(
            PoolGoodput(
                pool=pool,
                objectives=obj,
                goodput=g,
                requests_per_s=None if requests is None or span <= 0 else requests / span,
                output_tokens_per_s=tokens[pool] / span if pool in tokens and span > 0 else None,
                gpus=len(gpus[pool]) or None,
                unaligned=tuple(u.message() for u in obj.unaligned() if u.engine in engines[pool]),
                exact=exact[EXACT_GOOD].get(pool, 0.0) / n_exact if n_exact > 0 else None,
                exact_requests_per_s=n_exact / span if n_exact > 0 and span > 0 else None,
                exact_good_tokens_per_s=(
                    exact[EXACT_GOOD_TOKENS].get(pool, 0.0) / span if n_exact > 0 and span > 0 else None
                ),
            )
        )
    return out


def share_text(row: PoolGoodput | None) -> str | None:
    """Goodput as one cell: `90.0% exact (tap)`, `85.0% .. 88.4%`, `<= 88.4% (tpot not evaluable)`;
    None when nothing was read (the report and the UI show it as absent)."""
    if row is None:
        return None
    g = row.goodput
    if row.exact is not None:
        return f"{row.exact:.1%} exact (tap)"
    if g.upper is None:
        return None
    if g.lower is None:
        return f"<= {g.upper:.1%} ({', '.join(g.not_evaluable)} not evaluable)"
    return f"{g.upper:.1%}" if g.lower == g.upper else f"{g.lower:.1%} .. {g.upper:.1%}"


def render_text(rows: list[PoolGoodput]) -> str:
    """A table of each pool's goodput beside its raw throughput."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.3g}"

    lines = []
    for r in rows:
        g = r.goodput
        share = f"{pct(g.lower)} .. {pct(g.upper)} from histograms"
        if r.exact is not None:
            share += f"; exact {pct(r.exact)} of the requests the tap saw"
        lo, hi = r.good_requests_per_s()
        tlo, thi = r.good_tokens_per_s()
        lines.append(f"{r.pool or '(no model label)'}: {r.objectives.describe()}")
        lines.append(f"  goodput {share}")
        lines.append(f"  requests/s {num(r.requests_per_s)}, good {num(lo)} .. {num(hi)}")
        lines.append(f"  output tokens/s {num(r.output_tokens_per_s)}, good {num(tlo)} .. {num(thi)}")
        glo, ghi = r.good_tokens_per_gpu_hour()
        lines.append(
            f"  good tokens per GPU-hour {num(glo)} .. {num(ghi)}"
            if r.gpus
            else "  good tokens per GPU-hour: GPU count unknown"
        )
        lines.append(f"  objectives read: {', '.join(g.read) or 'none'}")
        if g.not_evaluable:
            lines.append(f"  not evaluable (no histogram): {', '.join(g.not_evaluable)}; the lower bound is unknown")
        lines += [f"  warning: {u}" for u in r.unaligned]
        if (gap := r.outside_engine()) is not None:
            lines.append(f"  note: {gap}")
    return "\n".join(lines) if lines else "no pool counted requests on any objective's histogram in this window"
