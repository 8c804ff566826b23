"""A fleet of vLLM engines replicated from the real vLLM 0.32 /metrics capture, for fleet benches.

`write_capture_fleet` writes N engines x T of the capture's series that kvscope reads (every series
whose name the catalog maps, plus `vllm:cache_config_info`), with the capture's own names, label
sets and bucket layouts, one engine per `instance`, four models. It is vectorised over engines and
time (numpy), so hundreds of engines over hours are written in minutes:

* load: each engine a steady request rate with noise; a tenth of the engines (the "incident"
  engines) go through a KV-pressure episode from 55 % to 75 % of the window: KV usage at 97-99 %,
  preemptions, a growing queue, more running requests, and latency histograms observed 3x slower;
* counters advance from the capture's values by increments proportional to the load;
* histograms keep the capture's bucket shape (its empirical CDF over its real bounds); the
  stressed engines observe latencies 3x longer (the CDF read at le / 3);
* gauges: KV usage, running and waiting requests as above; the other gauges keep their captured
  value.

Output: OpenMetrics with timestamps (promtool `tsdb create-blocks-from openmetrics`), or the
Prometheus text format with millisecond timestamps (VictoriaMetrics `/api/v1/import/prometheus`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

CAPTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"
MODELS = 4
STRESS_FACTOR = 3.0
EPISODE = (0.55, 0.75)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Family:
    """One metric family of the capture: kind and its series (label dicts, captured values)."""

    name: str
    kind: str                           # gauge | counter | histogram | info
    series: list[tuple[str, dict[str, str], float]]   # (sample name, labels, value)


def read_capture(path: Path = CAPTURE) -> list[Family]:
    """The capture's families that kvscope's catalog reads (by upstream name)."""
    from kvscope.diagnoser.evaluate.evaluator import sample_names
    from kvscope.diagnoser.pushdown.run import wire_pattern
    from kvscope.diagnoser.rulebook.rule import read_rules

    catalog_names = set().union(*(sample_names(r) for r in read_rules()))
    from kvscope.agent.signals import load_catalog
    wanted = re.compile(wire_pattern(catalog_names, load_catalog()))
    types: dict[str, str] = {}
    fams: dict[str, Family] = {}
    for line in path.read_text().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            types[name] = kind
            continue
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        name, body, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name.endswith("_created"):
            continue
        labels = dict(_LABEL.findall(body))
        base = re.sub(r"(_bucket|_sum|_count|_total)$", "", name)
        kind = types.get(base, types.get(name, "gauge"))
        if name == "vllm:cache_config_info":
            kind = "info"
        elif not wanted.fullmatch(name):
            continue
        fam = fams.setdefault(base, Family(base, kind, []))
        fam.series.append((name, labels, value))
    return list(fams.values())


SIGMA = 0.35


def lognormal_cdf(bounds: np.ndarray, median: float, sigma: float) -> np.ndarray:
    """Share of lognormal observations (around `median`) at or below each bound (the normal CDF
    as a logistic, max error ~1 %: plenty for load generation)."""
    with np.errstate(divide="ignore"):
        z = (np.log(np.maximum(bounds, 1e-300)) - np.log(median)) / sigma
    return 1.0 / (1.0 + np.exp(-1.702 * np.clip(z, -30, 30)))


def _engine_labels(i: int) -> dict[str, str]:
    return {"instance": f"10.{i // 62500}.{i // 250 % 250}.{i % 250}:8000", "job": "vllm"}


def write_capture_fleet(out: IO[str], engines: int, start: float, end: float, interval: float = 15.0,
                        seed: int = 7, millis: bool = False, openmetrics: bool = True) -> dict:
    """Write the fleet's samples in [start, end] every `interval`; returns what was written
    (incident engines, episode, samples)."""
    rng = np.random.default_rng(seed)
    ts = np.arange(start, end + 1e-9, interval)
    n_t = len(ts)
    hot = np.sort(rng.choice(engines, size=max(1, engines // 10), replace=False))
    stressed = np.zeros((engines, n_t), dtype=bool)
    a, b = int(EPISODE[0] * n_t), int(EPISODE[1] * n_t)
    stressed[hot, a:b] = True
    load = np.clip(1.0 + 0.15 * rng.standard_normal((engines, n_t)), 0.2, None)
    load[stressed] *= 1.6
    stamp = [f"{int(round(t * 1000))}" if millis else f"{t:.3f}" for t in ts]
    samples = 0
    for fam in read_capture():
        if openmetrics:
            out.write(f"# TYPE {fam.name} {'gauge' if fam.kind == 'info' else fam.kind}\n")
        values = _family_values(fam, rng, load, stressed, interval)
        for e in range(engines):
            target = _engine_labels(e)
            for (name, labels, _), row in zip(fam.series, values, strict=True):
                lab = {**labels, **target}
                if "enable_prefix_caching" in lab:
                    lab["enable_prefix_caching"] = "True"          # a tuned fleet
                if "model_name" in lab:
                    lab["model_name"] = f"model-{e % MODELS}"
                prefix = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(lab.items())) + "} "
                vals = row[e] if row.ndim == 2 else row
                out.write("".join(f"{prefix}{v:.12g} {s}\n" for v, s in zip(vals.tolist(), stamp, strict=True)))
                samples += n_t
    if openmetrics:
        out.write("# EOF\n")
    return {"incident_instances": [_engine_labels(int(e))["instance"] for e in hot],
            "episode": [float(ts[a]), float(ts[min(b, n_t - 1)])], "samples": samples, "steps": n_t}


def _family_values(fam: Family, rng: np.random.Generator, load: np.ndarray, stressed: np.ndarray,
                   interval: float) -> list[np.ndarray]:
    """One array per series of the family: [engines, T] (or [T] / a scalar row when constant)."""
    n_e, n_t = load.shape
    if fam.kind == "histogram":
        return _histogram(fam, rng, load, stressed, interval)
    out = []
    for name, _labels, value in fam.series:
        if fam.kind == "info":
            out.append(np.full(n_t, value))
        elif fam.kind == "counter" or name.endswith("_total"):
            if "preemption" in name:
                inc = np.where(stressed, rng.poisson(2.0, size=(n_e, n_t)), 0).astype(float)
            else:
                inc = load * max(value, 1.0) / 600.0 * interval
            out.append(value + np.floor(np.cumsum(inc, axis=1)))
        elif "kv_cache_usage" in name:
            kv = np.clip(0.35 + 0.08 * rng.standard_normal((n_e, n_t)), 0.0, 0.85)
            kv[stressed] = 0.97 + 0.02 * rng.random(int(stressed.sum()))
            out.append(kv)
        elif name.endswith("num_requests_running"):
            out.append(rng.poisson(8.0, size=(n_e, n_t)) + np.where(stressed, 16.0, 0.0))
        elif name.endswith("num_requests_waiting"):
            ramp = np.cumsum(stressed, axis=1) * 0.05
            out.append(rng.poisson(0.2, size=(n_e, n_t)) + np.where(stressed, 2.0 + ramp, 0.0))
        else:
            out.append(np.full(n_t, value))
    return out


def _histogram(fam: Family, rng: np.random.Generator, load: np.ndarray, stressed: np.ndarray,
               interval: float) -> list[np.ndarray]:
    """Bucket, _sum and _count rows with the capture's bucket shape; stressed engines observe
    latency families 3x slower."""
    n_e, n_t = load.shape
    by_labels: dict[tuple, dict] = defaultdict(dict)
    for name, labels, value in fam.series:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        if name.endswith("_bucket"):
            le = labels["le"]
            by_labels[key][float("inf") if le == "+Inf" else float(le)] = value
        else:
            by_labels[key][name[len(fam.name):]] = value
    latency = fam.name.endswith("_seconds")
    rows: dict[tuple, dict] = {}
    for key, got in by_labels.items():
        les = sorted(k for k in got if isinstance(k, float))
        counts = np.array([got[le] for le in les])
        total = max(counts[-1], 1.0)
        mean = got.get("_sum", 0.0) / total if counts[-1] > 0 else 0.1
        finite = np.array([le for le in les if np.isfinite(le)])
        # a healthy engine's observations: lognormal around the capture's mean (the CPU capture's
        # own spread is a tiny model's, wide enough to trip tail rules on every engine)
        cdf = np.r_[lognormal_cdf(finite, max(mean, 1e-6), SIGMA), 1.0]
        slow = np.r_[lognormal_cdf(finite, max(mean, 1e-6) * STRESS_FACTOR, SIGMA), 1.0] if latency else cdf
        obs = rng.poisson(np.maximum(load, 0.0) * 2.0 * interval / 15.0).astype(float)     # [E, T]
        cum = {}
        for j, le in enumerate(les):
            per = obs * np.where(stressed, slow[j], cdf[j]) if latency else obs * cdf[j]
            cum[le] = got[le] + np.floor(np.cumsum(per, axis=1))      # whole counts, monotone in t and le
        rows[key] = {"les": les, "cum": cum,
                     "_count": cum[les[-1]],
                     "_sum": got.get("_sum", 0.0) + np.cumsum(obs * mean * np.where(stressed & latency, 3.0, 1.0),
                                                              axis=1)}
    out = []
    for name, labels, _ in fam.series:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        if name.endswith("_bucket"):
            le = labels["le"]
            out.append(rows[key]["cum"][float("inf") if le == "+Inf" else float(le)])
        else:
            out.append(rows[key][name[len(fam.name):]])
    return out
