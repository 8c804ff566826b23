"""The alert a triage link names: what a generated alert's `runbook_url` opens
(diagnoser/promql/runbooklinks.py: `?page=Triage&alertname=&window=&label.<name>=`).

`from_query` reads the page's query parameters; `windowed` gives a live source that window;
`at_labels` the findings located at the alert's labels; `stored_diagnosis` the diagnosis that
`kvscope serve` kept for this alert (`GET /api/v1/diagnoses/latest`), when the UI was started
with `--serve-url`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

from kvscope.core.scalars import parse_duration
from kvscope.diagnoser.findings import Finding, same_place
from kvscope.diagnoser.sources import SourceError, read_url
from kvscope.ui.data import ENV_SERVE, SourceSpec

LABEL = "label."
MAX_LABELS = 32
MAX_VALUE_CHARS = 512
MAX_WINDOW_S = 86400.0
"""The longest window a link makes a live source read: four times the longest window of a generated
burn-rate alert (6h); a link asking more is clamped to this and says so (a window=31d link made
the triage page read 31 days of a whole fleet)."""
MAX_WINDOW = "24h"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class AlertLink:
    """One alert as its link names it: name, labels (severity and the rule's own included) and
    the window to look at (seconds before `end`, None = the source's own)."""

    alertname: str
    labels: tuple[tuple[str, str], ...]
    window_s: float | None = None
    window: str = ""

    def label_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels) or "no labels"

    def query(self) -> str:
        """`alertname=&label.<name>=` as `kvscope serve` takes them."""
        return urlencode([("alertname", self.alertname), *((LABEL + k, v) for k, v in self.labels)])


def from_query(params: Mapping[str, Any]) -> AlertLink | None:
    """The alert in a page's query parameters, or None (no alertname, or one that is no metric
    name). Bad labels and windows are dropped, never trusted: the values come from a URL; a window
    longer than MAX_WINDOW_S is clamped to it (and `window` says so)."""
    name = _first(params.get("alertname"))
    if not name or not _NAME.fullmatch(name):
        return None
    labels: list[tuple[str, str]] = []
    for key in sorted(k for k in params if isinstance(k, str) and k.startswith(LABEL)):
        label, value = key[len(LABEL) :], _first(params.get(key))
        if _NAME.fullmatch(label) and value and len(value) <= MAX_VALUE_CHARS and len(labels) < MAX_LABELS:
            labels.append((label, value))
    window = _first(params.get("window")) or ""
    try:
        seconds: float | None = parse_duration(window)  # a Prometheus duration, as runbooklinks writes it
    except ValueError:
        seconds = None
    if seconds is not None and seconds <= 0:
        seconds = None
    if seconds is not None and seconds > MAX_WINDOW_S:
        seconds, window = MAX_WINDOW_S, f"{MAX_WINDOW} (the link asked {window}: a link reads at most {MAX_WINDOW})"
    return AlertLink(name, tuple(labels), seconds, window if seconds else "")


def _first(value: Any) -> str | None:
    if isinstance(value, list | tuple):
        value = value[0] if value else None
    return value if isinstance(value, str) else None


def windowed(source: SourceSpec, link: AlertLink | None) -> SourceSpec:
    """A live source (Prometheus, agent) reads the alert's window ending now; a recording is
    what it is."""
    if link is None or link.window_s is None or source.kind == "recording":
        return source
    return replace(source, since_s=link.window_s, end=None)


def at_labels(findings: Iterable[Finding], link: AlertLink) -> list[Finding]:
    """Findings located where the alert is: every label they share with the alert agrees, and
    they share at least one (a fleet-wide finding shares none and is not listed here)."""
    have = dict(link.labels)
    return [f for f in findings if set(f.where) & set(have) and same_place(f.where, have)]


def serve_url(env: Mapping[str, str] | None = None) -> str | None:
    """The `kvscope serve` address the UI was started with (`kvscope ui --serve-url`)."""
    return (os.environ if env is None else env).get(ENV_SERVE) or None


def stored_diagnosis(base: str, link: AlertLink, timeout_s: float = 5.0) -> tuple[dict[str, Any] | None, str]:
    """(the stored row, its stable URL) or (None, why not) from `kvscope serve`."""
    url = f"{base.rstrip('/')}/api/v1/diagnoses/latest?{link.query()}"
    try:
        body = read_url(url, "kvscope serve", timeout_s, 8 << 20, on_status=lambda e: SourceError(f"HTTP {e.status}"))
        return json.loads(body), url
    except SourceError as exc:
        text = str(exc)
        return None, "no stored diagnosis of this alert yet" if "404" in text else f"{url}: {text}"
    except ValueError as exc:
        return None, f"{url}: not JSON ({exc})"


def stored_text(row: dict[str, Any]) -> tuple[str, bool]:
    """(the stored diagnosis of an alert in one Markdown line, whether it was diagnosed): its
    likely cause; for an alert whose data could not be read (`not_diagnosed`, `error`) or held
    none of the rules' signals (`no_data`) its headline ("not diagnosed: <reason>"), never "no
    rule fired"."""
    ks = row.get("alert", {}).get("kvscope") or {}
    status = str(ks.get("status", row.get("status")))
    cause = ks.get("likely_cause") or {}
    diagnosed = status == "diagnosed"
    if cause:
        what = str(cause.get("title") or cause.get("rule_id"))
    elif diagnosed:
        what = "no rule fired"
    else:
        what = str(ks.get("headline") or f"not diagnosed ({status})")
    return f"**Stored diagnosis** (kvscope serve, #{row.get('id')}, {status}): {what}", diagnosed
