"""Measure the dynamics the fleet generator needs from the real vLLM recordings.

Reads tests/recordings/<scenario>.om.gz (native vLLM names) and derives, per scrape interval:
* TTFT vs queue depth (kv-pressure-cascade): mean TTFT (delta sum / delta count of
  vllm:time_to_first_token_seconds) against vllm:num_requests_waiting, as a ratio to the idle TTFT;
* preemption vs KV usage (kv-pressure-cascade): vllm:kv_cache_usage_perc in the intervals where
  vllm:num_preemptions_total increased, and how often high / low usage intervals preempt;
* routing: prefix hit rate under round-robin vs sticky across 2 replicas (round-robin-vs-sticky);
* cold start: time until a restarted replica's hit rate reaches 90 % of the warm one's, also
  expressed as requests per tenant prefix (what transfers to a fleet with other traffic);
* a healthy engine's queue (HEALTHY, the real recordings without pressure): queue time as a share
  of TTFT (delta sums of vllm:request_queue_time_seconds / vllm:time_to_first_token_seconds) and
  the share of scrapes with a request waiting.
`python -m testbed.fleetgen.calibrate` prints the numbers and writes calibration.yaml next to it.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from kvscope.agent.recording.omfile import read_recording, scrapes_by_target

LIBRARY = Path(__file__).resolve().parents[2] / "tests" / "recordings"
OUT = Path(__file__).with_name("calibration.yaml")


def read_series(path: Path) -> dict[str, list[tuple[float, dict[str, float]]]]:
    """instance -> [(timestamp, {native name (labels summed): value})] in time order."""
    scrapes, _ = read_recording(path)
    out: dict[str, list[tuple[float, dict[str, float]]]] = {}
    for (_job, instance), target in scrapes_by_target(scrapes):
        rows = []
        for sc in target:
            vals: dict[str, float] = defaultdict(float)
            for s in sc.samples:
                if s.name.endswith("_bucket"):
                    continue
                vals[s.name] += s.value
            rows.append((sc.timestamp, dict(vals)))
        out[instance] = rows
    return out


def _deltas(rows, name):
    return [(b[0], b[1].get(name, 0.0) - a[1].get(name, 0.0), a[1], b[1]) for a, b in zip(rows, rows[1:], strict=False)]


def ttft_vs_queue(rows) -> dict:
    """Linear fit of TTFT ratio (to the idle median) against waiting requests."""
    points = []
    for (_, d_sum, a, b), (_, d_cnt, _, _) in zip(
        _deltas(rows, "vllm:time_to_first_token_seconds_sum"),
        _deltas(rows, "vllm:time_to_first_token_seconds_count"),
        strict=True,
    ):
        if d_cnt > 0:
            waiting = (a.get("vllm:num_requests_waiting", 0) + b.get("vllm:num_requests_waiting", 0)) / 2
            points.append((waiting, d_sum / d_cnt))
    idle = [t for w, t in points if w == 0] or [min(t for _, t in points)]
    base = statistics.median(idle)
    xs = [w for w, _ in points]
    ys = [t / base for _, t in points]
    slope, intercept = statistics.linear_regression(xs, ys) if len(set(xs)) > 1 else (0.0, 1.0)
    return {
        "idle_ttft_s": round(base, 4),
        "ratio_per_waiting_request": round(slope, 3),
        "intercept": round(intercept, 3),
        "intervals": len(points),
        "max_waiting": max(xs),
    }


def preemption_onset(rows) -> dict:
    """How preemption relates to KV usage per scrape interval (usage = max of the two ends).

    The gauge is sampled at scrape instants, so an interval can preempt while both samples are
    below full (requests finished in between): report the distribution, not a single threshold.
    """
    events = []
    for _, d, a, b in _deltas(rows, "vllm:num_preemptions_total"):
        usage = max(a.get("vllm:kv_cache_usage_perc", 0), b.get("vllm:kv_cache_usage_perc", 0))
        events.append((usage, d))
    preempting = sorted(u for u, d in events if d > 0)
    if not preempting:
        return {"kv_usage_median_when_preempting": None}

    def share(sel):
        chosen = [d for u, d in events if sel(u)]
        return round(sum(d > 0 for d in chosen) / len(chosen), 3) if chosen else None

    return {
        "kv_usage_median_when_preempting": round(statistics.median(preempting), 3),
        "kv_usage_p10_when_preempting": round(preempting[len(preempting) // 10], 3),
        "preempting_share_usage_ge_0_9": share(lambda u: u >= 0.9),
        "preempting_share_usage_lt_0_5": share(lambda u: u < 0.5),
        "preemptions_per_preempting_interval": round(statistics.fmean(d for _, d in events if d > 0), 2),
    }


def hit_rate(rows, t0: float, t1: float) -> float | None:
    """Prefix hit rate (delta hits / delta queries) between two times."""
    inside = [r for r in rows if t0 <= r[0] <= t1]
    if len(inside) < 2:
        return None
    q = inside[-1][1].get("vllm:prefix_cache_queries_total", 0) - inside[0][1].get("vllm:prefix_cache_queries_total", 0)
    h = inside[-1][1].get("vllm:prefix_cache_hits_total", 0) - inside[0][1].get("vllm:prefix_cache_hits_total", 0)
    return h / q if q else None


def _phases(name: str) -> tuple[dict, float]:
    meta = yaml.safe_load((LIBRARY / f"{name}.yaml").read_text())
    return {p["name"]: p for p in meta["phases"]}, meta["recorded_at_unix"]


def routing_ratio() -> dict:
    series = read_series(LIBRARY / "round-robin-vs-sticky.om.gz")
    phases, t0 = _phases("round-robin-vs-sticky")
    out = {}
    for ph in ("round-robin", "sticky"):
        p = phases[ph]
        rates = [hit_rate(rows, t0 + p["start_s"], t0 + p["end_s"]) for rows in series.values()]
        out[ph] = round(statistics.fmean(r for r in rates if r is not None), 3)
    out["rr_over_sticky"] = round(out["round-robin"] / out["sticky"], 3) if out["sticky"] else None
    return out


def cold_start() -> dict:
    series = read_series(LIBRARY / "replica-restart-cold-cache.om.gz")
    phases, t0 = _phases("replica-restart-cold-cache")
    rejoin = phases["rejoin"]
    start, end = t0 + rejoin["start_s"], t0 + rejoin["end_s"]
    warm = hit_rate(series["replica-0"], start, end) or 0.0
    cold = series["replica-1"]
    # requests per second per tenant prefix during rejoin (client side), to express refill in requests
    per_prefix_rps = rejoin["client"]["all"]["requests"] / (end - start) / len(rejoin["client"]["tenants"])
    times = [r[0] for r in cold if start <= r[0] <= end]
    for i in range(2, len(times)):
        if (hit_rate(cold, times[i - 2], times[i]) or 0.0) >= 0.9 * warm:
            secs = times[i] - start
            return {
                "warm_hit_rate": round(warm, 3),
                "seconds_to_90pct_of_warm": round(secs, 1),
                "requests_per_prefix_to_90pct": round(secs * per_prefix_rps, 2),
            }
    return {"warm_hit_rate": round(warm, 3), "seconds_to_90pct_of_warm": None, "requests_per_prefix_to_90pct": None}


HEALTHY = ("healthy-shared-prefix", "metrics-only-healthy-busy-sticky", "metrics-only-sticky-2-steady")
"""Real recordings of engines below their knee (roomy pools, no preemption, steady load)."""


def healthy_queue() -> dict:
    """Queue time against TTFT, and how often a request waits, on the HEALTHY recordings."""
    queue = ttft = scrapes = waiting = 0.0
    for name in HEALTHY:
        for rows in read_series(LIBRARY / f"{name}.om.gz").values():
            queue += rows[-1][1].get("vllm:request_queue_time_seconds_sum", 0.0) - rows[0][1].get(
                "vllm:request_queue_time_seconds_sum", 0.0
            )
            ttft += rows[-1][1].get("vllm:time_to_first_token_seconds_sum", 0.0) - rows[0][1].get(
                "vllm:time_to_first_token_seconds_sum", 0.0
            )
            scrapes += len(rows)
            waiting += sum(r[1].get("vllm:num_requests_waiting", 0.0) > 0 for r in rows)
    return {
        "recordings": list(HEALTHY),
        "queue_share_of_ttft": float(f"{queue / ttft:.3g}"),
        "scrapes_with_waiting": round(waiting / scrapes, 4),
        "scrapes": int(scrapes),
    }


def calibrate() -> dict:
    pressure = read_series(LIBRARY / "kv-pressure-cascade.om.gz")["replica-0"]
    return {
        "source": "tests/recordings (real vLLM 0.32 on CPU); regenerate: python -m testbed.fleetgen.calibrate",
        "ttft_vs_queue": ttft_vs_queue(pressure),
        "preemption": preemption_onset(pressure),
        "routing_2_replicas": routing_ratio(),
        "cold_start": cold_start(),
        "healthy_queue": healthy_queue(),
    }


if __name__ == "__main__":
    cal = calibrate()
    OUT.write_text(yaml.safe_dump(cal, sort_keys=False))
    yaml.safe_dump(cal, sys.stdout, sort_keys=False)
