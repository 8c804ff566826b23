"""Parse Prometheus text (0.0.4) and OpenMetrics exposition into raw samples.

Pure text -> data, no I/O. Bad lines never raise: each becomes a `ParseIssue` with its line
number and reason, and parsing goes on, so one malformed series cannot hide the rest of an
engine's metrics. Upstream names are kept exactly as exposed; mapping to canonical signals is
the engine dialects' job (agent/normalize/dialect.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from kvscope.agent.signals import Labels

_SAMPLE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"          # metric name
    r"(?:\{(.*)\})?"                        # label body (greedy: values may contain '}')
    r"[ \t]+([^ \t]+)"                      # value
    r"(?:[ \t]+([^ \t#]+))?[ \t]*$"         # optional timestamp
)
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*,?')
_LABELS_FULL = re.compile(r'(?:[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*"[ \t]*,?)*[ \t]*')
_MISSING: Labels = (("", ""),)  # sentinel: not in the label cache yet
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_UNESCAPE = re.compile(r'\\[\\"n]')
TYPES = ("counter", "gauge", "histogram", "summary", "untyped", "unknown", "info",
         "stateset", "gaugehistogram")


class RawSample(NamedTuple):
    """One sample with its upstream name; timestamp in seconds or None."""

    name: str
    labels: Labels
    value: float
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class ParseIssue:
    """Why one line was skipped. `reason` is a short stable token used as a metric label."""

    line: int
    reason: str
    text: str


@dataclass
class Exposition:
    """Everything parsed out of one payload."""

    samples: list[RawSample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)
    issues: list[ParseIssue] = field(default_factory=list)
    openmetrics: bool = False
    complete: bool = True

    def family_type(self, sample_name: str) -> str | None:
        """The declared TYPE of the family a sample name belongs to, if any."""
        t = self.types.get(sample_name)
        if t is not None:
            return t
        for suffix in ("_total", "_bucket", "_count", "_sum", "_created", "_info", "_gcount", "_gsum"):
            if sample_name.endswith(suffix):
                t = self.types.get(sample_name[: -len(suffix)])
                if t is not None:
                    return t
        return None


def parse_exposition(text: str, openmetrics: bool | None = None,
                     label_cache: dict[str, Labels | None] | None = None) -> Exposition:
    """Parse one exposition. `openmetrics=None` detects the format from a trailing `# EOF`.

    `label_cache` (label body text -> parsed labels, None when malformed) may be kept by the
    caller across payloads of one target, so that label sets seen before are not parsed again;
    the caller bounds it (agent/normalize/blockcache.py clears it past 20k entries).

    OpenMetrics timestamps are seconds; text-format timestamps are milliseconds. Both come
    out in seconds. A payload that does not end in a newline (text) or lacks `# EOF`
    (OpenMetrics) is marked incomplete and its last, possibly cut, line is dropped.
    """
    stripped = text.rstrip()
    if openmetrics is None:
        openmetrics = stripped.endswith("# EOF")
    out = Exposition(openmetrics=openmetrics)
    lines = text.split("\n")
    if openmetrics:
        if not stripped.endswith("# EOF"):
            out.complete = False
            _drop_last(lines, out)
    elif text and not text.endswith("\n"):
        out.complete = False
        _drop_last(lines, out)
    ts_scale = 1.0 if openmetrics else 0.001
    seen: set[tuple[str, Labels, float | None]] = set()
    if label_cache is None:
        label_cache = {}
    append = out.samples.append
    for lineno, line in enumerate(lines, 1):
        if not line or line[0] == "#" or line.isspace():
            if line and line[0] == "#":
                _parse_comment(line, lineno, out)
            continue
        sample = _parse_sample(line, lineno, ts_scale, out, label_cache)
        if sample is None:
            continue
        key = (sample[0], sample[1], sample[3])
        if key in seen:
            out.issues.append(ParseIssue(lineno, "duplicate_series", line[:200]))
            continue
        seen.add(key)
        append(sample)
    return out


def _drop_last(lines: list[str], out: Exposition) -> None:
    while lines and not lines[-1].strip():
        lines.pop()
    if lines:
        out.issues.append(ParseIssue(len(lines), "truncated", lines[-1][:200]))
        lines.pop()


def _parse_comment(line: str, lineno: int, out: Exposition) -> None:
    parts = line.split(None, 3)
    if len(parts) < 3 or parts[1] not in ("TYPE", "HELP"):
        return  # free-form comment or "# EOF"
    if parts[1] == "TYPE":
        kind = parts[3].strip() if len(parts) > 3 else ""
        if kind not in TYPES:
            out.issues.append(ParseIssue(lineno, "bad_type", line[:200]))
            return
        out.types[parts[2]] = kind
    else:
        out.helps[parts[2]] = parts[3] if len(parts) > 3 else ""


def _parse_sample(line: str, lineno: int, ts_scale: float, out: Exposition,
                  label_cache: dict[str, Labels | None]) -> RawSample | None:
    if " # " in line:  # OpenMetrics exemplar: ignore it
        line = line.split(" # ", 1)[0]
    m = _SAMPLE.match(line)
    if m is None:
        out.issues.append(ParseIssue(lineno, "malformed_line", line[:200]))
        return None
    name, body, raw_value, raw_ts = m.groups()
    if body:
        labels = label_cache.get(body, _MISSING)
        if labels is _MISSING:
            labels = label_cache[body] = _parse_labels(body)
    else:
        labels = ()
    if labels is None:
        out.issues.append(ParseIssue(lineno, "malformed_labels", line[:200]))
        return None
    try:
        value = float(raw_value)
        timestamp = float(raw_ts) * ts_scale if raw_ts is not None else None
    except ValueError:
        out.issues.append(ParseIssue(lineno, "bad_value", line[:200]))
        return None
    if timestamp is not None and not math.isfinite(timestamp):
        out.issues.append(ParseIssue(lineno, "bad_timestamp", line[:200]))
        return None
    return RawSample(name, labels, value, timestamp)


_IDENT = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_known_keys: set[str] = set()


def _parse_labels(body: str) -> Labels | None:
    """Label body -> sorted pairs, or None when malformed.

    Fast path: without a backslash no value can contain `",`, so splitting on it is exact.
    """
    if "\\" in body:
        return _parse_labels_slow(body)
    b = body.rstrip()
    if b.endswith(","):
        b = b[:-1].rstrip()
    if not b.endswith('"'):
        return None if b.strip() else ()
    pairs = []
    for seg in b[:-1].split('",'):
        key, sep, value = seg.partition('="')
        key = key.strip()
        if not sep or '"' in value or key not in _known_keys:
            if not sep or '"' in value or _IDENT.fullmatch(key) is None:
                return _parse_labels_slow(body)
            if len(_known_keys) < 4096:
                _known_keys.add(key)
        pairs.append((key, value))
    if len(pairs) > 1:
        pairs.sort()
        if any(pairs[i][0] == pairs[i + 1][0] for i in range(len(pairs) - 1)):
            return None
    return tuple(pairs)


def _parse_labels_slow(body: str) -> Labels | None:
    if _LABELS_FULL.fullmatch(body) is None:
        return None
    pairs = _LABEL.findall(body)
    if "\\" in body:
        pairs = [(k, _UNESCAPE.sub(lambda m: _ESCAPES[m.group(0)], v)) for k, v in pairs]
    names = [k for k, _ in pairs]
    if len(set(names)) != len(names):
        return None
    return tuple(sorted(pairs))


def escape_label_value(value: str) -> str:
    """Escape a label value for exposition output."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(labels: Labels) -> str:
    """`{a="1",b="2"}` or the empty string."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels) + "}"


def format_value(value: float) -> str:
    """Exposition spelling of a float (NaN, +Inf, -Inf, repr otherwise)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
