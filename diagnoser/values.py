"""How an evidence value is written for a reader: the evidence table, the summary of a finding (in
the CLI, the UI, the webhook's JSON and the report alike) and the UI's tables use these, so a
summary says "5.8 waiting" beside an evidence row reading 5.8."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from kvscope.diagnoser.findings import Evidence

NUMBER_UNITS = {"ratio": "", "per_second": "/s", "tokens_per_second": "tokens/s", "count": "", "tokens": "tokens"}
"""Units whose value `fmt_number` writes (a summary then writes the unit in its own words)."""


def fmt_number(v: float, unit: str) -> str:
    """The number of a `NUMBER_UNITS` value as the evidence table writes it, without the unit:
    ratios as percent to a tenth (`100.0%`), others to 3 significant digits (`5.8`, `18,101`)."""
    if unit == "ratio":
        return f"{v:.1%}"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def fmt_value(ev: Evidence) -> str:
    """A number with its unit, readable (ratios as percent)."""
    v = ev.value
    if v is None:
        return "absent"
    if ev.unit == "seconds":
        return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if ev.unit == "bytes" or ev.unit == "bytes_per_second":
        suffix = "/s" if ev.unit.endswith("second") else ""
        for unit in ("B", "KB", "MB", "GB", "TB"):
            if abs(v) < 1000:
                return f"{v:.1f} {unit}{suffix}"
            v /= 1000
        return f"{v:.1f} PB{suffix}"
    return f"{fmt_number(v, ev.unit)} {NUMBER_UNITS.get(ev.unit, ev.unit)}".strip()


_SECONDS_FIELD = re.compile(r"\{(\w+)(?::[^}]*)?\}s(?![/\w])")
_FIELD = re.compile(r"\{(\w+)(?::[^}]*)?\}")


def fill_summary(template: str, series: Sequence[str], evidence: Sequence[Evidence]) -> str | None:
    """A rule's summary template (`{kv:.0%} ... {ttft_mean:.2f}s`) with each field, an evidence
    series name, written as the evidence table writes its value: durations by `fmt_value`
    ("226.0 ms", not "0.226s"), counts, rates and ratios by `fmt_number` ("5.8 waiting", not
    "6 waiting"), any other unit by the template's own format. None when a field's value is absent
    or the template does not fit the evidence."""
    by_series = dict(zip(series, evidence, strict=False))
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    if any(by_series.get(f) is None or by_series[f].value is None for f in fields):
        return None

    def seconds(m: re.Match[str]) -> str:
        ev = by_series[m.group(1)]
        return fmt_value(ev).replace("{", "{{").replace("}", "}}") if ev.unit == "seconds" else m.group(0)

    def number(m: re.Match[str]) -> str:
        ev = by_series[m.group(1)]
        return fmt_number(ev.value, ev.unit) if ev.unit in NUMBER_UNITS and ev.value is not None else m.group(0)

    try:
        text = _FIELD.sub(number, _SECONDS_FIELD.sub(seconds, template))
        return text.format_map({k: e.value for k, e in by_series.items()})
    except (KeyError, ValueError, TypeError, IndexError):
        return None
