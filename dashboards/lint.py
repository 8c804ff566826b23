"""PromQL lint over the generated dashboard queries: the defects of anchor-dashboards.md §10.

Each issue names the board, panel and rule; docs/dashboards.md tables the rules (guarded
division, rate() only on counters, histogram_quantile over sum by (le), known series, units,
variables, role label, descriptions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from kvscope.core.signals import Catalog, load_catalog, signal_of
from kvscope.dashboards.board import Board, Panel
from kvscope.dashboards.queries import KVSCOPE_PREFIX

AGENT_SERIES = ("target_up", "target_status", "target_series", "scrape_duration_seconds", "engine_info")
"""The agent's self-health families that panels may read (documented in agent/serve/export.py)."""

BUILTINS = ("ALERTS", "ALERTS_FOR_STATE", "up")
CANONICAL_PREFIX = "kvscope:"
"""Canonical series recorded by rules/prometheus/kvscope-canonical.yml."""
GRAFANA_VARS = ("__rate_interval", "__range", "__interval", "__all_variables", "__url_time_range")
_METRIC = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
_RATE = re.compile(r"\b(rate|increase|irate|resets)\(\s*$")
"""Functions that read a counter's increments (`resets` counts its drops: the process restarted)."""
_VAR = re.compile(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)")


@dataclass(frozen=True)
class LintIssue:
    board: str
    panel: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.board} / {self.panel}: [{self.rule}] {self.detail}"


def read_recorded_names(root: Path | None = None) -> set[str]:
    """Series produced by the Prometheus recording rules in rules/prometheus/*.yml (if any)."""
    folder = root or Path(str(resources.files("kvscope.rules"))) / "prometheus"
    names: set[str] = set()
    for path in sorted(folder.glob("*.y*ml")) if folder.is_dir() else ():
        doc = yaml.safe_load(path.read_text()) or {}
        for group in doc.get("groups") or ():
            names.update(r["record"] for r in group.get("rules") or () if "record" in r)
    return names


class QueryLinter:
    """Checks expressions against the catalog and the recording rules."""

    def __init__(self, catalog: Catalog | None = None, recorded: set[str] | None = None) -> None:
        self.catalog = catalog or load_catalog()
        self.recorded = read_recorded_names() if recorded is None else recorded

    def series_kind(self, name: str) -> str | None:
        """'counter' | 'gauge' | 'histogram_part' | 'recorded' | 'builtin' for a known series, else None.

        `kvscope:<signal>` must be produced by a recording rule *and* be a catalog signal (its kind
        comes from the catalog); `kvscope_<signal>` is the agent's re-export or self-health.
        """
        if name in BUILTINS:
            return "builtin"
        if name.startswith(CANONICAL_PREFIX):
            return self._catalog_kind(name[len(CANONICAL_PREFIX) :]) if name in self.recorded else None
        if name in self.recorded:
            return "recorded"
        if not name.startswith(KVSCOPE_PREFIX):
            return None
        base = name[len(KVSCOPE_PREFIX) :]
        return "gauge" if base in AGENT_SERIES else self._catalog_kind(base)

    def _catalog_kind(self, base: str) -> str | None:
        """A catalog signal's kind; "histogram_part" for a histogram's _bucket/_sum/_count (a
        histogram's bare name is no series); None where the catalog has no such signal."""
        name = signal_of(base, self.catalog)
        sig = self.catalog.signals.get(name)
        if sig is None:
            return None
        if name == base:
            return None if sig.kind == "histogram" else sig.kind
        return "histogram_part" if sig.kind == "histogram" else None

    def lint_expr(self, expr: str) -> list[tuple[str, str]]:
        """(rule, detail) pairs for one expression."""
        body = _strip_strings(expr)
        issues = self._quantiles(body) + self._division(body)
        for m in _METRIC.finditer(body):
            issues += self._metric(m.group(1), body[: m.start()])
        return issues

    def _metric(self, name: str, before: str) -> list[tuple[str, str]]:
        kind = self.series_kind(name)
        if kind is None:
            return [("unknown-metric", f"{name} is not in the catalog, the agent's series or the recording rules")]
        in_rate = bool(_RATE.search(before))
        if in_rate and kind not in ("counter", "histogram_part"):
            return [("rate-on-non-counter", f"rate/increase over {name} ({kind})")]
        if not in_rate and kind in ("counter", "histogram_part"):
            return [("lifetime-maths", f"{name} used without rate()/increase(): a since-start value")]
        return []

    @staticmethod
    def _quantiles(body: str) -> list[tuple[str, str]]:
        out = []
        for m in re.finditer(r"histogram_quantile\(", body):
            arg = body[m.end() :]
            by = re.match(r"\s*[\d.$a-z_]+\s*,\s*sum\s+by\s*\(([^)]*)\)\s*\(\s*rate\([a-zA-Z_:0-9]+_bucket", arg)
            if not by or "le" not in [x.strip() for x in by.group(1).split(",")]:
                out.append(("quantile-without-sum-by-le", arg[:80]))
        return out

    @staticmethod
    def _division(body: str) -> list[tuple[str, str]]:
        rests = (body[m.end() :].lstrip() for m in re.finditer("/", body))
        return [("unguarded-division", r[:60]) for r in rests if not (re.match(r"[\d.]+", r) or _guarded(r))]


def _strip_strings(expr: str) -> str:
    """Blank out label-matcher string contents so regexes and '/' inside them are ignored."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def _guarded(rest: str) -> bool:
    if not rest.startswith("("):
        return False
    depth = 0
    for j, ch in enumerate(rest):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return re.search(r">\s*0\s*$", rest[1:j]) is not None
    return False


def lint_board(board: Board, linter: QueryLinter | None = None) -> list[LintIssue]:
    """All lint issues of one dashboard spec."""
    linter = linter or QueryLinter()
    issues: list[LintIssue] = []
    used: set[str] = set()
    for panel in board.panels():
        issues += [LintIssue(board.uid, panel.title, r, d) for r, d in _lint_panel(panel, linter)]
        for q in panel.queries:
            used.update(_VAR.findall(q.expr))
        for link in panel.links:
            used.update(_VAR.findall(link["url"]))
    declared = {t.name for t in board.variables()}
    for var in sorted(used - declared - set(GRAFANA_VARS)):
        issues.append(LintIssue(board.uid, "-", "undefined-variable", f"${var}"))
    for var in sorted(declared - used - {"datasource", "ui_url"}):
        issues.append(LintIssue(board.uid, "-", "unused-variable", f"${var}"))
    return issues


def _lint_panel(panel: Panel, linter: QueryLinter) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if not panel.description.strip():
        out.append(("no-description", "panel has no description"))
    for q in panel.queries:
        out += linter.lint_expr(q.expr)
        if re.search(r'pod=~"[^"]*(prefill|decode)', q.expr):
            out.append(("pod-name-role", "use the role label, not a pod-name regex"))
    if _is_latency(panel, linter.catalog) and panel.unit != "seconds":
        out.append(("wrong-unit", f"latency panel with unit {panel.unit!r}"))
    return out


def _is_latency(panel: Panel, catalog: Catalog) -> bool:
    sigs = [catalog.signals.get(s) for s in panel.signals()]
    return (
        bool(sigs)
        and all(s is not None and s.kind == "histogram" and s.unit == "seconds" for s in sigs)
        and all("_bytes" not in q.expr and ("histogram_quantile" in q.expr or "_sum" in q.expr) for q in panel.queries)
    )


def lint_boards(boards, linter: QueryLinter | None = None) -> list[LintIssue]:
    linter = linter or QueryLinter()
    return [i for b in boards for i in lint_board(b, linter)]
