"""`kvscope tap`: an OpenAI-compatible reverse proxy that measures every request per tenant."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Any

from kvscope.agent.derive.fairness import fairness_json_since_start, fairness_since_start
from kvscope.agent.runtime import freeze_startup_objects
from kvscope.agent.tap.eventloop import loop_name, run_event_loop
from kvscope.agent.tap.proxy import RequestTap, TapConfig, parse_upstream
from kvscope.agent.traces.export import SpanBatchExporter
from kvscope.agent.traces.otlp import Span
from kvscope.commands._common import add_command
from kvscope.commands._objectives import add_objective_flags, objectives_from_args
from kvscope.core.scalars import split_host_port

DESCRIPTION = """\
Put kvscope between clients (or a router) and OpenAI-compatible engines (vLLM, SGLang).
/v1/chat/completions and /v1/completions requests pass through unchanged while the tap records
per tenant: requests, prompt tokens, tokens served from the engine's prefix cache
(usage.prompt_tokens_details.cached_tokens; vLLM needs --enable-prompt-tokens-details, SGLang
--enable-cache-report), client-side TTFT and inter-chunk gaps, and prefix reuse potential
(chained hashes of prompt blocks; no prompt text is kept). The tenant is the --tenant-header
value, else the OpenAI `user` field, else a hash of the API key (never the key); beyond
--max-tenants the quieter ones count as `other`. Several --upstream URLs are used round-robin.
The tap sends `traceparent` upstream and, with --otlp-endpoint, its spans. It serves
/kvscope/metrics (Prometheus text) and /kvscope/fairness (JSON) itself. Details: docs/requests.md.
"""

EXAMPLES = """\
examples:
  kvscope tap --upstream http://127.0.0.1:8000
  kvscope tap --upstream http://10.0.0.5:8000 --upstream http://10.0.0.6:8000 \\
      --listen 127.0.0.1:8001 --tenant-header X-Tenant --otlp-endpoint http://127.0.0.1:4318/v1/traces
  curl -s 127.0.0.1:8001/kvscope/fairness | jq .
"""


# (flag, TapConfig field, metavar, help); the default is TapConfig's
_CONFIG_FLAGS = (
    ("--max-tenants", "max_tenants", "N", "busiest tenants with their own label; the rest are counted as `other`"),
    ("--max-adapters", "max_adapters", "N", "request models (LoRA adapters) with their own label; the rest `other`"),
    ("--block-chars", "block_chars", "N", "prompt block size for reuse hashing, in characters (about N/4 tokens)"),
    ("--prefix-window", "prefix_window_s", "SECONDS", "a prompt block counts as reusable if seen this recently"),
    ("--max-connections", "max_connections", "N", "client connections at most; more get 503 + Retry-After"),
    ("--header-timeout", "header_timeout_s", "SECONDS", "a request head must arrive whole within this"),
    ("--request-timeout", "request_timeout_s", "SECONDS", "the whole request (head and body) within this"),
    ("--idle-timeout", "idle_timeout_s", "SECONDS", "close a keep-alive client connection idle this long"),
)


def register(subparsers: Any) -> None:
    help = "per-tenant measuring reverse proxy for OpenAI-compatible engines"
    p = add_command(subparsers, "tap", help, DESCRIPTION, EXAMPLES)
    up_help = "engine base URL, e.g. http://127.0.0.1:8000 (repeat for round-robin over replicas)"
    p.add_argument("--upstream", action="append", required=True, metavar="URL", help=up_help)
    p.add_argument("--listen", default="127.0.0.1:8001", metavar="HOST:PORT", help="where clients connect")
    tenant_help = "request header naming the tenant ('' to use only `user` / key hash)"
    p.add_argument("--tenant-header", default="X-Tenant", metavar="NAME", help=tenant_help)
    usage_help = "never add stream_options.include_usage upstream (streams that did not ask give no token counts)"
    p.add_argument("--no-inject-usage", action="store_true", help=usage_help)
    otlp_help = "send the tap's spans (OTLP/HTTP protobuf) here, e.g. http://127.0.0.1:4318/v1/traces"
    p.add_argument("--otlp-endpoint", metavar="URL", help=otlp_help)
    for flag, field, metavar, help_ in _CONFIG_FLAGS:
        default = getattr(TapConfig, field)
        p.add_argument(flag, dest=field, type=type(default), default=default, metavar=metavar, help=help_)
    add_objective_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = TapConfig(
            upstreams=tuple(args.upstream),
            listen=args.listen,
            tenant_header=args.tenant_header or None,
            inject_usage=not args.no_inject_usage,
            objectives=objectives_from_args(args),
            **{field: getattr(args, field) for _, field, _, _ in _CONFIG_FLAGS},
        )
        split_host_port(cfg.listen)
        for url in cfg.upstreams:
            parse_upstream(url)
    except ValueError as e:
        print(f"kvscope tap: bad argument: {e}")
        return 2
    try:
        run_event_loop(_serve(cfg, args.otlp_endpoint))
    except OSError as e:
        print(f"kvscope tap: cannot listen on {cfg.listen}: {e}")
        return 1
    return 0


def build_tap(cfg: TapConfig, span_sink: Callable[[list[Span]], None] | None = None) -> RequestTap:
    """The standalone tap: its /kvscope/metrics adds the fairness gauges since start, and
    /kvscope/fairness answers them as JSON (inside the agent, the runtime derives them)."""
    return RequestTap(
        cfg,
        span_sink=span_sink,
        derive=fairness_since_start,
        json_pages={"/kvscope/fairness": fairness_json_since_start},
    )


async def _serve(cfg: TapConfig, otlp_endpoint: str | None) -> None:
    exporter = SpanBatchExporter(otlp_endpoint) if otlp_endpoint else None
    tap = build_tap(cfg, span_sink=exporter.add if exporter else None)
    await tap.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sender = asyncio.create_task(exporter.run()) if exporter else None
    freeze_startup_objects()  # as the agent does: a proxied request leaves no reference cycle
    print(
        f"kvscope tap: listening on {split_host_port(cfg.listen)[0]}:{tap.port}, "
        f"forwarding to {', '.join(cfg.upstreams)} ({loop_name()} event loop)",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await tap.stop()
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
