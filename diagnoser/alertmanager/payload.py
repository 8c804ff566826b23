"""Alertmanager webhook payloads (v4), and the diagnosis attached to each alert.

Every firing alert gains a `kvscope` object (shape: docs/alerting.md). It leads with what changed
at the alert's place in its window (`changes`, a change to the engines first, each with its verdict
at matched load and deltas, as `kvscope.diagnoser.curve.report.with_changes` attached them) and a
`headline` that names that change before the likely cause; then the findings at the alert's place
(its `instance`, `model`, ... labels), `matched` (the finding of its own `rule_id`) and
`likely_cause` (the top-ranked one there, which may be a cascade's earlier stage) and `actions`
(its levers split into `do_now` and `fix`). An alert whose window could not be read (Prometheus
down, unresolvable, stalled) gets `not_diagnosed` instead: status and headline say so first, never
an empty all-clear.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from kvscope.core.jsonbody import loads_bounded
from kvscope.core.scalars import parse_timestamp
from kvscope.diagnoser.actions import actions_dict
from kvscope.diagnoser.curve.report import FINDING_KINDS as ENGINE_CHANGE_KINDS
from kvscope.diagnoser.findings import Diagnosis, LeverAdvice, confidence_words, count, nothing_evaluable, same_place

MAX_ALERTS = 50
"""Alerts diagnosed per webhook; the rest are stored marked `truncated` (Alertmanager groups
can be large, and every diagnosis reads a window from Prometheus)."""

NOT_DIAGNOSED = "not_diagnosed"
"""The status of an alert (and a stored row) whose data could not be read: not an all-clear."""

NO_DATA_HEADLINE = (
    "no data: no rule could look at this window (Prometheus held none of their signals); not an all-clear"
)

PLACE_LABELS = ("instance", "model", "dp_rank", "role", "tenant", "gpu", "node")
"""Labels that locate a finding (docs/rules.md `by`); other alert labels are ignored when
matching findings to an alert."""


class WebhookError(ValueError):
    """The request body is not a usable Alertmanager webhook; str() says what is wrong."""


class Alert(msgspec.Struct, rename="camel"):
    """One alert of a webhook, Alertmanager's webhook v4 schema, its times checked at decode
    (`starts_at`, `ends_at`: unix seconds). A lone surrogate in a label (`"\\ud800"`, valid JSON, no
    valid text and never a Prometheus label) is written out as the six characters `\\ud800`, so
    the reads and log lines built from the alert work (Prometheus refuses U+FFFD in a query)."""

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    starts: str = msgspec.field(name="startsAt")
    ends: str = msgspec.field(default="", name="endsAt")
    annotations: dict[str, str] = {}
    generator_url: str = msgspec.field(default="", name="generatorURL")
    fingerprint: str = ""

    def __post_init__(self) -> None:
        self.labels = {_utf8(k): _utf8(v) for k, v in self.labels.items()}
        if parse_time(self.starts) is None:
            raise WebhookError("startsAt is missing")
        parse_time(self.ends)

    @property
    def starts_at(self) -> float:
        return parse_time(self.starts) or 0.0  # never the zero time: refused at decode

    @property
    def ends_at(self) -> float | None:  # None while firing (Alertmanager's zero time)
        return parse_time(self.ends)

    def place(self) -> dict[str, str]:
        return {k: v for k, v in self.labels.items() if k in PLACE_LABELS and v}


class Webhook(msgspec.Struct, rename="camel"):
    """An Alertmanager webhook, v4 schema. It validates a body; what is stored and forwarded is
    the decoded document itself, so fields Alertmanager adds later are kept."""

    version: Literal["4"]
    alerts: Annotated[list[Alert], msgspec.Meta(min_length=1)]
    status: str = ""
    receiver: str = ""
    group_key: str = ""
    group_labels: dict[str, str] = {}
    common_labels: dict[str, str] = {}
    common_annotations: dict[str, str] = {}
    external_url: str = msgspec.field(default="", name="externalURL")
    truncated_alerts: int = 0


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def parse_time(text: str) -> float | None:
    """RFC 3339 (as Alertmanager writes it) → unix seconds; the zero time → None."""
    if not text or text.startswith("0001-01-01"):
        return None
    try:
        return parse_timestamp(text)
    except ValueError as exc:
        raise WebhookError(f"bad timestamp {text!r}") from exc


def parse_webhook(body: bytes) -> dict[str, Any]:
    """Validate a webhook body (nesting bounded first, then `Webhook`); returns the decoded
    document. Raises WebhookError."""
    try:
        doc = loads_bounded(body)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise WebhookError(f"body is not JSON: {exc}") from exc
    try:
        msgspec.convert(doc, Webhook)
    except msgspec.ValidationError as exc:
        raise WebhookError(f"not an Alertmanager v4 webhook: {exc}") from exc
    return doc


def parse_alert(raw: object, index: int = 0) -> Alert:
    """One entry of `alerts`; raises WebhookError naming the entry."""
    try:
        return msgspec.convert(raw, Alert)
    except msgspec.ValidationError as exc:
        raise WebhookError(f"alerts[{index}]: {exc}") from exc


def diagnosis_window(alert: Alert, now: float, before_s: float, max_s: float) -> tuple[float, float]:
    """[start, end] to diagnose: from `before_s` before the alert started (the cause precedes
    the symptom) to its end or now, at most `max_s` long."""
    end = min(alert.ends_at or now, now) if alert.status == "resolved" else now
    start = max(alert.starts_at - before_s, end - max_s)
    return start, max(end, start + 1.0)


def instance_places(label_sets: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    """instance -> the place labels every series of that instance agrees on (e.g. its model),
    from the label sets of a window's series."""
    seen: dict[str, dict[str, set[str]]] = {}
    for labels in label_sets:
        if labels.get("instance"):
            per = seen.setdefault(labels["instance"], {})
            for key in PLACE_LABELS:
                per.setdefault(key, set()).add(labels.get(key, ""))
    return {
        inst: {k: next(iter(v)) for k, v in per.items() if len(v) == 1 and "" not in v} for inst, per in seen.items()
    }


def full_place(alert: Alert, places: dict[str, dict[str, str]] | None) -> dict[str, str]:
    """The alert's place, completed from `places` (`instance_places`) where it names only its
    instance: e.g. the model that instance serves."""
    place = alert.place()
    return {**(places or {}).get(place.get("instance", ""), {}), **place}


def select_findings(
    diagnosis: dict[str, Any], alert: Alert, places: dict[str, dict[str, str]] | None = None
) -> dict[str, Any]:
    """From a `Diagnosis.to_dict()`: the findings at the alert's place, best first, and the one
    from the alert's own rule. `places` (from `instance_places`) completes an alert that names
    only its instance, so a per-model finding of another model is not attached to it."""
    ranked = [diagnosis.get("likely_cause"), *diagnosis.get("competing", []), *diagnosis.get("other", [])]
    place = full_place(alert, places)
    here = [f for f in ranked if f and same_place(f.get("where", {}), place)]  # a fleet-wide one: every alert's
    rule_id = alert.labels.get("rule_id")
    matched = next((f for f in here if rule_id and f.get("rule_id") == rule_id), None)
    changes = changes_at_place(diagnosis.get("changes", []), place, alert.starts_at)
    return {
        "changes": changes,
        "headline": headline(changes, here[0] if here else None),
        "rule_id": rule_id,
        "matched": matched,
        "likely_cause": here[0] if here else None,
        "findings": here,
        "skipped": len(diagnosis.get("skipped", [])),
        **_counts(diagnosis),
        **finding_actions(here[0] if here else None),
        **({"routers": diagnosis["routers"]} if diagnosis.get("routers") else {}),
    }


def changes_at_place(changes: list[dict[str, Any]], place: dict[str, str], starts_at: float) -> list[dict[str, Any]]:
    """The window's changes (`Diagnosis.changes`) at the alert's place, the one to read first first:
    changes to the engines (config, version, restart) before replica-count changes and bare curve
    shifts; among those, one judged a regression at matched load first; then the changes before the
    alert began, nearest first (the cause precedes the symptom), then those after it, earliest first.
    A change is at the place unless its pool's model or its instances disagree with the alert's."""
    here = [c for c in changes if _change_here(c, place)]
    return sorted(
        here,
        key=lambda c: (
            c.get("kind") not in ENGINE_CHANGE_KINDS,
            c.get("verdict") != "regression",
            c["time"] > starts_at,
            abs(starts_at - c["time"]),
        ),
    )


def _change_here(change: dict[str, Any], place: dict[str, str]) -> bool:
    model = change.get("pool", {}).get("model")
    if model and place.get("model", model) != model:
        return False
    instances = change.get("instances") or []
    return not instances or place.get("instance") in (None, *instances)


def headline(changes: list[dict[str, Any]], likely: dict[str, Any] | None) -> str:
    """One line for a chat message: the change to the engines that leads `changes` (what, when,
    its verdict at matched load and deltas) when there is one, then the likely cause."""
    parts = []
    if changes and changes[0].get("kind") in ENGINE_CHANGE_KINDS:
        parts.append(f"what changed: {changes[0]['text']}")
    if likely:
        parts.append(f"likely cause: {likely.get('title')} ({likely.get('summary')})")
    return "; ".join(parts) or "no change to the engines and no finding at this place"


def not_diagnosed(reason: str, rule_id: str | None = None, window: list[float] | None = None) -> dict[str, Any]:
    """The `kvscope` object of an alert whose data could not be read: status `not_diagnosed` and a
    headline "not diagnosed: <reason>" first (what a chat message shows), no finding, and the
    reason in `errors` as on a diagnosed alert."""
    return {
        "status": NOT_DIAGNOSED,
        "headline": f"not diagnosed: {reason}",
        **({"window": window} if window else {}),
        "rule_id": rule_id,
        "matched": None,
        "likely_cause": None,
        "findings": [],
        "errors": [reason],
    }


def row_status(payload: dict[str, Any]) -> str:
    """A stored webhook's status once its alerts are through: `not_diagnosed` when any alert in it
    could not be diagnosed (a webhook is not an all-clear while one of its alerts went unread),
    else `done`."""
    alerts = payload.get("alerts", [])
    unread = any(isinstance(a, dict) and (a.get("kvscope") or {}).get("status") == NOT_DIAGNOSED for a in alerts)
    return NOT_DIAGNOSED if unread else "done"


def window_status(diagnosis: dict[str, Any]) -> str:
    """`no_data` when no rule could look at the window (the source held none of their signals:
    the CLI's exit 4), `not_diagnosed` when the window was not read at all, else `diagnosed`
    (looked; the findings may be empty)."""
    if "window" not in diagnosis:
        return NOT_DIAGNOSED
    return "no_data" if nothing_evaluable(msgspec.convert(diagnosis, Diagnosis)) else "diagnosed"


def _counts(diagnosis: dict[str, Any]) -> dict[str, Any]:
    """`counts` (rules, fired, not_evaluable, mechanism_off, overruled) and `counts_text`, the
    numbers and words of the CLI header and the UI caption; nothing when the source was unread."""
    if "window" not in diagnosis:
        return {}
    c = count(msgspec.convert(diagnosis, Diagnosis))
    return {"counts": msgspec.to_builtins(c), "counts_text": c.text()}


def finding_actions(finding: dict[str, Any] | None) -> dict[str, Any]:
    """The alert's likely cause as the CLI and UI show it: how sure it is (`confidence`, with what
    would confirm it) and its levers as actions, `do_now` then `fix` (docs/alerting.md)."""
    levers = [msgspec.convert(lv, LeverAdvice) for lv in (finding or {}).get("levers", [])]
    if finding is None:
        return {"actions": actions_dict(levers)}
    words = confidence_words(str(finding.get("confidence", "high")), str(finding.get("confirm", "")))
    return {"confidence": words, "actions": actions_dict(levers)}
