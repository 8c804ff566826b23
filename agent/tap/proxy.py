"""The request tap: an OpenAI-compatible streaming reverse proxy that measures each request
(docs/requests.md).

Per request to an accounted path it records the tenant, client-side TTFT and token gaps, the
engine's usage (prompt / completion / cached tokens) and the prompt's prefix reuse potential, and
continues the W3C trace (`traceparent` upstream, the tap's span to `span_sink`). The client gets
exactly the bytes it would have got without the tap (a usage chunk the tap asked for is dropped);
no prompt text or API key is kept. Wire work: http1.py and forward.py; this module owns the
server's lifecycle, connection limits and accounting.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import msgspec

from kvscope.agent.metricsets import CounterSet
from kvscope.agent.serve.export import CONTENT_TYPE, canonical_families
from kvscope.agent.serve.limits import Refused, connection_cap, http_answer, worth_a_warning
from kvscope.agent.tap.exchange import Exchange
from kvscope.agent.tap.forward import Forward
from kvscope.agent.tap.groups import GroupSeries
from kvscope.agent.tap.http1 import (
    HOP_BY_HOP,
    Downstream,
    Request,
    UpstreamPool,
    error_body,
    filter_headers,
    render_request,
)
from kvscope.agent.tap.prefix import PrefixIndex, render_prompt
from kvscope.agent.tap.sessions import SessionTracker, parse_session_id
from kvscope.agent.tap.sse import parse_json_object, parse_usage
from kvscope.agent.tenants import TenantLimiter, clean_id, parse_tenant
from kvscope.agent.traces.otlp import Span
from kvscope.core.objectives import ObjectiveSet
from kvscope.core.scalars import split_host_port
from kvscope.core.signals import Sample, load_catalog, make_labels

log = logging.getLogger("kvscope.tap")
_RANDOM = random.Random(int.from_bytes(os.urandom(16), "big"))

ACCOUNTED_PATHS = ("/v1/chat/completions", "/v1/completions")
_UPSTREAM_DROP = HOP_BY_HOP | {b"accept-encoding"}  # the tap reads the body: ask for it uncompressed
_UPSTREAM_DROP_TRACED = _UPSTREAM_DROP | {b"traceparent", b"tracestate"}
BACKLOG = 2048  # a burst of new client connections must not overflow the accept queue
SWEEP_S = 1.0  # at most; shorter when a configured timeout is short
REFUSED = http_answer(
    "503 Service Unavailable", error_body("too many connections to the tap (max_connections)", "service_unavailable")
)
"""The answer to a connection over `max_connections` (then closed)."""


@dataclass(frozen=True)
class TapConfig:
    """How the tap listens, where it forwards and how it identifies tenants."""

    upstreams: tuple[str, ...] = ("http://127.0.0.1:8000",)
    listen: str = "127.0.0.1:8001"
    tenant_header: str | None = "X-Tenant"
    inject_usage: bool = True
    max_tenants: int = 50
    max_adapters: int = 20  # request `model` values with their own adapter series; the rest `other`
    max_request_bytes: int = 16 << 20
    read_timeout_s: float = 600.0
    prefix_window_s: float = 900.0
    prefix_max_blocks: int = 200_000
    block_chars: int = 64
    service_name: str = "kvscope-tap"
    max_connections: int = 1024  # client connections; more are answered 503 at once (docs/requests.md)
    header_timeout_s: float = 10.0  # a request head must arrive whole within this (from accept / first byte)
    request_timeout_s: float = 60.0  # ... and its body with it, counted from the head's start
    idle_timeout_s: float = 75.0  # a keep-alive connection with no request is closed after this
    objectives: ObjectiveSet = ObjectiveSet()  # what a good request meets (core/objectives.py)

    def __post_init__(self) -> None:
        limits = (self.header_timeout_s, self.request_timeout_s, self.idle_timeout_s, self.max_connections)
        if not all(v > 0 for v in limits):
            raise ValueError("max_connections, header/request/idle timeouts must be positive")


def _hex(nbytes: int) -> str:
    """A random non-zero id (W3C trace / span id), without a system call per id."""
    return f"{_RANDOM.getrandbits(nbytes * 8) | 1:0{nbytes * 2}x}"


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


class _Target(NamedTuple):
    """One upstream base URL, ready for the wire."""

    key: tuple[str, int, bool]  # host, port, TLS
    host: bytes  # Host header value
    prefix: bytes  # path prefix of the base URL ('' usually)


def parse_upstream(base: str) -> _Target:
    """An upstream base URL (http:// or https://) as a connection target."""
    u = urlsplit(base)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"upstream must be an http(s):// URL, got {base!r}")
    tls = u.scheme == "https"
    port = u.port or (443 if tls else 80)
    return _Target((u.hostname, port, tls), u.netloc.rpartition("@")[2].encode(), u.path.rstrip("/").encode())


class RequestTap:
    """The proxy server plus its per-tenant accounting. `start()`/`stop()`; `render_samples()`."""

    def __init__(
        self,
        config: TapConfig,
        span_sink: Callable[[list[Span]], None] | None = None,
        derive: Callable[[list[Sample]], list[Sample]] | None = None,
        json_pages: Mapping[str, Callable[[list[Sample]], Any]] | None = None,
    ) -> None:
        """`derive` adds series computed from the tap's own to its /kvscope/metrics page, and
        `json_pages` serves path -> JSON of the tap's series (the standalone `kvscope tap` wires
        fairness into both; in the agent the runtime's derive hooks do that instead)."""
        self.config = config
        self.span_sink = span_sink
        self.derive = derive
        self.json_pages = dict(json_pages or {})
        self.tenants = TenantLimiter(config.max_tenants)
        self.prefixes = PrefixIndex(
            window_s=config.prefix_window_s, max_blocks=config.prefix_max_blocks, block_chars=config.block_chars
        )
        self.adapters = TenantLimiter(config.max_adapters)  # the request's `model`: a LoRA adapter or the base
        self.by_tenant = GroupSeries("tenant")
        self.by_adapter = GroupSeries("adapter")
        self.reusable_tokens = CounterSet("tenant_reusable_tokens_total")
        self.goodput_requests = CounterSet("goodput_requests_total")
        self.goodput_good = CounterSet("goodput_good_requests_total")
        self.goodput_good_tokens = CounterSet("goodput_good_output_tokens_total")
        self.stats: Counter[str] = Counter()
        self.sessions = SessionTracker()
        self.targets = {base: parse_upstream(base) for base in config.upstreams}
        self._rr = itertools.cycle(config.upstreams)
        self.pool = UpstreamPool(connect_timeout_s=10.0)
        self.tasks: set[asyncio.Task[None]] = set()
        self._clients: set[Downstream] = set()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.port: int | None = None
        self.max_connections = config.max_connections

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Bind the listen address (upstream connections are opened on demand and kept alive)."""
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        host, port = split_host_port(self.config.listen)
        self.max_connections = connection_cap(self.config.max_connections, "tap", fds_each=2, reserve=256)
        self._server = await loop.create_server(self._accept, host, port, backlog=BACKLOG)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = loop.create_task(self._sweep())
        log.info("tap listening on %s:%s -> %s", host, self.port, ", ".join(self.config.upstreams))

    async def stop(self) -> None:
        """Stop listening, cut open connections (both sides), cancel pending connects."""
        if self._server is None:
            return
        self._server.close()
        for task in [self._sweeper, *self.tasks]:
            if task is not None:
                task.cancel()
        for conn in list(self._clients):
            if conn.transport is not None:
                conn.transport.abort()
        self.pool.close()
        await self._server.wait_closed()
        await asyncio.sleep(0)  # let the aborted transports report connection_lost
        self._server = self._sweeper = None

    def _accept(self) -> asyncio.Protocol:
        """A new client connection: served, or over `max_connections` answered 503 and closed."""
        if len(self._clients) < self.max_connections:
            return Downstream(self._on_request, self._clients, self.config.max_request_bytes)
        self.stats["connections_refused"] += 1
        if worth_a_warning(self.stats["connections_refused"]):
            log.warning(
                "tap: %d client connections open (max_connections); %d refused with 503 so far",
                len(self._clients),
                self.stats["connections_refused"],
            )
        return Refused(REFUSED)

    async def _sweep(self) -> None:
        """Time out silent upstreams (read timeout) and client connections: a request head that
        does not arrive whole in `header_timeout_s` (however slowly its bytes trickle), a request
        not whole in `request_timeout_s`, a keep-alive connection idle for `idle_timeout_s`."""
        cfg = self.config
        limits = {"head": cfg.header_timeout_s, "body": cfg.request_timeout_s, "idle": cfg.idle_timeout_s}
        while True:
            await asyncio.sleep(min(SWEEP_S, min(limits.values()) / 4))
            now = time.monotonic()
            for up in list(self.pool.busy):
                if up.handler is not None and now - up.active_since(now) > cfg.read_timeout_s:
                    up.fail_timeout()
            for conn in list(self._clients):
                if not conn.busy and now - conn.since > limits[conn.phase]:
                    self.stats[f"client_timeout_{conn.phase}"] += 1
                    conn.time_out()

    # ------------------------------------------------------------ the tap's own endpoints
    def render_metrics_text(self) -> str:
        """The tap's series in Prometheus text format (names as in the catalog, no prefix)."""
        out: list[str] = []
        samples = self.render_samples()
        samples += self.derive(samples) if self.derive else []
        for fam in canonical_families(samples, load_catalog()):
            fam.render(out)
        return "".join(out)

    # ------------------------------------------------------------ proxying
    def _on_request(self, conn: Downstream, req: Request) -> None:
        if req.method == "GET" and req.path == "/kvscope/metrics":
            conn.send_whole(200, self.render_metrics_text().encode(), CONTENT_TYPE.encode())
            return
        if req.method == "GET" and req.path in self.json_pages:
            conn.send_whole(200, json.dumps(self.json_pages[req.path](self.render_samples())).encode())
            return
        doc = parse_json_object(req.body) if req.method == "POST" and req.path in ACCOUNTED_PATHS else None
        ex, body, injected = None, req.body, False
        if doc is not None:
            ex = self._begin(req)
            if doc.get("stream") is True and self.config.inject_usage and not _asks_usage(doc):
                body, injected = render_with_usage(req.body, doc), True
        target = self.targets[ex.replica if ex else self.config.upstreams[0]]
        wire = render_request(req.method, target.prefix + req.target, target.host, upstream_headers(req, ex), body)
        Forward(self, conn, req, ex, doc, injected, target, wire).start()

    def _begin(self, req: Request) -> Exchange:
        """What the request needs before it goes upstream: its trace context and replica. Who sent
        it (`identify`) is worked out after it went, so that work never delays the engine."""
        trace_id, parent = parse_traceparent(req.headers.get("traceparent")) or (_hex(16), "")
        start, replica, start_ns = time.perf_counter(), next(self._rr), time.time_ns()
        return Exchange("", req.path, None, start, trace_id, _hex(8), parent, replica, start_ns=start_ns)

    def identify(self, ex: Exchange, req: Request, doc: dict[str, Any]) -> None:
        """The request's tenant label, model and session id (called once the request is upstream,
        or when it ends without having got there)."""
        ex.tenant = self.tenants.label(parse_tenant(req.headers, doc, self.config.tenant_header))
        ex.model = model if isinstance(model := doc.get("model"), str) and model.strip() else None
        ex.adapter = self.adapters.label(clean_id(ex.model)) if ex.model is not None else None
        ex.session_id = parse_session_id(req.headers, doc)

    def observe_prefix(self, ex: Exchange, doc: dict[str, Any]) -> None:
        """Reuse potential of the request's prompt, matched in arrival order (in-flight ones included),
        and the session turn it continues (agent/tap/sessions.py).

        Called just after the request went upstream, so hashing never delays the engine."""
        prompt = render_prompt(doc)
        match = self.prefixes.observe(prompt, ex.replica) if prompt else None
        if match is not None:
            ex.reusable_ratio = match.reusable_ratio
        ex.turn = self.sessions.begin(match, ex.session_id)  # which earlier turn this one follows

    # ------------------------------------------------------------ accounting
    def account(self, ex: Exchange) -> None:
        """Count one finished exchange: tenant and adapter series, session turn, the tap's span.
        A request without a `model` has no adapter series (absent, never a made-up name)."""
        prompt_tokens, completion_tokens, cached = parse_usage(ex.usage)
        seconds = time.perf_counter() - ex.start
        lab = self.by_tenant.labels(ex.tenant)
        self.by_tenant.count(lab, ex, prompt_tokens, completion_tokens, cached, seconds)
        if ex.adapter is not None:
            self.by_adapter.count(
                self.by_adapter.labels(ex.adapter), ex, prompt_tokens, completion_tokens, cached, seconds
            )
        self.stats["requests"] += 1
        if ex.outcome != "ok":
            self.stats[ex.outcome] += 1
        if prompt_tokens is not None and ex.reusable_ratio is not None:
            self.reusable_tokens.inc(lab, round(prompt_tokens * ex.reusable_ratio))
        if ex.outcome == "ok" and 0 < ex.status < 400:
            self._count_goodput(ex, completion_tokens)
        self.sessions.finish(ex.turn, ex.tenant, ex.replica, prompt_tokens, cached)
        if self.span_sink is not None:
            self._emit_span(ex, prompt_tokens, completion_tokens, cached)

    def _count_goodput(self, ex: Exchange, completion_tokens: int | None) -> None:
        """Whether this answered request met every objective of its pool (model) and tenant, counted
        exactly: TTFT to the first token event, end to end to the answer's last byte, TPOT as
        (end - first token) / (output tokens - 1), the tokens from usage or else one per token
        event; a request of one token has no time per output token to miss."""
        end = time.perf_counter()
        ttft = None if ex.first_token is None else ex.first_token - ex.start
        tokens = completion_tokens if completion_tokens is not None else len(ex.gaps) + 1
        tpot = None if ttft is None else (0.0 if tokens < 2 else (end - ex.first_token) / (tokens - 1))  # type: ignore[operator]
        objectives = self.config.objectives.of(pool=ex.model, tenant=ex.tenant)
        lab = make_labels({"tenant": ex.tenant, "model": ex.adapter or ""})  # the adapter limiter's bound
        self.goodput_requests.inc(lab)
        good = objectives.met({"ttft": ttft, "tpot": tpot, "e2e": end - ex.start})
        self.goodput_good.inc(lab, 1.0 if good else 0.0)  # 0: the series exists
        self.goodput_good_tokens.inc(lab, float(completion_tokens or 0) if good else 0.0)

    def _emit_span(
        self, ex: Exchange, prompt_tokens: int | None, completion_tokens: int | None, cached: int | None
    ) -> None:
        end_ns = ex.start_ns + int((time.perf_counter() - ex.start) * 1e9)
        attrs = {
            "kvscope.tenant": ex.tenant,
            "http.request.method": "POST",
            "url.path": ex.path,
            "http.response.status_code": ex.status,
            "kvscope.replica": ex.replica,
            "kvscope.outcome": ex.outcome,
            "gen_ai.request.model": ex.model,
            "gen_ai.usage.prompt_tokens": prompt_tokens,
            "gen_ai.usage.completion_tokens": completion_tokens,
            "gen_ai.usage.cached_tokens": cached,
            "kvscope.reusable_ratio": ex.reusable_ratio,
            "kvscope.ttft_s": ex.first_token - ex.start if ex.first_token else None,
        }
        span = Span(
            ex.trace_id,
            ex.span_id,
            ex.parent_id,
            f"POST {ex.path}",
            2,
            ex.start_ns,
            end_ns,
            {k: v for k, v in attrs.items() if v is not None},
            {"service.name": self.config.service_name},
            "kvscope.tap",
        )
        try:
            self.span_sink([span])  # type: ignore[misc]
        except Exception as e:  # a broken sink must not break proxying
            self.stats["span_sink_error"] += 1
            log.debug("span sink failed: %r", e)

    def render_samples(self, timestamp: float | None = None) -> list[Sample]:
        """Every tap series: tenant and adapter counters, TTFT/ITL histograms, prefix split ratio, session turns."""
        out = self.by_tenant.render(timestamp) + self.reusable_tokens.render(timestamp)
        out += self.by_adapter.render(timestamp)
        for fam in (self.goodput_requests, self.goodput_good, self.goodput_good_tokens):
            out.extend(fam.render(timestamp))
        if (split := self.prefixes.split_ratio) is not None:
            out.append(Sample("prefix_split_ratio", (), split, timestamp))
        out.extend(self.sessions.render(timestamp))
        return out


def upstream_headers(req: Request, ex: Exchange | None) -> list[tuple[bytes, bytes]]:
    """The headers a request goes upstream with (pure): the client's minus hop-by-hop ones and
    Accept-Encoding; an accounted one carries the tap's traceparent (and the client's tracestate)."""
    if ex is None:
        return filter_headers(req.raw_headers, _UPSTREAM_DROP)
    headers = filter_headers(req.raw_headers, _UPSTREAM_DROP_TRACED)
    headers.append((b"traceparent", f"00-{ex.trace_id}-{ex.span_id}-01".encode()))
    if ts := req.headers.get("tracestate"):
        headers.append((b"tracestate", ts.encode("latin-1")))
    return headers


def _asks_usage(doc: dict[str, Any]) -> bool:
    opts = doc.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def render_with_usage(body: bytes, doc: dict[str, Any]) -> bytes:
    """The request body asking for `stream_options.include_usage` (pure).

    Without `stream_options` the member is appended to the client's own bytes; otherwise the
    object is encoded again."""
    raw = body.rstrip()
    if "stream_options" not in doc and raw.endswith(b"}") and len(doc) > 0:
        return raw[:-1] + b',"stream_options":{"include_usage":true}}'
    opts = doc.get("stream_options")
    return msgspec.json.encode(
        {**doc, "stream_options": {**(opts if isinstance(opts, dict) else {}), "include_usage": True}}
    )
