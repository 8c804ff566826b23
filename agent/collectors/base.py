"""What every collector is and returns, and the registry the agent builds them from.

A collector reads one source (engine /metrics, dcgm-exporter, NVML, psutil...) and returns
canonical samples plus its own health. It never raises for a source problem: a target that is
down, slow, malformed or missing is reported in `Health` and the agent keeps going.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvscope.core.signals import Sample


@dataclass
class Health:
    """Self-observation of one collector (or one target of a collector) for one collection."""

    collector: str
    target: str = ""  # instance for scraping collectors, "" otherwise
    up: bool = True
    reason: str = ""  # why not up: a stable token (timeout, http_503, NVMLError_LibraryNotFound)
    duration_s: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)  # errors by reason this collection
    dropped: Counter[str] = field(default_factory=Counter)  # samples dropped by reason
    series: int = 0  # canonical series produced
    closed: Counter[str] = field(default_factory=Counter)  # client connections closed unserved, by reason, since start


@dataclass
class Collection:
    """What one `collect()` call produced."""

    samples: list[Sample] = field(default_factory=list)
    health: list[Health] = field(default_factory=list)
    facts: dict[str, dict[str, str]] = field(default_factory=dict)  # instance -> facts
    engines: dict[str, str | None] = field(default_factory=dict)  # instance -> detected engine


class Collector(Protocol):
    """A source of canonical samples."""

    name: str

    async def collect(self) -> Collection:
        """Read the source once. Must not raise for source problems; report them in Health."""
        ...

    async def close(self) -> None:
        """Release connections and handles."""
        ...


CollectorFactory = Callable[[Any], Collector]
_REGISTRY: dict[str, tuple[CollectorFactory, bool]] = {}


def register_collector(name: str, default_enabled: bool = True) -> Callable[[CollectorFactory], CollectorFactory]:
    """Class decorator: make a collector constructible by name from the agent config."""

    def deco(factory: CollectorFactory) -> CollectorFactory:
        _REGISTRY[name] = (factory, default_enabled)
        return factory

    return deco


def collector_option_help() -> dict[str, dict[str, str]]:
    """name -> {option: help} for collectors that declare options (a class attribute `OPTIONS`).
    A help text starting with "list:" marks an option that takes several values (repeated flag)."""
    return {
        name: dict(getattr(factory, "OPTIONS", {}))
        for name, (factory, _) in _REGISTRY.items()
        if getattr(factory, "OPTIONS", None)
    }


def registered_collectors() -> dict[str, tuple[CollectorFactory, bool]]:
    """name -> (factory taking the agent config, enabled by default)."""
    return dict(_REGISTRY)
