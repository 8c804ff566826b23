"""The request tap: an OpenAI-compatible streaming reverse proxy that measures each request.

Per request to `/v1/chat/completions` or `/v1/completions` it records the tenant, client-side
TTFT and inter-chunk gaps, prompt / completion / cached tokens from the engine's usage object,
and the prefix reuse potential of the prompt (agent/tap/prefix.py). It starts (or continues) the
W3C trace: the upstream gets a `traceparent` naming the tap's span, so the engine's
`llm_request` span joins the tap's trace, and the tap's own span (with `kvscope.tenant`) goes to
`span_sink` (the OTLP receiver, in-process or over HTTP).

Streaming without usage: the tap may ask upstream for `stream_options.include_usage` and then
drops the usage-only chunk it caused, so the client receives exactly the bytes it would have
received without the tap. Every other byte (status, body, events) passes unchanged; hop-by-hop
headers are not forwarded.

Never stored: prompt or completion text, API keys. Bounded: request body size, tenant labels,
prefix index, per-series histograms. A client that disconnects closes the upstream request; an
upstream 5xx passes through and is counted; an unreachable upstream gives the client a 502.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from kvscope.agent.analytics.fairness import (
    FairnessReport,
    TenantUsage,
    evaluate_fairness,
    render_fairness_samples,
)
from kvscope.agent.export import canonical_families
from kvscope.agent.signals import Sample, load_catalog, make_labels
from kvscope.agent.tap.prefix import PrefixIndex, render_prompt
from kvscope.agent.tap.sse import SseSplitter, classify_event, parse_usage
from kvscope.agent.tap.tenants import TenantLimiter, parse_tenant
from kvscope.agent.traces.histogram import GENAI_TPOT_BUCKETS, GENAI_TTFT_BUCKETS, CounterSet, HistogramSet
from kvscope.agent.traces.otlp import Span

log = logging.getLogger("kvscope.tap")

ACCOUNTED_PATHS = ("/v1/chat/completions", "/v1/completions")
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"}


@dataclass(frozen=True)
class TapConfig:
    """How the tap listens, where it forwards and how it identifies tenants."""

    upstreams: tuple[str, ...] = ("http://127.0.0.1:8000",)
    listen: str = "127.0.0.1:8001"
    tenant_header: str | None = "X-Tenant"
    inject_usage: bool = True
    max_tenants: int = 50
    max_request_bytes: int = 16 << 20
    read_timeout_s: float = 600.0
    prefix_window_s: float = 900.0
    prefix_max_blocks: int = 200_000
    block_chars: int = 64
    service_name: str = "kvscope-tap"

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)


@dataclass
class _Exchange:
    """What the tap learned about one request while it passed."""

    tenant: str
    path: str
    model: str | None
    start: float
    trace_id: str
    span_id: str
    parent_id: str
    replica: str = ""
    reusable_ratio: float | None = None
    first_token: float | None = None
    last_chunk: float | None = None
    status: int = 0
    usage: dict[str, Any] | None = None
    outcome: str = "ok"
    start_ns: int = 0
    gaps: list[float] = field(default_factory=list)


def _hex(nbytes: int) -> str:
    return os.urandom(nbytes).hex()


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace_id, parent span id) from a W3C traceparent header, None if absent or invalid."""
    parts = (value or "").strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    if set(parts[1]) == {"0"} or set(parts[2]) == {"0"}:
        return None
    return parts[1], parts[2]


class RequestTap:
    """The proxy server plus its per-tenant accounting. `start()`/`stop()`; `render_samples()`."""

    def __init__(self, config: TapConfig, span_sink: Callable[[list[Span]], None] | None = None) -> None:
        self.config = config
        self.span_sink = span_sink
        self.tenants = TenantLimiter(config.max_tenants)
        self.prefixes = PrefixIndex(window_s=config.prefix_window_s, max_blocks=config.prefix_max_blocks,
                                    block_chars=config.block_chars)
        self.requests = CounterSet("tenant_requests_total")
        self.prompt_tokens = CounterSet("tenant_prompt_tokens_total")
        self.cached_tokens = CounterSet("tenant_cached_tokens_total")
        self.reusable_tokens = CounterSet("tenant_reusable_tokens_total")
        self.ttft = HistogramSet("tenant_ttft_seconds", GENAI_TTFT_BUCKETS)
        self.itl = HistogramSet("tenant_itl_seconds", GENAI_TPOT_BUCKETS)
        self.stats: Counter[str] = Counter()
        self._rr = itertools.cycle(config.upstreams)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port: int | None = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Bind the listen address and open the upstream connection pool."""
        if self._runner is not None:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.config.read_timeout_s))
        app = web.Application(client_max_size=self.config.max_request_bytes)
        app.router.add_get("/kvscope/metrics", self._metrics)
        app.router.add_get("/kvscope/fairness", self._fairness)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await self._runner.setup()
        host, port = self.config.host_port()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("tap listening on %s:%s -> %s", host, self.port, ", ".join(self.config.upstreams))

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------ the tap's own endpoints
    async def _metrics(self, request: web.Request) -> web.Response:
        """The tap's series in Prometheus text format (names as in the catalog, no prefix)."""
        out: list[str] = []
        samples = self.render_samples() + render_fairness_samples(evaluate_fairness(self.tenant_usage()))
        for fam in canonical_families(samples, load_catalog()):
            fam.render(out)
        return web.Response(text="".join(out), content_type="text/plain", charset="utf-8")

    async def _fairness(self, request: web.Request) -> web.Response:
        """Per-tenant fairness since the tap started, as JSON."""
        return web.json_response(render_fairness_json(evaluate_fairness(self.tenant_usage())))

    # ------------------------------------------------------------ proxying
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        doc = _json_object(body) if request.method == "POST" and request.path in ACCOUNTED_PATHS else None
        if doc is None:
            return await self._forward(request, body, None, None)
        ex = self._begin(request, doc)
        up_body = body
        if doc.get("stream") is True and self.config.inject_usage and not _asks_usage(doc):
            doc["stream_options"] = {**(doc.get("stream_options") or {}), "include_usage": True}
            up_body = json.dumps(doc).encode()
            injected = True
        else:
            injected = False
        try:
            return await self._forward(request, up_body, ex, injected)
        finally:
            self._finish(ex)

    def _begin(self, request: web.Request, doc: dict[str, Any]) -> _Exchange:
        tenant = self.tenants.label(parse_tenant(request.headers, doc, self.config.tenant_header))
        ctx = parse_traceparent(request.headers.get("traceparent"))
        trace_id, parent = ctx if ctx else (_hex(16), "")
        ex = _Exchange(tenant=tenant, path=request.path, model=_str(doc.get("model")), start=time.perf_counter(),
                       trace_id=trace_id, span_id=_hex(8), parent_id=parent)
        ex.replica = next(self._rr)
        ex.start_ns = time.time_ns()
        prompt = render_prompt(doc)
        if prompt:   # matched when the engine would look it up: on arrival, in-flight requests included
            ex.reusable_ratio = self.prefixes.observe(prompt, ex.replica).reusable_ratio
        return ex

    def _upstream_headers(self, request: web.Request, ex: _Exchange | None) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        if ex is not None:
            headers = {k: v for k, v in headers.items() if k.lower() not in ("traceparent", "tracestate")}
            headers["traceparent"] = f"00-{ex.trace_id}-{ex.span_id}-01"
            if ts := request.headers.get("tracestate"):
                headers["tracestate"] = ts
        return headers

    async def _forward(self, request: web.Request, body: bytes, ex: _Exchange | None,
                       injected: bool | None) -> web.StreamResponse:
        assert self._session is not None
        base = ex.replica if ex else self.config.upstreams[0]
        url = base.rstrip("/") + request.raw_path
        try:
            async with self._session.request(request.method, url, data=body,
                                             headers=self._upstream_headers(request, ex)) as up:
                if ex is not None:
                    ex.status = up.status
                if up.headers.get("Content-Type", "").startswith("text/event-stream"):
                    return await self._stream(request, up, ex, bool(injected))
                return await self._whole(up, ex)
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            if ex is not None:
                ex.outcome = "upstream_unreachable"
            self.stats[f"upstream_{type(e).__name__}"] += 1
            return web.json_response({"error": {"message": f"kvscope tap: upstream {base} unreachable",
                                                "type": "bad_gateway"}}, status=502)

    async def _whole(self, up: aiohttp.ClientResponse, ex: _Exchange | None) -> web.Response:
        data = await up.read()
        if ex is not None:
            now = time.perf_counter()
            ex.first_token = ex.last_chunk = now
            doc = _json_object(data)
            if doc is not None and isinstance(doc.get("usage"), dict):
                ex.usage = doc["usage"]
            if up.status >= 500:
                ex.outcome = f"upstream_{up.status}"
        return web.Response(status=up.status, body=data, headers=_response_headers(up))

    async def _stream(self, request: web.Request, up: aiohttp.ClientResponse, ex: _Exchange | None,
                      injected: bool) -> web.StreamResponse:
        resp = web.StreamResponse(status=up.status, headers=_response_headers(up))
        await resp.prepare(request)
        splitter = SseSplitter()
        try:
            async for chunk in up.content.iter_any():
                out = self._pass_events(splitter.feed(chunk), ex, injected)
                if out:
                    await resp.write(out)
            if rest := splitter.rest():
                await resp.write(rest)
            await resp.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError) as e:
            self._outcome(ex, "client_disconnect")
            log.debug("client went away: %s", e)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as e:
            # upstream died mid-stream: cut the client connection too rather than end the stream cleanly
            self._outcome(ex, "upstream_broken")
            log.debug("upstream stream broke: %r", e)
            if request.transport is not None:
                request.transport.close()
        return resp

    def _outcome(self, ex: _Exchange | None, outcome: str) -> None:
        if ex is not None:
            ex.outcome = outcome
        else:
            self.stats[outcome] += 1

    def _pass_events(self, events: list[bytes], ex: _Exchange | None, injected: bool) -> bytes:
        if ex is None:
            return b"".join(events)
        keep = []
        for ev in events:
            now = time.perf_counter()
            e = classify_event(ev)
            if e.usage is not None:
                ex.usage = e.usage
            if e.kind == "usage_only" and injected:
                continue                      # we asked for it; the client did not
            if e.kind == "token":
                if ex.first_token is None:
                    ex.first_token = now
                elif ex.last_chunk is not None:
                    ex.gaps.append(now - ex.last_chunk)
                ex.last_chunk = now
            keep.append(ev)
        return b"".join(keep)

    # ------------------------------------------------------------ accounting
    def _finish(self, ex: _Exchange) -> None:
        prompt_tokens, completion_tokens, cached = parse_usage(ex.usage)
        lab = make_labels({"tenant": ex.tenant})
        self.requests.inc(lab)
        self.stats["requests"] += 1
        if ex.outcome != "ok":
            self.stats[ex.outcome] += 1
        if prompt_tokens is not None:
            self.prompt_tokens.inc(lab, prompt_tokens)
            if ex.reusable_ratio is not None:
                self.reusable_tokens.inc(lab, round(prompt_tokens * ex.reusable_ratio))
        if cached is not None:
            self.cached_tokens.inc(lab, cached)
        if ex.first_token is not None and ex.outcome == "ok" and ex.status < 400:
            self.ttft.observe(lab, ex.first_token - ex.start)
            for g in ex.gaps:
                self.itl.observe(lab, g)
        if self.span_sink is not None:
            self._emit_span(ex, prompt_tokens, completion_tokens, cached)

    def _emit_span(self, ex: _Exchange, prompt_tokens: int | None, completion_tokens: int | None,
                   cached: int | None) -> None:
        end_ns = ex.start_ns + int((time.perf_counter() - ex.start) * 1e9)
        attrs: dict[str, Any] = {"kvscope.tenant": ex.tenant, "http.request.method": "POST",
                                 "url.path": ex.path, "http.response.status_code": ex.status,
                                 "kvscope.replica": ex.replica, "kvscope.outcome": ex.outcome}
        for k, v in (("gen_ai.request.model", ex.model), ("gen_ai.usage.prompt_tokens", prompt_tokens),
                     ("gen_ai.usage.completion_tokens", completion_tokens), ("gen_ai.usage.cached_tokens", cached),
                     ("kvscope.reusable_ratio", ex.reusable_ratio),
                     ("kvscope.ttft_s", ex.first_token - ex.start if ex.first_token else None)):
            if v is not None:
                attrs[k] = v
        span = Span(ex.trace_id, ex.span_id, ex.parent_id, f"POST {ex.path}", 2, ex.start_ns, end_ns, attrs,
                    {"service.name": self.config.service_name}, "kvscope.tap")
        try:
            self.span_sink([span])  # type: ignore[misc]
        except Exception as e:  # a broken sink must not break proxying
            self.stats["span_sink_error"] += 1
            log.debug("span sink failed: %r", e)

    def tenant_usage(self) -> dict[str, TenantUsage]:
        """Cumulative per-tenant usage (input to agent/analytics/fairness.py)."""
        out: dict[str, TenantUsage] = {}
        buckets: dict[str, list[tuple[float, float]]] = {}
        for s in self.ttft.render():
            if s.name == "tenant_ttft_seconds_bucket":
                le = s.label("le") or "+Inf"
                buckets.setdefault(s.label("tenant") or "", []).append((float(le), s.value))
        for s in self.requests.render():
            t = s.label("tenant") or ""
            lab = s.labels
            out[t] = TenantUsage(tenant=t, requests=s.value, prompt_tokens=self.prompt_tokens.value(lab) or 0.0,
                                 cached_tokens=self.cached_tokens.value(lab),
                                 reusable_tokens=self.reusable_tokens.value(lab),
                                 ttft_buckets=sorted(buckets.get(t, [])))
        return out

    def render_samples(self, timestamp: float | None = None) -> list[Sample]:
        """Every tap series: tenant counters, TTFT/ITL histograms, prefix split ratio."""
        out: list[Sample] = []
        for fam in (self.requests, self.prompt_tokens, self.cached_tokens, self.reusable_tokens, self.ttft, self.itl):
            out.extend(fam.render(timestamp))
        if (split := self.prefixes.split_ratio) is not None:
            out.append(Sample("prefix_split_ratio", (), split, timestamp))
        return out


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _asks_usage(doc: dict[str, Any]) -> bool:
    opts = doc.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _response_headers(up: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in up.headers.items() if k.lower() not in _HOP}


def render_fairness_json(report: FairnessReport) -> dict[str, Any]:
    """A fairness report as plain JSON (None stays null: absent, not zero)."""
    return {"aggregate_hit_ratio": report.aggregate_hit_ratio, "jain_index": report.jain_index,
            "cold_tenant_ratio": report.cold_tenant_ratio, "tail_gap_ratio": report.tail_gap_ratio,
            "worst_tenant": report.worst_tenant,
            "tenants": {name: dict(t.__dict__) for name, t in report.tenants.items()}}
