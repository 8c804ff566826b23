"""Real NVIDIA Dynamo 1.6.1 on CPU: its frontend and KV router over two mocker workers, recorded.

The mocker simulates vLLM's scheduler and KV cache (no model runs), so this is cheap: one mocker
process with 2 workers, a frontend with `--router-mode kv`, then the same workers behind a
frontend with `--router-mode round-robin`; each run gets 12 chat requests (3 tenants x 4, each
tenant with its own ~180-word system prompt; new tenants per run so the second does not find
the first's prefixes cached) while `kvscope record` scrapes the frontend and the mocker.

Expected, written before the first run: the KV router keeps each tenant on the worker holding its
prefix (the cached prefix on the chosen worker equals the best worker's, no non-max-overlap
selections, a mean predicted hit rate above one half), and the engines report more cached prompt
tokens per request than under round robin, which makes no KV-router decisions (measured: the
selected/best prefix counters are absent there, the hit-rate histogram is exported with count 0).
R1 router_gave_locality_away reads kv_selected vs kv_best (its chosen-vs-best reading): evaluated, quiet.

KVSCOPE_DYNAMO_CAPTURE=1 also writes the loaded bodies to tests/fixtures/scrapes/dynamo-1.6.1-*.txt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvscope.agent.recording.omfile import read_recording
from testbed.dynamo import DYNAMO_VERSION, MODEL_NAME, DynamoFleet, dynamo_unavailable_reason
from testbed.tiny_model import cache_root, ensure_tiny_model, model_key
from testbed.vllm_env import vllm_unavailable_reason

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes"
PER_TENANT = 4
TENANTS = 3
RECORD_S = 6


def _chat(url: str, tenant: str, i: int) -> int:
    system = f"tenant {tenant} " + "shared words here " * 60
    body = json.dumps(
        {
            "model": MODEL_NAME,
            "max_tokens": 4,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"q {i}"}],
        }
    ).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status


def _values(body: str, name: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name + "{")]


def _run(fleet: DynamoFleet, mode: str, tmp: Path) -> tuple[dict[str, str], Path]:
    config = tmp / f"{mode}.yaml"
    config.write_text(
        json.dumps({"targets": [{"url": u, "job": f"dynamo-{n}"} for n, u in fleet.metrics_urls.items()]})
    )
    out = tmp / f"dynamo-{mode}.om.gz"
    rec = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvscope",
            "record",
            "--config",
            str(config),
            "--duration",
            f"{RECORD_S}s",
            "--interval",
            "1s",
            "--no-progress",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        assert rec.poll() is None, rec.communicate()[1][-2000:]
        codes = [_chat(fleet.url, f"{mode}-{t}", i) for t in range(TENANTS) for i in range(PER_TENANT)]
        _, err = rec.communicate(timeout=RECORD_S + 60)
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()
    assert codes == [200] * TENANTS * PER_TENANT
    assert rec.returncode == 0, err[-2000:]
    bodies = {n: urllib.request.urlopen(u, timeout=10).read().decode() for n, u in fleet.metrics_urls.items()}
    if os.environ.get("KVSCOPE_DYNAMO_CAPTURE") == "1":
        _capture(mode, bodies)
    return bodies, out


def _capture(mode: str, bodies: dict[str, str]) -> None:
    how = (
        f"# Captured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by tests/integration/test_dynamo_mocker.py "
        f"(KVSCOPE_DYNAMO_CAPTURE=1): real ai-dynamo {DYNAMO_VERSION} on CPU (scripts/install-dynamo.sh), no etcd/NATS "
        "(file discovery, tcp request plane, zmq event plane); `python -m dynamo.mocker --num-workers 2 --block-size 16 "
        "--num-gpu-blocks-override 256 --enable-prefix-caching` (tiny-llama tokenizer)"
    )
    load = f"after {TENANTS * PER_TENANT} chat requests ({TENANTS} tenants x {PER_TENANT}, ~180-word system prompt each, max_tokens 4)"
    slug = "kv" if mode == "kv" else "round_robin"
    (FIXTURES / f"dynamo-{DYNAMO_VERSION}-frontend-{slug}-mocker-loaded.txt").write_text(
        f"{how}; `python -m dynamo.frontend --router-mode {mode}`: GET the frontend's /metrics {load}. Unedited below.\n"
        + bodies["frontend"]
    )
    if mode != "kv":  # the mocker's body after both runs
        (FIXTURES / f"dynamo-{DYNAMO_VERSION}-mocker-2workers-loaded.txt").write_text(
            f"{how}: GET the mocker's system /metrics (DYN_SYSTEM_PORT) after both frontend runs (kv, then "
            f"round-robin), {2 * TENANTS * PER_TENANT} requests. Unedited below.\n" + bodies["mocker"]
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    reason = dynamo_unavailable_reason()
    if reason:
        pytest.skip(reason)
    model = cache_root() / "models" / f"tiny-llama-{model_key()}"
    if not (model / "tokenizer.json").is_file():  # the mocker needs only its tokenizer and config
        if vllm_unavailable_reason():
            pytest.skip(f"the tiny model is not built at {model} and cannot be: {vllm_unavailable_reason()}")
        model = ensure_tiny_model()  # built with the vLLM venv's torch
    tmp = tmp_path_factory.mktemp("dynamo")
    with DynamoFleet(model, router_mode="kv", workers=2) as fleet:
        kv = _run(fleet, "kv", tmp)
        fleet.restart_frontend("round-robin")
        rr = _run(fleet, "round-robin", tmp)
    return {"kv": kv, "round-robin": rr}


def test_dynamo_kv_router_keeps_prefixes_and_round_robin_does_not(runs):
    n = TENANTS * PER_TENANT
    (kv_bodies, kv_file), (rr_bodies, rr_file) = runs["kv"], runs["round-robin"]
    kv, rr = kv_bodies["frontend"], rr_bodies["frontend"]
    selected = sum(_values(kv, "dynamo_component_router_kv_selected_cached_prefix_tokens_total"))
    best = sum(_values(kv, "dynamo_component_router_kv_best_eligible_cached_prefix_tokens_total"))
    assert selected > 0 and selected == best  # every request went to the best worker
    assert sum(_values(kv, "dynamo_component_router_non_max_overlap_selections_total")) == 0
    assert sum(_values(kv, "dynamo_component_router_kv_hit_rate_count")) == n
    assert sum(_values(kv, "dynamo_component_router_kv_hit_rate_sum")) / n > 0.5
    assert not _values(rr, "dynamo_component_router_kv_selected_cached_prefix_tokens_total")
    assert sum(_values(rr, "dynamo_component_router_kv_hit_rate_count")) == 0  # exported, never observed
    cached = {
        m: sum(_values(b, "dynamo_frontend_cached_tokens_sum")) / sum(_values(b, "dynamo_frontend_cached_tokens_count"))
        for m, b in (("kv", kv), ("round-robin", rr))
    }
    assert cached["kv"] > cached["round-robin"], cached
    print({"cached_tokens_per_request": cached, "kv_selected": selected, "kv_best": best})

    for path in (kv_file, rr_file):
        scrapes, expo = read_recording(path)
        assert not expo.issues
        for job in ("dynamo-frontend", "dynamo-mocker"):
            mine = [s for s in scrapes if s.job == job]
            assert len(mine) >= RECORD_S - 2 and all(s.up for s in mine), (path.name, job)
        assert any(
            r.name == "dynamo_frontend_requests_total" for s in scrapes if s.job == "dynamo-frontend" for r in s.samples
        )


def _r1(recording: Path, *params: str) -> dict | None:
    """R1's finding on a recording (None when quiet), with `params` overridden."""
    args = [a for p in params for a in ("--param", f"router_gave_locality_away.{p}")]
    res = subprocess.run(
        [sys.executable, "-m", "kvscope", "diagnose", "--recording", str(recording), "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode in (0, 1, 2), res.stderr[-2000:]
    report = json.loads(res.stdout)
    assert not [s for s in report["skipped"] if "router_gave_locality_away" in json.dumps(s)]
    found = ([report["likely_cause"]] if report["likely_cause"] else []) + report["competing"] + report["other"]
    return next((f for f in found if f["rule_id"] == "router_gave_locality_away"), None)


def test_dynamo_kv_router_r1_evaluated_and_quiet(runs):
    """R1's chosen-vs-best reading on the kv-mode recording (the router kept every tenant on its best
    worker, expected above): evaluated and quiet. The 12 requests come in a burst shorter than the
    time-scaled `for`, so `for` is set to 0 to judge the share itself, not the burst's length. (Reading
    the share back with no threshold depends on how many scrapes caught the 5 s burst, so it is not
    asserted here; the rule's test cases pin the reading.)"""
    _, kv_file = runs["kv"]
    assert _r1(kv_file) is None
    assert _r1(kv_file, "for=0s") is None
