"""A fleet of vLLM engines replicated from the real vLLM 0.32 /metrics capture, for fleet benches.

`CaptureFleet` generates N engines x T of the capture's series that kvscope reads (every series
whose name the catalog maps, plus `vllm:cache_config_info`), with the capture's own names, label
sets and bucket layouts, one engine per `instance`, four models. It is vectorised over engines and
time (numpy) and produced in time chunks (counters and histograms carry their totals from one
chunk to the next, each chunk draws from its own seeded generator), so a week of a hundred engines
never sits in memory at once:

* load: each engine a steady request rate with noise; a tenth of the engines (the "incident"
  engines) go through a KV-pressure episode from 55 % to 75 % of the window: KV usage at 97-99 %,
  preemptions, a growing queue, more running requests, and latency histograms observed 3x slower;
* counters advance from the capture's values by increments proportional to the load;
* histograms: lognormal around the capture's means over its real bounds; the stressed engines
  observe latencies 3x longer. The capture was taken right after a load burst on CPU, so its
  queue time is 96 % of its TTFT: a healthy engine instead queues the share of TTFT, and has a
  request waiting in the share of scrapes, measured on the real healthy recordings
  (calibration.yaml `healthy_queue`: 0.01 % and none); a stressed engine queues as the capture
  did, 3x longer;
* gauges: KV usage, running and waiting requests as above; the other gauges keep their captured
  value;
* with `cut` (a share of the window), one pool (model-1's engines) restarts at that point with half
  its KV cache: its counters and histograms start over from zero, its `cache_config_info` names
  half the blocks and tokens from then on (a new series; the old one ends), and it runs pressured
  as the incident engines do, at the same offered load (fleet benches of changes judged at a
  restart; no engine of the other pools restarts).

Output: `write_capture_fleet` writes OpenMetrics with timestamps (promtool `tsdb
create-blocks-from openmetrics`; the whole fleet is gathered per family, so for sizes that fit in
memory); `import_capture_fleet` streams it into VictoriaMetrics as JSON lines
(`/api/v1/import`, one line per series and chunk), without a file, for weeks and big fleets.
Both give the same samples for the same arguments.
"""

from __future__ import annotations

import re
import threading
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from queue import Queue
from typing import IO

import msgspec
import numpy as np

CAPTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"
MODELS = 4
STRESS_FACTOR = 3.0
EPISODE = (0.55, 0.75)
CUT_MODEL = 1
HALVED = ("num_gpu_blocks", "num_gpu_blocks_override", "kv_cache_size_tokens", "kv_cache_memory_bytes")
QUEUE, QUEUED_OF = "request_queue_time_seconds", "vllm:time_to_first_token_seconds"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class Family:
    """One metric family of the capture: kind and its series (label dicts, captured values)."""

    name: str
    kind: str  # gauge | counter | histogram | info
    series: list[tuple[str, dict[str, str], float]]  # (sample name, labels, value)


def read_capture(path: Path = CAPTURE) -> list[Family]:
    """The capture's families that kvscope's catalog reads (by upstream name)."""
    from kvscope.core.signals import load_catalog, signal_of
    from kvscope.diagnoser.evaluate.evaluator import sample_names
    from kvscope.diagnoser.rulebook.rule import read_rules
    from kvscope.diagnoser.sources.prometheus import wire_pattern

    catalog = load_catalog()
    read = set().union(*(sample_names(r) for r in read_rules()))
    # every series of a signal the rules read (a histogram's buckets too where a rule reads its mean)
    signals = [catalog.signals[s] for s in {signal_of(n, catalog) for n in read} & catalog.signals.keys()]
    wanted = re.compile(wire_pattern(read | {n for sig in signals for n in sig.series_names()}, catalog))
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


def _halved(labels: dict[str, str]) -> dict[str, str]:
    """cache_config_info's labels with half the KV cache (the cut pool's after its restart)."""
    return {k: str(int(v) // 2) if k in HALVED and v.isdigit() else v for k, v in labels.items()}


def _engine_labels(i: int) -> dict[str, str]:
    return {"instance": f"10.{i // 62500}.{i // 250 % 250}.{i % 250}:8000", "job": "vllm"}


def _series_labels(labels: dict[str, str], e: int) -> dict[str, str]:
    lab = {**labels, **_engine_labels(e)}
    if "enable_prefix_caching" in lab:
        lab["enable_prefix_caching"] = "True"  # a tuned fleet
    if "model_name" in lab:
        lab["model_name"] = f"model-{e % MODELS}"
    return lab


CHUNK_STEPS = 1440
"""Scrapes per generated chunk (6 h at 15 s)."""


class CaptureFleet:
    """The fleet's samples in [start, end] every `interval`, produced chunk by chunk."""

    def __init__(
        self,
        engines: int,
        start: float,
        end: float,
        interval: float = 15.0,
        seed: int = 7,
        chunk_steps: int = CHUNK_STEPS,
        capture: Path = CAPTURE,
        cut: float | None = None,
    ) -> None:
        """`capture`: the /metrics text replicated (default the vLLM 0.32 one; e.g. sglang-router's
        /engine_metrics, whose series name their worker in `worker_addr`); `cut`: where in the
        window model-1's pool restarts with half its KV cache (0 < cut < 1; None: no restart)."""
        self.engines, self.interval, self.seed, self.chunk_steps = engines, interval, seed, chunk_steps
        self.ts = np.arange(start, end + 1e-9, interval)
        n_t = len(self.ts)
        rng = np.random.default_rng(seed)
        self.hot = np.sort(rng.choice(engines, size=max(1, engines // 10), replace=False))
        self.episode = (int(EPISODE[0] * n_t), int(EPISODE[1] * n_t))
        self.families = read_capture(capture)
        self.cut = None if cut is None else max(1, int(cut * n_t))
        self.cut_engines = np.arange(CUT_MODEL, engines, MODELS)
        self.after_cut: set[tuple] = set()  # the info series the cut pool reports after its restart
        if self.cut is not None:
            for fam in self.families:
                if fam.kind == "info":
                    copies = [(n, _halved(lab), v) for n, lab, v in fam.series]
                    self.after_cut |= {(n, tuple(sorted(lab.items()))) for n, lab, _ in copies}
                    fam.series += copies
        self._state: dict[tuple, np.ndarray] = {}
        self._c0 = 0
        from testbed.fleetgen.sim import load_calibration

        healthy = load_calibration()["healthy_queue"]
        self.queue_share = healthy["queue_share_of_ttft"]
        self.waiting_rate = -np.log1p(-healthy["scrapes_with_waiting"])  # Poisson mean: P(> 0) as measured
        ttft = {n[len(QUEUED_OF) :]: v for f in self.families for n, _, v in f.series if n.startswith(QUEUED_OF)}
        self.ttft_mean = ttft.get("_sum", 0.0) / ttft["_count"] if ttft.get("_count") else 0.1

    def info(self) -> dict:
        """Incident instances, episode, samples and steps (what the benches print)."""
        a, b = self.episode
        per_step = sum(len(f.series) for f in self.families) * self.engines
        return {
            "incident_instances": [_engine_labels(int(e))["instance"] for e in self.hot],
            "episode": [float(self.ts[a]), float(self.ts[min(b, len(self.ts) - 1)])],
            "samples": per_step * len(self.ts),
            "steps": len(self.ts),
            "cut": None if self.cut is None else {"model": f"model-{CUT_MODEL}", "at": float(self.ts[self.cut])},
        }

    def chunks(self) -> Iterator[tuple[np.ndarray, list[tuple[Family, list[np.ndarray]]]]]:
        """(timestamps, [(family, one array per series: [engines, n] or [n])]) per chunk, in order."""
        self._state = {}
        for c, c0 in enumerate(range(0, len(self.ts), self.chunk_steps)):
            c1 = min(len(self.ts), c0 + self.chunk_steps)
            rng = np.random.default_rng([self.seed, c])
            stressed = np.zeros((self.engines, c1 - c0), dtype=bool)
            a, b = max(self.episode[0], c0), min(self.episode[1], c1)
            if a < b:
                stressed[np.ix_(self.hot, np.arange(a - c0, b - c0))] = True
            load = np.clip(1.0 + 0.15 * rng.standard_normal((self.engines, c1 - c0)), 0.2, None)
            load[stressed] *= 1.6
            cut = np.zeros_like(stressed)
            if self.cut is not None and self.cut < c1:
                cut[np.ix_(self.cut_engines, np.arange(max(self.cut, c0) - c0, c1 - c0))] = True
            self._c0 = c0
            fams = [(fam, self._family(fam, rng, load, stressed | cut, stressed, cut)) for fam in self.families]
            yield self.ts[c0:c1], fams

    def _carry(self, key: tuple, inc: np.ndarray) -> np.ndarray:
        """Running sums of `inc` [E, n] along time, continued from the previous chunk's."""
        prev = self._state.get(key)
        out = np.cumsum(inc, axis=1)
        if prev is not None:
            out += prev[:, None]
        self._state[key] = out[:, -1].copy()
        return out

    def _restart(self, key: tuple, out: np.ndarray) -> np.ndarray:
        """A cumulative row [E, n] with the cut pool's engines starting over from zero at the cut
        (less their own value at the scrape before it)."""
        if self.cut is None:
            return out
        before, first = self.cut - 1 - self._c0, max(self.cut - self._c0, 0)
        if 0 <= before < out.shape[1]:
            self._state[("base", key)] = out[self.cut_engines, before]
        if first < out.shape[1]:
            out[self.cut_engines, first:] -= self._state[("base", key)][:, None]
        return out

    def _family(
        self,
        fam: Family,
        rng: np.random.Generator,
        load: np.ndarray,
        stressed: np.ndarray,
        episode: np.ndarray,
        cut: np.ndarray,
    ) -> list[np.ndarray]:
        """`stressed`: the engines pressured (in the episode or past the cut); `episode`: in the
        episode (their queue grows); `cut`: the cut pool's engines past its restart."""
        n_e, n_t = load.shape
        if fam.kind == "histogram":
            return self._histogram(fam, rng, load, stressed)
        out = []
        for name, labels, value in fam.series:
            key = (name, tuple(sorted(labels.items())))
            if fam.kind == "info" and self.cut is not None:
                row = np.full((n_e, n_t), value)
                row[cut != (key in self.after_cut)] = np.nan  # absent: each series before or after
                out.append(row)
            elif fam.kind == "info":
                out.append(np.full(n_t, value))
            elif fam.kind == "counter" or name.endswith("_total"):
                if "preemption" in name:
                    inc = np.where(stressed, rng.poisson(2.0, size=(n_e, n_t)), 0).astype(float)
                else:
                    inc = load * max(value, 1.0) / 600.0 * self.interval
                out.append(self._restart(key, value + np.floor(self._carry(key, inc))))
            elif "kv_cache_usage" in name:
                kv = np.clip(0.35 + 0.08 * rng.standard_normal((n_e, n_t)), 0.0, 0.85)
                kv[stressed] = 0.97 + 0.02 * rng.random(int(stressed.sum()))
                out.append(kv)
            elif name.endswith("num_requests_running"):
                out.append(rng.poisson(8.0, size=(n_e, n_t)) + np.where(stressed, 16.0, 0.0))
            elif name.endswith("num_requests_waiting"):
                ramp = self._carry(key, episode.astype(float)) * 0.05
                out.append(rng.poisson(self.waiting_rate, size=(n_e, n_t)) + np.where(stressed, 2.0 + ramp, 0.0))
            else:
                out.append(np.full(n_t, value))
        return out

    def _histogram(
        self, fam: Family, rng: np.random.Generator, load: np.ndarray, stressed: np.ndarray
    ) -> list[np.ndarray]:
        """Bucket, _sum and _count rows with the capture's bucket shape; stressed engines observe
        latency families 3x slower."""
        by_labels: dict[tuple, dict] = defaultdict(dict)
        for name, labels, value in fam.series:
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            if name.endswith("_bucket"):
                le = labels["le"]
                by_labels[key][float("inf") if le == "+Inf" else float(le)] = value
            else:
                by_labels[key][name[len(fam.name) :]] = value
        latency = fam.name.endswith("_seconds")
        rows: dict[tuple, dict] = {}
        for key, got in by_labels.items():
            les = sorted(k for k in got if isinstance(k, float))
            counts = np.array([got[le] for le in les])
            total = max(counts[-1], 1.0)
            mean = got.get("_sum", 0.0) / total if counts[-1] > 0 else 0.1
            healthy = self.queue_share * self.ttft_mean if fam.name.endswith(QUEUE) else mean
            finite = np.array([le for le in les if np.isfinite(le)])
            # a healthy engine's observations: lognormal around the capture's mean (the CPU capture's
            # own spread is a tiny model's, wide enough to trip tail rules on every engine)
            cdf = np.r_[lognormal_cdf(finite, max(healthy, 1e-6), SIGMA), 1.0]
            slow = np.r_[lognormal_cdf(finite, max(mean, 1e-6) * STRESS_FACTOR, SIGMA), 1.0] if latency else cdf
            obs = rng.poisson(np.maximum(load, 0.0) * 2.0 * self.interval / 15.0).astype(float)  # [E, T]
            cum = {}
            for j, le in enumerate(les):
                per = obs * np.where(stressed, slow[j], cdf[j]) if latency else obs * cdf[j]
                got_le = got[le] + np.floor(self._carry((fam.name, key, le), per))  # whole counts, monotone
                cum[le] = self._restart((fam.name, key, le), got_le)
            slow_sum = obs * np.where(stressed & latency, mean * STRESS_FACTOR, healthy)
            rows[key] = {
                "les": les,
                "cum": cum,
                "_count": cum[les[-1]],
                "_sum": self._restart(
                    (fam.name, key, "_sum"), got.get("_sum", 0.0) + self._carry((fam.name, key, "_sum"), slow_sum)
                ),
            }
        out = []
        for name, labels, _ in fam.series:
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            if name.endswith("_bucket"):
                le = labels["le"]
                out.append(rows[key]["cum"][float("inf") if le == "+Inf" else float(le)])
            else:
                out.append(rows[key][name[len(fam.name) :]])
        return out


def write_capture_fleet(
    out: IO[str],
    engines: int,
    start: float,
    end: float,
    interval: float = 15.0,
    seed: int = 7,
    capture: Path = CAPTURE,
    cut: float | None = None,
) -> dict:
    """Write the fleet as OpenMetrics with timestamps (each family once, gathered over every
    chunk); returns `CaptureFleet.info()`."""
    fleet = CaptureFleet(engines, start, end, interval, seed, capture=capture, cut=cut)
    gathered: list[list[list[np.ndarray]]] = [[[] for _ in fam.series] for fam in fleet.families]
    stamps = []
    for ts, fams in fleet.chunks():
        stamps.append(ts)
        for f, (_fam, arrays) in enumerate(fams):
            for i, arr in enumerate(arrays):
                gathered[f][i].append(arr)
    stamp = [f"{t:.3f}" for t in np.concatenate(stamps)]
    for fam, series in zip(fleet.families, gathered, strict=True):
        out.write(f"# TYPE {fam.name} {'gauge' if fam.kind == 'info' else fam.kind}\n")
        for (name, labels, _), parts in zip(fam.series, series, strict=True):
            row = np.concatenate(parts, axis=-1)
            for e in range(engines):
                lab = _series_labels(labels, e)
                prefix = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(lab.items())) + "} "
                vals = row[e] if row.ndim == 2 else row
                out.write(
                    "".join(f"{prefix}{v:.12g} {s}\n" for v, s in zip(vals.tolist(), stamp, strict=True) if v == v)
                )
    out.write("# EOF\n")
    return fleet.info()


IMPORT_BATCH_BYTES = 64 << 20


def import_capture_fleet(
    url: str,
    engines: int,
    start: float,
    end: float,
    interval: float = 15.0,
    seed: int = 7,
    shift_s: float = 0.0,
    timeout_s: float = 1800.0,
    names: re.Pattern[str] | None = None,
    cut: float | None = None,
) -> dict:
    """Stream the fleet into VictoriaMetrics' `/api/v1/import` (JSON lines: metric, values,
    millisecond timestamps), timestamps moved by `shift_s`; generation and posting overlap (one
    posting thread). `names`: only the families with a sample name it matches in full (a bench of
    one command's signals at sizes the whole capture would not fit); `cut`: CaptureFleet's. Returns
    `CaptureFleet.info()`."""
    fleet = CaptureFleet(engines, start, end, interval, seed, cut=cut)
    if names is not None:
        fleet.families = [f for f in fleet.families if any(names.fullmatch(n) for n, _, _ in f.series)]
    enc = msgspec.json.Encoder()
    todo: Queue[bytes | None] = Queue(maxsize=2)
    failed: list[BaseException] = []

    def post() -> None:
        while (body := todo.get()) is not None:
            if failed:
                continue
            try:
                req = urllib.request.Request(url + "/api/v1/import", data=body, method="POST")
                with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
                    resp.read()
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                failed.append(exc)

    poster = threading.Thread(target=post, daemon=True)
    poster.start()
    # labels in name order, as Prometheus' remote write sends them: VictoriaMetrics keeps the first 30
    # (-maxLabelsPerTimeseries) and vLLM 0.32's cache_config_info has 40 with instance and job, which
    # it would drop were they last
    prefixes = [
        [
            [enc.encode({"__name__": name, **dict(sorted(_series_labels(labels, e).items()))}) for e in range(engines)]
            for name, labels, _ in fam.series
        ]
        for fam in fleet.families
    ]
    buf: list[bytes] = []
    size = 0
    try:
        for ts, fams in fleet.chunks():
            ms = np.rint((ts + shift_s) * 1000).astype(np.int64)
            stamps = b',"timestamps":' + enc.encode(ms.tolist()) + b"}\n"
            for (_fam, arrays), pre in zip(fams, prefixes, strict=True):
                for arr, names in zip(arrays, pre, strict=True):
                    shared = None if arr.ndim == 2 else enc.encode(arr.tolist())
                    rows = arr.tolist() if arr.ndim == 2 else None
                    absent = np.isnan(arr) if arr.ndim == 2 and np.isnan(arr).any() else None
                    for e in range(engines):
                        values, own = (shared if rows is None else enc.encode(rows[e])), stamps
                        if absent is not None and absent[e].any():  # a series before or after the cut
                            if absent[e].all():
                                continue
                            kept = ~absent[e]
                            values = enc.encode(arr[e][kept].tolist())
                            own = b',"timestamps":' + enc.encode(ms[kept].tolist()) + b"}\n"
                        line = b'{"metric":' + names[e] + b',"values":' + values + own
                        buf.append(line)
                        size += len(line)
                    if size >= IMPORT_BATCH_BYTES:
                        todo.put(b"".join(buf))
                        buf, size = [], 0
                    if failed:
                        raise failed[0]
        if buf:
            todo.put(b"".join(buf))
    finally:
        todo.put(None)
        poster.join()
    if failed:
        raise failed[0]
    with urllib.request.urlopen(url + "/internal/force_flush", timeout=timeout_s) as resp:  # noqa: S310
        resp.read()
    return fleet.info()
