"""OTLP push of kvscope's metrics (HTTP/protobuf), beside `/metrics`.

On when the config has an `otlp_push:` section (without `enabled: false`) or the environment says
`OTEL_METRICS_EXPORTER=otlp`. The SDK's exporter (`OTLPMetricExporter`) reads the standard
variables itself: a key in the section is passed to it and wins over its variable, as an explicit
setting does in the SDK; what the section leaves out the SDK resolves, default in brackets:

- endpoint: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/metrics
  (http://localhost:4318/v1/metrics)
- headers: OTEL_EXPORTER_OTLP_METRICS_HEADERS, else OTEL_EXPORTER_OTLP_HEADERS (none)
- timeout_s: OTEL_EXPORTER_OTLP_METRICS_TIMEOUT, else OTEL_EXPORTER_OTLP_TIMEOUT (seconds, as the
  Python SDK reads them; 10 s)
- temporality: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE (lowmemory = delta; cumulative)

kvscope's own loop pushes (the SDK's periodic reader collects from instruments, kvscope's points
are engine histograms), so kvscope reads OTEL_METRIC_EXPORT_INTERVAL itself (`interval_s`,
milliseconds; 60 s). Its own keys: operation_name (`gen_ai.operation.name`, text_completion) and
max_points (data points per push, the rest counted as dropped; 200000).

Every push is bounded: the points per request are capped (the rest counted as dropped), the
SDK exporter's request has a timeout, and a push still running when the next is due is skipped
and counted. Outcomes land in `kvscope_exports_total{exporter="otlp",result}` and the
`otlp_push` entry of the collector health (`kvscope_collector_up`, /api/v1/health).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kvscope.agent.config import (
    ConfigError,
    Key,
    count_key,
    key_value,
    parse_seconds,
    register_section,
    section_values,
    switch_key,
)
from kvscope.agent.otel.convert import Converter
from kvscope.agent.otel.genai import OPERATION_NAME, genai_points
from kvscope.agent.ratelog import warn_every
from kvscope.agent.serve.export import canonical_families, health_families
from kvscope.core.resolve import daemon_call
from kvscope.core.signals import Catalog, load_catalog

log = logging.getLogger("kvscope.agent.otel")

SECTION = "otlp_push"
EXPORTER = "otlp"
INTERVAL_VAR = "OTEL_METRIC_EXPORT_INTERVAL"
_KEYS = ("enabled", "endpoint", "headers", "interval_s", "timeout_s", "temporality", "operation_name", "max_points")


@dataclass(frozen=True)
class PushConfig:
    """Where and how often kvscope's metrics are pushed, as resolved with the SDK's exporter."""

    exporter: Any
    endpoint: str
    timeout_s: float
    temporality: str
    interval_s: float = 60.0
    operation_name: str = OPERATION_NAME
    max_points: int = 200_000


_ENABLED = switch_key(f"{SECTION}.enabled", True)
_TIMES = tuple(  # absent: the variable or the SDK's default decides
    Key(f"{SECTION}.{name}", None, parse_seconds, lambda v: 0 < v < 86400, "a duration > 0 and < 1d")
    for name in ("interval_s", "timeout_s")
)
_INTERVAL_VAR = Key(
    INTERVAL_VAR, None, lambda ms: float(ms) / 1000, lambda v: 0 < v < 86400, "milliseconds > 0 and < 1 day"
)
_MAX_POINTS = count_key(f"{SECTION}.max_points", PushConfig.max_points, 1, 100_000_000)


def parse_section(raw: Any) -> dict[str, Any]:
    """Validate the `otlp_push:` section (the environment is read by `push_config` at start).
    Raises ConfigError naming the key."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{SECTION}: must be a mapping ({', '.join(_KEYS)}), got {raw!r}")
    for key in raw:
        if key not in _KEYS:
            raise ConfigError(f"{SECTION}.{key}: unknown key (allowed: {', '.join(_KEYS)})")
    _section_values(raw, {})
    return raw


register_section(SECTION, parse_section)


def push_config(section: Mapping[str, Any] | None, environ: Mapping[str, str] = os.environ) -> PushConfig | None:
    """The push configuration with its exporter, or None when pushing is off. The exporter reads
    the standard variables from the process environment. Raises ConfigError naming the key (or
    the variable) that is wrong."""
    if section is None:
        if "otlp" not in {e.strip().lower() for e in environ.get("OTEL_METRICS_EXPORTER", "").split(",")}:
            return None
        section = {}
    if not key_value(_ENABLED, section.get(_ENABLED.name, _ENABLED.default)):
        return None
    given = _section_values(section, environ)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import Histogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    exporter = OTLPMetricExporter(
        endpoint=given.get("endpoint"), headers=given.get("headers"), timeout=given.get("timeout_s")
    )
    # what the SDK resolved (its 1.45 exporter keeps them there): the loop bounds its wait by the
    # timeout and converts with the temporality
    endpoint = _url(exporter._endpoint, "otlp_push.endpoint or OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT")
    delta = (exporter._preferred_temporality or {}).get(Histogram) == AggregationTemporality.DELTA
    return PushConfig(
        exporter,
        endpoint,
        given.get("timeout_s", exporter._client._timeout),
        given.get("temporality", "delta" if delta else "cumulative"),
        **{k: given[k] for k in ("interval_s", "operation_name", "max_points") if k in given},
    )


def _section_values(section: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The section's keys checked and parsed, `interval_s` from its variable when the section
    leaves it out; a key absent from both is absent (the SDK or the default decides)."""
    out: dict[str, Any] = {}
    if "endpoint" in section:
        out["endpoint"] = _url(section["endpoint"], f"{SECTION}.endpoint")
    if "headers" in section:
        raw = section["headers"] or {}
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
            raise ConfigError(f"{SECTION}.headers: must be a mapping of header name to string value")
        out["headers"] = raw
    out.update(section_values(section, _TIMES))
    if "interval_s" not in out and INTERVAL_VAR in environ:
        out["interval_s"] = key_value(_INTERVAL_VAR, environ[INTERVAL_VAR])
    if "temporality" in section:
        value = {"cumulative": "cumulative", "delta": "delta", "lowmemory": "delta"}.get(
            str(section["temporality"]).strip().lower()
        )
        if value is None:
            raise ConfigError(f"{SECTION}.temporality: must be cumulative or delta (lowmemory reads as delta)")
        out["temporality"] = value
    name = section.get("operation_name", OPERATION_NAME)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{SECTION}.operation_name: must be a non-empty string such as chat or text_completion")
    out["operation_name"] = name.strip()
    out["max_points"] = key_value(_MAX_POINTS, section.get(_MAX_POINTS.name, _MAX_POINTS.default))
    return out


def _url(url: Any, where: str) -> str:
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{where}: must be an http:// or https:// URL of the OTLP/HTTP metrics receiver "
            f"(e.g. http://collector:4318/v1/metrics), got {url!r}"
        )
    return url


# ------------------------------------------------------------------------------------------ push loop


class OtlpPusher:
    """Pushes the agent's state every `interval_s` until stopped; never raises out of `run`."""

    def __init__(
        self,
        cfg: PushConfig,
        state: Any,
        catalog: Catalog | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.cfg, self.state, self.clock = cfg, state, clock
        self.catalog = catalog or load_catalog()
        self.exporter = cfg.exporter
        self.converter = Converter(cfg.temporality, started_ns=clock())
        self._busy: asyncio.Future[Any] | None = None
        self._stop = asyncio.Event()

    async def push_once(self) -> str:
        """Convert the current state and export it; returns the outcome token (also counted)."""
        if self._busy is not None and not self._busy.done():
            return self._count("skipped_busy", "a push is still running")
        t0 = time.monotonic()
        st = self.state
        try:
            samples = st.canonical_samples()
            dropped: dict[str, int] = {}
            genai = genai_points(samples, self.cfg.operation_name, dropped)
            fams = canonical_families(samples, self.catalog) + health_families(st, st.store_stats)
            data, kept, over = self.converter.metrics_data(fams, genai, self.clock(), self.cfg.max_points)
        except Exception as e:  # a bug in conversion must not stop the agent
            warn_every(log, f"otlp_convert:{type(e).__name__}", "OTLP push: conversion failed: %r", e)
            return self._count(f"exception_{type(e).__name__}", "conversion failed", t0)
        for reason, n in (*dropped.items(), ("max_points", over)):
            if n:
                st.dropped[("otlp_push", "", reason)] += n
        # a thread of its own: one stuck in a name lookup must hold neither the loop's executor nor the exit
        self._busy = daemon_call(self.exporter.export, data, name="kvscope-otlp-push")
        try:
            # the exporter's own timeout bounds the request; the wait is bounded too
            result = await asyncio.wait_for(asyncio.shield(self._busy), timeout=self.cfg.timeout_s + 5.0)
        except TimeoutError:
            return self._count("timeout", "the receiver did not answer in time", t0)
        except Exception as e:
            return self._count(f"exception_{type(e).__name__}", str(e), t0)
        ok = getattr(result, "name", str(result)) == "SUCCESS"
        return self._count("ok" if ok else "failed", "" if ok else f"export to {self.cfg.endpoint} failed", t0, kept)

    def _count(self, result: str, why: str, t0: float | None = None, points: int = 0) -> str:
        st = self.state
        st.exports[(EXPORTER, result)] += 1
        if points:
            st.exported_points[EXPORTER] += points
        if result != "ok" and why:
            warn_every(log, f"otlp_push:{result}", "OTLP push %s: %s", result, why)
        seconds = time.monotonic() - t0 if t0 is not None else 0.0
        st.collector_status["otlp_push"] = (result == "ok", result, seconds)
        return result

    async def run(self) -> None:
        """Push every `interval_s` (the first one interval after start) until `stop()`."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.cfg.interval_s)
            if self._stop.is_set():
                break
            try:
                await self.push_once()
            except Exception as e:  # noqa: BLE001 - the loop goes on
                warn_every(log, f"otlp_push:{type(e).__name__}", "OTLP push failed: %r", e)

    def stop(self) -> None:
        self._stop.set()

    async def close(self) -> None:
        """One last push of what the agent holds, then shut the exporter down."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.push_once(), timeout=self.cfg.timeout_s + 5.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(daemon_call(self.exporter.shutdown, name="kvscope-otlp-push"), self.cfg.timeout_s)
