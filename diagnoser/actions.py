"""A finding's levers as actions: what to do now (mitigate) and what fixes it for good.

One wording for every consumer (CLI card, UI first screen, webhook answer, weekly report, generated
runbooks and docs/levers.md): `plan` splits a finding's ranked levers by kind, `change_text` writes
one system's exact setting, `lever_dict` is the webhook's form.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvscope.diagnoser.findings import EngineChange, Finding, LeverAdvice

KIND_LABEL = {"mitigate": "Do now", "fix": "Fix for good"}
"""Headings of the two lists, in the order they are shown."""

KIND_HELP = {
    "mitigate": "acts within minutes and buys time (shed, cap, add a replica)",
    "fix": "removes the cause; roll it out after the incident",
}

SYSTEM_NAME = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "router": "router",
    "gateway": "gateway",
    "k8s": "Kubernetes",
    "app": "application",
    "ops": "procedure",
}


def plan(f: Finding) -> tuple[list[LeverAdvice], list[LeverAdvice]]:
    """The finding's levers in rank order, split into (do now, fix for good)."""
    return split(f.levers)


def split(levers: Iterable[LeverAdvice]) -> tuple[list[LeverAdvice], list[LeverAdvice]]:
    """Levers in rank order, split into (do now, fix for good)."""
    ranked = sorted(levers, key=lambda lv: lv.rank)
    return [lv for lv in ranked if lv.kind == "mitigate"], [lv for lv in ranked if lv.kind != "mitigate"]


def where_text(c: EngineChange) -> str:
    """'vLLM', 'router (SGLang Model Gateway)': the system and product that take the change."""
    name = SYSTEM_NAME.get(c.system, c.system)
    return f"{name} ({c.product})" if c.product else name


def change_text(c: EngineChange, code: str = "") -> str:
    """'vLLM: --max-num-seqs N (lower than now ...)'; `code` wraps the setting (e.g. a backtick)."""
    note = f" ({c.note})" if c.note else ""
    return f"{where_text(c)}: {code}{c.change}{code}{note}"


def lever_heading(lv: LeverAdvice) -> str:
    """'Concurrency limit per engine (decrease): needs an engine restart; lower throughput per GPU'."""
    direction = "" if lv.direction in ("set", "review", "") else f" ({lv.direction})"
    return f"{lv.title or lv.id}{direction}: {'; '.join(lv.cost_tags())}"


def lever_dict(lv: LeverAdvice) -> dict[str, Any]:
    """One lever as the webhook writes it under `actions`."""
    return {
        "id": lv.id,
        "title": lv.title,
        "direction": lv.direction,
        "kind": lv.kind,
        "restart": lv.restart,
        "quality_risk": lv.quality_risk,
        "capacity": lv.capacity,
        "cost": lv.cost,
        "how": [
            {"system": c.system, "product": c.product, "set": c.change, "note": c.note, "text": change_text(c)}
            for c in lv.changes
        ],
    }


def actions_dict(levers: Iterable[LeverAdvice]) -> dict[str, list[dict[str, Any]]]:
    """{'do_now': [...], 'fix': [...]}: a finding's levers as the webhook writes them."""
    now, fix = split(levers)
    return {"do_now": [lever_dict(lv) for lv in now], "fix": [lever_dict(lv) for lv in fix]}


def markdown_lines(f: Finding) -> list[str]:
    """The do-now and fix lists in Markdown (report, runbooks): headings, levers, settings."""
    out: list[str] = []
    for kind, levers in zip(KIND_LABEL, plan(f), strict=True):
        if not levers:
            continue
        out.append(f"**{KIND_LABEL[kind]}**: {KIND_HELP[kind]}")
        for lv in levers:
            out.append(f"- **{lever_heading(lv)}**")
            out += [f"  - {change_text(c, '`')}" for c in lv.changes]
    return out
