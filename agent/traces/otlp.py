"""OTLP/HTTP trace payloads -> flat `Span`s, pure. Protobuf (`application/x-protobuf`) and OTLP/JSON
(camelCase keys, hex ids, 64-bit integers as strings); a body that does not decode raises
`OtlpDecodeError`, which the receiver answers with HTTP 400."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from kvscope.core.jsonbody import loads_bounded

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class OtlpDecodeError(ValueError):
    """The payload is not a valid OTLP trace export; the message says why."""


class Span(NamedTuple):
    """One span, flattened with its resource and scope. Ids are lowercase hex; times are unix ns."""

    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str = ""

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


def decompress(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """Undo `Content-Encoding: gzip|deflate|identity`, refusing output beyond `max_bytes` (zip bombs)."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ("gzip", "deflate"):
        raise OtlpDecodeError(f"unsupported content-encoding {encoding!r}")
    d = zlib.decompressobj(wbits=47 if enc == "gzip" else 15)  # 47: gzip or zlib header
    try:
        out = d.decompress(body, max_bytes + 1)
    except zlib.error as e:
        raise OtlpDecodeError(f"bad {enc} body: {e}") from e
    if len(out) > max_bytes or d.unconsumed_tail:
        raise OtlpDecodeError(f"decompressed body exceeds {max_bytes} bytes")
    return out


def parse_otlp_traces(body: bytes, content_type: str) -> list[Span]:
    """Decode an (already decompressed) export request into spans."""
    ctype = (content_type or PROTOBUF).split(";")[0].strip().lower()
    if ctype in (PROTOBUF, "application/protobuf", "application/octet-stream"):
        return list(_from_protobuf(body))
    if ctype == JSON:
        return list(_from_json(body))
    raise OtlpDecodeError(f"unsupported content-type {content_type!r} (want {PROTOBUF} or {JSON})")


def _from_protobuf(body: bytes) -> Iterator[Span]:
    try:
        req = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError) as e:
        raise OtlpDecodeError(f"not an OTLP protobuf ExportTraceServiceRequest: {e}") from e
    for rs in req.resource_spans:
        resource = {kv.key: _pb_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            scope = ss.scope.name
            for s in ss.spans:
                yield Span(
                    s.trace_id.hex(),
                    s.span_id.hex(),
                    s.parent_span_id.hex(),
                    s.name,
                    s.kind,
                    s.start_time_unix_nano,
                    s.end_time_unix_nano,
                    {kv.key: _pb_value(kv.value) for kv in s.attributes},
                    resource,
                    scope,
                )


def _pb_value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_pb_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


def _from_json(body: bytes) -> Iterator[Span]:
    try:
        doc = loads_bounded(body)
    except ValueError as e:  # UnicodeDecodeError is one
        raise OtlpDecodeError(f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise OtlpDecodeError("OTLP/JSON body must be an object with resourceSpans")
    try:
        yield from _json_spans(doc)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as e:
        raise OtlpDecodeError(f"malformed OTLP/JSON: {type(e).__name__}: {e}") from e


def _json_spans(doc: dict[str, Any]) -> Iterator[Span]:
    for rs in doc.get("resourceSpans") or []:
        resource = _json_attrs((rs.get("resource") or {}).get("attributes"))
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
            scope = (ss.get("scope") or ss.get("instrumentationLibrary") or {}).get("name", "")
            for s in ss.get("spans") or []:
                yield Span(
                    _hex_id(s.get("traceId"), 16),
                    _hex_id(s.get("spanId"), 8),
                    _hex_id(s.get("parentSpanId"), 8, allow_empty=True),
                    str(s.get("name", "")),
                    _kind(s.get("kind", 0)),
                    _int(s.get("startTimeUnixNano", 0), 0, 2**64 - 1),
                    _int(s.get("endTimeUnixNano", 0), 0, 2**64 - 1),
                    _json_attrs(s.get("attributes")),
                    resource,
                    scope,
                )


def _int(v: Any, lo: int, hi: int) -> int:
    """A JSON integer within its protobuf type's range (fixed64 times, int64 values), as the
    protobuf decoder would have it; a ValueError (a 400) otherwise."""
    try:
        n = int(v)
    except OverflowError as e:  # a JSON number beyond float range reads as inf
        raise ValueError(f"integer {v!r} out of range") from e
    if not lo <= n <= hi:
        raise ValueError(f"integer {n} out of range [{lo}, {hi}]")
    return n


def _kind(k: Any) -> int:
    return PbSpan.SpanKind.Value(k) if isinstance(k, str) else int(k)


def _hex_id(v: Any, nbytes: int, allow_empty: bool = False) -> str:
    s = (v or "").lower()
    if not s and allow_empty:
        return ""
    if len(s) != 2 * nbytes:
        raise ValueError(f"id {v!r} is not {nbytes} hex bytes")
    bytes.fromhex(s)
    return s


def _json_attrs(attrs: Any) -> dict[str, Any]:
    return {a["key"]: _json_value(a.get("value") or {}) for a in attrs or []}


def _json_value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return _int(v["intValue"], -(2**63), 2**63 - 1)
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_json_value(x) for x in (v["arrayValue"] or {}).get("values") or []]
    if "kvlistValue" in v:
        return _json_attrs((v["kvlistValue"] or {}).get("values"))
    if "bytesValue" in v:
        return v["bytesValue"]
    return None
