"""A small OTLP/HTTP (protobuf) trace receiver for the test bed: one JSON line per span.

Test tooling only (the product receiver lives in agent/traces). Binds 127.0.0.1 on a free port,
accepts `POST /v1/traces` with `application/x-protobuf` bodies up to `max_body_bytes`, and keeps
no string attribute whose key names prompt or completion content.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_TEXT_KEYS = ("gen_ai.prompt", "gen_ai.completion", "llm.prompts", "llm.completions")


def parse_any_value(v):
    """An OTLP AnyValue as a plain Python value."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [parse_any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: parse_any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def _attrs(kvs) -> dict:
    return {kv.key: parse_any_value(kv.value) for kv in kvs if not kv.key.startswith(_TEXT_KEYS)}


def parse_spans(body: bytes) -> list[dict]:
    """Flatten one ExportTraceServiceRequest into span dicts (resource and scope inlined)."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append(
                    {
                        "resource": resource,
                        "scope": ss.scope.name,
                        "name": sp.name,
                        "kind": sp.kind,
                        "trace_id": sp.trace_id.hex(),
                        "span_id": sp.span_id.hex(),
                        "parent_span_id": sp.parent_span_id.hex(),
                        "start_ns": sp.start_time_unix_nano,
                        "end_ns": sp.end_time_unix_nano,
                        "attributes": _attrs(sp.attributes),
                        "status": {"code": sp.status.code, "message": sp.status.message},
                    }
                )
    return out


class OtlpSink:
    """Context manager: `with OtlpSink(path) as sink: sink.endpoint` (http://127.0.0.1:PORT/v1/traces)."""

    def __init__(self, path: str | Path, max_body_bytes: int = 8 << 20) -> None:
        self.path = Path(path)
        self.max_body_bytes = max_body_bytes
        self.spans = 0
        self.rejected = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def _handler(self):
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                size = int(self.headers.get("Content-Length") or 0)
                if self.path != "/v1/traces" or size > sink.max_body_bytes:
                    sink.rejected += 1
                    self.send_error(413 if size > sink.max_body_bytes else 404)
                    return
                try:
                    spans = parse_spans(self.rfile.read(size))
                except Exception:  # a malformed body must not kill the receiver
                    sink.rejected += 1
                    self.send_error(400)
                    return
                sink.write(spans)
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        return Handler

    def write(self, spans: list[dict]) -> None:
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            for sp in spans:
                f.write(json.dumps(sp, sort_keys=True) + "\n")
            self.spans += len(spans)

    def __enter__(self) -> OtlpSink:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
