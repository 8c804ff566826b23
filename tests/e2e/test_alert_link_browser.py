"""End to end: a generated alert's runbook_url opens the triage page for that alert.

Real components all the way: the tenant SLO rules are built with `--runbook-base-url` pointing at
a real `kvscope ui`; a real Prometheus scrapes a target where tenant `acme` has half its first
tokens over 1 s and evaluates the rules until the alert is active, expanding its runbook_url;
the alert is posted, as Alertmanager would, to a real `kvscope serve`, which stores its diagnosis;
then real headless Debian Chromium opens the runbook_url and the triage page names the alert,
its labels, its window and the diagnosis serve stored for it.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from kvscope.commands.demo import default_recording
from kvscope.diagnoser.promql.rulefiles import build_rule_files
from kvscope.ui.data import SourceSpec
from kvscope.ui.server import UiServer, free_port
from testbed.procs import start_reporting_port, stop_process, wait_until
from testbed.prometheus import get_json, require_binaries, running_prometheus

pytestmark = [pytest.mark.browser, pytest.mark.prometheus]

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"]
ALERT = "LlmTenantTtftSloBurnRate"


class _Tenants(http.server.BaseHTTPRequestHandler):
    """Two tenants as the agent re-exports them: acme slow (half over 1 s), beta fast."""

    started = time.time()

    def do_GET(self) -> None:  # noqa: N802
        n = 10 * (time.time() - self.started)
        lines = ["# TYPE kvscope_tenant_requests_total counter", "# TYPE kvscope_tenant_ttft_seconds histogram"]
        for tenant, fast in (("acme", 0.5), ("beta", 1.0)):
            lines += [
                f'kvscope_tenant_requests_total{{tenant="{tenant}"}} {n:.3f}',
                f'kvscope_tenant_ttft_seconds_bucket{{tenant="{tenant}",le="1.0"}} {n * fast:.3f}',
                f'kvscope_tenant_ttft_seconds_bucket{{tenant="{tenant}",le="+Inf"}} {n:.3f}',
                f'kvscope_tenant_ttft_seconds_sum{{tenant="{tenant}"}} {n:.3f}',
                f'kvscope_tenant_ttft_seconds_count{{tenant="{tenant}"}} {n:.3f}',
            ]
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def _active_alert(prom_url: str) -> dict | None:
    alerts = get_json(f"{prom_url}/api/v1/alerts")["data"]["alerts"]
    return next(
        (a for a in alerts if a["labels"].get("alertname") == ALERT and a["labels"].get("tenant") == "acme"), None
    )


def _post(url: str, doc: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - a local test server
        return json.load(resp)


def test_an_alerts_runbook_url_opens_its_triage_page(tmp_path: Path):
    require_binaries("prometheus", "chromium")
    recording = default_recording()
    assert recording is not None, "tests/recordings/ holds no recording"
    ui_port = free_port()
    ui_base = f"http://127.0.0.1:{ui_port}"
    files = build_rule_files(alert_groups=None, runbook_base_url=ui_base)
    for name in ("kvscope-canonical.yml", "kvscope-tenant-slo.yml"):
        (tmp_path / name).write_text(files[name])
    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Tenants)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        "rule_files: [kvscope-canonical.yml, kvscope-tenant-slo.yml]\n"
        f"scrape_configs:\n  - job_name: tap\n    static_configs: [{{targets: ['127.0.0.1:{target.server_address[1]}']}}]\n"
    )
    serve = None
    try:
        with running_prometheus(config, tmp_path / "data") as prom:
            alert = wait_until(lambda: _active_alert(prom.url), 180, ALERT, procs=(prom.proc,))
            url = alert["annotations"]["runbook_url"]
            assert url == f"{ui_base}/?page=Triage&alertname={ALERT}&window=1h&label.tenant=acme", url
            # Alertmanager's webhook of this alert to kvscope serve, which diagnoses and stores it
            serve, port = start_reporting_port(
                [sys.executable, "-m", "kvscope", "serve", "--prometheus", prom.url, "--listen", "127.0.0.1:0"]
                + ["--store", str(tmp_path / "diagnoses.sqlite")],
                r"listening on http://127\.0\.0\.1:(\d+)",
            )
            serve_url = f"http://127.0.0.1:{port}"
            labels = {"alertname": ALERT, **alert["labels"]}
            webhook = {
                "version": "4",
                "status": "firing",
                "receiver": "kvscope",
                "groupKey": "{}",
                "groupLabels": {"alertname": ALERT},
                "commonLabels": labels,
                "commonAnnotations": alert["annotations"],
                "externalURL": "http://127.0.0.1:9093",
                "alerts": [
                    {
                        "status": "firing",
                        "labels": labels,
                        "annotations": alert["annotations"],
                        "startsAt": alert["activeAt"],
                        "endsAt": "0001-01-01T00:00:00Z",
                        "generatorURL": prom.url,
                        "fingerprint": "0",
                    }
                ],
            }
            row_id = _post(serve_url + "/api/v1/alerts", webhook)["id"]
            latest = f"{serve_url}/api/v1/diagnoses/latest?alertname={ALERT}&label.tenant=acme"
            stored = wait_until(lambda: get_json(latest)["status"] == "done" and get_json(latest), 180, "stored")
            assert stored["id"] == row_id
        with UiServer(
            SourceSpec("recording", str(recording)), ui_port, log_path=tmp_path / "streamlit.log", serve_url=serve_url
        ) as ui:
            ui.wait_healthy(90)
            from playwright.sync_api import sync_playwright

            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1600})
                    page.set_default_timeout(180_000)  # waits end when the UI shows; a hang guard only
                    page.goto(url)
                    page.get_by_text(f"Alert {ALERT}", exact=True).wait_for(timeout=120_000)
                    page.get_by_text("Stored diagnosis").first.wait_for(timeout=180_000)
                    # the triage of the window is rendered below the alert: wait for it before reading
                    cause = page.get_by_text("Likely cause", exact=True).or_(page.get_by_text("No rule fired"))
                    cause.first.wait_for(timeout=180_000)
                    body = page.inner_text("body")
                    page.screenshot(path=str(tmp_path / "alert-link.png"))
                finally:
                    browser.close()
        assert "tenant=acme" in body
        assert "last 1h" in body
        assert f"Stored diagnosis (kvscope serve, #{row_id}" in body
        assert "Likely cause" in body or "No rule fired" in body  # the triage of the window follows
    finally:
        if serve is not None:
            stop_process(serve)
        target.shutdown()
        target.server_close()
