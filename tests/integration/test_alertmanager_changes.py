"""What changed leads the alert's diagnosis, end to end with real binaries and a real config change:

    tests/recordings/curve-vllm-config-changes (real vLLM on CPU, restarted between phases with
    --num-gpu-blocks-override 256 -> 20 -> 256 -> 256), shifted to end a minute ago
      -> promtool tsdb create-blocks-from openmetrics -> Prometheus 2.42
      -> an alert posted to Alertmanager 0.25 (started during the small-KV phase)
      -> Alertmanager's webhook -> kvscope serve (diagnoses the alert's window from that Prometheus)

`kvscope serve` runs at its default 15 s step (the findings'); the changes are read at the
recording's 2 s scrape interval, measured from the raw samples (docs/curve.md), as `kvscope curve`
reads them without --step. The alert's `kvscope` object must lead with the KV-capacity change
(the YAML's expected verdict, written before the recording was read: a regression), name the same
changes, verdicts and deltas as `kvscope curve --json` on the same Prometheus window, and the
stored row must be what the alert's stable link (`/api/v1/diagnoses/latest`) answers.

Backfilled blocks carry no staleness markers (promtool cannot write them), so without them a
restarted engine's old series would be read for 5 minutes after it stopped. A live Prometheus
writes those markers when the series vanish from the scrape; `--query.lookback-delta=10s` (five
of the recording's 2 s scrapes) stands in for them here.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from kvscope.agent.recording.omfile import read_recording_text
from kvscope.cli import main
from testbed.alertmanager import alertmanager_argv, post_alerts
from testbed.procs import ProcessGroup, free_port, retry_port_clash, wait_http
from testbed.prometheus import backfill_openmetrics, prometheus_argv

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"
NAME = "curve-vllm-config-changes"
READY_S = 180  # bounds a hang only; a loaded 2-core box starts these slowly
ALERT = {
    "alertname": "LlmKvPressurePreemption",
    "rule_id": "kv_pressure_preemption",
    "severity": "warning",
    "instance": "replica-0",
}

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.needs("prometheus", "promtool", "prometheus-alertmanager"),
    pytest.mark.servers,
]


def _shifted(text: str, end: float) -> tuple[str, float]:
    """The OpenMetrics text with every sample moved so the last is at `end`; the shift."""
    lines = text.splitlines()
    last = max(float(ln.rsplit(" ", 1)[1]) for ln in lines if ln and not ln.startswith("#"))
    shift = end - last
    out = []
    for ln in lines:
        if ln and not ln.startswith("#"):
            head, ts = ln.rsplit(" ", 1)
            ln = f"{head} {float(ts) + shift:.3f}"
        out.append(ln)
    return "\n".join(out) + "\n", shift


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _start(tmp: Path, procs: ProcessGroup) -> dict:
    prom_port, am_port, serve_port = free_port(), free_port(), free_port()
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    (tmp / "alertmanager.yml").write_text(
        yaml.safe_dump(
            {
                "route": {"receiver": "kvscope", "group_by": ["alertname", "instance"], "group_wait": "1s"},
                "receivers": [
                    {"name": "kvscope", "webhook_configs": [{"url": f"http://127.0.0.1:{serve_port}/api/v1/alerts"}]}
                ],
            }
        )
    )
    argv = [sys.executable, "-m", "kvscope.cli", "serve", "--prometheus", f"http://127.0.0.1:{prom_port}"]
    argv += ["--listen", f"127.0.0.1:{serve_port}", "--store", str(tmp / "diagnoses.sqlite")]
    # serve's default 15 s grid for the findings: each phase lasts ~80 s, too few 15 s intervals to
    # compare at matched load, so the changes must be read at the 2 s the recording was scraped at
    # (curve.window.curve_step, from the raw samples' gaps)
    argv += ["--before", "20m", "--diagnosis-timeout", "8m"]
    serve = procs.start("serve", argv)
    am = procs.start("alertmanager", alertmanager_argv(tmp / "alertmanager.yml", tmp / "am", am_port))
    prom = procs.start(
        "prometheus",
        prometheus_argv(tmp / "prometheus.yml", tmp / "data", prom_port, "--query.lookback-delta=10s"),
    )
    for proc, url in (
        (serve, f"http://127.0.0.1:{serve_port}/-/healthy"),
        (am, f"http://127.0.0.1:{am_port}/-/ready"),
        (prom, f"http://127.0.0.1:{prom_port}/-/ready"),
    ):
        wait_http(url, READY_S, procs=(proc,), request_timeout_s=5, interval_s=0.2)
    return {
        "prom": f"http://127.0.0.1:{prom_port}",
        "am": f"http://127.0.0.1:{am_port}",
        "serve": f"http://127.0.0.1:{serve_port}",
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("changes")
    text, shift = _shifted(read_recording_text(RECORDINGS / f"{NAME}.om.gz"), time.time() - 60)
    (tmp / "native.om").write_text(text)
    backfill_openmetrics(tmp / "native.om", tmp / "data")
    meta = yaml.safe_load((RECORDINGS / f"{NAME}.yaml").read_text())
    with ProcessGroup(tmp) as procs:
        urls = retry_port_clash(lambda: _start(tmp, procs), cleanup=procs.stop_all)
        yield urls | {"meta": meta, "t0": meta["recorded_at_unix"] + shift, "procs": procs}


def _diagnosed(served, deadline_s: float = 480) -> dict | None:
    """The stored diagnosis of the alert once `kvscope serve` finished it."""
    url = f"{served['serve']}/api/v1/diagnoses/latest?alertname={ALERT['alertname']}&label.instance=replica-0"
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            row = _get(url)
        except urllib.error.HTTPError:
            row = None
        if row and row["status"] != "pending":
            return row
        time.sleep(1)
    return None


def test_the_kv_capacity_change_leads_the_alerts_diagnosis(served, capsys):
    meta, t0 = served["meta"], served["t0"]
    small = next(p for p in meta["phases"] if p["name"] == "tiny-kv")
    starts = t0 + small["start_s"] + 40  # the alert fires during the small-KV phase, after the change
    alert = {"labels": ALERT, "startsAt": _iso(starts), "endsAt": _iso(time.time() + 3600)}
    assert post_alerts(served["am"], [alert]) == 200

    row = _diagnosed(served)
    assert row, "no diagnosis stored\n" + served["procs"].logs()
    assert row["status"] == "done", row
    ks = row["alert"]["kvscope"]
    assert ks["status"] == "diagnosed" and ks["errors"] == [], ks.get("errors")
    assert list(ks)[:4] == ["status", "window", "changes", "headline"]  # what changed, before the findings
    # read for the alert's pool only: the model its instance serves (from the TSDB's index)
    assert ks["changes_read"] == "the pools of model tiny-llama (1 instance(s))"

    # the lead: the change the YAML expected a regression from (written before kvscope read it)
    want = meta["expected_curve"]["changes"][0]
    lead = ks["changes"][0]
    assert (lead["kind"], lead["verdict"]) == (want["kind"], want["verdict"])
    assert lead["diff"] == {"kv_capacity_tokens": [8192.0, 640.0]} and lead["instances"] == ["replica-0"]
    assert t0 + 90 < lead["time"] <= starts
    assert lead["deltas"]["ttft_p99_s"]["relative"] > 0.1
    assert (
        ks["headline"].startswith("what changed: ") and "kv_capacity_tokens 8192 -> 640: regression" in ks["headline"]
    )
    found = [f for f in ks["findings"] if f["rule_id"] == "regression_after_change"]
    assert any("kv_capacity_tokens 8192 -> 640" in f["summary"] for f in found), [f["rule_id"] for f in ks["findings"]]

    # the same changes, verdicts and deltas as `kvscope curve --json` over the same window
    start, end = ks["window"]
    main(["curve", "--prometheus", served["prom"], "--start", str(start), "--end", str(end), "--json"])
    (pool,) = json.loads(capsys.readouterr().out)["pools"]
    by_time = {c["time"]: c for c in pool["changes"]}
    assert sorted(by_time) == sorted(c["time"] for c in ks["changes"])
    for c in ks["changes"]:
        assert all(c[k] == by_time[c["time"]][k] for k in ("kind", "verdict", "diff", "deltas")), c

    # the stored row by id holds the same object the alert's stable link answered
    stored = _get(f"{served['serve']}/api/v1/diagnoses/{row['id']}")["payload"]["alerts"][0]["kvscope"]
    assert stored == ks
    listing = _get(f"{served['serve']}/api/v1/diagnoses?alertname={ALERT['alertname']}")["diagnoses"]
    assert listing[0]["summary"][0]["headline"] == ks["headline"]


def test_diagnose_on_the_fleet_path_reads_what_changed_in_the_likely_causes_pool(served, capsys):
    """`kvscope diagnose --prometheus` (the fleet path) reads no changes by default and says so;
    with --changes it reads those of the likely cause's pool (the pool `serve` reads for an alert
    there), and they are the changes `kvscope curve --json` gives for the same window."""
    meta, t0 = served["meta"], served["t0"]
    start, end = t0 - 30, time.time() // 15 * 15  # the whole recording: every phase, both sides of each change
    window = ["--prometheus", served["prom"], "--start", f"{start:.0f}", "--end", f"{end:.0f}"]
    main(["diagnose", *window, "--json"])
    plain = capsys.readouterr()
    assert json.loads(plain.out)["changes"] == []
    assert "what changed: not read on the fleet path (--changes reads the likely cause's pool)" in plain.err

    main(["diagnose", *window, "--json", "--changes"])
    got = capsys.readouterr()
    doc = json.loads(got.out)
    assert "what changed: read for the pools of model tiny-llama (1 instance(s))" in got.err
    want = meta["expected_curve"]["changes"][0]  # the YAML's verdict, written before the recording was read
    lead = next(c for c in doc["changes"] if c["diff"] == {"kv_capacity_tokens": [8192.0, 640.0]})
    assert (lead["kind"], lead["verdict"]) == (want["kind"], want["verdict"])
    assert any(f["rule_id"] == "regression_after_change" for f in [doc["likely_cause"], *doc["other"]] if f)

    main(["curve", *window, "--json"])
    (pool,) = json.loads(capsys.readouterr().out)["pools"]
    assert [(c["time"], c["kind"], c["verdict"]) for c in doc["changes"]] == [
        (c["time"], c["kind"], c["verdict"]) for c in pool["changes"]
    ]
