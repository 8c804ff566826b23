"""Span stitching on spans shaped like the real vLLM / SGLang ones (engine-metrics.md §1.8, §2.7)."""

import pytest

from kvscope.agent.traces.export import encode_spans, render_phase_spans
from kvscope.agent.traces.otlp import Span, parse_otlp_traces
from kvscope.agent.traces.stitch import StitchConfig, TraceStitcher, stitch_trace

T = "4bf92f3577b34da6a3ce929d0e0e4736"
S = 1_795_324_915_000_000_000  # a unix-ns origin
MS = 1_000_000


def llm_request(span_id, start_ms, dur_ms, queue, prefill, decode, ttft, service="vllm", parent="", **attrs):
    a = {
        "gen_ai.latency.time_to_first_token": ttft,
        "gen_ai.latency.e2e": dur_ms / 1000,
        "gen_ai.latency.time_in_queue": queue,
        "gen_ai.latency.time_in_model_prefill": prefill,
        "gen_ai.latency.time_in_model_decode": decode,
        "gen_ai.latency.time_in_model_inference": prefill + decode,
        "gen_ai.request.id": "cmpl-" + span_id[:6],
        "gen_ai.usage.prompt_tokens": 707,
        "gen_ai.usage.completion_tokens": 8,
        "gen_ai.request.max_tokens": 8,
        **attrs,
    }
    return Span(
        T,
        span_id,
        parent,
        "llm_request",
        2,
        S + start_ms * MS,
        S + (start_ms + dur_ms) * MS,
        a,
        {"service.name": service, "vllm.instrumenting_module_name": "vllm.llm_engine"},
        "vllm.tracing.otel",
    )


def child(name, span_id, parent, start_ms, dur_ms, **attrs):
    return Span(
        T,
        span_id,
        parent,
        name,
        1,
        S + start_ms * MS,
        S + (start_ms + dur_ms) * MS,
        attrs,
        {"service.name": "sglang"},
        "sglang",
    )


def test_vllm_llm_request_gives_queue_prefill_decode_and_usage():
    tap_root = Span(
        T,
        "00f067aa0ba902b7",
        "",
        "POST /v1/completions",
        2,
        S,
        S + 70 * MS,
        {"kvscope.tenant": "acme"},
        {"service.name": "kvscope-tap"},
    )
    span = llm_request("90780fd5c60faf09", 1, 62, 0.004, 0.010, 0.046, 0.016, parent="00f067aa0ba902b7")
    [rec] = stitch_trace([tap_root, span])
    assert rec.engine == "vllm" and rec.role == "unified" and rec.tenant == "acme"
    assert (rec.phase("queue"), rec.phase("prefill"), rec.phase("decode")) == (0.004, 0.010, 0.046)
    assert rec.phase("kv_transfer") is None
    assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (707, 8, None)
    assert rec.ttft_s == 0.016 and rec.instance == "vllm" and rec.request_id == "cmpl-90780f"


def _sglang_pd_trace():
    # prefill server: root, per-thread span, stage slices; decode server likewise (one trace via traceparent)
    return [
        child(
            "prefill Req 1a2b3c4d",
            "a000000000000001",
            "",
            0,
            40,
            rid="1a2b3c4d5e",
            bootstrap_room=7,
            module="sglang::request",
            **{"gen_ai.usage.prompt_tokens": 512, "gen_ai.usage.cached_tokens": 384},
        ),
        child(
            "Scheduler [TP 0] [PP 0] [DP 0] (host:h1 | pid:11)",
            "a000000000000002",
            "a000000000000001",
            0,
            40,
            tp_rank=0,
            thread_label="Scheduler",
        ),
        child("prefill_waiting", "a000000000000003", "a000000000000002", 0, 5),
        child("prefill_forward", "a000000000000004", "a000000000000002", 5, 12),
        child("chunked_prefill", "a000000000000005", "a000000000000002", 17, 8),
        child("prefill_transfer_kv_cache", "a000000000000006", "a000000000000002", 25, 15),
        child(
            "decode Req 1a2b3c4d",
            "b000000000000001",
            "",
            2,
            120,
            rid="1a2b3c4d5e",
            bootstrap_room=7,
            **{"gen_ai.usage.completion_tokens": 64, "gen_ai.latency.time_to_first_token": 0.045},
        ),
        child("Scheduler [TP 0] [PP 0] [DP 1] (host:h2 | pid:22)", "b000000000000002", "b000000000000001", 2, 120),
        child("decode_loop", "b000000000000003", "b000000000000002", 42, 80),
    ]


def test_sglang_pd_pair_uses_stage_slices_and_the_explicit_transfer_span():
    cfg = StitchConfig(service_labels={"sglang": {"model": "qwen"}})
    [rec] = stitch_trace(_sglang_pd_trace(), cfg)
    assert rec.engine == "sglang" and rec.role == "pd" and rec.model == "qwen"
    assert rec.phase("queue") == pytest.approx(0.005)
    assert rec.phase("prefill") == pytest.approx(0.020)
    assert rec.phase("kv_transfer") == pytest.approx(0.015) and rec.kv_transfer_source == "span"
    assert rec.phase("decode") == pytest.approx(0.080)
    assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens) == (512, 384, 64)
    assert rec.ttft_s == pytest.approx(0.047)
    assert rec.e2e_s == pytest.approx(0.122)
    roles = {p.phase: p.role for p in rec.phases}
    assert roles == {"queue": "prefill", "prefill": "prefill", "kv_transfer": "prefill", "decode": "decode"}


def test_vllm_pd_pair_measures_the_kv_transfer_gap():
    cfg = StitchConfig(
        service_labels={
            "vllm-p": {"role": "prefill", "instance": "p:8000"},
            "vllm-d": {"role": "decode", "instance": "d:8000"},
        }
    )
    pre = llm_request("1000000000000001", 0, 30, 0.002, 0.025, 0.0, 0.027, service="vllm-p")
    # decode request arrives 3 ms after prefill ended and waits 7 ms for the remote KV (in its queue)
    dec = llm_request("2000000000000001", 33, 90, 0.007, 0.001, 0.080, 0.009, service="vllm-d")
    [rec] = stitch_trace([dec, pre], cfg)
    assert rec.role == "pd" and rec.kv_transfer_source == "gap"
    assert rec.phase("kv_transfer") == pytest.approx(0.010)
    assert rec.phase("queue") == pytest.approx(0.002) and rec.phase("decode") == pytest.approx(0.080)
    assert rec.instance == "d:8000"
    # the decode instance's first step (scheduled -> first token) stays, observed on the decode instance
    assert [(p.phase, p.instance, p.role, round(p.seconds, 6)) for p in rec.phases] == [
        ("queue", "p:8000", "prefill", 0.002),
        ("prefill", "p:8000", "prefill", 0.025),
        ("kv_transfer", "d:8000", "decode", 0.010),
        ("prefill", "d:8000", "decode", 0.001),
        ("decode", "d:8000", "decode", 0.080),
    ]
    assert rec.ttft_s == pytest.approx(0.042)


def test_unlabelled_vllm_pair_is_ordered_by_time():
    pre = llm_request("1000000000000001", 0, 30, 0.0, 0.025, 0.0, 0.027)
    dec = llm_request("2000000000000001", 31, 90, 0.0, 0.001, 0.080, 0.009)
    [rec] = stitch_trace([dec, pre])
    assert rec.role == "pd" and rec.phase("kv_transfer") == pytest.approx(0.001)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_stitcher_waits_to_settle_and_for_the_decode_half():
    clock = Clock()
    st = TraceStitcher(StitchConfig(settle_s=1.0, ttl_s=10.0), clock=clock)
    trace = _sglang_pd_trace()
    st.add(trace[:6])  # prefill half only
    clock.t = 5.0
    assert st.flush() == [] and len(st) == 1
    st.add(trace[6:])
    clock.t = 5.5
    assert st.flush() == []  # not settled yet
    clock.t = 6.6
    [rec] = st.flush()
    assert rec.role == "pd" and len(st) == 0


def test_a_decode_half_that_arrives_first_waits_for_its_prefill_half():
    # two engines, two BatchSpanProcessors: the decode instance's batch can be exported first
    clock = Clock()
    cfg = StitchConfig(
        settle_s=1.0, ttl_s=10.0, service_labels={"vllm-p": {"role": "prefill"}, "vllm-d": {"role": "decode"}}
    )
    st = TraceStitcher(cfg, clock=clock)
    st.add([llm_request("2000000000000001", 33, 90, 0.007, 0.001, 0.080, 0.009, service="vllm-d")])
    clock.t = 4.0
    assert st.flush() == [] and len(st) == 1
    st.add([llm_request("1000000000000001", 0, 30, 0.002, 0.025, 0.0, 0.027, service="vllm-p")])
    clock.t = 5.1
    [rec] = st.flush()
    assert rec.role == "pd" and rec.phase("kv_transfer") == pytest.approx(0.010)
    st.add([llm_request("3000000000000001", 0, 90, 0.0, 0.001, 0.080, 0.009, service="vllm-d")])
    clock.t = 15.2  # no prefill half within ttl_s: the decode half alone
    [alone] = st.flush()
    assert alone.role == "decode" and alone.phase("kv_transfer") is None and len(st) == 0


def test_stitcher_bounds_memory_and_counts_what_it_drops():
    clock = Clock()
    st = TraceStitcher(StitchConfig(max_traces=3, max_spans_per_trace=2, ttl_s=5.0), clock=clock)
    for i in range(5):
        st.add([Span(f"{i:032x}", "0" * 15 + "1", "", "GET /", 2, S, S + MS, {}, {})])
    assert len(st) == 3 and st.dropped["evicted_incomplete"] == 2
    st.add([Span(f"{4:032x}", f"{j:016x}", "", "x", 1, S, S, {}, {}) for j in range(3)])
    assert st.dropped["span_limit"] == 2
    clock.t = 6.0
    assert st.flush() == [] and len(st) == 0 and st.dropped["no_request_span"] == 3


def test_phase_spans_render_back_to_back_and_encode_to_otlp():
    cfg = StitchConfig(service_labels={"vllm-p": {"role": "prefill"}, "vllm-d": {"role": "decode"}})
    pre = llm_request("1000000000000001", 0, 30, 0.002, 0.025, 0.0, 0.027, service="vllm-p")
    dec = llm_request("2000000000000001", 33, 90, 0.007, 0.001, 0.080, 0.009, service="vllm-d")
    [rec] = stitch_trace([pre, dec], cfg)
    spans = render_phase_spans(rec)
    assert [s.name for s in spans] == [
        "phase queue",
        "phase prefill",
        "phase kv_transfer",
        "phase prefill",
        "phase decode",
    ]
    assert [s.parent_id for s in spans] == [pre.span_id] * 2 + [dec.span_id] * 3
    assert spans[2].start_ns == pre.end_ns and spans[2].end_ns == pre.end_ns + 10 * MS
    assert spans[3].start_ns == spans[2].end_ns and spans[4].start_ns == spans[3].end_ns == spans[2].end_ns + MS
    assert len({s.span_id for s in spans}) == 5
    decoded = parse_otlp_traces(encode_spans(spans), "application/x-protobuf")
    assert [(s.name, s.attributes["kvscope.phase"]) for s in decoded] == [
        (s.name, s.attributes["kvscope.phase"]) for s in spans
    ]
