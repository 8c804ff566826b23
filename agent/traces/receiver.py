"""OTLP/HTTP trace receiver: `POST /v1/traces` -> stitched requests -> `request_phase_seconds`
and, for requests whose spans name a tenant, the `tenant_*` counters (tenants.py).

Protobuf or JSON, gzip/deflate, at most `max_body_bytes` before and after decompression; a body
that does not decode gets HTTP 400 and the receiver keeps serving. Optionally forwards every body
to `forward_url` and the stitched phase spans to `stitched_url` through a bounded queue that drops
(and counts) rather than slows down. The `otlp` config section: docs/requests.md §1."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from kvscope.agent.collectors.base import Collection, Health, register_collector
from kvscope.agent.config import (
    ConfigError,
    Key,
    address_value,
    count_key,
    duration_key,
    register_section,
    section_values,
    size_key,
)
from kvscope.agent.metricsets import PHASE_BUCKETS, HistogramSet
from kvscope.agent.ratelog import warn_every
from kvscope.agent.serve.site import HttpSite
from kvscope.agent.traces.export import encode_spans, render_phase_spans
from kvscope.agent.traces.otlp import JSON, OtlpDecodeError, decompress, parse_otlp_traces
from kvscope.agent.traces.stitch import RequestRecord, StitchConfig, TraceStitcher, observe_phases
from kvscope.agent.traces.tenants import TenantAccounting
from kvscope.core.resolve import Connector
from kvscope.core.scalars import split_host_port

log = logging.getLogger("kvscope.traces")


@dataclass(frozen=True)
class OtlpConfig:
    """The validated `otlp` section."""

    listen: str = "127.0.0.1:4318"
    max_body_bytes: int = 8 << 20
    forward_url: str | None = None
    stitched_url: str | None = None
    forward_timeout_s: float = 5.0
    forward_queue: int = 256
    flush_interval_s: float = 0.25
    recent_records: int = 1000
    max_tenants: int = 50
    fairness_window_s: float = 300.0
    stitch: StitchConfig = field(default_factory=StitchConfig)


_LISTEN = Key("otlp.listen", OtlpConfig.listen)
_STITCH_KEYS = (  # what each key means: docs/requests.md §1
    count_key("otlp.max_traces", StitchConfig.max_traces, 1, 1_000_000),
    count_key("otlp.max_spans_per_trace", StitchConfig.max_spans_per_trace, 1, 100_000),
    duration_key("otlp.settle_s", StitchConfig.settle_s, "0s", "1h"),
    duration_key("otlp.ttl_s", StitchConfig.ttl_s, "100ms", "1d"),
)
_KEYS = (
    size_key("otlp.max_body_bytes", OtlpConfig.max_body_bytes, "1KiB", "1GiB"),
    duration_key("otlp.forward_timeout_s", OtlpConfig.forward_timeout_s, "100ms", "1h"),
    count_key("otlp.max_tenants", OtlpConfig.max_tenants, 1, 10_000),
    duration_key("otlp.fairness_window_s", OtlpConfig.fairness_window_s, "1s", "1d"),
)


def parse_otlp_config(raw: Any) -> OtlpConfig:
    """Validate the `otlp` YAML section; raises ConfigError naming the key."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"otlp: must be a mapping, got {raw!r}")
    inner = {"forward_queue", "flush_interval_s", "recent_records", "stitch"}  # not settable in YAML
    known = {f.name for f in fields(OtlpConfig) + fields(StitchConfig)} - inner
    if unknown := sorted(set(raw) - known):
        raise ConfigError(f"otlp: unknown keys {unknown}; allowed: {sorted(known)}")
    listen = address_value(_LISTEN, raw.get(_LISTEN.name, _LISTEN.default))
    labels = raw.get("service_labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, dict) for v in labels.values()):
        raise ConfigError("otlp.service_labels: must map service.name -> {label: value}")
    stitch = StitchConfig(
        **section_values(raw, _STITCH_KEYS),
        service_labels={str(k): {str(a): str(b) for a, b in v.items()} for k, v in labels.items()},
    )
    return OtlpConfig(
        listen=listen,
        forward_url=raw.get("forward_url"),
        stitched_url=raw.get("stitched_url"),
        stitch=stitch,
        **section_values(raw, _KEYS),
    )


register_section("otlp", parse_otlp_config)


@register_collector("otlp", default_enabled=True)
class OtlpTraceReceiver:
    """Receives OTLP traces and reports the stitched requests; inert without an `otlp` section.
    `collect()` starts the server if the agent did not."""

    name = "otlp"

    def __init__(self, config: Any = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(config, OtlpConfig) or config is None:
            self.config: OtlpConfig | None = config or OtlpConfig()
        else:
            self.config = config.extensions.get("otlp")  # parsed by build_config (register_section)
        self.limits = getattr(config, "server_limits", None)  # the agent's `server.*` keys
        cfg = self.config or OtlpConfig()
        self.stitcher = TraceStitcher(cfg.stitch, clock=clock)
        self.phases = HistogramSet("request_phase_seconds", PHASE_BUCKETS)
        self.tenants = TenantAccounting(cfg.max_tenants)
        self.recent: deque[RequestRecord] = deque(maxlen=cfg.recent_records)
        self.stats: Counter[str] = Counter()  # cumulative: spans, requests, bad payloads, drops
        self._reported: Counter[str] = Counter()
        self._site: HttpSite | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._forward_q: asyncio.Queue[tuple[str, bytes, dict[str, str]]] | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def port(self) -> int | None:
        """The bound port once started (useful with `listen: 127.0.0.1:0`)."""
        return self._site.port if self._site is not None else None

    async def start(self) -> None:
        """Bind and serve. Raises OSError if the address is taken."""
        if self._site is not None or self.config is None:
            return
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/v1/traces", self._handle)
        # auto_decompress off: we decompress ourselves, under the max_body_bytes cap (zip bombs)
        site = HttpSite(app, self.limits, name="otlp receiver", access_log=None, auto_decompress=False)
        host, port = split_host_port(self.config.listen)
        await site.start(host, port)
        self._site = site
        self._tasks.append(asyncio.create_task(self._flush_loop()))
        if self.config.forward_url or self.config.stitched_url:
            self._forward_q = asyncio.Queue(self.config.forward_queue)
            self._session = aiohttp.ClientSession(
                connector=Connector(), timeout=aiohttp.ClientTimeout(total=self.config.forward_timeout_s)
            )
            self._tasks.append(asyncio.create_task(self._forward_loop()))
        log.info("OTLP receiver listening on %s:%s", host, site.port)

    async def stop(self) -> None:
        """Stop serving, stitch what is buffered, release sockets and tasks."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # a dead loop was reported in collect()
        self._tasks.clear()
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._emit(self.stitcher.flush(force=True))

    close = stop

    async def _handle(self, request: web.Request) -> web.Response:
        assert self.config is not None
        ctype = request.headers.get("Content-Type", "application/x-protobuf")
        try:
            body = await request.read()
            raw = decompress(body, request.headers.get("Content-Encoding", ""), self.config.max_body_bytes)
            spans = parse_otlp_traces(raw, ctype)
        except OtlpDecodeError as e:
            self.stats["bad_payload"] += 1
            return web.Response(status=400, text=str(e))
        self.stats["spans"] += len(spans)
        limited = self.stitcher.dropped["span_limit"]
        if not self._guard(lambda: self._emit(self.stitcher.add(spans))):
            return web.Response(status=500, text="internal error stitching these spans; counted, see the agent log")
        rejected = self.stitcher.dropped["span_limit"] - limited
        if self.config.forward_url:
            headers = {"Content-Type": ctype}
            if enc := request.headers.get("Content-Encoding"):
                headers["Content-Encoding"] = enc
            self._enqueue(self.config.forward_url, body, headers)
        return _response(ctype, rejected, self.config.stitch.max_spans_per_trace)

    def _enqueue(self, url: str, body: bytes, headers: dict[str, str]) -> None:
        if self._forward_q is None:
            return
        try:
            self._forward_q.put_nowait((url, body, headers))
        except asyncio.QueueFull:
            self.stats["forward_dropped_queue_full"] += 1

    async def _forward_loop(self) -> None:
        assert self._forward_q is not None and self._session is not None
        while True:
            url, body, headers = await self._forward_q.get()
            try:
                async with self._session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    self.stats["forwarded" if resp.status < 300 else f"forward_http_{resp.status}"] += 1
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
                self.stats[f"forward_{type(e).__name__}"] += 1

    async def _flush_loop(self) -> None:
        assert self.config is not None
        while True:
            await asyncio.sleep(self.config.flush_interval_s)
            self._guard(lambda: self._emit(self.stitcher.flush()))

    def _guard(self, step: Callable[[], None]) -> bool:
        """Run one step of handling; a bug on one input is counted (`internal_<error>`), logged
        (rate-limited) and survived. Returns whether it succeeded."""
        try:
            step()
            return True
        except Exception as e:  # noqa: BLE001 - one bad trace must not stop the receiver
            self.stats[f"internal_{type(e).__name__}"] += 1
            warn_every(log, f"otlp:{type(e).__name__}", "OTLP receiver: %r while stitching; counted", e)
            return False

    def _emit(self, records: list[RequestRecord]) -> None:
        for rec in records:
            self.stats["requests"] += 1
            observe_phases(self.phases, rec)
            self.tenants.observe(rec)
            self.recent.append(rec)
            if self.config and self.config.stitched_url and (spans := render_phase_spans(rec)):
                self._enqueue(self.config.stitched_url, encode_spans(spans), {"Content-Type": "application/x-protobuf"})

    async def collect(self) -> Collection:
        """Phase histograms and tenant counters (cumulative; the fairness gauges over them are the
        runtime's derive hook), and the receiver's health since the last collection."""
        if self.config is None:
            return Collection()
        t0 = time.perf_counter()
        health = Health(collector=self.name, target=self.config.listen)
        try:
            await self.start()
        except OSError as e:
            health.up, health.reason = False, f"bind_{e.errno}"
        self._guard(lambda: self._emit(self.stitcher.flush()))
        if dead := next((t for t in self._tasks if t.done() and not t.cancelled()), None):
            health.up, health.reason = False, f"loop_{type(dead.exception()).__name__}"
        now = time.time()
        samples = self.phases.render(now) + self.tenants.render(now)
        totals = self.stats + Counter({f"trace_{k}": v for k, v in self.stitcher.dropped.items()})
        delta = totals - self._reported
        self._reported = Counter(totals)
        health.errors.update(
            {k: v for k, v in delta.items() if k == "bad_payload" or k.startswith(("internal_", "forward_"))}
        )
        health.dropped.update({k: v for k, v in delta.items() if k.startswith("trace_")})
        if self._site is not None:
            health.closed.update(self._site.closed)
        health.series, health.duration_s = len(samples), time.perf_counter() - t0
        return Collection(samples=samples, health=[health])


def _response(ctype: str, rejected: int, limit: int) -> web.Response:
    """200 with an OTLP partial-success body when spans past the per-trace limit were dropped."""
    message = f"{rejected} spans over the {limit}-spans-per-trace limit were dropped" if rejected else ""
    if ctype.split(";")[0].strip().lower() == JSON:
        body = {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}} if rejected else {}
        return web.json_response(body)
    resp = ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    return web.Response(body=resp.SerializeToString(), content_type="application/x-protobuf")
