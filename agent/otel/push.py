"""OTLP push of kvscope's metrics (HTTP/protobuf), beside `/metrics`.

On when the config has an `otlp_push:` section (without `enabled: false`) or the environment says
`OTEL_METRICS_EXPORTER=otlp`. Each key comes from the section, else from the standard variable,
else the default (the SDK's own precedence: an explicit setting over the environment):

key (`otlp_push:`) and standard variable, default:

- endpoint: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/metrics;
  http://localhost:4318/v1/metrics
- headers: OTEL_EXPORTER_OTLP_METRICS_HEADERS, else OTEL_EXPORTER_OTLP_HEADERS (k=v,k=v); none
- interval_s: OTEL_METRIC_EXPORT_INTERVAL (milliseconds); 60 s
- timeout_s: OTEL_EXPORTER_OTLP_METRICS_TIMEOUT, else OTEL_EXPORTER_OTLP_TIMEOUT (ms); 10 s
- temporality: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE (lowmemory = delta); cumulative
- operation_name (`gen_ai.operation.name`): text_completion
- max_points (data points per push; the rest are counted as dropped): 200000

Every push is bounded: the points per request are capped (the rest counted as dropped), the
SDK exporter's request has a timeout, and a push still running when the next is due is skipped
and counted. Outcomes land in `kvscope_exports_total{exporter="otlp",result}` and the
`otlp_push` entry of the collector health (`kvscope_collector_up`, /api/v1/health).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from kvscope.agent.config import ConfigError, parse_count, register_section
from kvscope.agent.otel.convert import Converter
from kvscope.agent.otel.genai import OPERATION_NAME, genai_points
from kvscope.agent.ratelog import warn_every
from kvscope.agent.scalars import parse_bool, parse_duration
from kvscope.agent.scrape.resolve import daemon_call
from kvscope.agent.serve.export import canonical_families, health_families
from kvscope.agent.signals import Catalog, load_catalog

log = logging.getLogger("kvscope.agent.otel")

SECTION = "otlp_push"
EXPORTER = "otlp"
DEFAULT_ENDPOINT = "http://localhost:4318/v1/metrics"
_KEYS = ("enabled", "endpoint", "headers", "interval_s", "timeout_s", "temporality", "operation_name", "max_points")


@dataclass(frozen=True)
class PushConfig:
    """Where and how often kvscope's metrics are pushed."""

    endpoint: str = DEFAULT_ENDPOINT
    headers: tuple[tuple[str, str], ...] = ()
    interval_s: float = 60.0
    timeout_s: float = 10.0
    temporality: str = "cumulative"
    operation_name: str = OPERATION_NAME
    max_points: int = 200_000


def parse_section(raw: Any) -> dict[str, Any]:
    """Validate the `otlp_push:` section's shape (values are resolved with the environment by
    `push_config`). Raises ConfigError naming the key."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{SECTION}: must be a mapping ({', '.join(_KEYS)}), got {raw!r}")
    for key in raw:
        if key not in _KEYS:
            raise ConfigError(f"{SECTION}.{key}: unknown key (allowed: {', '.join(_KEYS)})")
    push_config(raw, {})  # every value checked at start
    return raw


register_section(SECTION, parse_section)


def push_config(section: Mapping[str, Any] | None, environ: Mapping[str, str]) -> PushConfig | None:
    """The push configuration, or None when pushing is off. Raises ConfigError naming the key
    (or the variable) that is wrong."""
    exporters = {e.strip().lower() for e in environ.get("OTEL_METRICS_EXPORTER", "").split(",")}
    if section is None:
        if "otlp" not in exporters:
            return None
        section = {}
    try:
        enabled = parse_bool(section.get("enabled", True))
    except ValueError:
        raise ConfigError(f"{SECTION}.enabled: must be true or false, got {section.get('enabled')!r}") from None
    if not enabled:
        return None
    return PushConfig(
        endpoint=_endpoint(section, environ),
        headers=_headers(section, environ),
        interval_s=_duration(section, environ, "interval_s", ("OTEL_METRIC_EXPORT_INTERVAL",), 60.0),
        timeout_s=_duration(
            section, environ, "timeout_s", ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"), 10.0
        ),
        temporality=_temporality(section, environ),
        operation_name=_operation(section),
        max_points=_max_points(section),
    )


def _endpoint(section: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    if "endpoint" in section:
        url, where = section["endpoint"], f"{SECTION}.endpoint"
    elif environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        url, where = environ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"], "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
    elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):  # the base URL: the signal path is appended
        url = environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/metrics"
        where = "OTEL_EXPORTER_OTLP_ENDPOINT"
    else:
        return DEFAULT_ENDPOINT
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


def _headers(section: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    if "headers" in section:
        raw = section["headers"] or {}
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
            raise ConfigError(f"{SECTION}.headers: must be a mapping of header name to string value")
        return tuple(sorted(raw.items()))
    for var in ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"):
        if text := environ.get(var, "").strip():
            out = []
            for item in text.split(","):
                name, sep, value = item.partition("=")
                if not sep or not name.strip():
                    raise ConfigError(f"{var}: must be comma-separated name=value pairs, got {item.strip()!r}")
                out.append((unquote(name.strip()), unquote(value.strip())))
            return tuple(out)
    return ()


def _duration(
    section: Mapping[str, Any], environ: Mapping[str, str], key: str, variables: tuple[str, ...], default: float
) -> float:
    value, where = default, ""
    if key in section:
        where = f"{SECTION}.{key}"
        try:
            value = parse_duration(section[key], loose=True)
        except ValueError:
            value = -1.0
    else:
        for var in variables:
            if var in environ:
                where = var
                try:
                    value = float(environ[var]) / 1000.0  # the standard variables are milliseconds
                except ValueError:
                    value = -1.0
                break
    if not 0 < value < 86400:
        raise ConfigError(f"{where}: must be a duration > 0 (the variables in milliseconds), got {value!r}")
    return value


def _temporality(section: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    if "temporality" in section:
        raw, where = str(section["temporality"]), f"{SECTION}.temporality"
    else:
        var = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
        raw, where = environ.get(var, "cumulative"), var
    value = {"cumulative": "cumulative", "delta": "delta", "lowmemory": "delta"}.get(raw.strip().lower())
    if value is None:
        raise ConfigError(f"{where}: must be cumulative or delta (lowmemory reads as delta), got {raw!r}")
    return value


def _operation(section: Mapping[str, Any]) -> str:
    value = section.get("operation_name", OPERATION_NAME)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{SECTION}.operation_name: must be a non-empty string such as chat or text_completion")
    return value.strip()


def _max_points(section: Mapping[str, Any]) -> int:
    try:
        value = parse_count(section.get("max_points", 200_000))
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{SECTION}.max_points: must be an integer >= 1, got {section.get('max_points')!r}")
    return value


# ------------------------------------------------------------------------------------------ push loop


def build_exporter(cfg: PushConfig) -> Any:
    """The OpenTelemetry SDK's OTLP/HTTP protobuf metric exporter for `cfg`."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=cfg.endpoint, headers=dict(cfg.headers), timeout=cfg.timeout_s)


class OtlpPusher:
    """Pushes the agent's state every `interval_s` until stopped; never raises out of `run`."""

    def __init__(
        self,
        cfg: PushConfig,
        state: Any,
        catalog: Catalog | None = None,
        exporter: Any = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.cfg, self.state, self.clock = cfg, state, clock
        self.catalog = catalog or load_catalog()
        self.exporter = exporter if exporter is not None else build_exporter(cfg)
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
        self._busy = daemon_call(self.exporter.export, data, self.cfg.timeout_s * 1000, name="kvscope-otlp-push")
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
