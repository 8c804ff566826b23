"""Diagnose from a running kvscope agent's JSON API (`/api/v1/samples`, `/api/v1/facts`)."""

from __future__ import annotations

import re
import time
import urllib.parse
from typing import Any

from kvscope.agent.recording.replay import scrape_interval as interval_of_targets
from kvscope.core.net import printable
from kvscope.core.signals import Sample, make_labels
from kvscope.diagnoser.evaluate.frame import Frame, frame_from_samples, merge_facts
from kvscope.diagnoser.sources import SourceError, answer_cap, answer_data, raise_cap_hint, read_url

DEFAULT_WINDOW_S = 1800.0
PROBE_S = 3600.0
"""`scrape_interval` reads at most this span of the agent's scrape history."""
DEFAULT_TIMEOUT_S = 30.0


class AgentSource:
    """The agent's stored canonical samples (already normalized by the agent). Each read of the
    API ends within `timeout_s` (a command's --timeout), connect to last byte, and its answer is
    capped at `sources.answer_cap()` before it is parsed."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.description = f"agent:{self.url}"
        self.notes: list[str] = []

    def natural_step(self) -> float | None:
        """None: the agent's scrape interval is its own config (callers pick a step)."""
        return None

    def scrape_interval(self, names: set[str], start: float, end: float) -> float | None:
        """The interval the agent scraped its targets at, from the `kvscope_target_up` history it
        stores for each target (the last PROBE_S of [start, end]), measured as a recording's is
        (per target the median gap, then the lower median over targets). `names` is accepted for
        the TSDB sources' signature: the agent scrapes every target of one node on one interval.
        None when no target was scraped twice there."""
        lo = max(start, end - PROBE_S)
        query = urllib.parse.urlencode({"match": "kvscope_target_up", "start": f"{lo:.3f}", "end": f"{end:.3f}"})
        try:
            samples = parse_samples_answer(self._get(f"/api/v1/samples?{query}"))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise SourceError(f"agent {self.url}: malformed answer ({printable(exc, 200)})") from None
        return interval_of_targets(samples)

    def read_frame(self, names: set[str], start: float | None, end: float | None, step: float) -> Frame:
        end = time.time() if end is None else end
        start = end - DEFAULT_WINDOW_S if start is None else start
        samples = []
        try:
            for pattern in _patterns(sorted(names)):
                query = urllib.parse.urlencode(
                    {"match": f"({pattern})", "start": f"{start - 300:.3f}", "end": f"{end:.3f}"}
                )
                samples += parse_samples_answer(self._get(f"/api/v1/samples?{query}"))
            facts = parse_facts_answer(self._get("/api/v1/facts"))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise SourceError(f"agent {self.url}: malformed answer ({printable(exc, 200)})") from None
        frame = frame_from_samples(samples, start, end, step, names=names)
        frame.facts = facts
        return frame

    def _get(self, path: str) -> dict[str, Any]:
        too_large = raise_cap_hint("narrow the window (--since)")
        body = read_url(self.url + path, f"agent {self.url}", self.timeout_s, answer_cap(), too_large=too_large)
        data = answer_data(body, f"agent {self.url}", path.split("?")[0]) or {}
        if not isinstance(data, dict):
            raise SourceError(f"agent {self.url}{path.split('?')[0]}: malformed answer: data is not an object")
        return data


def _patterns(names: list[str], max_chars: int = 1500) -> list[str]:
    """The names as alternations short enough for one request line each (servers refuse URLs past
    about 8 KiB with 414; a regex escapes to up to three times its length once URL-encoded)."""
    out: list[str] = []
    for n in map(re.escape, names):
        if out and len(out[-1]) + len(n) + 1 <= max_chars:
            out[-1] += "|" + n
        else:
            out.append(n)
    return out or ["$^"]


def parse_samples_answer(data: dict[str, Any]) -> list[Sample]:
    """`{"series": [{"name", "labels", "points": [[ts, v]...]}]}` -> canonical samples."""
    out = []
    for s in data.get("series") or []:
        labels = make_labels({str(k): str(v) for k, v in (s.get("labels") or {}).items()})
        for ts, value in s.get("points") or []:
            out.append(Sample(str(s["name"]), labels, float(value), float(ts)))
    return out


def parse_facts_answer(data: dict[str, Any]) -> dict[str, dict[str, str]]:
    """`{instance: {"facts": {...}}}` -> instance -> facts. A fact whose value is an object is one
    DP rank's facts; ranks are merged as every source merges them (`merge_facts`: a plain fact,
    then the first rank, wins)."""
    per_rank: dict[str, dict[str, dict[str, str]]] = {}
    for instance, entry in (data or {}).items():
        ranks = per_rank.setdefault(str(instance), {})
        for k, v in ((entry or {}).get("facts") or {}).items():
            if isinstance(v, dict):
                ranks[str(k)] = {str(a): str(b) for a, b in v.items()}
            else:
                ranks.setdefault("", {})[str(k)] = str(v)
    return merge_facts(per_rank)
