"""`runbook_url` on generated alerts: a link to the UI's triage page for that alert.

With a base URL (`kvscope rules build --runbook-base-url https://kvscope-ui.example`), every
generated alert gets

    <base>/?page=Triage&alertname=<Alert>&window=<w>&label.<name>=<value>...

the alert's own labels filled in by Prometheus when it fires (a Go template over `$labels`,
values URL-escaped with `urlquery`), and `window` the alert's long window (its `window` label,
`1h/5m` -> `1h`) or one hour. The triage page (ui/alert_link.py) reads the window back, shows the
alert and its labels, the findings at those labels, and the diagnosis `kvscope serve` stored for
that alert (`GET /api/v1/diagnoses/latest?alertname=&label.<name>=`). Without a base URL the
annotation is absent: a repository path is no link a pager can open.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

DEFAULT_WINDOW = "1h"
SKIPPED_LABELS = "^__"
"""Labels left out of the link (a regex for Prometheus' template function `match`): `__name__`
of a recorded series the alert compares."""


def runbook_url(base: str, alertname: str, window: str) -> str:
    """The templated triage link of one alert rule."""
    skip = f'{{{{ if not (match "{SKIPPED_LABELS}" $k) }}}}'
    labels = "{{ range $k, $v := $labels }}" + skip + "&label.{{ $k | urlquery }}={{ $v | urlquery }}{{ end }}{{ end }}"
    return f"{base.rstrip('/')}/?page=Triage&alertname={quote(alertname)}&window={quote(window)}{labels}"


def alert_window(rule: dict[str, Any]) -> str:
    """The window a reader should look at: the long window of a burn-rate pair, else an hour."""
    window = str((rule.get("labels") or {}).get("window", ""))
    return window.split("/", 1)[0] or DEFAULT_WINDOW


def link_alerts(rules: Iterable[dict[str, Any]], base: str | None) -> None:
    """Set (base given) or remove (no base) `runbook_url` on every alerting rule, in place."""
    for rule in rules:
        if "alert" not in rule:
            continue
        notes = rule.setdefault("annotations", {})
        notes.pop("runbook_url", None)
        if base:
            notes["runbook_url"] = runbook_url(base, rule["alert"], alert_window(rule))
