"""`kvscope agent`: run the per-node agent (scrape, normalize, store, serve /metrics and the API)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

from kvscope.agent.api import AgentServer
from kvscope.agent.config import AgentConfig, ConfigError
from kvscope.agent.derive.hooks import derive_hooks
from kvscope.agent.otel.push import SECTION as PUSH_SECTION
from kvscope.agent.otel.push import OtlpPusher, push_config
from kvscope.agent.runtime import AgentRuntime, build_collectors, known_collectors
from kvscope.agent.tap.eventloop import run_event_loop
from kvscope.commands._common import add_command, fail
from kvscope.commands._flags import ENV_HELP, add_agent_flags, add_scrape_flags, config_from_args
from kvscope.core.scalars import split_host_port

DESCRIPTION = """\
Run the kvscope agent on this node. Every interval it scrapes the configured engine
(vLLM, SGLang) and dcgm-exporter /metrics targets and runs the enabled collectors (NVML, host...),
maps everything to canonical signals, keeps history in a local SQLite store, and serves:

  /metrics          canonical series as kvscope_<signal>, plus self-health
                    (kvscope_target_up, kvscope_scrape_errors_total{reason}, ...)
  /api/v1/samples   stored samples as JSON (?match=<names, | and .* wildcards>&start=&end=)
  /api/v1/facts     engine configuration facts (block size, prefix caching, kv dtype)
  /api/v1/health    collectors and targets with the reason of any failure
  /-/ready          200 once the first cycle finished

With an otlp_push: section, or OTEL_METRICS_EXPORTER=otlp, it also pushes the same metrics
plus the OpenTelemetry GenAI server histograms (gen_ai.server.*) over OTLP/HTTP protobuf
(OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS, OTEL_METRIC_EXPORT_INTERVAL; docs/otel.md).

A bad target never stops the agent: it is reported with a reason. A bad config stops it at
start with a message naming the key. SIGTERM or Ctrl-C stop it cleanly (the store is flushed).
"""

EXAMPLES = """\
examples:
  kvscope agent --target http://127.0.0.1:8000/metrics
  kvscope agent --config kvscope.yaml --scrape.interval 5s --no-collector.nvml
  KVSCOPE_SCRAPE_TIMEOUT_S=2 kvscope agent --config kvscope.yaml
"""


def register(subparsers: Any) -> None:
    collectors = known_collectors()
    help = "run the per-node agent (scrape, store, serve /metrics)"
    parser = add_command(subparsers, "agent", help, DESCRIPTION, EXAMPLES + "\n" + ENV_HELP)
    add_scrape_flags(parser)
    add_agent_flags(parser, collectors)
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error"), help="log verbosity on stderr"
    )
    parser.set_defaults(func=run, known_collectors=collectors)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_args(args, args.known_collectors)
    except ConfigError as e:
        return fail("agent", f"config error: {e}", 2)
    for warning in config.warnings:
        logging.getLogger("kvscope.agent").warning("config: %s", warning)
    return run_event_loop(serve(config))  # uvloop when installed: less CPU per scrape and request


async def serve(config: AgentConfig, ready: asyncio.Event | None = None) -> int:
    """Run collectors and the HTTP server until SIGTERM/SIGINT. Returns the exit code."""
    log = logging.getLogger("kvscope.agent")
    from kvscope.agent.serve.limits import OPEN_FILES, raise_open_files
    from kvscope.agent.store.sqlite import MEMORY, MEMORY_MAX_BYTES, SqliteStore, StoreError

    if (files := raise_open_files()) < OPEN_FILES:
        log.warning("open-file limit %d (wanted %d): listeners accept fewer connections", files, OPEN_FILES)

    try:
        push = push_config(config.extensions.get(PUSH_SECTION), os.environ)
    except ConfigError as e:
        log.error("config error: %s", e)
        return 2
    try:
        store = SqliteStore(
            config.store_path or MEMORY,
            retention_s=config.retention_s,
            max_bytes=config.store_max_bytes if config.store_path else min(config.store_max_bytes, MEMORY_MAX_BYTES),
            max_series_per_target=config.store_max_series_per_target,
        )
    except (StoreError, OSError) as e:
        log.error("store: %s", e)
        return 1
    runtime = AgentRuntime(config, build_collectors(config), store, derive=derive_hooks(config), freeze_gc=True)
    server = AgentServer(runtime)
    pusher = OtlpPusher(push, runtime.state) if push is not None else None
    host, port = split_host_port(config.listen_address)
    try:
        bound = await server.start(host, port)
    except OSError as e:
        log.error("cannot listen on %s: %s", config.listen_address, e.strerror or e)
        await runtime.close()
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.stop)
    names = ", ".join(c.name for c in runtime.collectors)
    log.info("listening on http://%s:%d/metrics; %d target(s), collectors: %s", host, bound, len(config.targets), names)
    if push is not None:
        log.info("pushing metrics over OTLP to %s every %gs (%s)", push.endpoint, push.interval_s, push.temporality)
    if ready is not None:
        ready.set()
    push_task = asyncio.create_task(pusher.run()) if pusher is not None else None
    try:
        await runtime.run()
    finally:
        if pusher is not None and push_task is not None:
            pusher.stop()
            await push_task
            await pusher.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()
        await runtime.close()
        log.info("stopped after %d cycle(s)", runtime.state.cycles)
    return 0
