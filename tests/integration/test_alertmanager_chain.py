"""The whole alert path on 127.0.0.1 with real binaries:

    metrics target (vLLM names, KV full, preemptions climbing)
      -> Prometheus 2.42 (generated canonical rules + the generated LlmKvPressurePreemption alert)
      -> Alertmanager 0.25 (group_wait 1s)
      -> kvscope serve (diagnoses the alert's window from that Prometheus)
      -> forward target (receives the enriched payload)

The alert's `for` is shortened to 5s on both sides (the generated alert is compiled with the
same parameter override that `kvscope serve --param` passes to the engine), so the chain runs in
about 20 s. The metrics target is a test double of our own: real vLLM on CPU does not preempt on
demand. Everything else is the real component.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from kvscope.core.signals import load_catalog
from kvscope.diagnoser.promql.alerts import compile_rule
from kvscope.diagnoser.promql.rulefiles import canonical_rules, render_rule_file
from kvscope.diagnoser.promql.runbooklinks import link_alerts
from kvscope.diagnoser.rulebook.rule import read_rule, rules_dir
from testbed.alertmanager import alertmanager_argv
from testbed.httpstub import serving
from testbed.procs import ProcessGroup, free_port, retry_port_clash, wait_http
from testbed.prometheus import prometheus_argv

# A wait for a real server to be ready (or Prometheus to have scraped) ends as soon as it is; the limit
# only bounds a hang, sized for a box whose cores other test runs saturate (a vLLM start took 13x its
# idle time at load average 25).
READY_S = 180
RULE_ID = "kv_pressure_preemption"
OVERRIDE = {"for": "5s"}
RUNBOOK_BASE = "https://kvscope-ui.example"

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.needs("prometheus", "prometheus-alertmanager"),
    pytest.mark.servers,
]


class _Target(BaseHTTPRequestHandler):
    """vLLM exposition: KV cache 97 % full, one more preemption every scrape."""

    started = time.time()

    def do_GET(self) -> None:  # noqa: N802
        preemptions = int((time.time() - self.started) * 2)
        body = (
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.97\n'
            "# TYPE vllm:num_preemptions counter\n"
            f'vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preemptions}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="tiny"} 8\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Sink(BaseHTTPRequestHandler):
    """Forward target: keeps every POSTed JSON body."""

    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Sink.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _write_configs(tmp: Path, target_port: int, am_port: int, serve_port: int) -> None:
    rule = read_rule(rules_dir() / f"{RULE_ID}.yaml").with_params(OVERRIDE)
    alerts = compile_rule(rule)
    assert isinstance(alerts, list)
    link_alerts(alerts, RUNBOOK_BASE)  # as `kvscope rules build --runbook-base-url` does
    (tmp / "rules.yml").write_text(
        render_rule_file(
            [{"name": "canonical", "rules": canonical_rules(load_catalog())}, {"name": "alerts", "rules": alerts}], ""
        )
    )
    (tmp / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp / "rules.yml")],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
                "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}],
            }
        )
    )
    (tmp / "alertmanager.yml").write_text(
        yaml.safe_dump(
            {
                "route": {
                    "receiver": "kvscope",
                    "group_by": ["alertname", "instance"],
                    "group_wait": "1s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                },
                "receivers": [
                    {
                        "name": "kvscope",
                        "webhook_configs": [
                            {"url": f"http://127.0.0.1:{serve_port}/api/v1/alerts", "send_resolved": True}
                        ],
                    }
                ],
            }
        )
    )


def _start_chain(tmp, target_port: int, sink_port: int, procs: ProcessGroup) -> dict:
    prom_port, am_port, serve_port = free_port(), free_port(), free_port()
    _write_configs(tmp, target_port, am_port, serve_port)
    serve = procs.start(
        "serve",
        [
            sys.executable,
            "-m",
            "kvscope.cli",
            "serve",
            "--prometheus",
            f"http://127.0.0.1:{prom_port}",
            "--listen",
            f"127.0.0.1:{serve_port}",
            "--forward-url",
            f"http://127.0.0.1:{sink_port}/",
            "--store",
            str(tmp / "diagnoses.sqlite"),
            "--step",
            "1s",
            "--before",
            "2m",
            "--param",
            f"{RULE_ID}.for=5s",
        ],
    )
    am = procs.start("alertmanager", alertmanager_argv(tmp / "alertmanager.yml", tmp / "am", am_port))
    prom = procs.start(
        "prometheus", prometheus_argv(tmp / "prometheus.yml", tmp / "tsdb", prom_port, "--rules.alert.resend-delay=1s")
    )
    for proc, url in (
        (serve, f"http://127.0.0.1:{serve_port}/-/healthy"),
        (am, f"http://127.0.0.1:{am_port}/-/ready"),
        (prom, f"http://127.0.0.1:{prom_port}/-/ready"),
    ):
        wait_http(url, READY_S, procs=(proc,), request_timeout_s=5, interval_s=0.2)
    return {"serve": f"http://127.0.0.1:{serve_port}", "tmp": tmp, "procs": procs}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chain")
    with serving(_Target) as target, serving(_Sink) as sink, ProcessGroup(tmp) as procs:
        yield retry_port_clash(
            lambda: _start_chain(tmp, target.server_address[1], sink.server_address[1], procs), cleanup=procs.stop_all
        )


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"{}")


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _logs(chain) -> str:
    return chain["procs"].logs()


def test_bad_webhooks_get_4xx_and_the_receiver_keeps_running(chain):
    url = chain["serve"] + "/api/v1/alerts"
    assert _post(url, b"{not json")[0] == 400
    assert _post(url, json.dumps({"version": "3", "alerts": []}).encode())[0] == 400
    status, body = _post(url, json.dumps({"version": "4", "alerts": [{"labels": {"a": 1}}]}).encode())
    assert status == 400 and "labels" in body["error"]
    assert _post(url, b'{"version": "4", "alerts": ["' + b"x" * (2 * 1024 * 1024) + b'"]}')[0] == 413
    with urllib.request.urlopen(chain["serve"] + "/-/healthy", timeout=5) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(chain["serve"] + "/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert 'kvscope_webhook_requests_total{code="400"} 3' in metrics
    assert 'kvscope_webhook_requests_total{code="413"} 1' in metrics
    lint = subprocess.run(
        ["promtool", "check", "metrics"], input=metrics, capture_output=True, text=True, timeout=300
    )  # hang guard
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_firing_alert_reaches_the_forward_target_with_the_rule_and_its_lever(chain):
    deadline = time.time() + 90
    while time.time() < deadline and not _forwarded_firing():
        time.sleep(0.5)
    payload = _forwarded_firing()
    assert payload, "no enriched firing alert was forwarded\n" + _logs(chain)
    alert = next(a for a in payload["alerts"] if a["labels"]["alertname"] == "LlmKvPressurePreemption")
    ks = alert["kvscope"]
    assert ks["status"] == "diagnosed", ks
    assert ks["matched"] is not None, f"the engine did not confirm the alert: {ks}\n" + _logs(chain)
    assert ks["matched"]["rule_id"] == RULE_ID
    assert ks["matched"]["where"] == {"instance": alert["labels"]["instance"]}
    first_lever = read_rule(rules_dir() / f"{RULE_ID}.yaml").doc["levers"][0]["id"]
    assert ks["matched"]["levers"][0]["id"] == first_lever
    evidence = {e["name"]: e["value"] for e in ks["matched"]["evidence"]}
    assert any(v is not None and abs(v - 0.97) < 1e-9 for v in evidence.values()), evidence
    assert ks["likely_cause"] is not None
    # the runbook link, filled in by Prometheus and carried by Alertmanager, opens this alert's triage page
    instance = urllib.parse.quote_plus(alert["labels"]["instance"])
    link = alert["annotations"]["runbook_url"]
    assert link.startswith(f"{RUNBOOK_BASE}/?page=Triage&alertname=LlmKvPressurePreemption&window=1h"), link
    assert link.endswith(f"&label.instance={instance}"), link  # the series' labels ($labels), not the rule's

    stored = _get(f"{chain['serve']}/api/v1/diagnoses/{payload['kvscope_id']}")
    assert stored["status"] == "done" and stored["forward"].startswith("ok")
    assert stored["payload"]["alerts"][0]["kvscope"]["matched"]["rule_id"] == RULE_ID
    listing = _get(chain["serve"] + "/api/v1/diagnoses?alertname=LlmKvPressurePreemption")["diagnoses"]
    assert any(d["id"] == payload["kvscope_id"] for d in listing)


def _forwarded_firing() -> dict | None:
    for payload in _Sink.received:
        for alert in payload.get("alerts", []):
            if alert["labels"].get("alertname") == "LlmKvPressurePreemption" and alert["status"] == "firing":
                return payload
    return None
