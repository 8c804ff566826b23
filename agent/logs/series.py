"""Recognised log lines -> canonical samples, one snapshot per engine stream (instance, engine, DP
rank) and log time: what a scrape then would have read, token counters integrated from the logged
rates, preemptions summed from the warnings (docs/logs.md, "What a line gives", has each source and
rule). A signal no line carries is absent, never zero; counters start at 0 at the stream's first line."""

from __future__ import annotations

import calendar
import datetime
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Protocol

from kvscope.agent.logs.lines import MAX_LINE, Line, parse_line
from kvscope.core.signals import Sample, make_labels

MAX_RECORDS = 500_000
"""Recognised lines kept per read (about 1.7 KiB of samples each); the rest are counted (over_limit)."""
UNTIMED_SPACING_S = 10.0
"""Seconds between consecutive lines of a log no line of which carries a time: vLLM's default stats
interval (VLLM_LOG_STATS_INTERVAL). An assumption, said in the summary, never the engine's time."""
MAX_UNKNOWN = 64
"""Distinct unknown field names counted by name (outside text: bounded)."""
GAUGES = {
    "running": "engine_requests_running",
    "waiting": "engine_requests_waiting",
    "kv": "engine_kv_cache_usage_ratio",
    "prefix_hit": "engine_prefix_cache_hit_ratio",
    "spec_len": "engine_spec_accept_length_tokens",
}
COUNTERS = {
    "prompt": "engine_prompt_tokens_total",
    "gen": "engine_generation_tokens_total",
    "queries": "engine_prefix_cache_queries_tokens_total",
    "hits": "engine_prefix_cache_hits_tokens_total",
    "preempt": "engine_preemptions_total",
    "spec_acc": "engine_spec_accepted_tokens_total",
    "spec_draft": "engine_spec_draft_tokens_total",
    "spec_drafts": "engine_spec_drafts_total",
    "xfer_n": "kv_transfer_seconds_count",
    "xfer_s": "kv_transfer_seconds_sum",
    "xfer_bytes_n": "kv_transfer_bytes_count",
    "xfer_bytes": "kv_transfer_bytes_sum",
    "xfer_fail": "kv_transfer_failures_total",
    "xfer_expired": "kv_transfer_expired_requests_total",
    "xfer_late": "kv_transfer_notifications_after_expiry_total",
    "lookup": "kv_tier_lookup_tokens_total",
    "hit": "kv_tier_hit_tokens_total",
    "loaded": "kv_tier_loaded_tokens_total",
    "stored": "kv_tier_stored_tokens_total",
    "offload_load_bytes": "engine_kv_offload_load_bytes_total",
    "offload_store_bytes": "engine_kv_offload_store_bytes_total",
    "offload_load_s": "engine_kv_offload_load_seconds_total",
    "offload_alloc_fail": "kv_tier_failures_total",
}
SAMPLE_LABELS = {"kv_tier_failures_total": {"tier": "cpu", "op": "allocate"}}
"""Labels a counter carries beyond its stream's: vLLM's offload allocation failures are the CPU
tier's failed allocations, as the catalog labels `vllm:kv_offload_allocation_failure`."""
SUMMED = {
    "spec": ("spec_acc", "spec_draft"),
    "kvxfer": (
        "xfer_fail",
        "xfer_expired",
        "xfer_late",
        "offload_load_bytes",
        "offload_store_bytes",
        "offload_load_s",
        "offload_alloc_fail",
    ),
    "xferevent": ("xfer_expired", "xfer_late"),
    "lookup": ("lookup", "hit"),
    "retrieve": ("loaded",),
    "store": ("stored",),
}
"""Line kind -> the fields that are counts since the previous line of that kind (or per request),
summed into counters as printed: exact, no rate integrated."""
ROLL = {
    "year": (183 * 86400, lambda d: d.replace(year=d.year + 1, day=min(d.day, 28))),
    "date": (43200, lambda d: d + datetime.timedelta(days=1)),
}
"""What a line's own time lacks -> (how far back it must fall to roll over, the next day to try)."""
ROLL_AHEAD_S = {"year": 31 * 86400, "date": 43200}
"""A roll is taken only when the rolled time lands at most this far after the newest line (a
dormant engine's gap); further on, the line is not a new year or day but a log out of order."""
JUMP_S = 31 * 86400.0
"""A line of one stream later than that stream's newest by more than this (a dormant engine's
longest plausible silence, as ROLL_AHEAD_S says for a year's roll) is no time of the same run:
counted (`LogSummary.jumps`), and a log with such lines is refused by the commands
(`LogSummary.jump_error`), never read as a window of years that held nothing."""
BACKWARDS_S = 60.0
"""A line of one stream (pod, engine, rank) earlier than that stream's newest by more than this is
out of order beyond jitter: skipped and counted (`time_backwards`), never rolled."""
HELP = {
    "engine_prompt_tokens_total": "From engine log lines: vLLM's logged prompt tokens/s integrated over "
    "the interval between stats lines; SGLang: #new-token + #cached-token.",
    "engine_generation_tokens_total": "From engine log lines: the logged generation tokens/s integrated "
    "over the interval between stats lines.",
}


@dataclass
class LogSummary:
    """What a read saw: lines, recognised lines by format, skipped lines by reason."""

    lines: int = 0
    formats: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    unknown_fields: Counter[str] = field(default_factory=Counter)
    untimed: int = 0  # lines given times by their order (no line of the log carries a time)
    backwards_s: float = 0.0  # the furthest a skipped line went back in time
    jumps: int = 0  # lines later than the newest of their stream by more than JUMP_S
    jump_s: float = 0.0  # the furthest such a line jumped ahead

    def warnings(self) -> list[str]:
        """What the user must hear even with -q: lines whose time ran backwards."""
        n = self.skipped.get("time_backwards", 0)
        if not n:
            return []
        span = _span(self.backwards_s)
        return [
            f"{n} log line(s) went back in time by more than {BACKWARDS_S:g} s (up to {span}) against the "
            "lines before them from the same engine: skipped, not read as a new day or year. Is the log "
            "several runs or files joined out of order? Sort it by time or split it."
        ]

    def jump_error(self) -> str | None:
        """Why the log cannot be diagnosed when lines jumped ahead past JUMP_S (`jumps`), else
        None: its times are not one run's, and the window they span was never read."""
        n = self.jumps
        if not n:
            return None
        return (
            f"{n} line(s) jump ahead by more than {JUMP_S / 86400:g} days (up to {_span(self.jump_s)}) from the "
            "lines before them from the same engine: the log's times are not one run's, and a window that long "
            "would be judged on lines it never held. Check the log's timestamps, or split it where they jump "
            "and read each part"
        )

    def text(self) -> str:
        seen = ", ".join(f"{n} {k}" for k, n in sorted(self.formats.items())) or "none"
        out = f"log: {self.lines} lines read; recognised: {seen}"
        out += f"; {self.skipped.get('other', 0)} other lines (not engine stats)"
        bad = {k: n for k, n in self.skipped.items() if k != "other"}
        if bad:
            out += "; skipped: " + ", ".join(f"{n} {k}" for k, n in sorted(bad.items()))
        if self.unknown_fields:
            out += "; unknown fields (ignored): " + ", ".join(
                f"{k!r} x{n}" for k, n in self.unknown_fields.most_common(8)
            )
        if self.untimed:
            out += (
                f"; times unknown: no line carries a time, so the {self.untimed} recognised lines are ordered as "
                f"printed and placed {UNTIMED_SPACING_S:g} s apart (an assumption): durations and rates are not "
                "the engine's, levels (KV usage, queues, running requests) are"
            )
        return out


def _span(seconds: float) -> str:
    """A time span as people say it: 3.2 years, 4.5 days, 2.0 h, 40 s."""
    if seconds >= 365 * 86400:
        return f"{seconds / (365.25 * 86400):,.1f} years"
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds:,.0f} s"


@dataclass
class LogRead:
    """The canonical series of a log: `scrapes` as (instance, time, samples), time-ordered per instance."""

    job: str
    scrapes: list[tuple[str, float, list[Sample]]]
    summary: LogSummary


class LineStream(Protocol):
    """What `iter_lines` reads: a binary file, plain or gzip."""

    def readline(self, size: int, /) -> bytes: ...


def iter_lines(stream: LineStream, max_bytes: int) -> Iterator[str | None]:
    """Decoded lines of a binary stream (line ends stripped); None for a line over `max_bytes`,
    which is skipped in bounded reads, never held whole."""
    limit = max_bytes + 1
    while chunk := stream.readline(limit):
        if len(chunk) == limit and not chunk.endswith(b"\n"):
            while (more := stream.readline(limit)) and not more.endswith(b"\n"):
                pass
            yield None
            continue
        yield chunk.decode("utf-8", "replace").rstrip("\r\n")


def read_log(
    stream: IO[bytes], instance: str, job: str = "engine", model: str | None = None, day: datetime.date | None = None
) -> LogRead:
    """Parse a whole log. `day`: the date of lines whose own time lacks it (vLLM's MM-DD has no
    year, SGLang before its dated format has only HH:MM:SS; default: today, UTC). A line earlier
    than the newest one by over half a year (vLLM) or half a day (SGLang) moves on a year / day."""
    summary = LogSummary()
    day = day or datetime.datetime.now(datetime.UTC).date()
    streams: Streams = defaultdict(list)
    kept, newest = 0, 0.0
    untimed: list[Line] = []  # recognised lines without a time, in printed order
    newest_of: dict[str, float] = {}  # per stream source (pod or the log's instance)
    for text in iter_lines(stream, MAX_LINE * 4):  # UTF-8: up to 4 bytes a character
        summary.lines += 1
        if text is None:
            summary.skipped["too_long"] += 1
            continue
        got = parse_line(text, day)
        if isinstance(got, Line) and got.missing == "time":
            if len(untimed) < MAX_RECORDS:
                untimed.append(got)
            else:
                summary.skipped["over_limit"] += 1
            continue
        if isinstance(got, Line) and got.missing and got.ts < newest - ROLL[got.missing][0]:
            ahead = ROLL[got.missing][1](day)
            again = parse_line(text, ahead)
            if isinstance(again, Line) and again.ts <= newest + ROLL_AHEAD_S[got.missing]:
                day, got = ahead, again
        if isinstance(got, str):
            summary.skipped[got] += 1
            continue
        last = newest_of.get(got.source or instance)
        if last is not None and got.ts < last - BACKWARDS_S:
            summary.skipped["time_backwards"] += 1
            summary.backwards_s = max(summary.backwards_s, last - got.ts)
            continue
        if last is not None and got.ts > last + JUMP_S:
            summary.jumps += 1
            summary.jump_s = max(summary.jump_s, got.ts - last)
        newest_of[got.source or instance] = max(last or got.ts, got.ts)
        if kept >= MAX_RECORDS:
            summary.skipped["over_limit"] += 1
            continue
        kept, newest = kept + 1, max(newest, got.ts)
        summary.formats[_format(got)] += 1
        for name in got.unknown:  # at most MAX_UNKNOWN names kept, the rest counted together
            summary.unknown_fields[
                name if name in summary.unknown_fields or len(summary.unknown_fields) < MAX_UNKNOWN else "(others)"
            ] += 1
        streams[(got.source or instance, got.engine, got.rank)].append(got)
    _place_untimed(untimed, streams, day, instance, summary)
    return LogRead(job=job, scrapes=_scrapes(streams, job, model, summary), summary=summary)


Streams = dict[tuple[str, str, str], list[Line]]
"""(instance, engine, rank) -> that stream's lines in log order."""


def _place_untimed(
    untimed: list[Line], streams: Streams, day: datetime.date, instance: str, summary: LogSummary
) -> None:
    """In place: the lines without a time, ordered as printed from the start of `day` when no
    line of the log has a time (an excerpt without headers); else counted as no_timestamp."""
    if untimed and not streams:  # an excerpt without headers: order as printed, times assumed
        t0 = float(calendar.timegm(day.timetuple()))
        for k, got in enumerate(untimed):
            got = got._replace(ts=t0 + k * UNTIMED_SPACING_S, missing="")
            summary.formats[_format(got)] += 1
            streams[(got.source or instance, got.engine, got.rank)].append(got)
        summary.untimed = len(untimed)
    elif untimed:  # the log has times: a line without one is not placed by guess
        summary.skipped["no_timestamp"] += len(untimed)


def _scrapes(
    streams: Streams, job: str, model: str | None, summary: LogSummary
) -> list[tuple[str, float, list[Sample]]]:
    """The streams' snapshots as scrapes: (instance, time, samples), in time order per instance."""
    by_time: dict[tuple[str, float], list[Sample]] = defaultdict(list)
    for (inst, engine, rank), lines in streams.items():
        base = (
            {"instance": inst, "job": job, "engine": engine}
            | ({"model": model} if model else {})
            | ({"dp_rank": rank} if rank else {})
            | ({"tier": "lmcache"} if engine == "lmcache" else {})  # kv_tier_* carry the tier
        )
        for ts, values in _snapshots(lines, summary):
            by_time[(inst, ts)].extend(
                Sample(n, make_labels(base | SAMPLE_LABELS.get(n, {})), v, ts) for n, v in values.items()
            )
    return [(inst, ts, samples) for (inst, ts), samples in sorted(by_time.items())]


def _format(line: Line) -> str:
    other = {
        "spec": "vLLM SpecDecoding lines",
        "spec0": "vLLM V0 Speculative metrics lines",
        "lookup": "LMCache lookup lines",
        "retrieve": "LMCache retrieve lines",
        "store": "LMCache store lines",
        "xferevent": "vLLM NIXL expired-lease lines",
    }
    if line.kind == "kvxfer":
        f = line.fields
        connector = "Mooncake" if "xfer_fail_recv" in f else "NIXL" if "xfer_n" in f else "offloading"
        return f"vLLM KV Transfer ({connector}) lines"
    if line.kind in other:
        return other[line.kind]
    if line.engine == "sglang":
        return "SGLang " + ("retraction warnings" if line.kind == "retract" else f"{line.kind} lines")
    if line.kind == "stats":
        return "vLLM V0 stats lines" if "swapped" in line.fields else "vLLM V1 stats lines"
    return "vLLM V0 preemption warnings" if line.kind == "preempt" else "vLLM V0 prefix-cache lines"


def _snapshots(lines: list[Line], summary: LogSummary) -> list[tuple[float, dict[str, float]]]:
    """Per log time of one stream, the gauges and counters a scrape then would have read."""
    kinds = {ln.kind for ln in lines}
    keys = set().union(*(ln.fields for ln in lines))
    stats_ts = [ln.ts for ln in lines if ln.kind == "stats"]
    gaps = [b - a for a, b in zip(stats_ts, stats_ts[1:], strict=False) if b > a]
    cap = statistics.median(gaps) if len(gaps) >= 2 else float("inf")
    counters = _counters_kept(lines, kinds, keys)
    # the `KV Transfer metrics:` line counts the per-request expiry lines' events too: one source
    aggregated = set().union(*(ln.fields for ln in lines if ln.kind == "kvxfer"))
    gauges: dict[str, float] = {}
    last: dict[str, float] = {}  # kind -> time of the previous line of that kind
    out: dict[float, dict[str, float]] = {}  # one snapshot per time: the last line's values
    for ln in lines:
        if out and ln.ts < next(reversed(out)):
            summary.skipped["out_of_order"] += 1
            continue
        f = {} if ln.kind == "xferevent" and ln.fields.keys() & aggregated else ln.fields
        gauges.update((k, f[k]) for k in GAUGES if k in f)
        dt = ln.ts - last[ln.kind] if ln.kind in last else 0.0
        last[ln.kind] = ln.ts
        _advance(ln.kind, f, min(dt, cap) if ln.kind == "stats" else dt, counters, gauges)
        if values := {GAUGES[k]: v for k, v in gauges.items()} | {COUNTERS[k]: v for k, v in counters.items()}:
            out[round(ln.ts, 3)] = values
    return list(out.items())


def _counters_kept(lines: list[Line], kinds: set[str], keys: set[str]) -> dict[str, float]:
    """The counters this stream's lines can feed, each from 0 (a counter none of them feed is absent)."""
    counters: dict[str, float] = {}
    if "stats" in kinds:
        counters |= {
            k: 0.0 for k, f in (("prompt", "prompt_tps"), ("gen", "gen_tps"), ("preempt", "preempt_n")) if f in keys
        }
    if "prefill" in kinds and "new" in keys:
        counters |= {"prompt": 0.0} | ({"queries": 0.0, "hits": 0.0} if "cached" in keys else {})
    if "decode" in kinds and "gen_tps" in keys:
        counters["gen"] = 0.0
    for kind, fields in SUMMED.items():
        if kind in kinds:
            counters |= {k: 0.0 for k in fields if k in keys}
    if "kvxfer" in kinds and "xfer_n" in keys:  # the transfer histograms' _count and _sum
        counters |= {"xfer_n": 0.0} | ({"xfer_s": 0.0} if "xfer_s" in keys else {})
        counters |= {"xfer_bytes_n": 0.0, "xfer_bytes": 0.0} if "xfer_bytes" in keys else {}
    if "retract" in kinds or next((ln.fields["preempt_total"] for ln in lines if ln.kind == "preempt"), None) == 1:
        counters["preempt"] = 0.0
    return counters


def _advance(kind: str, f: dict[str, float], dt: float, counters: dict[str, float], gauges: dict[str, float]) -> None:
    """In place: the counters (and the prefix-hit gauge) after one line of `kind` with fields `f`,
    `dt` seconds after the previous line of its kind (a stats line's rates count over dt)."""
    if kind == "stats":
        _stats(f, dt, counters)
    elif kind == "preempt":
        counters["preempt"] = max(counters.get("preempt", 0.0), f["preempt_total"])
    elif kind == "prefill" and "new" in f:
        _prefill(f, counters, gauges)
    elif kind == "decode" and "gen" in counters:
        counters["gen"] += f.get("gen_tps", 0.0) * dt
    elif kind == "retract":
        counters["preempt"] += f["retracted"]
    elif kind == "kvxfer":
        _transfers(f, counters)
    elif kind == "spec0":
        _spec_totals(f, counters)
    for key in SUMMED.get(kind, ()):
        if key in counters:
            counters[key] += f.get(key, 0.0)


def _spec_totals(f: dict[str, float], counters: dict[str, float]) -> None:
    """vLLM V0's `Speculative metrics:` line: totals since the engine started, so each is the
    counter's value, not an increase (a fall is a restart, undone by the rate's reset handling).
    The counters appear at the first such line, never from 0 before it (that would count the
    engine's whole past as one interval). Draft rounds: draft tokens / k, as V0's own system
    efficiency counts the speculated sequences (vllm/spec_decode/metrics.py)."""
    for key, field_ in (("spec_acc", "spec_acc_total"), ("spec_draft", "spec_draft_total")):
        if field_ in f:
            counters[key] = f[field_]
    if "spec_draft_total" in f and f.get("spec_k", 0.0) >= 1:
        counters["spec_drafts"] = f["spec_draft_total"] / f["spec_k"]


def _stats(f: dict[str, float], dt: float, counters: dict[str, float]) -> None:
    """A vLLM stats line: its prompt and generation throughputs over `dt`, and its preemptions."""
    for key, field_ in (("prompt", "prompt_tps"), ("gen", "gen_tps")):
        if key in counters:
            counters[key] += f.get(field_, 0.0) * dt
    if "preempt" in counters:
        counters["preempt"] += f.get("preempt_n", 0.0)


def _transfers(f: dict[str, float], counters: dict[str, float]) -> None:
    """A NIXL or Mooncake line: its transfer count, and their time and bytes as count x the printed
    mean (the offloading connector's counts are summed as SUMMED says)."""
    n = f.get("xfer_n", 0.0)
    if "xfer_fail" in counters:  # Mooncake's failed receives are failed transfers too (summed after this)
        counters["xfer_fail"] += f.get("xfer_fail_recv", 0.0)
    if "xfer_n" in counters:
        counters["xfer_n"] += n
    if "xfer_s" in counters:
        counters["xfer_s"] += n * f.get("xfer_s", 0.0)
    if "xfer_bytes" in counters:
        counters["xfer_bytes_n"] += n
        counters["xfer_bytes"] += n * f.get("xfer_bytes", 0.0)


def _prefill(f: dict[str, float], counters: dict[str, float], gauges: dict[str, float]) -> None:
    """A prefill line: its new and cached prompt tokens, and the prefix-hit share when it says both."""
    counters["prompt"] += f["new"] + f.get("cached", 0.0)
    if "queries" in counters:
        counters["queries"] += f["new"] + f.get("cached", 0.0)
        counters["hits"] += f.get("cached", 0.0)
    if f["new"] + f.get("cached", 0.0) > 0 and "cached" in f:
        gauges["prefix_hit"] = f["cached"] / (f["new"] + f["cached"])
