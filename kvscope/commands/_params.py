"""`--param RULE.NAME=VALUE`: rule parameter overrides, shared by `diagnose` and `serve`."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Mapping
from typing import Any

import yaml


def add_param_flag(parser: argparse.ArgumentParser) -> None:
    """Add the repeatable --param flag."""
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="RULE.NAME=VALUE",
        help="override a rule parameter, e.g. kv_pressure_preemption.kv_full=0.85 "
        "(repeatable; each rule's parameters are under `params:` in rules/diagnosis/*.yaml)",
    )


def parse_params(items: list[str], known: Mapping[str, Iterable[str]]) -> dict[str, dict[str, Any]]:
    """['rule.name=value', ...] -> {rule: {name: value}}, values read as YAML scalars.

    `known` maps each rule id to its parameter names. Raises ValueError on a malformed item, an
    unknown rule or parameter; the message suggests the closest spelling and lists what there is.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        rule, dot, name = key.partition(".")
        if not sep or not dot or not rule or not name:
            raise ValueError(f"--param {item!r}: expected RULE.NAME=VALUE, e.g. kv_pressure_preemption.kv_full=0.85")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        out.setdefault(rule, {})[name] = value
    ids = list(known)
    unknown = sorted(set(out) - set(ids))
    if unknown:
        hints = "; ".join(f"{u}{_did_you_mean(u, ids)}" for u in unknown)
        raise ValueError(
            f"--param names unknown rule(s): {hints} (rule ids: kvscope rules check, "
            "or the id: line of rules/diagnosis/*.yaml)"
        )
    for rule, values in out.items():
        names = sorted(known[rule])
        for name in sorted(set(values) - set(names)):
            raise ValueError(
                f"--param {rule}.{name}: rule {rule} has no parameter {name!r}"
                f"{_did_you_mean(name, names)}; its parameters: {', '.join(names) or 'none'}"
            )
    return out


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""
