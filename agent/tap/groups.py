"""The tap's per-request series of one grouping label (`tenant`, `adapter`): requests, errors,
tokens, in-flight seconds, TTFT and token gaps, the same families under `<group>_*` names
(docs/requests.md "Per adapter"). One implementation for every grouping."""

from __future__ import annotations

from kvscope.agent.metricsets import GroupFamilies
from kvscope.agent.tap.exchange import Exchange
from kvscope.core.signals import Labels, make_labels


class GroupSeries(GroupFamilies):
    """Counters and histograms of the tap's requests keyed by one label. The label values are
    bounded by the caller (a `TenantLimiter` hands them out); `labels()` keeps one label set per
    value it was given."""

    def __init__(self, group: str) -> None:
        super().__init__(group)
        self._labels: dict[str, Labels] = {}

    def labels(self, value: str) -> Labels:
        """The label set of one (already bounded) label value."""
        lab = self._labels.get(value)
        if lab is None:
            lab = self._labels[value] = make_labels({self.group: value})
        return lab

    def count(
        self,
        lab: Labels,
        ex: Exchange,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        cached: int | None,
        seconds: float,
    ) -> None:
        """Count one finished exchange under `lab`. Tokens the engine's usage did not give stay
        uncounted (absent, not 0); TTFT and gaps only for a request answered ok with a first token."""
        self.requests.inc(lab)
        self.errors.inc(lab, 1.0 if ex.outcome.startswith("upstream_") else 0.0)  # 0: the series exists
        self.request_seconds.inc(lab, seconds)
        if prompt_tokens is not None:
            self.prompt_tokens.inc(lab, prompt_tokens)
        if completion_tokens is not None:
            self.completion_tokens.inc(lab, completion_tokens)
        if cached is not None:
            self.cached_tokens.inc(lab, cached)
        if ex.first_token is not None and ex.outcome == "ok" and ex.status < 400:
            self.ttft.observe(lab, ex.first_token - ex.start)
            self.itl.observe(lab, *ex.gaps)
