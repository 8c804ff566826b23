"""OpenTelemetry: GenAI server metrics from canonical signals and the OTLP/HTTP metrics push
(docs/otel.md)."""
