"""JSON request bodies with a bounded nesting depth (OTLP/JSON, the Alertmanager webhook):
`loads_bounded` turns the decoder's RecursionError and any nesting past the limit (one iterative
walk, linear in the containers) into a ValueError before other code recurses over the document."""

from __future__ import annotations

import json
from typing import Any

MAX_JSON_DEPTH = 64
"""Nesting levels a body may have: OTLP/JSON needs about 10 plus nested attribute values, an
Alertmanager webhook 4."""


def loads_bounded(body: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode JSON; ValueError (also for bad JSON or UTF-8) when nested deeper than `max_depth`."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    stack = [(doc, 1)] if isinstance(doc, (dict, list)) else []
    while stack:
        value, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"JSON nested deeper than {max_depth} levels")
        items = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in items if isinstance(v, (dict, list)))
    return doc
