"""Speculative-decoding and KV-connector log lines (issue 38 item 7): vLLM's `SpecDecoding metrics:`,
the NIXL connector's `KV Transfer metrics:`, LMCache's lookup and retrieve lines.

Each parse test reads a line as an upstream thread or PR posted it (provenance beside it); the rule
tests build logs in the exact shapes of the engines' own format strings (vllm/v1/spec_decode/metrics.py
and vllm/v1/metrics/loggers.py of vLLM 0.32, vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py
reduce(), LMCache's lmcache/logging.py header and vllm_v1_adapter.py / cache_engine.py messages)
with numbers chosen for the case. Expected verdicts, written before the first run:
* acceptance 20 % for 15 min with speculation on -> spec_decode_ineffective (L10); 75 % -> quiet;
* NIXL mean transfer 10 ms for 20 min, then 40 ms for 10 min at the same size -> kv_transfer_slowing
  (L7); 10 ms throughout -> quiet;
* LMCache lookups finding 10 % of the prompt tokens for 15 min -> kv_tier_failing (R6); 80 % -> quiet.
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

# vllm-project/vllm-ascend#13665 (the 0.32-era form: acceptance rate last)
SPEC_ASCEND = (
    "(APIServer pid=6485) INFO 08-05 20:20:43 [metrics.py:100] SpecDecoding metrics: Mean acceptance length: 1.00, "
    "Accepted throughput: 0.00 tokens/s, Drafted throughput: 1.23 tokens/s, Accepted: 0 tokens, Drafted: 495 tokens, "
    "Per-position acceptance rate: 0.000, 0.000, 0.000, 0.000, 0.000, Avg Draft acceptance rate: 0.0%"
)
# vllm-project/vllm PR #24127 (the 0.10-0.11 form: acceptance rate first)
SPEC_24127 = (
    "(APIServer pid=2236552) INFO 09-09 11:51:35 [metrics.py:96] SpecDecoding metrics: Draft acceptance rate: 88.8%, "
    "Mean acceptance length: 5.44, Accepted throughput: 4.37 tokens/s, Drafted throughput: 4.92 tokens/s, "
    "Accepted: 262 tokens, Drafted: 295 tokens, Per-position acceptance rate: 0.983, 0.949, 0.915, 0.881, 0.712"
)
# vllm-project/vllm PR #15902 (0.8.3: the first `SpecDecoding metrics:` form; header as vLLM 0.8 prints it)
SPEC_15902 = (
    "INFO 04-01 10:00:00 [loggers.py:80] SpecDecoding metrics: Draft acceptance rate: 100.0%, Accepted: 66 tokens, "
    "Drafted: 66 tokens"
)
# vllm-project/vllm PR #25388 (NIXL telemetry in the CLI log)
NIXL_25388 = (
    "(APIServer pid=205253) INFO 09-22 13:28:53 [metrics.py:98] KV Transfer metrics: Num successful transfers=1, "
    "Avg xfer time (ms)=9.862, P90 xfer time (ms)=9.862, Avg post time (ms)=5.693, P90 post time (ms)=5.693, "
    "Avg MB per transfer=70.0, Throughput (MB/s)=7097.952, Avg number of descriptors=56.0"
)
# LMCache/LMCache#889 (LMCache's own header) and PR #3110's quickstart (a vLLM process prefix before it)
LMCACHE_889 = (
    "[2025-06-21 20:59:57,672] LMCache INFO: Reqid: chatcmpl-ec5a3a80c13548ca89dd8e6241abc343, Total tokens 263, "
    "LMCache hit tokens: 256, need to load: 256 (vllm_v1_adapter.py:812:lmcache.integration.vllm.vllm_v1_adapter)"
)
LMCACHE_3110 = (
    "(EngineCore_DP0 pid=494270) [2025-09-30 01:12:36,502] LMCache INFO: Retrieved 8 out of 24 required tokens "
    "(from 32 total tokens). size: 0.0011 gb, cost 0.55 ms, throughput: 1.98 GB/s;"
)


def ts(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()


def test_spec_decoding_lines_of_three_releases():
    got = parse_line(SPEC_ASCEND, DAY)
    assert isinstance(got, Line) and (got.engine, got.kind, got.ts) == ("vllm", "spec", ts("2026-08-05 20:20:43"))
    assert got.fields == {"spec_len": 1.0, "spec_acc": 0.0, "spec_draft": 495.0} and got.unknown == ()
    got = parse_line(SPEC_24127, DAY)
    assert isinstance(got, Line) and got.fields == {"spec_len": 5.44, "spec_acc": 262.0, "spec_draft": 295.0}
    got = parse_line(SPEC_15902, DAY)  # no mean acceptance length before 0.9
    assert isinstance(got, Line) and got.fields == {"spec_acc": 66.0, "spec_draft": 66.0}


def test_nixl_transfer_line():
    got = parse_line(NIXL_25388, DAY)
    assert isinstance(got, Line) and (got.kind, got.ts) == ("kvxfer", ts("2026-09-22 13:28:53"))
    assert got.fields["xfer_n"] == 1 and math.isclose(got.fields["xfer_s"], 0.009862)
    assert got.fields["xfer_bytes"] == 70 * 2**20  # the source's MB is MiB (bytes / 2**20)
    assert "xfer_fail" not in got.fields  # this release printed no failure count: absent, not 0


def test_lmcache_lookup_and_retrieve_lines():
    got = parse_line(LMCACHE_889, DAY)
    assert isinstance(got, Line) and (got.engine, got.kind) == ("lmcache", "lookup")
    assert got.ts == ts("2025-06-21 20:59:57") and got.missing == ""  # LMCache's header has the year
    assert got.fields == {"lookup": 263.0, "hit": 256.0}
    coloured = "\x1b[32;20m" + LMCACHE_889.replace("INFO: ", "INFO:\x1b[0m ", 1)  # as on a terminal
    assert parse_line(coloured, DAY) == got
    got = parse_line(LMCACHE_3110, DAY)
    assert isinstance(got, Line) and (got.kind, got.fields) == ("retrieve", {"loaded": 8.0})
    none = LMCACHE_889.replace("hit tokens: 256, need to load: 256", "hit tokens: None.")  # vllm_v1_adapter.py
    assert parse_line(none, DAY) == "no_fields"
    assert parse_line("Retrieved 5 files out of 7 required tokens", DAY) == "other"


def test_lines_sum_into_counters_and_transfer_histograms():
    text = "\n".join(
        [
            SPEC_24127,
            SPEC_24127.replace("11:51:35", "11:51:45").replace("Accepted: 262", "Accepted: 100"),
            NIXL_25388,
            NIXL_25388.replace("13:28:53", "13:29:03").replace("transfers=1,", "transfers=3,")
            + ", Num failed transfers=2, Num KV expired reqs=0, Num notifs after expiry=0",
        ]
    )
    lmcache = "\n".join([LMCACHE_889, LMCACHE_889.replace("57,672", "59,000").replace("tokens: 256", "tokens: 0")])
    last: dict[tuple[str, str], float] = {}
    labels: dict[str, dict[str, str]] = {}
    formats: dict[str, int] = {}
    for log in (text, lmcache):  # apart: the LMCache excerpt is a year older than the vLLM ones
        read = read_log(io.BytesIO(log.encode()), "eng", day=DAY)
        formats |= read.summary.formats
        for _, _, samples in read.scrapes:
            for s in samples:
                last[(s.name, dict(s.labels)["engine"])] = s.value
                labels[s.name] = dict(s.labels)
    assert last[("engine_spec_accepted_tokens_total", "vllm")] == 362
    assert last[("engine_spec_draft_tokens_total", "vllm")] == 590
    assert last[("engine_spec_accept_length_tokens", "vllm")] == 5.44
    assert last[("kv_transfer_seconds_count", "vllm")] == 4
    assert math.isclose(last[("kv_transfer_seconds_sum", "vllm")], 4 * 0.009862)
    assert last[("kv_transfer_bytes_sum", "vllm")] == 4 * 70 * 2**20
    # the first line printed no failure count: the counter starts at 0 there, then takes the 2
    assert last[("kv_transfer_failures_total", "vllm")] == 2
    assert last[("kv_tier_lookup_tokens_total", "lmcache")] == 526
    assert last[("kv_tier_hit_tokens_total", "lmcache")] == 256
    assert labels["kv_tier_hit_tokens_total"]["tier"] == "lmcache"
    assert "tier" not in labels["engine_spec_draft_tokens_total"]
    assert formats == {
        "vLLM SpecDecoding lines": 2,
        "vLLM KV Transfer (NIXL) lines": 2,
        "LMCache lookup lines": 2,
    }


def _stats(t: datetime.datetime, running: int) -> str:
    """vLLM 0.32's stats line (loggers.py), one engine."""
    return (
        f"(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [loggers.py:259] Engine 000: Avg prompt throughput: 800.0 tokens/s, "
        f"Avg generation throughput: 300.0 tokens/s, Running: {running} reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 35.0%, Prefix cache hit rate: 40.0%"
    )


def _spec(t: datetime.datetime, accepted: int, drafted: int) -> str:
    """vLLM 0.32's SpecDecoding line (spec_decode/metrics.py), k=3, 10 s since the previous one."""
    drafts = drafted // 3
    per = f"{accepted / drafts / 3:.3f}"
    return (
        f"(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [metrics.py:120] SpecDecoding metrics: "
        f"Mean acceptance length: {1 + accepted / drafts:.2f}, Accepted throughput: {accepted / 10:.2f} tokens/s, "
        f"Drafted throughput: {drafted / 10:.2f} tokens/s, Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
        f"Per-position acceptance rate: {per}, {per}, {per}, Avg Draft acceptance rate: {100 * accepted / drafted:.1f}%"
    )


def _nixl(t: datetime.datetime, ms: float) -> str:
    """NIXL's reduce() as KVConnectorLogging prints it (vLLM 0.32), 6 transfers of 70 MiB."""
    return (
        f"(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [metrics.py:103] KV Transfer metrics: Num successful transfers=6, "
        f"Avg xfer time (ms)={ms}, P90 xfer time (ms)={ms * 1.2:.3f}, Avg post time (ms)=0.5, P90 post time (ms)=0.6, "
        f"Avg MB per transfer=70.0, Throughput (MB/s)={70 / ms * 1000:.3f}, Avg number of descriptors=56.0, "
        "Num failed transfers=0, Num KV expired reqs=0, Num notifs after expiry=0"
    )


def _lmcache(t: datetime.datetime, k: int, hit: int) -> str:
    """LMCache's lookup line (vllm_v1_adapter.py) under its own header (lmcache/logging.py)."""
    return (
        f"[{t:%Y-%m-%d %H:%M:%S},000] LMCache INFO: Reqid: cmpl-{k:06d}-0, Total tokens 1024, "
        f"LMCache hit tokens: {hit}, need to load: {hit} (vllm_v1_adapter.py:1228:lmcache.integration.vllm.vllm_v1_adapter)"
    )


def _diagnose(capsys, tmp_path: Path, lines: list[str]) -> dict:
    log = tmp_path / "engine.log"
    log.write_text("\n".join(lines) + "\n")
    main(["diagnose", "--log", str(log), "--date", str(DAY), "--json"])
    return json.loads(capsys.readouterr().out)


def _loud(result: dict) -> list[tuple[str, str]]:
    every = ([result["likely_cause"]] if result.get("likely_cause") else []) + result.get("competing", [])
    return [(f["rule_id"], f["levers_md"]) for f in every + result.get("other", []) if f["severity"] in BAD]


T0 = datetime.datetime(2026, 11, 24, 9, 0, 0)


def _every_10s(minutes: int):
    return [T0 + datetime.timedelta(seconds=10 * k) for k in range(minutes * 6)]


def test_low_acceptance_fires_spec_decode_ineffective(capsys, tmp_path):
    lines = [line for t in _every_10s(15) for line in (_stats(t, 8), _spec(t, 120, 600))]
    loud = _loud(_diagnose(capsys, tmp_path, lines))
    assert ("spec_decode_ineffective", "L10") in loud, loud


def test_high_acceptance_stays_quiet(capsys, tmp_path):
    lines = [line for t in _every_10s(15) for line in (_stats(t, 8), _spec(t, 450, 600))]
    assert _loud(_diagnose(capsys, tmp_path, lines)) == []


def test_nixl_transfers_slowing_fire_kv_transfer_slowing(capsys, tmp_path):
    lines = [line for k, t in enumerate(_every_10s(30)) for line in (_stats(t, 8), _nixl(t, 10.0 if k < 120 else 40.0))]
    loud = _loud(_diagnose(capsys, tmp_path, lines))
    assert ("kv_transfer_slowing", "L7") in loud, loud


def test_nixl_transfers_steady_stay_quiet(capsys, tmp_path):
    lines = [line for t in _every_10s(30) for line in (_stats(t, 8), _nixl(t, 10.0))]
    assert _loud(_diagnose(capsys, tmp_path, lines)) == []


def _lookups(hit: int) -> list[str]:
    out = []
    for k, t in enumerate(_every_10s(15)):
        out += [_stats(t, 8), _lmcache(t, 2 * k, hit), _lmcache(t + datetime.timedelta(seconds=5), 2 * k + 1, hit)]
    return out


def test_lmcache_missing_fires_kv_tier_failing(capsys, tmp_path):
    loud = _loud(_diagnose(capsys, tmp_path, _lookups(100)))
    assert ("kv_tier_failing", "R6") in loud, loud


def test_lmcache_hitting_stays_quiet(capsys, tmp_path):
    assert _loud(_diagnose(capsys, tmp_path, _lookups(820))) == []
