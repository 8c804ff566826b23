"""What the routers decided over a window, per router (the Alertmanager webhook's `routers`, the
UI's triage page; docs/architecture.md). Read only from the series a router exports (a series it
lacks stays absent, never 0): decisions by policy and by branch; `kept` (to the worker holding the
prefix) against `gave_away` (SMG's branches as R1 reads them, sglang-router 0.2's cache hits and
load-balancing overrides, Dynamo's non-max-overlap selections; a give-away counter absent beside
counted kept ones is 0, as routers create it on first use); Dynamo's share of the best worker's
cached prefix kept; `load_only` decisions. Counts are increases over the window, resets handled,
a series that first appears inside the window counting from its first grid value.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kvscope.diagnoser.evaluate.frame import Frame, increases

KEPT = ("ring_hit", "target_worker_hit", "routing_key_hit", "tree_match")
GAVE_AWAY = ("load_balance_walk", "spill", "target_worker_miss")
LOAD_ONLY = ("fallback_least_load", "first_healthy_fallback", "random_fallback", "expected_wait_fallback")
LOAD_ONLY_POLICIES = ("round_robin", "random", "power_of_two")
SIGNALS = (
    "router_decisions_total",
    "router_policy_branch_total",
    "router_cache_hits_total",
    "router_cache_misses_total",
    "router_load_balancing_events_total",
    "router_non_max_overlap_selections_total",
    "router_selected_cached_prefix_tokens_total",
    "router_best_cached_prefix_tokens_total",
)
"""Every canonical series read here (a live source must fetch them)."""


def router_decisions(frame: Frame) -> list[dict[str, Any]]:
    """One dict per router instance that exports any decision series: instance, job, and only
    the keys its series give (decisions, branches, kept, gave_away, kept_share, load_only,
    prefix_tokens_kept_share)."""
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for name in SIGNALS:
        for labels, n in increases(frame, name, carry=True):
            row = out[labels.get("instance", "")]
            row.setdefault("job", labels.get("job", ""))
            _count(row, name, labels, n)
    rows = []
    for inst, row in sorted(out.items()):
        shown = _shares(row)
        if len(shown) > 1:  # more than its job
            rows.append({"instance": inst, **shown})
    return rows


def _add(row: dict[str, Any], key: str, n: float, sub: str | None = None) -> None:
    """In place: `n` added to `row[key]`, or to `row[key][sub]` when `sub` is given."""
    if sub is None:
        row[key] = row.get(key, 0.0) + n
    else:
        per = row.setdefault(key, {})
        per[sub] = per.get(sub, 0.0) + n


def _count(row: dict[str, Any], name: str, labels: dict[str, str], n: float) -> None:
    """In place: one series' increase `n` of the signal `name` counted into its router's row."""
    policy, branch = labels.get("policy", ""), labels.get("branch", "")
    if name == "router_decisions_total":
        _add(row, "decisions", n, policy or "unlabelled")
        if policy in LOAD_ONLY_POLICIES:
            _add(row, "load_only", n)
    elif name == "router_policy_branch_total":
        _add(row, "branches", n, f"{policy}:{branch}")
        for key, group in (("kept", KEPT), ("gave_away", GAVE_AWAY), ("load_only", LOAD_ONLY)):
            if branch in group:
                _add(row, key, n)
    elif name in ("router_cache_hits_total", "router_cache_misses_total"):
        _add(row, "kept" if name == "router_cache_hits_total" else "load_only", n)
    elif name in ("router_load_balancing_events_total", "router_non_max_overlap_selections_total"):
        _add(row, "gave_away", n)
    else:
        _add(row, name.split("_")[1], n)  # selected | best prefix tokens


def _shares(row: dict[str, Any]) -> dict[str, Any]:
    """A router's row as shown: the kept shares added, the raw prefix-token counts dropped, rounded."""
    if "kept" in row and row["kept"] + row.get("gave_away", 0.0) > 0:
        row["kept_share"] = row["kept"] / (row["kept"] + row.get("gave_away", 0.0))
    if row.get("best", 0.0) > 0 and "selected" in row:
        row["prefix_tokens_kept_share"] = min(1.0, row["selected"] / row["best"])
    return {k: _round(v) for k, v in row.items() if k not in ("selected", "best")}


def _round(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _round(x) for k, x in sorted(v.items())}
    return round(v, 3) if isinstance(v, float) else v


def router_line(row: dict[str, Any]) -> str:
    """One line of text per router (the UI; the webhook sends the dict)."""
    parts = []
    if "decisions" in row:
        parts.append("decisions " + ", ".join(f"{p} {n:,.0f}" for p, n in row["decisions"].items()))
    if "branches" in row:
        parts.append("by branch " + ", ".join(f"{b} {n:,.0f}" for b, n in row["branches"].items()))
    if "kept_share" in row:
        parts.append(
            f"to the worker holding the prefix {row['kept_share']:.0%} "
            f"({row['kept']:,.0f} kept, {row.get('gave_away', 0):,.0f} given away)"
        )
    elif "gave_away" in row:
        parts.append(f"{row['gave_away']:,.0f} sent away from the worker holding the most prefix")
    if "prefix_tokens_kept_share" in row:
        parts.append(f"cached prefix kept {row['prefix_tokens_kept_share']:.0%} of the best worker's")
    if "load_only" in row:
        parts.append(f"load-only {row['load_only']:,.0f}")
    return f"`{row['instance']}` ({row['job']}): " + "; ".join(parts)
