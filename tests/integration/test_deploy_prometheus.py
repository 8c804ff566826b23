"""deploy/prometheus and deploy/alertmanager with the real Debian binaries.

* promtool / amtool check the configs as shipped (the Prometheus config loads the generated
  rules through its relative rule_files path);
* a real Prometheus, started from deploy/prometheus/prometheus.yml with its targets rewritten
  to free 127.0.0.1 ports, scrapes a real `kvscope agent` process (which scrapes a local HTTP
  server replaying a captured vLLM exposition) and the engine itself; the agent's series appear
  with the engine's job/instance kept (honor_labels);
* a real Alertmanager started from deploy/alertmanager/alertmanager.yml routes an Llm* alert to
  the kvscope webhook URL (rewritten to a local receiver) and nothing else there.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from testbed.alertmanager import alertmanager_argv, post_alerts
from testbed.httpstub import serving, static_body_handler
from testbed.procs import ProcessGroup, free_port, wait_http, wait_until
from testbed.prometheus import get_json, prometheus_argv, query, require_binaries

pytestmark = [pytest.mark.prometheus, pytest.mark.servers]

ROOT = Path(__file__).resolve().parents[2]
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
AM_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
CAPTURE = ROOT / "tests" / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"
KVSCOPE = Path(sys.executable).with_name("kvscope")


def _binary(name: str) -> str:
    return require_binaries(name)[0]


@pytest.fixture
def processes(tmp_path):
    with ProcessGroup(tmp_path) as procs:
        yield procs


def _wait_for(what: str, check, timeout_s: float, procs=()) -> object:
    """The limits are generous on purpose: they only matter when something is broken, and a
    shared 2-core CI box can be very loaded."""
    return wait_until(check, timeout_s, what, procs=procs)


@pytest.fixture
def engine_port():
    """A local engine stand-in: serves a captured vLLM 0.32 /metrics payload."""
    with serving(static_body_handler(CAPTURE.read_bytes(), only_path="/metrics")) as server:
        yield server.server_address[1]


# ---------------------------------------------------------------------------- static checks


def test_promtool_accepts_the_prometheus_config_and_its_rule_files():
    res = subprocess.run(
        [_binary("promtool"), "check", "config", str(PROM_CONFIG)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
    files = sorted((ROOT / "rules" / "prometheus").glob("*.yml"))
    assert f"SUCCESS: {len(files)} rule files found" in res.stdout, res.stdout
    for path in files:  # each one checked through the config's relative rule_files path
        assert f"Checking {path}" in res.stdout, path


def test_amtool_accepts_the_alertmanager_config():
    res = subprocess.run(
        [_binary("amtool"), "check-config", str(AM_CONFIG)],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only (slow on a loaded 2-core box)
    )
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def _route(labels: dict[str, str]) -> str:
    argv = [_binary("amtool"), "config", "routes", "test", f"--config.file={AM_CONFIG}"]
    argv += [f"{k}={v}" for k, v in labels.items()]
    res = subprocess.run(
        argv, capture_output=True, text=True, timeout=300
    )  # a hang guard only (slow on a loaded 2-core box)
    return res.stdout.strip()


def test_every_generated_alert_routes_to_the_kvscope_webhook():
    alerts = set()
    for path in (ROOT / "rules" / "prometheus").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            alerts |= {r["alert"] for r in group["rules"] if "alert" in r}
    assert len(alerts) >= 10, f"rules/prometheus holds {len(alerts)} alerts: run `kvscope rules build`"
    for name in sorted(alerts):
        assert _route({"alertname": name, "job": "vllm"}) == "kvscope", name
    assert _route({"alertname": "NodeDiskFull"}) == "default"


# ---------------------------------------------------------------------------- live Prometheus


def _prometheus_config(tmp_path: Path, ports: dict[str, int]) -> Path:
    """The shipped config with every target on a test port, 1 s intervals and absolute rule paths."""
    cfg = yaml.safe_load(PROM_CONFIG.read_text())
    # short intervals, and a timeout as long as the interval: the test box may be loaded
    cfg["global"].update(scrape_interval="2s", scrape_timeout="2s", evaluation_interval="2s")
    cfg["rule_files"] = [str((PROM_CONFIG.parent / p).resolve()) for p in cfg["rule_files"]]
    cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{free_port()}"]
    for job in cfg["scrape_configs"]:
        port = ports.get(job["job_name"]) or free_port()  # nothing listens: that job is down
        job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
    out = tmp_path / "prometheus.yml"
    out.write_text(yaml.safe_dump(cfg))
    return out


def _query(port: int, expr: str) -> list[dict]:
    return query(f"http://127.0.0.1:{port}", expr, timeout_s=30)


def test_prometheus_from_the_deploy_config_scrapes_a_real_agent(tmp_path, processes, engine_port):
    prometheus = _binary("prometheus")
    agent_port, prom_port = free_port(), free_port()
    agent = processes.start(
        "agent",
        [
            str(KVSCOPE),
            "agent",
            "--target",
            f"http://127.0.0.1:{engine_port}/metrics",
            "--job",
            "vllm",
            "--scrape.interval",
            "2s",
            "--web.listen-address",
            f"127.0.0.1:{agent_port}",
            "--store.path",
            "",
        ],
    )
    config = _prometheus_config(tmp_path, {"kvscope-agent": agent_port, "vllm": engine_port})
    prom = processes.start("prometheus", prometheus_argv(config, tmp_path / "tsdb", prom_port, binary=prometheus))
    procs = (agent, prom)
    wait_http(f"http://127.0.0.1:{prom_port}/-/ready", 180, procs=procs)

    up = _wait_for(
        "up{job='kvscope-agent'} == 1", lambda: _query(prom_port, 'up{job="kvscope-agent"} == 1'), 180, procs
    )
    assert up[0]["metric"]["instance"] == f"127.0.0.1:{agent_port}"
    kv = _wait_for(
        "kvscope_engine_kv_cache_usage_ratio",
        lambda: _query(prom_port, "kvscope_engine_kv_cache_usage_ratio"),
        120,
        procs,
    )
    # honor_labels: the agent's series keep the engine's job/instance, not the agent's
    assert {(s["metric"]["job"], s["metric"]["instance"]) for s in kv} == {("vllm", f"127.0.0.1:{engine_port}")}
    _wait_for(
        "kvscope_target_up{job='vllm'} == 1",
        lambda: _query(prom_port, 'kvscope_target_up{job="vllm"} == 1'),
        120,
        procs,
    )
    # the engine job scrapes vLLM directly; a job with nothing listening is down, not missing
    _wait_for("up{job='vllm'} == 1", lambda: _query(prom_port, 'up{job="vllm"} == 1'), 120, procs)
    dcgm = _wait_for("up{job='dcgm'}", lambda: _query(prom_port, 'up{job="dcgm"}'), 120, procs)
    assert [s["value"][1] for s in dcgm] == ["0"]

    groups = get_json(f"http://127.0.0.1:{prom_port}/api/v1/rules")["data"]["groups"]
    expected = sum(len(yaml.safe_load(p.read_text())["groups"]) for p in (ROOT / "rules" / "prometheus").glob("*.yml"))
    assert len(groups) == expected
    broken = [r["name"] for g in groups for r in g["rules"] if r.get("health") == "err"]
    assert not broken, broken


# ---------------------------------------------------------------------------- live Alertmanager


def test_alertmanager_from_the_deploy_config_delivers_llm_alerts_to_kvscope_serve(tmp_path, processes):
    am = _binary("prometheus-alertmanager")
    hook_port, am_port = free_port(), free_port()
    # The real webhook; no Prometheus behind it here, so diagnoses come back without a cause.
    serve = processes.start(
        "serve",
        [
            str(KVSCOPE),
            "serve",
            f"--prometheus=http://127.0.0.1:{free_port()}",
            f"--listen=127.0.0.1:{hook_port}",
            "--store=:memory:",
        ],
    )
    cfg = yaml.safe_load(AM_CONFIG.read_text())
    hook = next(r for r in cfg["receivers"] if r["name"] == "kvscope")["webhook_configs"][0]
    shipped = urllib.parse.urlsplit(hook["url"])
    assert shipped.port == 9465 and shipped.path == "/api/v1/alerts"  # kvscope serve's defaults
    hook["url"] = f"http://127.0.0.1:{hook_port}{shipped.path}"
    cfg["route"]["routes"][0]["group_wait"] = "0s"  # shipped: 10s; the route itself is unchanged
    (tmp_path / "am.yml").write_text(yaml.safe_dump(cfg))
    proc = processes.start("alertmanager", alertmanager_argv(tmp_path / "am.yml", tmp_path / "am", am_port, binary=am))
    wait_http(f"http://127.0.0.1:{am_port}/-/ready", 180, procs=(proc, serve))

    alerts = [
        {"labels": {"alertname": "LlmKvCachePressure", "job": "vllm", "instance": "e1"}},
        {"labels": {"alertname": "NodeDiskFull", "instance": "n1"}},
    ]
    assert post_alerts(f"http://127.0.0.1:{am_port}", alerts) == 200
    diagnoses_url = f"http://127.0.0.1:{hook_port}/api/v1/diagnoses"
    got = _wait_for("a diagnosis at kvscope serve", lambda: get_json(diagnoses_url)["diagnoses"], 120, (proc, serve))
    time.sleep(1.0)  # anything else that would (wrongly) arrive
    got = get_json(diagnoses_url)["diagnoses"]
    assert [d["alertnames"] for d in got] == [["LlmKvCachePressure"]]
