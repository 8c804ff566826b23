"""The derive hooks the agent runs over every cycle's samples, built from its config: one list
for `kvscope agent` and the integration harness, so a hook added here runs everywhere."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvscope.agent.config import AgentConfig
from kvscope.agent.derive.cascade import CascadeWindow
from kvscope.agent.derive.fairness import fairness_hook
from kvscope.agent.derive.gpu_join import engine_gpu_hook
from kvscope.core.signals import Sample

DeriveHook = Callable[[Sequence[Sample]], Iterable[Sample]]
"""A derive hook, which the agent's runtime calls once per cycle with the cycle's canonical
samples; what it returns is stored too."""


def fairness_window_s(config: AgentConfig) -> float:
    """The fairness gauges' window: the `tap` section's `fairness_window_s`, else the `otlp`
    section's (both default to 300 s)."""
    tap, otlp = config.extensions.get("tap"), config.extensions.get("otlp")
    if isinstance(tap, dict) and "fairness_window_s" in tap:
        return float(tap["fairness_window_s"])
    return float(getattr(otlp, "fairness_window_s", 300.0))


def derive_hooks(config: AgentConfig) -> list[DeriveHook]:
    """The engine↔GPU join, the per-tenant fairness gauges and the eviction cascade (over 15 min),
    in that order."""
    return [engine_gpu_hook(config.gpu_mapping), fairness_hook(fairness_window_s(config)), CascadeWindow(900.0)]
