"""The request tap inside the agent: config section `tap` (keys: `_KEYS`; docs/requests.md),
series through the agent's store. The fairness gauges are the runtime's derive hook
(agent/derive/fairness.py), which reads the tap's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from typing import Any

from kvscope.agent.collectors.base import Collection, Health, register_collector
from kvscope.agent.config import (
    ConfigError,
    Key,
    address_value,
    count_key,
    duration_key,
    key_value,
    register_section,
    section_values,
    switch_key,
)
from kvscope.agent.tap.proxy import RequestTap, TapConfig, parse_upstream
from kvscope.agent.traces.export import SpanBatchExporter

_CLOSED = {  # tap.stats key -> reason of kvscope_connections_closed_total (the config key that closed it)
    "connections_refused": "max_connections",
    "client_timeout_head": "header_timeout",
    "client_timeout_body": "request_timeout",
    "client_timeout_idle": "idle_timeout",
}
LISTEN = Key("tap.listen", TapConfig.listen)
KEYS = (  # what each key means: docs/requests.md (the tap in the agent)
    count_key("tap.max_tenants", TapConfig.max_tenants, 1, 10_000),
    count_key("tap.max_adapters", TapConfig.max_adapters, 1, 10_000),
    switch_key("tap.inject_usage", TapConfig.inject_usage),
    count_key("tap.block_chars", TapConfig.block_chars, 1, 1 << 20),
    count_key("tap.max_connections", TapConfig.max_connections, 1, 1_000_000),
    duration_key("tap.prefix_window_s", TapConfig.prefix_window_s, "1s", "1d"),
    duration_key("tap.header_timeout_s", TapConfig.header_timeout_s, "100ms", "1h"),
    duration_key("tap.request_timeout_s", TapConfig.request_timeout_s, "100ms", "1h"),
    duration_key("tap.idle_timeout_s", TapConfig.idle_timeout_s, "100ms", "1d"),
)
FAIRNESS_WINDOW = duration_key("tap.fairness_window_s", 300.0, "1s", "1d")
_KEYS = {*(k.name for k in KEYS), LISTEN.name, "upstreams", "tenant_header", "otlp_endpoint", FAIRNESS_WINDOW.name}


def parse_tap_config(raw: Any) -> dict[str, Any]:
    """Validate the `tap` section; returns {"tap": TapConfig, "otlp_endpoint", "fairness_window_s"}."""
    if not isinstance(raw, dict):
        raise ConfigError(f"tap: must be a mapping, got {raw!r}")
    if unknown := sorted(set(raw) - _KEYS):
        raise ConfigError(f"tap: unknown keys {unknown}; allowed: {sorted(_KEYS)}")
    ups = raw.get("upstreams")
    if isinstance(ups, str):
        ups = [ups]
    if not ups or not isinstance(ups, list):
        raise ConfigError(f"tap.upstreams: needs one or more http(s):// base URLs, got {ups!r}")
    for url in ups:
        try:
            parse_upstream(url if isinstance(url, str) else "")
        except ValueError:
            raise ConfigError(f"tap.upstreams: needs one or more http(s):// base URLs, got {url!r}") from None
    cfg = TapConfig(
        upstreams=tuple(ups),
        listen=address_value(LISTEN, raw.get(LISTEN.name, LISTEN.default)),
        tenant_header=raw.get("tenant_header", "X-Tenant") or None,
        **section_values(raw, KEYS),
    )
    return {
        "tap": cfg,
        "otlp_endpoint": raw.get("otlp_endpoint"),
        "fairness_window_s": key_value(FAIRNESS_WINDOW, raw.get(FAIRNESS_WINDOW.name, FAIRNESS_WINDOW.default)),
    }


register_section("tap", parse_tap_config)


@register_collector("tap", default_enabled=True)
class TapCollector:
    """Runs the request tap in the agent's loop (inert when the config has no `tap` section)."""

    name = "tap"

    def __init__(self, config: Any = None) -> None:
        section = config.extensions.get("tap") if config is not None else None  # parsed by build_config
        self.section = section
        self.exporter = SpanBatchExporter(section["otlp_endpoint"]) if section and section["otlp_endpoint"] else None
        objectives = getattr(config, "objectives", None)  # the agent config's `objectives:` section
        tap_config = replace(section["tap"], objectives=objectives) if section and objectives else None
        self.tap = (
            RequestTap(tap_config or section["tap"], span_sink=self.exporter.add if self.exporter else None)
            if section
            else None
        )
        self._sender: asyncio.Task[None] | None = None

    async def collect(self) -> Collection:
        if self.tap is None or self.section is None:
            return Collection()
        health = Health(collector=self.name, target=self.tap.config.listen)
        try:
            await self.tap.start()
            if self.exporter and self._sender is None:
                self._sender = asyncio.create_task(self.exporter.run())
        except OSError as e:
            health.up, health.reason = False, f"bind_{e.errno}"
            return Collection(health=[health])
        now = time.time()
        samples = self.tap.render_samples(now)
        health.series = len(samples)
        health.closed.update({reason: self.tap.stats[key] for key, reason in _CLOSED.items()})
        return Collection(samples=samples, health=[health])

    async def close(self) -> None:
        if self.tap is not None:
            await self.tap.stop()
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
