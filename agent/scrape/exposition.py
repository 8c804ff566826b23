"""Parse Prometheus text (0.0.4) and OpenMetrics exposition into raw samples (upstream names kept;
agent/normalize/dialect.py maps them). Pure text -> data. Bad lines never raise: each becomes a
`ParseIssue` (line number, reason) and parsing goes on. Linear time on any input: every regex is
possessive (`*+`, `?+`) and each line is matched once (a diagnosing pass runs only on a failed line).
The per-line bounds, `Limits`, `deadline` and every drop reason: docs/collectors.md "Bounds and
limits". Timestamps: integer ms (text format), decimal seconds (OpenMetrics).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

from kvscope.core.signals import Labels, Sample

MAX_LINE = 1 << 16
MAX_LABELS = 256
MAX_VALUE = 1 << 14
LIMIT_REASONS = (
    "sample_limit_exceeded",
    "series_limit_exceeded",
    "label_limit_exceeded",
    "label_name_length_limit_exceeded",
    "label_value_length_limit_exceeded",
)
FATAL = (*LIMIT_REASONS, "parse_timeout")
"""Issues that fail a scrape whole (agent/collectors/engine.py), as Prometheus fails one past a limit."""
_OM_TS = r"[+-]?+(?:[0-9]++(?:\.[0-9]*+)?+|\.[0-9]++)(?:[eE][+-]?+[0-9]++)?+"
_FLOAT = rf"(?:{_OM_TS}|[+-]?+[iI][nN][fF](?:[iI][nN][iI][tT][yY])?+|[nN][aA][nN])"
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*+"


def _grammar(om: bool) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """(line, label item, exemplar) regexes. A line's groups: name, separator, label body, value,
    timestamp, exemplar. OpenMetrics keeps unknown escapes as they are and wants single spaces."""
    qs = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"' if om else r'"[^"\\\n]*+(?:\\[\\"n][^"\\\n]*+)*+"'
    item = rf"[ \t]*+(?:[a-zA-Z_][a-zA-Z0-9_]*+|{qs})[ \t]*+(?:=[ \t]*+{qs}[ \t]*+)?+"
    body = rf"\{{(?:{item}(?:,{item})*+{'' if om else ',?+'})?+[ \t]*+\}}"
    if om:
        line = rf"({_NAME})?+()({body})?+ ({_FLOAT})(?: ({_OM_TS}))?+(?: (#.*))?+"
    else:
        line = rf"[ \t]*+({_NAME})?+([ \t]*+)({body})?+[ \t]*+({_FLOAT})(?:[ \t]++([+-]?+[0-9]++))?+[ \t]*+(#.*)?+\r?+"
    item_groups = rf"[ \t]*+(?:([a-zA-Z_][a-zA-Z0-9_]*+)|({qs}))[ \t]*+(?:=[ \t]*+({qs})[ \t]*+)?+"
    exemplar = rf"# ({body}) ({_FLOAT})(?: ({_OM_TS}))?+"
    return re.compile(line, re.S), re.compile(item_groups), re.compile(exemplar, re.S)


_TEXT, _OM = _grammar(False), _grammar(True)
_VALUE = re.compile(_FLOAT)
_OM_META = re.compile(r"# (TYPE|HELP|UNIT) ([^ \t\n]++) (.*)", re.S)
_UNESCAPE = re.compile(r"\\(.)")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


RawSample = Sample
"""One sample with its upstream name (before normalization); timestamp in seconds or None."""


@dataclass(frozen=True, slots=True)
class ParseIssue:
    """Why one line was skipped. `reason` is a short stable token used as a metric label."""

    line: int
    reason: str
    text: str


@dataclass(frozen=True)
class Limits:
    """A target's limits, Prometheus' names and meaning (0 = no limit). The label limits count
    the labels a sample is exposed with (the target's own labels are not counted)."""

    sample_limit: int = 0
    label_limit: int = 0
    label_name_length_limit: int = 0
    label_value_length_limit: int = 0
    series_limit: int = 0
    """Distinct series (name and labels, whatever their timestamps): a whole recording's bound
    (agent/recording/omfile.py); a scrape has one sample per series and uses sample_limit."""


NO_LIMITS = Limits()


@dataclass
class Exposition:
    """Everything parsed out of one payload."""

    samples: list[RawSample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    issues: list[ParseIssue] = field(default_factory=list)
    openmetrics: bool = False
    complete: bool = True


def parse_exposition(
    text: str,
    openmetrics: bool | None = None,
    limits: Limits = NO_LIMITS,
    deadline: float | None = None,
) -> Exposition:
    """Parse one exposition (timestamps in seconds). `openmetrics=None` detects the format from a
    trailing `# EOF`. A text payload whose last line lacks its newline, or an OpenMetrics one
    without `# EOF`, is marked incomplete and its last, possibly cut, line is dropped."""
    stripped = text.rstrip()
    if openmetrics is None:
        openmetrics = stripped.endswith("# EOF")
    out = Exposition(openmetrics=openmetrics)
    lines = text.split("\n")
    _drop_unfinished(lines, stripped, out)
    grammar = _OM if openmetrics else _TEXT
    seen: set[tuple[str, Labels, float | None]] = set()
    series: set[tuple[str, Labels]] | None = set() if limits.series_limit > 0 else None
    cache: dict[str, Labels | str] = {}  # label body -> parsed labels or refusal reason
    append = out.samples.append
    for lineno, line in enumerate(lines, 1):
        c = line[:1]
        if c == "#" or c in " \t" and (not line.strip(" \t") or line.lstrip(" \t")[0] == "#"):
            if _metadata_line(line, lineno, lines, out):
                break
            continue
        if lineno & 1023 == 0 and deadline is not None and time.monotonic() > deadline:
            _issue(out, lineno, "parse_timeout", line)
            out.complete = False
            break
        sample = _sample(line, lineno, grammar, out, cache, limits)
        if sample is None:
            if out.issues[-1].reason in LIMIT_REASONS:
                break
            continue
        key = (sample[0], sample[1], sample[3])
        if key in seen:
            _issue(out, lineno, "duplicate_series", line)
            continue
        seen.add(key)
        append(sample)
        if len(seen) > limits.sample_limit > 0:
            _issue(out, lineno, "sample_limit_exceeded", line)
            break
        if series is not None:
            series.add(key[:2])
            if len(series) > limits.series_limit:
                _issue(out, lineno, "series_limit_exceeded", line)
                break
    return out


def _issue(out: Exposition, lineno: int, reason: str, line: str) -> None:
    out.issues.append(ParseIssue(lineno, reason, line[:200]))


def _metadata_line(line: str, lineno: int, lines: list[str], out: Exposition) -> bool:
    """A comment or blank line (1-based `lineno` of `lines`) read into `out`; True at
    OpenMetrics' `# EOF`, where reading stops (text after it is an issue)."""
    if not out.openmetrics:
        if line.lstrip(" \t")[:1] == "#":
            _comment(line.lstrip(" \t"), lineno, out)
        return False
    if line[:1] != "#":
        _issue(out, lineno, "blank_line" if not line.strip(" \t") else "bad_metadata", line)
        return False
    if not _comment(line, lineno, out):
        return False
    if any(map(str.strip, lines[lineno:])):
        _issue(out, lineno, "text_after_eof", line)
    return True


def _drop_unfinished(lines: list[str], stripped: str, out: Exposition) -> None:
    """In place: a payload that does not end as its format ends (text: with a newline;
    OpenMetrics: with `# EOF`) loses its last, possibly cut, line and is marked incomplete."""
    if out.openmetrics and not stripped.endswith("# EOF"):
        while lines and not lines[-1].strip():
            lines.pop()
        _cut(lines, out)
    elif not out.openmetrics and lines[-1].strip(" \t"):
        _cut(lines, out)


def _cut(lines: list[str], out: Exposition) -> None:
    out.complete = False
    if lines:
        _issue(out, len(lines), "truncated", lines.pop())


def _comment(line: str, lineno: int, out: Exposition) -> bool:
    """Read a HELP/TYPE(/UNIT) line into `out`; True for OpenMetrics' `# EOF`. Text format lets
    any other comment through; OpenMetrics has no free comments and single spaces only."""
    if out.openmetrics:
        if line == "# EOF":
            return True
        m = _OM_META.fullmatch(line)
        if m is None:
            _issue(out, lineno, "bad_metadata", line)
            return False
        kind, name, text = m.groups()
        name = _unquote(name)
        if kind == "TYPE" and name not in out.types and text in TYPES and text != "untyped":
            out.types[name] = text
        elif kind == "HELP" and name not in out.helps:
            out.helps[name] = text
        elif (
            kind != "UNIT"
            or name in out.units
            or (text and not name.endswith("_" + text))
            or out.types.get(name) in ("info", "stateset")
            or text != text.strip()
        ):
            _issue(out, lineno, "bad_metadata", line)
        else:
            out.units[name] = text
        return False
    parts = line.split(None, 3)
    if len(parts) < 3 or parts[1] not in ("TYPE", "HELP"):
        return False  # a free-form comment
    if parts[1] == "HELP":
        out.helps[_unquote(parts[2])] = parts[3] if len(parts) > 3 else ""
        return False
    kind = parts[3].strip() if len(parts) > 3 else ""
    kind = "gaugehistogram" if kind == "gauge_histogram" else kind
    if kind in TYPES:
        out.types[_unquote(parts[2])] = kind
    else:
        _issue(out, lineno, "bad_type", line)
    return False


def _unquote(name: str) -> str:
    """A quoted string's text; an escape other than \\\\, \\" and \\n stays as it is (only
    OpenMetrics lets one through)."""
    return _UNESCAPE.sub(_unescape, name[1:-1]) if name[:1] == '"' else name


def _unescape(m: re.Match[str]) -> str:
    return _ESCAPES.get(m.group(1)) or m.group(0)


def _sample(
    line: str,
    lineno: int,
    grammar: tuple[re.Pattern[str], ...],
    out: Exposition,
    cache: dict[str, Labels | str],
    limits: Limits,
) -> RawSample | None:
    if len(line) > MAX_LINE:
        _issue(out, lineno, "line_too_long", line)
        return None
    m = grammar[0].fullmatch(line)
    if m is None:
        _issue(out, lineno, _diagnose(line), line)
        return None
    name, sep, body, raw_value, raw_ts, exemplar = m.groups()
    if body is None:
        if name is None or (sep == "" and grammar is _TEXT):
            _issue(out, lineno, "malformed_line", line)
            return None
        labels: Labels | str = ()
    else:
        labels = cache.get(body, "") if name is not None else _labels(body, True, grammar, limits)
        if labels == "":
            labels = cache[body] = _labels(body, False, grammar, limits)
        if isinstance(labels, str):
            _issue(out, lineno, labels, line)
            return None
        if name is None:
            name, labels = labels[0][1], labels[1:]
    if exemplar is not None and not _exemplar_ok(exemplar, grammar, limits):
        _issue(out, lineno, "bad_exemplar", line)
        return None
    timestamp = None
    if raw_ts is not None:
        # text: int64 milliseconds (more digits would overflow the division or int()'s digit cap)
        timestamp = float(raw_ts) if out.openmetrics else int(raw_ts) / 1000 if len(raw_ts) < 20 else math.inf
        if not math.isfinite(timestamp):
            _issue(out, lineno, "bad_timestamp", line)
            return None
    return RawSample(name, labels, float(raw_value), timestamp)  # type: ignore[arg-type]


def _labels(body: str, wants_name: bool, grammar: tuple[re.Pattern[str], ...], limits: Limits) -> Labels | str:
    """A validated label body -> sorted pairs (with ("__name__", name) first when the metric
    name was inside the braces), or the reason it is refused."""
    pairs = []
    name = None
    for ident, qkey, qvalue in grammar[1].findall(body, 1, len(body) - 1):
        if not qvalue:
            if ident or name is not None or not wants_name or len(qkey) < 3:
                return "malformed_labels"
            name = _unquote(qkey)
            continue
        key = ident or _unquote(qkey)
        if not key or key == "__name__":
            return "malformed_labels"
        value = _unquote(qvalue) if "\\" in qvalue else qvalue[1:-1]
        if len(value) > MAX_VALUE:
            return "label_value_too_long"
        if len(key) > limits.label_name_length_limit > 0:
            return "label_name_length_limit_exceeded"
        if len(value) > limits.label_value_length_limit > 0:
            return "label_value_length_limit_exceeded"
        pairs.append((key, value))
    if wants_name and name is None:
        return "malformed_line"
    if len(pairs) > MAX_LABELS:
        return "too_many_labels"
    if len(pairs) > limits.label_limit > 0:
        return "label_limit_exceeded"
    pairs.sort()
    if any(pairs[i][0] == pairs[i + 1][0] for i in range(len(pairs) - 1)):
        return "malformed_labels"
    return (("__name__", name or ""), *pairs) if wants_name else tuple(pairs)


def _exemplar_ok(text: str, grammar: tuple[re.Pattern[str], ...], limits: Limits) -> bool:
    m = grammar[2].fullmatch(text)
    if m is None:
        return False
    labels = _labels(m.group(1), False, grammar, limits)
    return not isinstance(labels, str) and sum(len(k) + len(v) for k, v in labels) <= 128


def _diagnose(line: str) -> str:
    """Why a sample line did not match (only bad lines pay for this)."""
    rest = line.lstrip(" \t")
    head = re.match(rf"({_NAME})?+[ \t]*+", rest)
    rest = rest[head.end() :] if head else rest
    if rest[:1] == "{":
        return "malformed_labels"
    fields = rest.split("#", 1)[0].split()
    if not fields or len(fields) > 2 or (head and not head.group(1)):
        return "malformed_line"
    if not _VALUE.fullmatch(fields[0]):
        return "bad_value"
    return "bad_timestamp" if len(fields) == 2 else "malformed_line"


def escape_label_value(value: str) -> str:
    """Escape a label value for exposition output."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


_LEGACY_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def format_name(name: str, metric: bool = True) -> str:
    """A metric (or, with metric=False, label) name as exposition writes it: as it is when it is a
    classic name, else quoted (`"gen_ai.probe.ttft"`, the UTF-8 form Prometheus 3 and the parser
    above read; Prometheus 2.x refuses it, as it refuses the name unquoted)."""
    if (_LEGACY_METRIC if metric else _LEGACY_LABEL).fullmatch(name):
        return name
    return f'"{escape_label_value(name)}"'


def _label_items(labels: Labels) -> list[str]:
    return [f'{format_name(k, metric=False)}="{escape_label_value(v)}"' for k, v in labels]


def format_labels(labels: Labels) -> str:
    """`{a="1",b="2"}` (a UTF-8 label name quoted, `format_name`) or the empty string."""
    if not labels:
        return ""
    return "{" + ",".join(_label_items(labels)) + "}"


def format_series(name: str, labels: Labels) -> str:
    """`name{a="1"}`, or `{"dotted.name",a="1"}` for a UTF-8 metric name (its name inside the braces)."""
    quoted = format_name(name)
    if quoted == name:
        return name + format_labels(labels)
    return "{" + ",".join([quoted, *_label_items(labels)]) + "}"


def format_value(value: float) -> str:
    """Exposition spelling of a float (NaN, +Inf, -Inf, repr otherwise)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
