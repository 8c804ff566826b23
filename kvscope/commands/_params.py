"""`--param RULE.NAME=VALUE`: rule parameter overrides, shared by `diagnose` and `serve`."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

import yaml


def add_param_flag(parser: argparse.ArgumentParser) -> None:
    """Add the repeatable --param flag."""
    parser.add_argument("--param", action="append", default=[], metavar="RULE.NAME=VALUE",
                        help="override a rule parameter, e.g. kv_pressure_preemption.kv_full=0.85 "
                             "(repeatable; each rule's parameters are under `params:` in rules/diagnosis/*.yaml)")


def parse_params(items: list[str], rule_ids: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """['rule.name=value', ...] -> {rule: {name: value}}, values read as YAML scalars.

    Raises ValueError on a malformed item, or on a rule id not in `rule_ids` when given.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        rule, dot, name = key.partition(".")
        if not sep or not dot or not rule or not name:
            raise ValueError(f"--param {item!r}: expected RULE.NAME=VALUE")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        out.setdefault(rule, {})[name] = value
    if rule_ids is not None:
        unknown = sorted(set(out) - set(rule_ids))
        if unknown:
            raise ValueError(f"--param names unknown rule(s): {', '.join(unknown)}")
    return out
