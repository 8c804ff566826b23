"""The offloading and Mooncake connectors' `KV Transfer metrics:` keys and LMCache's `Stored` line
(issue 38).

Shapes, from the sources (written before the first run):
* vLLM 0.32.0 (the test bed's wheel), vllm/distributed/kv_transfer/kv_connector/v1/metrics.py
  `KVConnectorLogging.log`: `log_fn("KV Transfer metrics: %s", ", ".join(f"{k}={v}" for k, v in
  xfer_metrics.items()))`, the accumulator reset after each line.
  - offloading/metrics.py `OffloadingConnectorStats.reduce()`: its Prometheus names as keys, a
    counter as `name=value`, a histogram as `name_count` / `name_sum`; offloading/scheduler.py
    `update_connector_output` adds `vllm:kv_offload_load_bytes`, `_load_time` (seconds),
    `_load_size`, `_store_bytes`, `_store_time`, `_store_size`; the scheduler adds
    `vllm:kv_offload_lookup_sync_delay_seconds` / `_async_` histograms and
    `vllm:kv_offload_allocation_failure`. Python prints a small float as `1.2e-05`.
  - mooncake/stats.py `MooncakeKVConnectorStats.reduce()`: NIXL's keys and `Num failed recvs`.
* LMCache/LMCache lmcache/v1/cache_engine.py `store()` (commit 3bafe17fbd0b153a56d6507e264d74097f0e8cc1):
  `"Stored %d out of total %d tokens. size: %.4f gb, cost %.4f ms, throughput: %.4f GB/s;
  offload_time: %.4f ms, put_time: %.4f ms"` with the tokens stored first; the same count goes to
  `stats_monitor.on_store_finished` (lmcache:num_stored_tokens).

Expected readings:
* the offloading line below: load 268435456 bytes in 0.0213 s, store 134217728 bytes, 3 allocation
  failures; every other key known and not read (no unknown field); store time 1.2e-05 s parses.
  Two such lines sum: engine_kv_offload_load_bytes_total 536870912, load seconds 0.0426,
  kv_tier_failures_total{tier="cpu",op="allocate"} 6.
* the Mooncake line below: 5 transfers of 12.5 ms and 64 MiB, 1 failed transfer and 2 failed
  receives -> kv_transfer_failures_total 3, kv_transfer_seconds_sum 0.0625.
* LMCache PR #3110's store line: 31 tokens stored; two store lines sum into
  kv_tier_stored_tokens_total{tier="lmcache"}.
* 15 min of offloading lines with 3 allocation failures per 10 s line -> kv_tier_failing (R6);
  the same lines with 0 failures -> quiet.
"""

from __future__ import annotations

import datetime
import io
import json
import math
from pathlib import Path

from kvscope.agent.logs.lines import Line, parse_line
from kvscope.agent.logs.series import read_log
from kvscope.cli import main

DAY = datetime.date(2026, 11, 24)
BAD = ("warning", "critical")


def _offload(t: str, failures: int = 3) -> str:
    return (
        f"(APIServer pid=1) INFO {t} [metrics.py:103] KV Transfer metrics: vllm:kv_offload_load_bytes=268435456, "
        "vllm:kv_offload_load_time=0.0213, vllm:kv_offload_load_size_count=4, vllm:kv_offload_load_size_sum=268435456, "
        "vllm:kv_offload_store_bytes=134217728, vllm:kv_offload_store_time=1.2e-05, vllm:kv_offload_store_size_count=2, "
        "vllm:kv_offload_store_size_sum=134217728, vllm:kv_offload_lookup_sync_delay_seconds_count=12, "
        f"vllm:kv_offload_lookup_sync_delay_seconds_sum=4.1e-05, vllm:kv_offload_allocation_failure={failures}"
    )


MOONCAKE = (
    "(APIServer pid=1) INFO 11-24 09:00:10 [metrics.py:103] KV Transfer metrics: Num successful transfers=5, "
    "Avg xfer time (ms)=12.5, P90 xfer time (ms)=20.1, Avg MB per transfer=64.0, Throughput (MB/s)=5120.0, "
    "Avg number of descriptors=32.0, Num failed transfers=1, Num failed recvs=2, Num KV expired reqs=0"
)
# LMCache/LMCache PR #3110 (docs/source/getting_started/quickstart.rst, as quoted in its review thread)
STORE_3110 = (
    "(EngineCore_DP0 pid=458469) [2025-09-30 00:08:43,982] LMCache INFO: Stored 31 out of total 31 tokens. "
    "size: 0.0040 gb, cost 1.95 ms, throughput: 1.98 GB/s; offload_time: 1.88 ms, put_time: 0.07 ms"
)


def _last(log: str) -> tuple[dict[tuple[str, str], float], dict[str, int]]:
    read = read_log(io.BytesIO(log.encode()), "eng", day=DAY)
    last: dict[tuple[str, str], float] = {}
    for _, _, samples in read.scrapes:
        for s in samples:
            labels = dict(s.labels)
            last[(s.name, ",".join(f"{k}={labels[k]}" for k in ("tier", "op") if k in labels))] = s.value
    return last, dict(read.summary.formats)


def test_offloading_keys():
    got = parse_line(_offload("11-24 09:00:10"), DAY)
    assert isinstance(got, Line) and got.kind == "kvxfer" and got.unknown == ()
    assert got.fields == {
        "offload_load_bytes": 268435456.0,
        "offload_load_s": 0.0213,
        "offload_store_bytes": 134217728.0,
        "offload_alloc_fail": 3.0,
    }
    last, formats = _last(_offload("11-24 09:00:10") + "\n" + _offload("11-24 09:00:20"))
    assert last[("engine_kv_offload_load_bytes_total", "")] == 2 * 268435456
    assert last[("engine_kv_offload_store_bytes_total", "")] == 2 * 134217728
    assert math.isclose(last[("engine_kv_offload_load_seconds_total", "")], 0.0426)
    assert last[("kv_tier_failures_total", "tier=cpu,op=allocate")] == 6
    assert formats == {"vLLM KV Transfer (offloading) lines": 2}
    assert not any(name.startswith("kv_transfer_") for name, _ in last)  # no NIXL-style transfer: absent


def test_mooncake_keys():
    got = parse_line(MOONCAKE, DAY)
    assert isinstance(got, Line) and got.unknown == ()
    last, formats = _last(MOONCAKE)
    assert last[("kv_transfer_failures_total", "")] == 3
    assert last[("kv_transfer_seconds_count", "")] == 5
    assert math.isclose(last[("kv_transfer_seconds_sum", "")], 0.0625)
    assert last[("kv_transfer_bytes_sum", "")] == 5 * 64 * 2**20
    assert formats == {"vLLM KV Transfer (Mooncake) lines": 1}


def test_lmcache_store_line():
    got = parse_line(STORE_3110, DAY)
    assert isinstance(got, Line) and (got.engine, got.kind, got.fields) == ("lmcache", "store", {"stored": 31.0})
    assert got.ts == datetime.datetime(2025, 9, 30, 0, 8, 43, tzinfo=datetime.UTC).timestamp()
    layerwise = STORE_3110.replace("00:08:43", "00:08:53").replace("Stored 31", "Stored 16")
    last, formats = _last(STORE_3110 + "\n" + layerwise)
    assert last[("kv_tier_stored_tokens_total", "tier=lmcache")] == 47
    assert formats == {"LMCache store lines": 2}


def test_malformed_variants_do_not_raise():
    for bad in (
        _offload("11-24 09:00:10").replace("=268435456", "=1e999999"),
        _offload("11-24 09:00:10").replace("=0.0213", "=0.0213e"),
        _offload("11-24 09:00:10").replace("=0.0213", "=-1e-05"),
        "KV Transfer metrics: vllm:kv_offload_load_bytes:('CPU', 'x')=5, =, ==, ,",
        STORE_3110.replace("Stored 31", "Stored 3x1"),
        STORE_3110.replace("Stored 31", "Stored " + "9" * 60),
        "Stored " * 3000,
        "LMCache INFO: Stored 5 out of total ",
    ):
        assert isinstance(parse_line(bad, DAY), Line | str)
    assert parse_line(_offload("11-24 09:00:10").replace("=268435456", "=1e999999"), DAY) == "bad_value"
    assert parse_line(_offload("11-24 09:00:10").replace("=0.0213", "=-1e-05"), DAY) == "bad_value"
    assert parse_line(STORE_3110.replace("Stored 31", "Stored 3x1"), DAY) == "other"


def _stats(t: datetime.datetime) -> str:
    return (
        f"(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [loggers.py:259] Engine 000: Avg prompt throughput: 800.0 tokens/s, "
        "Avg generation throughput: 300.0 tokens/s, Running: 8 reqs, Waiting: 0 reqs, GPU KV cache usage: 35.0%, "
        "Prefix cache hit rate: 40.0%"
    )


def _diagnose(capsys, tmp_path: Path, failures: int) -> list[tuple[str, str]]:
    t0 = datetime.datetime(2026, 11, 24, 9, 0, 0)
    lines = []
    for k in range(90):
        t = t0 + datetime.timedelta(seconds=10 * k)
        lines += [_stats(t), _offload(f"{t:%m-%d %H:%M:%S}", failures)]
    log = tmp_path / "engine.log"
    log.write_text("\n".join(lines) + "\n")
    main(["diagnose", "--log", str(log), "--date", str(DAY), "--json"])
    result = json.loads(capsys.readouterr().out)
    every = ([result["likely_cause"]] if result.get("likely_cause") else []) + result.get("competing", [])
    return [(f["rule_id"], f["levers_md"]) for f in every + result.get("other", []) if f["severity"] in BAD]


def test_offload_allocation_failures_fire_kv_tier_failing(capsys, tmp_path):
    loud = _diagnose(capsys, tmp_path, 3)
    assert ("kv_tier_failing", "R6") in loud, loud


def test_offload_without_failures_stays_quiet(capsys, tmp_path):
    assert _diagnose(capsys, tmp_path, 0) == []
