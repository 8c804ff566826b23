"""OTLP payload decoding: protobuf, JSON, gzip, malformed bodies, size cap."""

import gzip
import json

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from kvscope.agent.traces.export import encode_spans
from kvscope.agent.traces.otlp import OtlpDecodeError, Span, decompress, parse_otlp_traces

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _vllm_span():
    # shaped exactly like the llm_request span a real vLLM 0.32 exported (research/vllm-cpu-probe.md §7)
    return Span(
        TRACE,
        "90780fd5c60faf09",
        "00f067aa0ba902b7",
        "llm_request",
        2,
        1795324915778555136,
        1795324915841462185,
        {
            "gen_ai.latency.time_to_first_token": 0.016108036041259766,
            "gen_ai.latency.e2e": 0.06231379508972168,
            "gen_ai.latency.time_in_queue": 3.396099987185153e-05,
            "gen_ai.usage.prompt_tokens": 9,
            "gen_ai.usage.completion_tokens": 16,
            "gen_ai.latency.time_in_model_prefill": 0.01016429500009508,
            "gen_ai.request.id": "chatcmpl-9689f1480858b2cd",
            "gen_ai.request.n": 1,
        },
        {"service.name": "vllm-fixture", "vllm.process_id": "31468"},
        "",
    )


def test_protobuf_round_trip_keeps_ids_times_and_typed_attributes():
    body = encode_spans([_vllm_span()])
    [s] = parse_otlp_traces(body, "application/x-protobuf")
    assert (s.trace_id, s.span_id, s.parent_id, s.name, s.kind) == (
        TRACE,
        "90780fd5c60faf09",
        "00f067aa0ba902b7",
        "llm_request",
        2,
    )
    assert s.start_ns == 1795324915778555136
    assert s.attributes["gen_ai.usage.prompt_tokens"] == 9
    assert s.attributes["gen_ai.latency.time_in_queue"] == pytest.approx(3.396099987185153e-05)
    assert s.resource["service.name"] == "vllm-fixture"
    assert s.duration_s == pytest.approx(0.062907049)


def test_protobuf_arrays_and_kvlists_decode():
    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add(trace_id=bytes(16), span_id=b"\x01" * 8, name="x")
    arr = AnyValue()
    arr.array_value.values.add(string_value="stop")
    sp.attributes.append(KeyValue(key="gen_ai.response.finish_reasons", value=arr))
    [s] = parse_otlp_traces(req.SerializeToString(), "application/x-protobuf")
    assert s.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert s.parent_id == ""


def _json_body():
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "sglang"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "sglang"},
                        "spans": [
                            {
                                "traceId": TRACE.upper(),
                                "spanId": "00f067aa0ba902b7",
                                "name": "prefill Req 1a2b3c4d",
                                "kind": "SPAN_KIND_SERVER",
                                "startTimeUnixNano": "1000",
                                "endTimeUnixNano": "3000000",
                                "attributes": [
                                    {"key": "gen_ai.usage.cached_tokens", "value": {"intValue": "384"}},
                                    {"key": "bootstrap_room", "value": {"intValue": 7}},
                                    {"key": "ok", "value": {"boolValue": True}},
                                    {"key": "lat", "value": {"doubleValue": 0.5}},
                                ],
                            }
                        ],
                    }
                ],
            }
        ]
    }


def test_json_decodes_camel_case_string_ints_and_upper_hex():
    [s] = parse_otlp_traces(json.dumps(_json_body()).encode(), "application/json; charset=utf-8")
    assert s.trace_id == TRACE and s.kind == 2 and s.end_ns == 3_000_000
    assert s.attributes == {"gen_ai.usage.cached_tokens": 384, "bootstrap_room": 7, "ok": True, "lat": 0.5}
    assert s.resource == {"service.name": "sglang"} and s.scope == "sglang"


@pytest.mark.parametrize(
    "body,ctype,why",
    [
        (b"\xff\x00garbage", "application/x-protobuf", "protobuf"),
        (b"{not json", "application/json", "not JSON"),
        (b"[1, 2]", "application/json", "object"),
        (
            json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "abc", "spanId": "00"}]}]}]}).encode(),
            "application/json",
            "hex",
        ),
        (b"x", "text/plain", "content-type"),
        # found by bench/fuzz.py: a 400-digit time reached the stitcher and overflowed float()
        (
            json.dumps(
                {
                    "resourceSpans": [
                        {
                            "scopeSpans": [
                                {"spans": [{"traceId": "ab" * 16, "spanId": "cd" * 8, "startTimeUnixNano": "9" * 400}]}
                            ]
                        }
                    ]
                }
            ).encode(),
            "application/json",
            "out of range",
        ),
        (json.dumps(_json_body()).replace('"384"', '"' + "1" * 30 + '"').encode(), "application/json", "out of range"),
    ],
)
def test_malformed_payloads_raise_a_decode_error_with_the_reason(body, ctype, why):
    with pytest.raises(OtlpDecodeError, match=why):
        parse_otlp_traces(body, ctype)


def test_gzip_is_undone_and_bombs_are_refused():
    raw = encode_spans([_vllm_span()])
    assert decompress(gzip.compress(raw), "gzip", 1 << 20) == raw
    with pytest.raises(OtlpDecodeError, match="exceeds"):
        decompress(gzip.compress(b"\0" * (2 << 20)), "gzip", 1 << 20)
    with pytest.raises(OtlpDecodeError, match="bad gzip"):
        decompress(b"not gzip", "gzip", 1 << 20)
    with pytest.raises(OtlpDecodeError, match="unsupported"):
        decompress(raw, "br", 1 << 20)


def test_tap_spans_keep_their_scope_on_the_wire_so_the_receiver_does_not_count_them_twice():
    from kvscope.agent.traces.export import encode_spans
    from kvscope.agent.traces.otlp import Span, parse_otlp_traces
    from kvscope.agent.traces.stitch import TAP_SCOPE, stitch_trace
    from kvscope.agent.traces.tenants import TenantAccounting

    tid = "0af7651916cd43dd8448eb211c80319c"
    tap = Span(
        tid,
        "a" * 16,
        "",
        "POST /v1/chat/completions",
        2,
        1,
        5,
        {"kvscope.tenant": "acme"},
        {"service.name": "kvscope-tap"},
        TAP_SCOPE,
    )
    engine = Span(
        tid,
        "b" * 16,
        "a" * 16,
        "llm_request",
        2,
        2,
        4,
        {"gen_ai.usage.prompt_tokens": 7},
        {"service.name": "kvscope-tap"},
        "",
    )
    spans = parse_otlp_traces(encode_spans([tap, engine]), "application/x-protobuf")
    assert sorted(s.scope for s in spans) == ["kvscope.tap", "kvscope.traces.stitch"]
    [record] = stitch_trace(spans)
    assert record.tenant == "acme" and record.tapped
    acct = TenantAccounting()
    assert not acct.observe(record) and acct.stats["counted_by_tap"] == 1 and acct.render() == []
    [untapped] = stitch_trace([s for s in spans if s.scope != TAP_SCOPE] + [tap._replace(scope="other-proxy")])
    assert acct.observe(untapped)
    assert {s.name: s.value for s in acct.render()}["tenant_requests_total"] == 1
