"""Findings and diagnoses: what the rule engine hands to every consumer.

A `Finding` is one rule that fired for one place in one window (onset, evidence numbers with their
series, ranked levers, citations); a `Diagnosis` orders one run's findings, likely cause first.
All plain data written as JSON by `to_dict` (CLI `--json`, webhook, UI, weekly report), versioned
by `SCHEMA_VERSION`: add fields, never rename them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kvscope.diagnoser.citations import Citation

SCHEMA_VERSION = 1

SEVERITIES = ("info", "warning", "critical")
"""What each means and the exit status it gives: docs/rules.md "Severity"."""

SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

CONFIDENCES = ("moderate", "high")
"""How directly a rule's signals show its mechanism (high by default): docs/rules.md "Confidence"."""


@dataclass(frozen=True)
class Evidence:
    """One named number behind a finding. `series`: the canonical PromQL that produced it; `at`:
    when it was read (None = a mean over the active period); `stat`: how it was taken (max, min,
    first, last, mean); `key`: the rule's series name (`evaluate.evaluator.evaluated_series`)."""

    name: str
    value: float | None
    unit: str
    series: str
    at: float | None = None
    threshold: float | None = None
    op: str | None = None
    stat: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class EngineChange:
    """How to pull one lever on one system: the flag/key and the value or direction."""

    system: str  # vllm | sglang | router | gateway | k8s | app | ops
    change: str  # the exact flag or setting, e.g. "--kv-cache-dtype fp8"
    note: str = ""  # how to pick the value, caveats
    product: str = ""  # which product of the system takes it ("SGLang Model Gateway", "Envoy"), "" = any


@dataclass(frozen=True)
class LeverAdvice:
    """A lever as ranked for one finding (ids come from rules/levers.yaml)."""

    id: str
    rank: int
    direction: str  # increase | decrease | enable | disable | set | review
    title: str = ""
    changes: tuple[EngineChange, ...] = ()
    cost: str = ""
    citations: tuple[str, ...] = ()
    kind: str = "fix"  # mitigate (do now, during the incident) | fix (for good)
    restart: bool = False  # pulling it restarts the engine
    quality_risk: bool = False  # output quality must be re-validated
    capacity: str = ""  # what it does to capacity ("adds GPUs", "rejects requests over the limit")

    def cost_tags(self) -> list[str]:
        """The costs an on-call engineer weighs first: restart, quality risk, capacity."""
        tags = ["needs an engine restart"] if self.restart else ["no engine restart"]
        if self.quality_risk:
            tags.append("quality risk: validate on your evaluations")
        if self.capacity:
            tags.append(self.capacity)
        return tags


@dataclass(frozen=True)
class CascadeInfo:
    """For cascade rules (K2): the stage reached and how long the root led the symptom."""

    stage: int  # 1-based index of the last stage reached
    stage_name: str
    stages_total: int
    onsets: dict[str, float | None]  # stage name -> onset timestamp (None = not reached)
    lead_time_s: float | None  # symptom onset - root onset, None if symptom not reached


@dataclass(frozen=True)
class Finding:
    """One rule that fired for one place during one window."""

    rule_id: str
    levers_md: str  # the LEVERS.md row (K2, P1, ...)
    title: str
    severity: str  # one of SEVERITIES
    where: dict[str, str]  # labels that locate it: instance, model, tenant, ...
    since: float  # onset of the active period (unix seconds)
    until: float  # end of the active period (== window end if still active)
    active: bool  # still firing at the end of the window
    window: tuple[float, float]  # the evaluated window (start, end)
    step_s: float  # grid step the series were evaluated on
    score: float  # ranking score (severity, strength, duration, root-ness)
    summary: str  # one line, numbers filled in
    evidence: tuple[Evidence, ...] = ()
    levers: tuple[LeverAdvice, ...] = ()
    citations: tuple[str, ...] = ()  # as shown: "Sizing LLM Inference for Production §7.4" (docs/sources.md)
    cascade: CascadeInfo | None = None
    false_positives: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)  # the parameter values used
    specificity: int = 2  # 1 generic symptom .. 3 names a mechanism (rule field)
    confidence: str = "high"  # one of CONFIDENCES (rule field)
    confirm: str = ""  # what would confirm a moderate-confidence finding
    defers_to: tuple[str, ...] = ()  # rules that judge the same mechanism from direct evidence
    sources: tuple[Citation, ...] = ()  # the citations with their public URL where one exists

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(frozen=True)
class Skipped:
    """A rule that could not be evaluated, and why (absent signals, missing parameters)."""

    rule_id: str
    reason: str


@dataclass(frozen=True)
class ScaleChange:
    """A rule whose verdict on a short window depended on its durations being shortened: what it
    found with them shortened (`Diagnosis.time_scale`) and at their usual length, each one of
    "fired", "did not fire" or "not evaluable"."""

    rule_id: str
    title: str
    shortened: str
    full: str
    detail: str = ""  # where both fired: how they differ, "as critical (at the usual length as warning)"


@dataclass(frozen=True)
class Diagnosis:
    """The ranked result of one diagnoser run over one window."""

    window: tuple[float, float]
    source: str  # e.g. "recording:vllm-kv.om", "prometheus:http://..."
    likely_cause: Finding | None
    competing: tuple[Finding, ...] = ()  # other plausible root causes of the same symptom
    other: tuple[Finding, ...] = ()  # everything else that fired
    skipped: tuple[Skipped, ...] = ()
    rules_evaluated: int = 0
    time_scale: float = 1.0  # rule durations were multiplied by this (short windows)
    scale_changes: tuple[ScaleChange, ...] | None = None
    """With time_scale < 1, the rules whose verdict differs from the same window judged with their
    usual durations (() = none: the shortening changed nothing); None where that was not compared
    (an unscaled window, the fleet path)."""
    schema_version: int = SCHEMA_VERSION
    changes: tuple[dict[str, Any], ...] = ()
    """What changed in the window, per pool, and its effect at matched load (kvscope.diagnoser.curve):
    {pool, time, kind, diff, verdict, deltas, text}."""

    @property
    def findings(self) -> tuple[Finding, ...]:
        """All findings, likely cause first."""
        head = (self.likely_cause,) if self.likely_cause else ()
        return head + self.competing + self.other

    @property
    def supporting(self) -> tuple[Finding, ...]:
        """Findings at the likely cause's place that share its mechanism (`same_mechanism`):
        they corroborate it rather than compete with it."""
        head = self.likely_cause
        if head is None:
            return ()
        return tuple(
            f for f in self.competing + self.other if same_place(f.where, head.where) and same_mechanism(head, f)
        )

    @property
    def hypotheses(self) -> tuple[Finding, ...]:
        """Competing findings that name a different mechanism than the likely cause."""
        support = set(id(f) for f in self.supporting)
        return tuple(f for f in self.competing if id(f) not in support)

    @property
    def other_than_supporting(self) -> tuple[Finding, ...]:
        """The other findings that do not support the likely cause (`supporting` lists those):
        the "other findings" every reader shows after the hypotheses."""
        support = set(id(f) for f in self.supporting)
        return tuple(f for f in self.other if id(f) not in support)

    def exit_status(self) -> int:
        """0 = nothing warning/critical fired, 1 = warning, 2 = critical."""
        return max((SEVERITY_RANK[f.severity] for f in self.findings), default=0)

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON, keys sorted (NaN and infinities as null)."""
        raw = _encode(self)
        return (msgspec.json.format(raw, indent=indent) if indent else raw).decode()


OVERRULED = "overruled:"
"""Start of a Skipped reason for a rule that looked but was overruled by direct evidence
(`evaluate/confidence.py`): it was evaluated, so it is not among the rules that could not look."""


MECHANISM_OFF = "mechanism off:"
"""Start of a Skipped reason for a rule whose mechanism (speculation, a KV tier, P/D) the source
shows is not running: it looked, and there is nothing to judge."""
MECHANISM_UNKNOWN = "mechanism unknown:"
"""Start of a Skipped reason for a rule that cannot tell whether its mechanism runs: not evaluable."""


@dataclass(frozen=True)
class Counts:
    """How many rules looked and what became of them: one set of numbers for the CLI header, the
    UI caption, the webhook answer and the weekly report (`Diagnosis.counts`)."""

    rules: int  # rules run over the window
    fired: int  # findings (a rule can fire at several places)
    not_evaluable: int  # could not look: absent signals, unset parameters, mechanism unknown
    mechanism_off: int  # looked, and the source shows the mechanism is not running
    overruled: int  # looked, and direct evidence overruled the inferred reading

    def text(self) -> str:
        """'55 rules, 3 fired, 29 not evaluable, 1 with the mechanism off'."""
        parts = [f"{self.rules} rules", f"{self.fired} fired", f"{self.not_evaluable} not evaluable"]
        if self.overruled:
            parts.append(f"{self.overruled} overruled by direct evidence")
        if self.mechanism_off:
            parts.append(f"{self.mechanism_off} with the mechanism off")
        return ", ".join(parts)


def count(d: Diagnosis) -> Counts:
    """The diagnosis' counts, from its findings and skipped rules."""
    blind = len(not_evaluable(d.skipped))
    off = sum(s.reason.startswith(MECHANISM_OFF) for s in d.skipped)
    return Counts(d.rules_evaluated, len(d.findings), blind, off, len(d.skipped) - blind - off)


def nothing_evaluable(d: Diagnosis) -> bool:
    """True when rules ran and none could look: the source held none of their signals in the
    window ("no data", exit 4 in the CLI, status `no_data` in the webhook), not an all-clear."""
    return d.rules_evaluated > 0 and len(d.skipped) == d.rules_evaluated and not d.findings


def confidence_words(confidence: str, confirm: str = "") -> str:
    """How sure a finding is, in the words every consumer uses (CLI card, UI card, webhook,
    report): 'likely, moderate confidence (inferred from indirect evidence): the request tap ...
    would confirm it', or 'measured, high confidence: ...' for a rule whose signals show the
    mechanism itself."""
    if confidence == "high":
        return "measured, high confidence: the rule's own signals show the mechanism"
    confirm = f": {confirm.strip()}" if confirm.strip() else ""
    return f"likely, {confidence} confidence (inferred from indirect evidence){confirm}"


def not_evaluable(skipped: Iterable[Skipped]) -> list[Skipped]:
    """The skipped rules that could not look (absent signals, unset parameters, a mechanism not
    known to run), without the ones that looked and were overruled by direct evidence or found
    their mechanism off."""
    return [s for s in skipped if not s.reason.startswith((OVERRULED, MECHANISM_OFF))]


def same_place(a: dict[str, str], b: dict[str, str]) -> bool:
    """True when the labels the two places share agree (a fleet-wide place matches any)."""
    return all(a[k] == b[k] for k in set(a) & set(b))


def same_mechanism(head: Finding, other: Finding) -> bool:
    """Whether `other` points at the same root mechanism as `head`: one defers to the other, the
    other's levers are a non-empty subset of the head's (a KV-pressure cascade's stages), or both
    are in the same LEVERS.md family (K, P, L, ...) and lead with the same lever."""
    if head.rule_id in other.defers_to or other.rule_id in head.defers_to:
        return True
    mine = [lv.id for lv in head.levers]
    theirs = [lv.id for lv in other.levers]
    if not mine or not theirs:
        return False
    if set(theirs) <= set(mine):
        return True
    return _family(head.levers_md) == _family(other.levers_md) != "" and mine[0] == theirs[0]


def _family(row: str) -> str:
    return row.rstrip("0123456789")


def _encode(obj: Any) -> bytes:
    """`obj` (dataclasses, tuples, numpy scalars) as strict JSON, keys sorted, NaN as null."""
    return msgspec.json.encode(obj, order="sorted", enc_hook=_scalar)


def _scalar(obj: Any) -> Any:
    if hasattr(obj, "item"):  # a numpy scalar
        return obj.item()
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


def _plain(obj: Any) -> Any:
    """`obj` as the JSON reader gives it back: dicts, lists, None for NaN."""
    return msgspec.json.decode(_encode(obj))
