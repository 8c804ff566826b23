"""Rule unit tests (`<rule_id>.test.yaml`): promtool-style input series, expected findings.

`parse_values` expands promtool's notation (`0+2x10`, `5x3`, `_`); `run_case` builds a Frame
from a case's input series and evaluates one rule, returning what fired. The parametrized pytest
module tests/unit/test_rules_cases.py runs every case of every rule.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvscope.core.signals import Sample, make_labels
from kvscope.diagnoser.evaluate.evaluator import evaluate_rule
from kvscope.diagnoser.evaluate.frame import frame_from_samples
from kvscope.diagnoser.findings import Finding, Skipped
from kvscope.diagnoser.rulebook.levers import Lever
from kvscope.diagnoser.rulebook.rule import Rule, parse_duration, parse_yaml

_SERIES = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNSIGNED = r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_TERM = re.compile(r"^(-?" + _UNSIGNED + r"|_|stale)(?:([+-])(" + _UNSIGNED + r"))?(?:x(\d+))?$")


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    """'name{a="b"}' -> ('name', {'a': 'b'})."""
    m = _SERIES.match(text)
    if not m:
        raise ValueError(f"bad series selector: {text!r}")
    labels: dict[str, str] = {}
    body = m.group(2) or ""
    pos = 0
    while pos < len(body.strip()):
        lm = _LABEL.match(body, pos)
        if not lm:
            raise ValueError(f"bad labels in {text!r}")
        labels[lm.group(1)] = lm.group(2)
        pos = lm.end()
    return m.group(1), labels


def parse_values(text: str) -> list[float | None]:
    """promtool expanding notation: 'a+bxn' (n+1 values), 'axn' (a, n+1 times), '_' (gap), 'stale'
    (a staleness marker, NaN: the series is absent from there on, as Prometheus writes when a target
    leaves service discovery, instead of carried by the lookback)."""
    out: list[float | None] = []
    for term in str(text).split():
        m = _TERM.match(term)
        if not m:
            raise ValueError(f"bad value term {term!r}")
        start, sign, delta, times = m.groups()
        if start in ("_", "stale"):
            out.extend([None if start == "_" else math.nan] * (int(times) + 1 if times else 1))
            continue
        a = float(start)
        if times is None:
            out.append(a)
            continue
        d = float(delta or 0) * (-1 if sign == "-" else 1)
        out.extend(a + d * i for i in range(int(times) + 1))
    return out


@dataclass
class Case:
    name: str
    input_series: list[dict[str, Any]]
    eval_time: float
    expect: list[dict[str, Any]]
    params: dict[str, Any]
    line: int
    facts: dict[str, dict[str, str]]


@dataclass
class TestFile:
    rule: str
    interval: float
    cases: list[Case]
    path: str


def read_test_file(path: str | Path) -> TestFile:
    p = Path(path)
    doc = parse_yaml(p.read_text(encoding="utf-8"), str(p))
    cases = [
        Case(
            name=str(c["name"]),
            input_series=list(c["input_series"]),
            eval_time=parse_duration(c["eval_time"]),
            expect=list(c.get("expect") or []),
            params=dict(c.get("params") or {}),
            line=c.line,
            facts={str(k): {str(a): str(b) for a, b in v.items()} for k, v in (c.get("facts") or {}).items()},
        )
        for c in doc["cases"]
    ]
    return TestFile(
        rule=str(doc["rule"]), interval=parse_duration(doc.get("interval", "15s")), cases=cases, path=str(p)
    )


def histogram_samples(item: dict[str, Any], interval: float) -> list[Sample]:
    """Expand the histogram shorthand of a test case into _bucket/_sum/_count counters.

    `{histogram: 'name{labels}', buckets: [0.1, 0.5, 1], phases: [{steps: 20, counts: [9, 1, 0, 0]}]}`:
    each step of a phase adds `counts` observations to the buckets (non-cumulative, the last one
    is +Inf); _sum grows by each bucket's midpoint (the highest finite bound for +Inf).
    """
    name, labels = parse_series(str(item["histogram"]))
    les = [float(b) for b in item["buckets"]]
    mids = [(lo + hi) / 2 for lo, hi in zip([0.0] + les[:-1], les, strict=True)] + [les[-1]]
    cum = np.zeros(len(les) + 1)
    total_sum, t = 0.0, 0
    rows: list[tuple[float, np.ndarray, float]] = [(0.0, cum.copy(), 0.0)]
    for phase in item["phases"]:
        counts = np.array([float(c) for c in phase["counts"]])
        if len(counts) != len(les) + 1:
            raise ValueError(f"{name}: counts need one entry per bucket plus +Inf")
        for _ in range(int(phase["steps"])):
            t += 1
            cum = cum + counts
            total_sum += float(np.dot(counts, mids))
            rows.append((t * interval, cum.copy(), total_sum))
    out = []
    bounds = [str(b) for b in les] + ["+Inf"]
    for ts, c, total in rows:
        running = np.cumsum(c)
        for le, v in zip(bounds, running, strict=True):
            out.append(Sample(name + "_bucket", make_labels({**labels, "le": le}), float(v), ts))
        out.append(Sample(name + "_count", make_labels(labels), float(running[-1]), ts))
        out.append(Sample(name + "_sum", make_labels(labels), total, ts))
    return out


def case_samples(case: Case, interval: float) -> list[Sample]:
    """Input series of a case as timestamped canonical samples (sample i at i x interval)."""
    out = []
    for item in case.input_series:
        if "histogram" in item:
            out.extend(histogram_samples(item, interval))
            continue
        name, labels = parse_series(str(item["series"]))
        lbl = make_labels(labels)
        for i, v in enumerate(parse_values(str(item["values"]))):
            if v is not None:
                out.append(Sample(name, lbl, float(v), i * interval))
    return out


def run_case(rule: Rule, case: Case, interval: float, levers: dict[str, Lever]) -> list[Finding] | Skipped:
    """Evaluate one rule over the window [0, eval_time] of a case's input series."""
    frame = frame_from_samples(case_samples(case, interval), 0.0, case.eval_time, interval)
    frame.facts = case.facts
    if not len(frame.ts):
        frame.ts = np.array([0.0])
    return evaluate_rule(rule.with_params(case.params), frame, levers)


def check_case(
    rule: Rule, case: Case, interval: float, levers: dict[str, Lever], facts: dict[str, dict[str, str]] | None = None
) -> list[str]:
    """Problems with one case (empty = pass): fired groups must equal `expect`."""
    result = run_case(rule, case, interval, levers)
    if isinstance(result, Skipped):
        return [] if not case.expect else [f"rule skipped: {result.reason}"]
    got = {tuple(sorted(f.where.items())): f for f in result}
    want = {tuple(sorted((str(k), str(v)) for k, v in (e.get("labels") or {}).items())): e for e in case.expect}
    problems = []
    for key in sorted(set(want) - set(got)):
        problems.append(f"expected a finding for {dict(key)}, none fired")
    for key in sorted(set(got) - set(want)):
        problems.append(f"unexpected finding for {dict(key)}: {got[key].summary}")
    for key in sorted(set(got) & set(want)):
        for field in ("severity", "confidence"):
            exp = want[key].get(field)
            if exp and getattr(got[key], field) != exp:
                problems.append(f"{dict(key)}: {field} {getattr(got[key], field)}, expected {exp}")
        stage = want[key].get("stage")
        cascade = got[key].cascade
        if stage and (cascade is None or cascade.stage_name != stage):
            problems.append(f"{dict(key)}: cascade stage {cascade and cascade.stage_name}, expected {stage}")
    return problems
