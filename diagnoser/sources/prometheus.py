"""Diagnose from a Prometheus-compatible HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics).

One range query (`/api/v1/query_range`, POST) per window fetches the native engine series the
rules need, by every upstream name the catalog knows (old and new vLLM names, Ray's `vllm_`
spelling, SGLang, DCGM), plus the agent's re-exported `kvscope_<signal>` series. Native series
go through the same dialects as live scrapes and recordings, one detection per scrape target;
`kvscope_*` series are already canonical. Range queries answer on the grid start + k x step
with Prometheus' 5-minute lookback, which is the Frame's own sampling rule, so a recording and
the same recording loaded into Prometheus give the same frame.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from typing import Any

from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.scrape.exposition import Exposition, RawSample
from kvscope.agent.signals import HISTOGRAM_SUFFIXES, KVSCOPE_PREFIX, Catalog, Sample, load_catalog, make_labels
from kvscope.diagnoser.evaluate.frame import Frame, frame_from_samples, merge_facts
from kvscope.diagnoser.sources import SourceError

DEFAULT_WINDOW_S = 1800.0
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
_TARGET_LABELS = ("job", "instance")


class PrometheusSource:
    """Range queries against one Prometheus-compatible base URL."""

    def __init__(self, url: str, timeout_s: float = 60.0, catalog: Catalog | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.catalog = catalog or load_catalog()
        self.description = f"prometheus:{self.url}"

    def read_frame(self, names: set[str], start: float | None, end: float | None, step: float) -> Frame:
        end = time.time() if end is None else end
        start = end - DEFAULT_WINDOW_S if start is None else start
        query = selector_for(names, self.catalog)
        result = self._query_range(query, start, end, step)
        samples, facts = parse_matrix(result, self.catalog)
        frame = frame_from_samples(samples, start, end, step, names=names)
        frame.facts = facts
        return frame

    def _query_range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        body = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                       "step": f"{step:g}"}).encode()
        req = urllib.request.Request(self.url + "/api/v1/query_range", data=body, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                raw = resp.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise SourceError(f"prometheus {self.url}: HTTP {exc.code}: {_error_text(exc)}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise SourceError(f"prometheus {self.url}: {exc}") from exc
        if len(raw) > MAX_RESPONSE_BYTES:
            raise SourceError(f"prometheus {self.url}: answer larger than {MAX_RESPONSE_BYTES} bytes; "
                              "narrow the window or raise --step")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise SourceError(f"prometheus {self.url}: not JSON ({exc})") from exc
        if doc.get("status") != "success" or (doc.get("data") or {}).get("resultType") != "matrix":
            raise SourceError(f"prometheus {self.url}: {doc.get('error', 'unexpected answer')}")
        return list(doc["data"]["result"])


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read(65536)).get("error", exc.reason))
    except (ValueError, OSError):
        return str(exc.reason)


def native_names(names: set[str], catalog: Catalog) -> set[str]:
    """Declared upstream names (all dialects) that produce the canonical sample names."""
    signals = {sig for n in names if (sig := _signal_of(n, catalog)) is not None}
    out = set()
    for sig in signals:
        for alias in catalog.signals[sig].aliases:
            out.add(alias.name)
    out |= {f.name for f in catalog.facts}
    return out


def _signal_of(sample_name: str, catalog: Catalog) -> str | None:
    if sample_name in catalog.signals:
        return sample_name
    for suffix in HISTOGRAM_SUFFIXES:
        base = sample_name[: -len(suffix)]
        if sample_name.endswith(suffix) and base in catalog.signals:
            return base
    return None


def selector_for(names: set[str], catalog: Catalog) -> str:
    """One `{__name__=~"..."}` selector for every native and kvscope_* name needed."""
    alternatives = set()
    for declared in native_names(names, catalog):
        base = re.escape(declared)
        alternatives.add(base)
        if ":" in declared:                                   # Ray / some builds spell vllm:x as vllm_x
            alternatives.add(re.escape(declared.replace(":", "_", 1)))
    native = "|".join(sorted(alternatives))
    suffix = "(_total|_bucket|_sum|_count)?"
    kv = "|".join(sorted(re.escape(KVSCOPE_PREFIX + n) for n in names))
    return f'{{__name__=~"(({native}){suffix})|({kv})"}}'


def parse_matrix(result: list[dict[str, Any]], catalog: Catalog | None = None
                 ) -> tuple[list[Sample], dict[str, dict[str, str]]]:
    """A range-query matrix -> canonical samples (native series normalized per target and step)."""
    catalog = catalog or load_catalog()
    canonical: list[Sample] = []
    per_target: dict[tuple[str, str], dict[float, list[RawSample]]] = defaultdict(lambda: defaultdict(list))
    for series in result:
        metric = dict(series.get("metric") or {})
        name = metric.pop("__name__", "")
        if name.startswith(KVSCOPE_PREFIX):
            canonical.extend(_kvscope_samples(name[len(KVSCOPE_PREFIX):], metric, series.get("values") or []))
            continue
        target = (metric.pop("job", ""), metric.pop("instance", ""))
        labels = make_labels(metric)
        for ts, value in series.get("values") or []:
            per_target[target][float(ts)].append(RawSample(name, labels, float(value), None))
    facts: dict[str, dict[str, dict[str, str]]] = {}
    for (job, instance), steps in per_target.items():
        union = Exposition(samples=[s for pts in steps.values() for s in pts[:2000]][:20000])
        engine = detect_engine(union, catalog)
        for ts, raw in sorted(steps.items()):
            norm = normalize(Exposition(samples=raw), engine, {"job": job, "instance": instance}, ts, catalog)
            canonical.extend(norm.samples)
            for rank, f in norm.facts.items():
                facts.setdefault(instance, {}).setdefault(rank, {}).update(f)
    return canonical, merge_facts(facts)


def _kvscope_samples(name: str, metric: dict[str, str], values: list) -> list[Sample]:
    """The agent's re-export: already canonical. Prometheus renames a clashing target label to
    exported_<label>; the engine's own instance/job win back."""
    for label in _TARGET_LABELS:
        if f"exported_{label}" in metric:
            metric[label] = metric.pop(f"exported_{label}")
    labels = make_labels(metric)
    return [Sample(name, labels, float(v), float(ts)) for ts, v in values]
