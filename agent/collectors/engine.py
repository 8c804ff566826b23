"""Engine collector: scrape every configured /metrics target (vLLM, SGLang, dcgm-exporter...).

Each `collect()` scrapes all targets concurrently (each bounded by the scrape timeout and the body
cap), detects each target's dialect from its metric names (or takes its `engine` override) and
normalizes the payload to canonical samples, keeping per target how each upstream series mapped
last time (`MappingMemo`). Every failure (the fetch, a target limit or
the parse deadline, `unknown_engine`, `no_canonical_series`, dropped lines and values) is reported
in the target's `Health`, never raised: docs/collectors.md ("Bounds and limits", "Failure modes") lists them.

`scrape_all()` returns the payloads (native names), which `kvscope record` writes.

Beside each successful scrape of an engine that serves /health (vLLM, SGLang, llama.cpp, TGI), the
collector probes that /health (same host and port, same timeout) and records the answer as
`engine_health_probe_up` (1 = 2xx): what a load balancer's health check sees, shown next to the
engine_hung rule, which reads forward progress instead. Option `health_probe: false` turns it off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from kvscope.agent.collectors.base import Collection, Health, register_collector
from kvscope.agent.config import AgentConfig, ConfigError, Target
from kvscope.agent.normalize.dialect import MappingMemo, Normalized, detect_engine, normalize
from kvscope.agent.ratelog import warn_every
from kvscope.agent.scrape.exposition import FATAL, Exposition, Limits, ParseIssue, parse_exposition
from kvscope.agent.scrape.fetch import ScrapeError, new_session, probe_ok, read_exposition
from kvscope.core.scalars import parse_bool
from kvscope.core.signals import Sample, load_catalog, make_labels

NAME = "engine"
log = logging.getLogger("kvscope.engine")
HEALTH_SIGNAL = "engine_health_probe_up"
HEALTH_ENGINES = frozenset({"vllm", "sglang", "llamacpp", "tgi"})
"""Dialects whose servers answer GET /health (200 while serving)."""


@dataclass
class TargetScrape:
    """What one scrape of one target gave: the payload, or why there is none."""

    target: Target
    timestamp: float  # wall clock at scrape start (what Prometheus stamps)
    duration_s: float
    text: str | None = None  # None when the scrape failed
    openmetrics: bool = False  # the server answered application/openmetrics-text
    reason: str = ""  # failure reason token; "" when it succeeded
    _expo: Exposition | None = field(default=None, repr=False)

    def exposition(self, deadline: float | None = None) -> Exposition | None:
        """The whole payload parsed (once) under the target's limits, with native names; None
        when the scrape failed."""
        if self.text is not None and self._expo is None:
            self._expo = parse_exposition(
                self.text,
                openmetrics=True if self.openmetrics else None,
                limits=limits_of(self.target),
                deadline=deadline,
            )
        return self._expo


@register_collector(NAME, default_enabled=True)
class EngineCollector:
    """Canonical samples from engine and dcgm-exporter /metrics endpoints."""

    name = NAME
    OPTIONS = {
        "health_probe": "probe each vLLM, SGLang, llama.cpp and TGI target's /health beside its /metrics "
        "(engine_health_probe_up; default true)",
    }

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        opts = config.collector_options(NAME) if hasattr(config, "collector_options") else {}
        try:
            self.health_probe = parse_bool(opts.get("health_probe", True))
        except ValueError as exc:
            raise ConfigError(f"collectors.{NAME}.health_probe: {exc}") from None
        self.catalog = load_catalog()
        self._session: aiohttp.ClientSession | None = None
        self._limit = asyncio.Semaphore(32)  # targets scraped at once
        self._engines: dict[str, str | None] = {}  # instance -> detected engine (cached)
        self._memos: dict[str, MappingMemo] = {}  # instance -> what its next scrape reuses

    async def scrape_all(self) -> list[TargetScrape]:
        """Scrape every target concurrently; one result per target, in config order."""
        if self._session is None:
            self._session = new_session()
        return list(await asyncio.gather(*(self._scrape_one(t) for t in self.config.targets)))

    async def _scrape_one(self, target: Target) -> TargetScrape:
        """Scrape one target. Never raises for a target problem."""
        async with self._limit:
            assert self._session is not None
            ts, t0 = time.time(), time.monotonic()
            try:
                payload = await read_exposition(
                    self._session, target.url, self.config.timeout_s, self.config.max_body_bytes
                )
            except ScrapeError as e:
                return TargetScrape(target, ts, time.monotonic() - t0, reason=e.reason)
        return TargetScrape(target, ts, time.monotonic() - t0, text=payload.text, openmetrics=payload.openmetrics)

    async def collect(self) -> Collection:
        """Every target's canonical samples, target by target in config order."""
        out = Collection()
        scrapes = await self.scrape_all()
        for scrape in scrapes:
            try:
                self._normalize_into(scrape, out)
            except Exception as e:  # noqa: BLE001 - one target's payload must not cost the other targets
                self._reader_failed(scrape.target.instance, e, out)
        if self.health_probe:
            await self._probe_health(scrapes, out)
        return out

    async def _probe_health(self, scrapes: list[TargetScrape], out: Collection) -> None:
        """`engine_health_probe_up` for each target scraped up whose engine serves /health, stamped
        with its scrape's time (the probes run side by side, each within the scrape timeout)."""
        up = {h.target for h in out.health if h.up}
        probed = [
            s for s in scrapes if s.target.instance in up and out.engines.get(s.target.instance) in HEALTH_ENGINES
        ]
        if not probed or self._session is None:
            return
        session = self._session
        answers = await asyncio.gather(
            *(probe_ok(session, health_url(s.target.url), self.config.timeout_s) for s in probed)
        )
        for scrape, ok in zip(probed, answers, strict=True):
            labels = {**scrape.target.target_labels(), "engine": str(out.engines[scrape.target.instance])}
            out.samples.append(Sample(HEALTH_SIGNAL, make_labels(labels), float(ok), scrape.timestamp))

    def _reader_failed(self, instance: str, e: Exception, out: Collection) -> None:
        """A bug reading one target's payload: that target is down with reason `parse_<error>`,
        counted, logged (rate-limited); its memo is dropped; the other targets go on."""
        self._memos.pop(instance, None)
        reason = f"parse_{type(e).__name__}"
        health = next((h for h in reversed(out.health) if h.target == instance), None)
        if health is None:
            out.health.append(health := Health(collector=NAME, target=instance))
        _down(health, reason)
        warn_every(log, f"engine:{reason}", "reading the payload of %s failed: %r; target reported down", instance, e)

    def _normalize_into(self, scrape: TargetScrape, out: Collection) -> None:
        target = scrape.target
        health = Health(collector=NAME, target=target.instance, duration_s=scrape.duration_s)
        out.health.append(health)
        deadline = time.monotonic() + max(0.1, self.config.timeout_s - scrape.duration_s)
        engine = None
        if scrape.text is not None:
            if _over_sample_limit(scrape):
                scrape.exposition(deadline)  # stops at the first sample past the limit
            engine = self._engine_of(target, scrape, deadline) if not self._failed(scrape) else None
        if reason := scrape.reason or self._failed(scrape):
            _down(health, reason)
            return
        out.engines[target.instance] = engine
        if engine is None:
            _down(health, "unknown_engine")
            expo = scrape.exposition(deadline)
            assert expo is not None  # the scrape has text (checked above)
            health.dropped.update(i.reason for i in expo.issues)
            return
        norm, issues = self._normalize(scrape, engine, deadline)
        if reason := _failed(issues):
            _down(health, reason)
            return
        health.dropped.update(i.reason for i in issues)
        self._judge(health, norm, scrape.text, engine)
        out.samples.extend(norm.samples)
        if norm.facts:
            out.facts[target.instance] = _merge_ranks(norm.facts)
        if not norm.samples and target.engine is None:
            self._engines.pop(target.instance, None)  # detect again next time

    def _judge(self, health: Health, norm: Normalized, text: str | None, engine: str) -> None:
        """A normalized payload's health: its series and drops, down without a canonical series,
        `aggregated_workers` when the engine summed its workers before exporting."""
        health.dropped.update(norm.dropped)
        health.series = len(norm.samples)
        if not norm.samples:
            _down(health, "no_canonical_series")
        elif _aggregated(text, self.catalog.dialects[engine].worker_labels):
            health.reason = "aggregated_workers"

    @staticmethod
    def _failed(scrape: TargetScrape) -> str:
        """The reason a parsed payload fails its scrape whole (a limit, the deadline), or ""."""
        return _failed(scrape._expo.issues) if scrape._expo is not None else ""

    def _normalize(self, scrape: TargetScrape, engine: str, deadline: float) -> tuple[Normalized, list[ParseIssue]]:
        """The payload parsed (unless detection already did) and normalized with the target's memo."""
        target = scrape.target
        memo = self._memos.get(target.instance)
        if memo is None:
            memo = self._memos[target.instance] = MappingMemo()
        expo = scrape.exposition(deadline)
        assert expo is not None  # the caller returned early for a failed scrape
        norm = normalize(expo, engine, target.target_labels(), scrape.timestamp, self.catalog, memo)
        return norm, expo.issues

    def _engine_of(self, target: Target, scrape: TargetScrape, deadline: float) -> str | None:
        if target.engine is not None:
            return target.engine
        engine = self._engines.get(target.instance)
        if engine is None:
            self._memos.pop(target.instance, None)
            expo = scrape.exposition(deadline)
            assert expo is not None  # the caller returned early for a failed scrape
            engine = detect_engine(expo, self.catalog)
            if engine is not None:
                self._engines[target.instance] = engine
        return engine

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = None


def health_url(metrics_url: str) -> str:
    """The /health URL on the host and port of a /metrics URL."""
    parts = urlsplit(metrics_url)
    return urlunsplit((parts.scheme, parts.netloc, "/health", "", ""))


def limits_of(target: Target) -> Limits:
    """The target's configured limits (agent/config.py LIMIT_KEYS) for the parser."""
    return Limits(**dict(target.limits))


def _over_sample_limit(scrape: TargetScrape) -> bool:
    """Whether the payload may hold more samples than its target's sample_limit: its lines that
    are not comments bound its samples from above (one C-level count; a parse only past it)."""
    text, limit = scrape.text or "", dict(scrape.target.limits).get("sample_limit", 0)
    return 0 < limit < text.count("\n") + 1 - text.count("\n#") - text.startswith("#")


def _down(health: Health, reason: str) -> None:
    health.up, health.reason = False, reason
    health.errors[reason] += 1


def _failed(issues: list[ParseIssue] | None) -> str:
    """The reason a scrape fails whole (a limit, the parse deadline), or ""."""
    return next((i.reason for i in issues or () if i.reason in FATAL), "")


def _aggregated(text: str | None, worker_labels: tuple[str, ...]) -> bool:
    """The payload labels its series with the worker behind them (one scan, no parse)."""
    return text is not None and any(f'{label}="' in text for label in worker_labels)


def _merge_ranks(by_rank: dict[str, dict[str, str]]) -> dict[str, str]:
    """One fact set per engine: rank 0 wins where DP ranks disagree."""
    return {k: v for rank in sorted(by_rank, reverse=True) for k, v in by_rank[rank].items()}
