"""Read a diagnosis window from Prometheus: the recorded canonical series → a `Frame`.

The generated rules (rules/prometheus/kvscope-canonical.yml) keep every canonical series as
`kvscope:<series>` whatever the engine or the agent exports, so this reader needs no engine
names: one `query_range` per sample name a rule reads, on the diagnosis grid. Engine facts come
from the info gauges (`kvscope_engine_info` from the agent, the engines' own info gauges named in
the catalog). Responses are size-bounded; a query that fails is reported and the rest still load
(an absent signal skips the rules that need it, it is never zero).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kvscope.agent.signals import Sample, load_catalog, make_labels
from kvscope.diagnoser.frame import DEFAULT_LOOKBACK_S, Frame, frame_from_samples
from kvscope.diagnoser.promrules_alerts import info_gauges
from kvscope.diagnoser.promrules_sources import AGENT_PREFIX, name_selector

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Largest query response read; a bigger one is an error (ask for a shorter window)."""

FACT_SKIP = {"__name__", "instance", "job", "engine", "model_name", "model", "dp_rank"}


class PrometheusError(RuntimeError):
    """Prometheus could not be queried, or answered with an error."""


@dataclass
class PrometheusWindow:
    """What one read produced: the frame and the queries that failed."""

    frame: Frame
    errors: list[str] = field(default_factory=list)


def parse_matrix(payload: dict[str, Any], prefix: str = "kvscope:") -> list[Sample]:
    """A query_range answer → canonical samples (the `kvscope:` prefix dropped). No I/O."""
    if payload.get("status") != "success":
        raise PrometheusError(f"{payload.get('errorType', 'error')}: {payload.get('error', 'no status')}")
    data = payload.get("data") or {}
    if data.get("resultType") != "matrix":
        raise PrometheusError(f"expected a matrix, got {data.get('resultType')!r}")
    out = []
    for series in data.get("result") or []:
        metric = dict(series.get("metric") or {})
        name = str(metric.pop("__name__", ""))
        name = name[len(prefix):] if name.startswith(prefix) else name
        labels = make_labels({str(k): str(v) for k, v in metric.items()})
        for ts, value in series.get("values") or []:
            out.append(Sample(name, labels, float(value), float(ts)))
    return out


def parse_facts(payload: dict[str, Any]) -> dict[str, dict[str, str]]:
    """An instant-vector answer over info gauges → instance → facts (labels as facts)."""
    if payload.get("status") != "success":
        raise PrometheusError(str(payload.get("error", "query failed")))
    facts: dict[str, dict[str, str]] = {}
    for series in (payload.get("data") or {}).get("result") or []:
        metric = series.get("metric") or {}
        instance = metric.get("instance")
        if instance:
            known = facts.setdefault(str(instance), {})
            known.update({str(k): str(v) for k, v in metric.items() if k not in FACT_SKIP})
    return facts


class PrometheusReader:
    """Fetches canonical series for a window from one Prometheus HTTP API."""

    def __init__(self, url: str, session: aiohttp.ClientSession, timeout_s: float = 10.0,
                 concurrency: int = 4) -> None:
        self.url = url.rstrip("/")
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._limit = asyncio.Semaphore(concurrency)

    async def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        async with self._limit:
            try:
                async with self.session.get(self.url + path, params=params, timeout=self.timeout) as resp:
                    body = await resp.content.read(MAX_RESPONSE_BYTES + 1)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise PrometheusError(f"{path}: {type(exc).__name__}: {exc}") from exc
        if len(body) > MAX_RESPONSE_BYTES:
            raise PrometheusError(f"{path}: response over {MAX_RESPONSE_BYTES} bytes")
        try:
            return json.loads(body)
        except ValueError as exc:
            raise PrometheusError(f"{path}: HTTP {resp.status}, not JSON") from exc

    async def fetch_series(self, name: str, start: float, end: float, step: float) -> list[Sample]:
        """One canonical sample name over [start, end] on the given step."""
        payload = await self._get("/api/v1/query_range", {
            "query": f"kvscope:{name}", "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
        return parse_matrix(payload)

    async def fetch_facts(self, at: float, lookback_s: float) -> dict[str, dict[str, str]]:
        names = (AGENT_PREFIX + "engine_info", *info_gauges(load_catalog()))
        query = f"last_over_time({name_selector(names)}[{int(lookback_s)}s])"
        return parse_facts(await self._get("/api/v1/query", {"query": query, "time": f"{at:.3f}"}))

    async def fetch_window(self, names: set[str], start: float, end: float, step: float) -> PrometheusWindow:
        """Every named series over the window as a Frame; failed queries listed, not raised."""
        begin = start - DEFAULT_LOOKBACK_S
        tasks = [self.fetch_series(n, begin, end, step) for n in sorted(names)]
        results = await asyncio.gather(*tasks, self.fetch_facts(end, end - begin), return_exceptions=True)
        samples: list[Sample] = []
        errors: list[str] = []
        for name, result in zip([*sorted(names), "facts"], results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, PrometheusError):
                    raise result
                errors.append(f"{name}: {result}")
            elif name != "facts":
                samples.extend(result)
        frame = frame_from_samples(samples, start, end, step)
        facts = results[-1]
        frame.facts = facts if isinstance(facts, dict) else {}
        return PrometheusWindow(frame, errors)
