"""Span stitching: spans of one trace -> request records with queue / prefill / KV transfer / decode,
from vLLM's `llm_request` span, SGLang's request tree or a prefill/decode pair in one trace
(docs/requests.md §1 says which spans and attributes give each phase and label). Bounded:
`max_traces` open traces of `max_spans_per_trace` spans; a trace is finished `settle_s` after its
last span (a lone P/D half waits up to `ttl_s` for the other) and dropped, counted, after `ttl_s`
without a request span."""

from __future__ import annotations

import re
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvscope.agent.metricsets import HistogramSet
from kvscope.agent.traces.otlp import Span
from kvscope.core.signals import make_labels

PHASES = ("queue", "prefill", "kv_transfer", "decode")
TAP_SCOPE = "kvscope.tap"
"""Instrumentation scope of the request tap's spans (agent/tap/proxy.py)."""

_SGLANG_ROOT = re.compile(r"^\s*(?:(prefill|decode)\s+)?Req\s+\S+\s*$")
_TENANT_KEYS = ("kvscope.tenant", "tenant", "tenant.id", "enduser.id", "user.id")
_MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "kvscope.model")
_ROLE_KEYS = ("kvscope.role",)
_INSTANCE_KEYS = ("kvscope.instance",)


@dataclass(frozen=True)
class StitchConfig:
    """Bounds and labelling. `service_labels` maps a resource `service.name` to labels
    (instance, model, role, tenant) for engines that cannot set `kvscope.*` attributes."""

    max_traces: int = 10_000
    max_spans_per_trace: int = 512
    settle_s: float = 1.0
    ttl_s: float = 30.0
    service_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass
class PhaseObservation:
    """One phase of one request, attributed to the instance that ran it."""

    phase: str
    seconds: float
    instance: str | None
    role: str | None


@dataclass
class RequestRecord:
    """One stitched request. Absent numbers are None (the source lacked them)."""

    trace_id: str
    request_id: str | None
    engine: str  # vllm | sglang
    start_ns: int
    end_ns: int
    phases: list[PhaseObservation]
    tenant: str | None = None
    model: str | None = None
    instance: str | None = None  # the instance that produced the output (decode side for P/D)
    role: str | None = None  # prefill | decode | unified | pd
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    kv_transfer_source: str | None = None  # span | gap | None
    tapped: bool = False  # the trace holds the request tap's span (scope kvscope.tap)
    anchors: dict[str, Span] = field(default_factory=dict)  # role -> engine span (for re-export)

    def phase(self, name: str) -> float | None:
        vals = [p.seconds for p in self.phases if p.phase == name]
        return sum(vals) if vals else None


@dataclass
class _Trace:
    first_seen: float
    last_seen: float
    spans: list[Span] = field(default_factory=list)


class TraceStitcher:
    """Collects spans per trace and turns finished traces into `RequestRecord`s. Not thread-safe:
    the receiver calls it from its event loop only."""

    def __init__(self, config: StitchConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or StitchConfig()
        self._clock = clock
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self.dropped: Counter[str] = Counter()  # traces/spans dropped by reason

    def __len__(self) -> int:
        return len(self._traces)

    def add(self, spans: Iterable[Span]) -> list[RequestRecord]:
        """Buffer spans; returns records of traces pushed out by the max_traces bound."""
        now, out = self._clock(), []
        for span in spans:
            tr = self._traces.get(span.trace_id)
            if tr is None:
                if len(self._traces) >= self.config.max_traces:
                    out.extend(self._evict_oldest())
                tr = self._traces[span.trace_id] = _Trace(first_seen=now, last_seen=now)
            if len(tr.spans) >= self.config.max_spans_per_trace:
                self.dropped["span_limit"] += 1
                continue
            tr.spans.append(span)
            tr.last_seen = now
        return out

    def _evict_oldest(self) -> list[RequestRecord]:
        _, tr = self._traces.popitem(last=False)
        records = stitch_trace(tr.spans, self.config)
        self.dropped["evicted_complete" if records else "evicted_incomplete"] += 1
        return records

    def flush(self, force: bool = False) -> list[RequestRecord]:
        """Records of every trace that is done (all of them with `force`); expired traces are dropped."""
        now, out, done = self._clock(), [], []
        for tid, tr in self._traces.items():
            state = self._state(tr, now)
            if force or state != "open":
                done.append(tid)
                records = stitch_trace(tr.spans, self.config) if state != "expired" or force else []
                if not records:
                    self.dropped["no_request_span"] += 1
                out.extend(records)
        for tid in done:
            del self._traces[tid]
        return out

    def _state(self, tr: _Trace, now: float) -> str:
        roots = [_role_of(s, self.config) for s in tr.spans if _is_request_span(s)]
        if not roots:
            return "expired" if now - tr.first_seen >= self.config.ttl_s else "open"
        if now - tr.last_seen < self.config.settle_s:
            return "open"
        if roots in (["prefill"], ["decode"]) and now - tr.first_seen < self.config.ttl_s:
            return "open"  # one P/D half: the other instance's exporter may send its span later
        return "done"


def stitch_trace(spans: list[Span], config: StitchConfig | None = None) -> list[RequestRecord]:
    """Request records of one trace's spans: one per engine request span, or one per P/D pair."""
    cfg = config or StitchConfig()
    by_id = {s.span_id: s for s in spans}
    tenant = next((t for s in spans if (t := _attr(s, _TENANT_KEYS)) is not None), None)
    roots = [s for s in spans if _is_request_span(s)]
    records = _pair_pd([_single(s, _slices_of(s, spans, by_id), cfg) for s in roots])
    tapped = any(s.scope == TAP_SCOPE for s in spans)
    for r in records:
        r.tenant = r.tenant or (str(tenant) if tenant is not None else None)
        r.tapped = tapped
    return records


def _is_request_span(s: Span) -> bool:
    return s.name == "llm_request" or bool(_SGLANG_ROOT.match(s.name))


def _attr(s: Span, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if k in s.attributes:
            return s.attributes[k]
        if k in s.resource:
            return s.resource[k]
    return None


def _configured(s: Span, cfg: StitchConfig, key: str) -> str | None:
    return cfg.service_labels.get(str(s.resource.get("service.name", "")), {}).get(key)


def _role_of(s: Span, cfg: StitchConfig) -> str:
    if m := _SGLANG_ROOT.match(s.name):
        return m.group(1) or "unified"
    role = _attr(s, _ROLE_KEYS) or _configured(s, cfg, "role")
    return str(role) if role else "unified"


def _slices_of(root: Span, spans: list[Span], by_id: dict[str, Span]) -> list[Span]:
    """Descendants of an SGLang root (stage slices sit under per-thread spans). vLLM: none."""
    if root.name == "llm_request":
        return []
    out = []
    for s in spans:
        p, hops = s.parent_id, 0
        while p and p != root.span_id and p in by_id and hops < 16:
            p, hops = by_id[p].parent_id, hops + 1
        if p == root.span_id and not _is_request_span(s):
            out.append(s)
    return out


def _stage_class(name: str) -> str | None:
    n = name.strip().lower()
    if "(" in n or "[" in n:
        return None  # per-thread container span, not a stage
    if "transfer" in n or "bootstrap" in n:
        return "kv_transfer"
    if "waiting" in n or n.endswith("_queue"):
        return "queue"
    if n.startswith("prefill") or n == "chunked_prefill":
        return "prefill"
    if n.startswith("decode"):
        return "decode"
    return None


_LATENCY_ATTRS = {
    "queue": "gen_ai.latency.time_in_queue",
    "prefill": "gen_ai.latency.time_in_model_prefill",
    "decode": "gen_ai.latency.time_in_model_decode",
}


def _num(v: Any) -> float | None:
    try:
        return None if v is None or isinstance(v, bool) else float(v)
    except (TypeError, ValueError):
        return None


def _int(v: Any) -> int | None:
    return None if (f := _num(v)) is None else int(f)


def _single(s: Span, slices: list[Span], cfg: StitchConfig) -> RequestRecord:
    role = _role_of(s, cfg)
    instance = _attr(s, _INSTANCE_KEYS) or _configured(s, cfg, "instance") or s.resource.get("service.name")
    instance = str(instance) if instance else None
    sums: dict[str, float] = {}
    for sl in slices:
        if cls := _stage_class(sl.name):
            sums[cls] = sums.get(cls, 0.0) + sl.duration_s
    for phase, key in _LATENCY_ATTRS.items():
        if phase not in sums and (v := _num(s.attributes.get(key))) is not None:
            sums[phase] = v
    model = _attr(s, _MODEL_KEYS) or _configured(s, cfg, "model")
    return RequestRecord(
        trace_id=s.trace_id,
        request_id=_str(s.attributes.get("gen_ai.request.id") or s.attributes.get("rid")),
        engine="vllm" if s.name == "llm_request" else "sglang",
        start_ns=s.start_ns,
        end_ns=s.end_ns,
        phases=[PhaseObservation(p, sums[p], instance, role) for p in PHASES if p in sums],
        tenant=_configured(s, cfg, "tenant"),
        model=_str(model),
        instance=instance,
        role=role,
        ttft_s=_num(s.attributes.get("gen_ai.latency.time_to_first_token")),
        e2e_s=_num(s.attributes.get("gen_ai.latency.e2e")) or s.duration_s,
        prompt_tokens=_int(s.attributes.get("gen_ai.usage.prompt_tokens")),
        completion_tokens=_int(s.attributes.get("gen_ai.usage.completion_tokens")),
        cached_tokens=_int(s.attributes.get("gen_ai.usage.cached_tokens")),
        kv_transfer_source="span" if "kv_transfer" in sums else None,  # no latency attribute fills it
        anchors={role: s},
    )


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _pair_pd(records: list[RequestRecord]) -> list[RequestRecord]:
    """Merge one prefill-role and one decode-role record of a trace into a P/D request; two unlabelled
    spans (vLLM) pair by time, the one that ended first being the prefill half."""
    if len(records) == 2 and {r.role for r in records} <= {"unified"}:
        first, second = sorted(records, key=lambda r: r.end_ns)
        if first.end_ns <= second.end_ns and first.start_ns <= second.start_ns:
            for rec, role in ((first, "prefill"), (second, "decode")):
                rec.role = role
                for p in rec.phases:
                    p.role = role
    pre = [r for r in records if r.role == "prefill"]
    dec = [r for r in records if r.role == "decode"]
    if len(pre) != 1 or len(dec) != 1:
        return records
    return [r for r in records if r.role not in ("prefill", "decode")] + [_merge(pre[0], dec[0])]


def _merge(p: RequestRecord, d: RequestRecord) -> RequestRecord:
    """One P/D request: the prefill side's queue and prefill, the KV transfer, the decode side's prefill
    (its first step, where a synchronous connector reads the KV) and decode. The decode side's queue
    time belongs to the transfer gap."""
    pre_side = [o for o in p.phases if o.phase in ("queue", "prefill", "kv_transfer")]
    transfer = [o for o in d.phases if o.phase == "kv_transfer"]
    dec_side = [o for o in d.phases if o.phase in ("prefill", "decode")]
    source = "span" if "span" in (p.kv_transfer_source, d.kv_transfer_source) else None
    if source is None:
        d_run = d.start_ns + int((d.phase("queue") or 0.0) * 1e9)
        transfer = [PhaseObservation("kv_transfer", max(0, d_run - p.end_ns) / 1e9, d.instance, "decode")]
        source = "gap"
    phases = (
        sorted(pre_side, key=lambda o: PHASES.index(o.phase))
        + transfer
        + sorted(dec_side, key=lambda o: PHASES.index(o.phase))
    )
    return RequestRecord(
        trace_id=p.trace_id,
        request_id=d.request_id or p.request_id,
        engine=d.engine,
        start_ns=min(p.start_ns, d.start_ns),
        end_ns=max(p.end_ns, d.end_ns),
        phases=phases,
        tenant=p.tenant or d.tenant,
        model=d.model or p.model,
        instance=d.instance,
        role="pd",
        ttft_s=None if d.ttft_s is None else (d.start_ns - p.start_ns) / 1e9 + d.ttft_s,
        e2e_s=(max(p.end_ns, d.end_ns) - min(p.start_ns, d.start_ns)) / 1e9,
        prompt_tokens=p.prompt_tokens if p.prompt_tokens is not None else d.prompt_tokens,
        completion_tokens=d.completion_tokens,
        cached_tokens=p.cached_tokens if p.cached_tokens is not None else d.cached_tokens,
        kv_transfer_source=source,
        anchors={**p.anchors, **d.anchors},
    )


def observe_phases(phases: HistogramSet, record: RequestRecord) -> None:
    """Count a stitched request's phases in `request_phase_seconds` (absent labels left out)."""
    for obs in record.phases:
        lab = {"phase": obs.phase, "engine": record.engine}
        lab |= {k: v for k, v in (("instance", obs.instance), ("role", obs.role), ("model", record.model)) if v}
        phases.observe(make_labels(lab), obs.seconds)
