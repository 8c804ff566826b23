"""Fleet scenario generator: synthetic recordings for conditions one CPU box cannot produce
(P/D KV transfer, 8+ replicas, DCGM GPU counters, SGLang HiCache / DP ranks).

Test tooling, not product code. Series use the exact upstream names, labels and histogram
buckets of vLLM 0.33, SGLang 0.5.23 and dcgm-exporter (shared/reference/engine-metrics.md);
dynamics are calibrated against the real vLLM recordings in tests/recordings (see README.md).
Output is the same OpenMetrics recording format `kvscope record` writes.
"""
