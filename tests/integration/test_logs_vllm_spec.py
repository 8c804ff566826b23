"""vLLM's `SpecDecoding metrics:` log line, read from a real vLLM 0.32 CPU server running ngram
speculation, against the same server's /metrics (issue 38 item 7).

Expected: the line counts the accepted and drafted tokens of the interval since the previous line,
the same per-step stats the `vllm:spec_decode_num_*` counters add up, so the reader's summed
`engine_spec_accepted_tokens_total` / `engine_spec_draft_tokens_total` equal the counters' rise over
the run exactly, and `Mean acceptance length` is 1 + accepted / drafts. (First measured with the
same steps as a script, 2026-11-25: 251 accepted and 364 drafted in both, 142 drafts, length 2.77.)
"""

from __future__ import annotations

import datetime
import io
import json
import time
import urllib.request

import pytest

from kvscope.agent.logs.series import read_log
from testbed.tiny_model import SERVED_NAME, ensure_tiny_model
from testbed.vllm_env import vllm_unavailable_reason
from testbed.vllm_server import VllmConfig, VllmServer

pytestmark = pytest.mark.vllm

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CONFIG = VllmConfig(
    service_name="vllm-spec", num_gpu_blocks=None, extra_args=("--speculative-config", json.dumps(SPEC))
)
COUNTERS = {
    "engine_spec_accepted_tokens_total": "vllm:spec_decode_num_accepted_tokens_total",
    "engine_spec_draft_tokens_total": "vllm:spec_decode_num_draft_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
}


def _counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in body.splitlines():
        for key, name in COUNTERS.items():
            if line.startswith(name + "{"):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


def test_spec_decoding_log_line_equals_the_spec_counters():
    if vllm_unavailable_reason():
        pytest.fail(vllm_unavailable_reason(), pytrace=False)
    ensure_tiny_model()
    with VllmServer(CONFIG) as srv:
        before = _counters(srv.metrics_url)
        start = srv.log_path.stat().st_size
        text = "one two three four five six seven eight nine ten " * 6  # repeats: ngram drafts from it
        for i in range(12):
            body = json.dumps({"model": SERVED_NAME, "prompt": f"{text} {i}", "max_tokens": 48, "temperature": 0})
            req = urllib.request.Request(
                srv.url + "/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=300) as r:
                assert r.status == 200
        time.sleep(13)  # the 10 s stats interval holding the last step is logged
        rise = {k: v - before[k] for k, v in _counters(srv.metrics_url).items()}
        raw = srv.log_path.read_bytes()[start:]
    read = read_log(io.BytesIO(raw), "vllm-0", day=datetime.datetime.now(datetime.UTC).date())
    assert read.summary.formats.get("vLLM SpecDecoding lines", 0) >= 1, read.summary.text()
    last: dict[str, float] = {}
    for _, _, samples in read.scrapes:
        for s in samples:
            last[s.name] = s.value
    print(read.summary.text(), {k: v for k, v in last.items() if "spec" in k}, rise)
    assert rise["engine_spec_draft_tokens_total"] > 0 and rise["drafts"] > 0, rise  # speculation ran
    assert last["engine_spec_accepted_tokens_total"] == rise["engine_spec_accepted_tokens_total"]
    assert last["engine_spec_draft_tokens_total"] == rise["engine_spec_draft_tokens_total"]
    if read.summary.formats["vLLM SpecDecoding lines"] == 1:  # one interval: its length is the run's
        want = 1 + rise["engine_spec_accepted_tokens_total"] / rise["drafts"]
        assert last["engine_spec_accept_length_tokens"] == pytest.approx(want, abs=0.006)
