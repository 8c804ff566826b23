"""Latency objectives, declared once: what a request must meet to count as good (goodput).

An `Objectives` is a set of bounds in seconds that one request must meet at once: time to first
token (`ttft`), time per output token over the whole request (`tpot`: decode time / (output
tokens - 1)) and end to end (`e2e`), plus the share of requests (`target`) that must meet them
all. An `ObjectiveSet` holds the fleet's default and overrides per pool (the `model` label) and
per tenant. The agent's config file (section `objectives:`), `kvscope rules build`,
`kvscope curve` and every reader of a goodput read them through `parse_objectives`, the one
parser; flags are merged into the same document first (`merge_flags`).

    objectives:
      ttft: 1s          # a duration (core/scalars.parse_duration, loose) or null: no objective
      tpot: 100ms
      e2e: 30s
      target: 0.99
      pools:   {llama-70b: {ttft: 2.5s}}           # inherit what they do not set
      tenants: {batch: {ttft: 10s, target: 0.95}}

Where a rule reads an engine's histogram, a bound only counts requests exactly when it is one of
the engine's bucket bounds (`unaligned`); between two bounds the share under it is known only
between the shares under the bounds on either side (docs/goodput.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvscope.core.scalars import parse_duration
from kvscope.core.signals import Catalog, load_catalog

KINDS = ("ttft", "tpot", "e2e")
"""The objectives a request is held to, in the order they are reported."""

HISTOGRAMS = {"ttft": "request_ttft_seconds", "tpot": "request_tpot_seconds", "e2e": "request_e2e_seconds"}
"""The engine histogram that measures each objective per request (catalog.yaml). vLLM's and
SGLang's per-request TPOT histogram, not the per-token inter-token latency: a bound on the mean
time per output token of a request is an objective on requests, and only a per-request histogram
counts requests."""

MAX_OVERRIDES = 10_000
"""Most pool plus tenant entries one document may declare (read before any is parsed)."""

_TOP_KEYS = {*KINDS, "target", "pools", "tenants"}


@dataclass(frozen=True)
class Objectives:
    """Bounds in seconds one request must meet at once (None: no objective of that kind) and the
    share of requests that must meet them (`target`, 0 < target < 1)."""

    ttft: float | None = 1.0
    tpot: float | None = None
    e2e: float | None = None
    target: float = 0.99

    def bounds(self) -> dict[str, float]:
        """{kind: bound} of the objectives that are set, in KINDS order."""
        return {k: b for k in KINDS if (b := getattr(self, k)) is not None}

    def describe(self) -> str:
        """`TTFT <= 1s, TPOT <= 0.1s for 0.99 of requests`."""
        parts = [f"{k.upper()} <= {b:g}s" for k, b in self.bounds().items()]
        return f"{', '.join(parts) or 'no latency objective'} for {self.target:.4g} of requests"

    def met(self, measured: Mapping[str, float | None]) -> bool:
        """Whether one request met every objective set, from its measured latencies by kind; a
        set objective the request has no measurement of is not met (no first token, no answer)."""
        for kind, bound in self.bounds().items():
            value = measured.get(kind)
            if value is None or not value <= bound:
                return False
        return True

    def unaligned(self, catalog: Catalog | None = None) -> list[Unaligned]:
        """Each objective and engine whose default buckets (catalog.yaml) have no bound at the
        objective's bound: rules read that engine's share under the bound from the wrong bucket,
        and goodput knows it only between the shares under the neighbouring bounds."""
        catalog = catalog or load_catalog()
        return [
            Unaligned(kind, alias.engine, alias.name, bound, alias.buckets)
            for kind, bound in self.bounds().items()
            for alias in catalog.signals[HISTOGRAMS[kind]].aliases
            if alias.buckets and not any(abs(b - bound) < 1e-9 for b in alias.buckets)
        ]


@dataclass(frozen=True)
class Unaligned:
    """An objective's bound that an engine's default histogram has no bucket bound at."""

    kind: str
    engine: str
    series: str
    bound: float
    buckets: tuple[float, ...]

    def message(self) -> str:
        return (
            f"{self.kind} {self.bound:g}s is not a bucket bound of {self.engine}'s {self.series} "
            f"(its defaults: {', '.join(f'{b:g}' for b in self.buckets)}): objectives read from histograms must "
            f"be bucket bounds; pick one it has or add it to the engine's buckets"
        )


@dataclass(frozen=True)
class ObjectiveSet:
    """The fleet's default objectives and overrides per pool (`model`) and per tenant."""

    default: Objectives = Objectives()
    pools: tuple[tuple[str, Objectives], ...] = ()
    tenants: tuple[tuple[str, Objectives], ...] = ()

    def of(self, pool: str | None = None, tenant: str | None = None) -> Objectives:
        """The objectives one request is held to: its tenant's, else its pool's, else the default."""
        for name, objectives in self.tenants:
            if tenant is not None and name == tenant:
                return objectives
        for name, objectives in self.pools:
            if pool is not None and name == pool:
                return objectives
        return self.default


def _bound(key: str, value: Any, where: str) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value, loose=True)
    except ValueError as exc:
        raise ValueError(f"{where}{key}: {exc}") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{where}{key}: must be a positive duration such as 500ms or 2.5s, got {value!r}")
    return seconds


def _target(value: Any, where: str) -> float:
    try:
        target = float(value)
    except (TypeError, ValueError):
        target = math.nan
    if isinstance(value, bool) or not 0 < target < 1:
        raise ValueError(f"{where}target: must be a share between 0 and 1 such as 0.99, got {value!r}")
    return target


def _one(doc: Mapping[str, Any], base: Objectives, where: str, allowed: set[str]) -> Objectives:
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        known = ", ".join(sorted(allowed))
        raise ValueError(f"{where.rstrip('.') or 'objectives'}: unknown key(s) {', '.join(unknown)} (known: {known})")
    changes: dict[str, Any] = {k: _bound(k, doc[k], where) for k in KINDS if k in doc}
    if "target" in doc:
        changes["target"] = _target(doc["target"], where)
    return replace(base, **changes)


def _overrides(doc: Any, base: Objectives, where: str) -> tuple[tuple[str, Objectives], ...]:
    if doc is None:
        return ()
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: must be a mapping of name -> objectives")
    out = []
    for name, entry in doc.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: names must be non-empty text, got {name!r}")
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}.{name}: must be a mapping such as {{ttft: 2s}}")
        out.append((name, _one(entry, base, f"{where}.{name}.", {*KINDS, "target"})))
    return tuple(out)


def parse_objectives(doc: Any, where: str = "objectives") -> ObjectiveSet:
    """The objectives a document declares (the `objectives:` section of a config file, with any
    flags merged in by `merge_flags`); None or {} gives the defaults (TTFT <= 1 s for 0.99 of
    requests). ValueError naming the key for anything else."""
    if doc is None:
        return ObjectiveSet()
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: must be a mapping with ttft, tpot, e2e, target, pools, tenants")
    n = sum(len(doc.get(k) or ()) for k in ("pools", "tenants") if isinstance(doc.get(k), Mapping))
    if n > MAX_OVERRIDES:
        raise ValueError(f"{where}: {n} pool and tenant entries, more than {MAX_OVERRIDES}")
    prefix = f"{where}." if where else ""
    default = _one(doc, Objectives(), prefix, _TOP_KEYS)
    return ObjectiveSet(
        default=default,
        pools=_overrides(doc.get("pools"), default, f"{prefix}pools"),
        tenants=_overrides(doc.get("tenants"), default, f"{prefix}tenants"),
    )


def merge_flags(doc: Any, flags: Mapping[str, Any]) -> dict[str, Any]:
    """`doc` (a config file's `objectives:` section, or None) with the flags that were given
    (`{kind or "target": text}`, None for a flag not given) set over its top level: flags win.
    The text stays text: `parse_objectives` reads both the same way."""
    if doc is not None and not isinstance(doc, Mapping):
        raise ValueError("objectives: must be a mapping with ttft, tpot, e2e, target, pools, tenants")
    out = dict(doc or {})
    for key, value in flags.items():
        if key not in {*KINDS, "target"}:
            raise ValueError(f"unknown objective flag {key!r}")
        if value is not None:
            out[key] = None if str(value).strip().lower() in ("off", "none") else value
    return out
