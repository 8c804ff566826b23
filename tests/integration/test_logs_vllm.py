"""The log lines of a real KV-pressure run on vLLM (CPU) read into what its /metrics said.

The same run as test_cascade_vllm.py (fill the small pool, then a wave); afterwards the server's
own log is read with `read_log` and compared with the scrapes taken during the run.
"""

import datetime
import io
import os
import time
import urllib.request

import pytest
from test_cascade_vllm import _canonical, _run_pressure

from kvscope.agent.logs.series import read_log

pytestmark = pytest.mark.vllm


def test_log_of_a_real_kv_pressure_run_matches_its_scrapes(vllm_small_kv):
    srv = vllm_small_kv
    start = os.path.getsize(srv.log_path)
    scrapes, requests, root_t, _ = _run_pressure(srv)
    assert root_t is not None and {s for s, _, _ in requests} == {200}
    time.sleep(12)  # the stats interval holding the end of the run is logged (10 s in 0.32)
    with urllib.request.urlopen(srv.metrics_url, timeout=30) as r:
        scrapes.append((time.time(), r.read().decode()))
    with open(srv.log_path, "rb") as f:
        f.seek(start)
        text = f.read()
    if os.environ.get("KVSCOPE_KEEP_LOG"):
        with open(os.environ["KVSCOPE_KEEP_LOG"], "wb") as out:
            out.write(b"".join(ln + b"\n" for ln in text.splitlines() if b"[loggers.py" in ln))
    read = read_log(io.BytesIO(text), "vllm-0", day=datetime.datetime.now(datetime.UTC).date())
    summary = read.summary
    assert summary.formats.get("vLLM V1 stats lines", 0) >= 2, summary.text()  # one 10 s interval at least
    assert not set(summary.skipped) - {"other"} and not summary.unknown_fields, summary.text()
    logged: dict[str, list[tuple[float, float]]] = {}
    for _, ts, samples in read.scrapes:
        for s in samples:
            logged.setdefault(s.name, []).append((ts, s.value))
    scraped: dict[str, list[tuple[float, float]]] = {}
    for s in _canonical(scrapes):
        if not dict(s.labels).get("dp_rank", "0") == "0" or s.name.endswith(("_bucket", "_sum", "_count")):
            continue
        scraped.setdefault(s.name, []).append((s.timestamp, s.value))
    preempted = scraped["engine_preemptions_total"][-1][1] - scraped["engine_preemptions_total"][0][1]
    print(summary.text(), f"preemptions in the run: {preempted:.0f}")
    # vLLM 0.12-0.33 build a `Preemptions: N` part but zero N (`_update_stats` -> `_reset`) before
    # testing N > 0, so no stats line prints it (docs/logs.md): the log has no preemption counter
    # even where /metrics counted some. Absent, not zero.
    assert "engine_preemptions_total" not in logged
    # the log's KV usage is the engine's own: its peak near the scrapes' peak (a 10 s stats line need
    # not catch the peak, which on a loaded box may also stay below full)
    kv_scraped = [v for _, v in scraped["engine_kv_cache_usage_ratio"]]
    kv_logged = max(v for _, v in logged["engine_kv_cache_usage_ratio"])
    # (both sample one process at different instants: near, not equal; a percent read unscaled or a
    # wrong field would be far off)
    # A 10 s stats line can miss a short peak entirely (a quiet box logged 0.173 against a scraped
    # 1.0), so the log is held to the range the scrapes saw, not to their peak.
    kv_all = [v for _, v in logged["engine_kv_cache_usage_ratio"]]
    lo, hi = min(kv_scraped) - 0.05, max(kv_scraped) + 0.05
    assert 0.0 < kv_logged <= 1.0 and all(lo <= v <= hi for v in kv_all), (kv_all, min(kv_scraped), max(kv_scraped))
    # tokens/s x the time between stats lines: the run's generated tokens to within the
    # one-second resolution of the log's times
    t0, t1 = logged["engine_generation_tokens_total"][0][0], logged["engine_generation_tokens_total"][-1][0]
    gen = scraped["engine_generation_tokens_total"]

    def at(t: float) -> float:  # the log's time is truncated to the second
        return max((v for ts, v in gen if ts <= t + 1), default=gen[0][1])

    truth = at(t1) - at(t0)
    got = logged["engine_generation_tokens_total"][-1][1]
    print(f"generation tokens: log {got:.0f}, scrapes {truth:.0f}")
    assert got == pytest.approx(truth, rel=0.25)
