"""Wrong usage of the commands fails fast, with a message that names the flag and says what to do.

Each case runs the real `kvscope` entry point (kvscope.cli.main) in-process; none needs a
network service: unreachable URLs point at a port nothing listens on.
"""

from __future__ import annotations

import gzip
import socket
from pathlib import Path

import pytest

from kvscope.cli import main
from kvscope.commands._checks import check_http_url, check_recording, parse_listen, parse_seconds, parse_time
from kvscope.commands._params import parse_params

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.fixture
def not_openmetrics(tmp_path: Path) -> Path:
    path = tmp_path / "notes.om"
    path.write_text("hello world\nthis is not a recording\n")
    return path


# --- recordings that are not recordings ---------------------------------------------------


def test_diagnose_names_a_file_that_is_not_openmetrics(capsys, not_openmetrics):
    code, err = run_cli(capsys, "diagnose", "--recording", str(not_openmetrics))
    assert code == 4
    assert "is not OpenMetrics text" in err and "'hello world'" in err and "kvscope record" in err


def test_diagnose_says_an_empty_recording_is_empty(capsys, tmp_path):
    empty = tmp_path / "empty.om"
    empty.write_bytes(b"")
    code, err = run_cli(capsys, "diagnose", "--recording", str(empty))
    assert code == 4 and "is empty (0 bytes)" in err


def test_diagnose_says_a_gz_name_without_gzip_content(capsys, tmp_path):
    fake = tmp_path / "x.om.gz"
    fake.write_text("vllm:num_requests_running 1 1\n")
    code, err = run_cli(capsys, "diagnose", "--recording", str(fake))
    assert code == 4 and "not gzip-compressed" in err


@pytest.mark.parametrize("command", ["diagnose", "curve", "goodput"])
def test_a_truncated_gzip_recording_is_said_without_a_traceback(capsys, tmp_path, command):
    whole = (RECORDINGS / "kv-pressure-cascade.om.gz").read_bytes()
    cut = tmp_path / "cut.om.gz"
    cut.write_bytes(whole[: len(whole) // 3])
    code, err = run_cli(capsys, command, "--recording", str(cut))
    assert code == 4 and f"recording {cut} is truncated or corrupt" in err and "Traceback" not in err


def test_report_weekly_names_a_corrupt_gzip_recording(capsys, tmp_path):
    """Regression: `report weekly` said a gzip cut short without the file, and a corrupt one
    (zlib.error) with a traceback."""
    head = gzip.decompress((RECORDINGS / "kv-pressure-cascade.om.gz").read_bytes())[: 64 * 1024]
    bad = tmp_path / "bad.om.gz"  # a readable first member, then one whose deflate block type is invalid
    bad.write_bytes(gzip.compress(head) + b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"\xff" * 64)
    code, err = run_cli(capsys, "report", "weekly", "--recording", str(bad), "--markdown", str(tmp_path / "w.md"))
    assert code == 4 and f"recording {bad} is truncated or corrupt" in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", ["diagnose", "curve", "goodput"])
def test_a_missing_recording_is_a_source_not_read(capsys, tmp_path, command):
    code, err = run_cli(capsys, command, "--recording", str(tmp_path / "none.om.gz"))
    assert code == 4 and "does not exist" in err and "Traceback" not in err, (code, err)


def test_binary_file_is_called_binary(tmp_path):
    blob = tmp_path / "blob.om"
    blob.write_bytes(b"\x7fELF\x02\x01\x00\x00" * 8)
    with pytest.raises(ValueError, match="is binary"):
        check_recording(blob)


def test_every_library_recording_passes_the_sniff():
    paths = sorted(RECORDINGS.glob("*.om.gz"))
    assert paths
    for path in paths:
        assert check_recording(path) == path


def test_sniff_accepts_leading_free_comments_and_plain_text_samples(tmp_path):
    plain = tmp_path / "plain.om"
    plain.write_text('# recorded by hand\nvllm:num_requests_running{model="m"} 3 1700000000\n# EOF\n')
    gz = tmp_path / "typed.om.gz"
    gz.write_bytes(gzip.compress(b'# TYPE up gauge\nup{job="e"} 1 1700000000\n# EOF\n'))
    assert check_recording(plain) == plain and check_recording(gz) == gz


def test_report_refuses_a_non_openmetrics_recording_before_reading(capsys, not_openmetrics):
    code, err = run_cli(capsys, "report", "weekly", "--recording", str(not_openmetrics), "--no-progress")
    assert code == 4 and "is not OpenMetrics text" in err


def test_ui_refuses_a_non_openmetrics_recording_before_starting(capsys, not_openmetrics):
    """The source is checked before the port: with the port held (another UI, `make demo`), the
    error is still about the recording."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, err = run_cli(capsys, "ui", "--recording", str(not_openmetrics), "--port", str(port))
    assert code == 4 and "is not OpenMetrics text" in err


# --- URLs, durations, times ---------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("diagnose", "--prometheus", "localhost:9090"),
        ("diagnose", "--prometheus", "http://[::1:9090"),  # urlsplit's "Invalid IPv6 URL"
        ("diagnose", "--agent", "127.0.0.1:9464"),
        ("curve", "--prometheus", "localhost:9090"),
        ("goodput", "--agent", "127.0.0.1:9464"),
        ("ui", "--prometheus", "localhost:9090"),
        ("serve", "--prometheus", "localhost:9090"),
        ("report", "weekly", "--prometheus", "localhost:9090", "--no-progress"),
    ],
)
def test_a_url_without_scheme_is_refused_with_an_example(capsys, argv):
    code, err = run_cli(capsys, *argv)
    assert code == 3
    assert f"{argv[-1] if argv[-1] != '--no-progress' else argv[-2]!r}" in err
    assert "expected an http:// or https:// URL such as http://127.0.0.1:" in err


@pytest.mark.parametrize("flag", ["--prometheus", "--agent"])
@pytest.mark.parametrize("command", ["diagnose", "curve", "goodput"])
def test_an_unreachable_source_gets_a_hint(capsys, command, flag):
    """goodput has no --log: reading an agent must not ask for one (it raised AttributeError)."""
    url = f"http://127.0.0.1:{_closed_port()}"
    code, err = run_cli(capsys, command, flag, url, "--since", "5m")
    assert code == 4
    assert "refused" in err.lower() and f"curl -s {url}/-/ready" in err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (("diagnose", "--prometheus", "http://127.0.0.1:1", "--since", "30x"), "--since"),
        (("diagnose", "--prometheus", "http://127.0.0.1:1", "--end", "yesterday"), "--end"),
        (("ui", "--prometheus", "http://127.0.0.1:1", "--since", "30x"), "--since"),
        (("report", "weekly", "--prometheus", "http://127.0.0.1:1", "--end", "yesterday"), "--end"),
        (("curve", "--agent", "http://127.0.0.1:1", "--start", "noon"), "--start"),
        (("curve", "--agent", "http://127.0.0.1:1", "--timeout", "-1"), "--timeout"),
        (("goodput", "--prometheus", "http://127.0.0.1:1", "--timeout", "0"), "--timeout"),
        (("goodput", "--agent", "http://127.0.0.1:1", "--since", "30x"), "--since"),
        (("diagnose", "--prometheus", "http://127.0.0.1:1", "--step", "0s"), "--step"),
        (("curve", "--agent", "http://127.0.0.1:1", "--step", "0s"), "--step"),
        (("serve", "--prometheus", "http://127.0.0.1:1", "--before=-5m"), "--before"),
        (("serve", "--prometheus", "http://127.0.0.1:1", "--step", "fast"), "--step"),
    ],
)
def test_bad_durations_and_times_name_their_flag(capsys, argv, flag):
    code, err = run_cli(capsys, *argv)
    assert code == 3 and err.startswith(f"kvscope {argv[0]}: {flag}:") and "got '" in err


@pytest.mark.parametrize("duration", ["0", "1e400"])
def test_record_refuses_a_duration_not_finite_and_above_zero(capsys, tmp_path, duration):
    argv = ("record", "--target", "http://127.0.0.1:1/metrics", "--duration", duration, "--out", str(tmp_path / "x.om"))
    code, err = run_cli(capsys, *argv)
    assert code == 2 and err.startswith("kvscope record: --duration: must be a finite number of seconds > 0")


def test_window_lengths_take_seconds_or_durations():
    assert parse_seconds("--since", "1800") == parse_seconds("--since", "30m") == 1800.0
    assert parse_seconds("--since", "1h") == 3600.0
    with pytest.raises(ValueError, match="must be a finite number of seconds > 0"):
        parse_seconds("--since", "0")


def test_times_take_unix_seconds_or_iso_8601_in_utc():
    assert parse_time("--end", "1763769600") == 1763769600.0
    assert parse_time("--end", "2025-11-22T00:00:00Z") == 1763769600.0
    assert parse_time("--end", "2025-11-22T00:00:00") == 1763769600.0  # no zone: UTC
    assert parse_time("--end", "2025-11-22T01:00:00+01:00") == 1763769600.0


def test_check_http_url_accepts_http_and_https_with_a_host():
    assert check_http_url("--prometheus", "https://prom.example:443/") == "https://prom.example:443/"
    with pytest.raises(ValueError, match="--prometheus"):
        check_http_url("--prometheus", "http:///nohost")


# --- rule parameters ----------------------------------------------------------------------


def test_unknown_rule_parameter_is_refused_with_a_suggestion(capsys):
    code, err = run_cli(
        capsys,
        "diagnose",
        "--recording",
        str(RECORDINGS / "kv-pressure-cascade.om.gz"),
        "--param",
        "kv_pressure_preemption.kvfull=0.9",
    )
    assert code == 3
    assert "has no parameter 'kvfull'" in err and "did you mean kv_full?" in err


def test_misspelt_rule_id_gets_a_suggestion():
    with pytest.raises(ValueError, match="did you mean kv_pressure_preemption"):
        parse_params(["kv_pressure_preemptoin.kv_full=0.9"], {"kv_pressure_preemption": {"kv_full": 0.95}})


def test_known_parameter_passes_with_a_mapping_of_names():
    assert parse_params(["r.a=2"], {"r": {"a": 1, "b": 2}}) == {"r": {"a": 2}}


# --- outputs, ports, stores ---------------------------------------------------------------


def test_report_checks_output_directories_before_working(capsys, tmp_path):
    code, err = run_cli(
        capsys,
        "report",
        "weekly",
        "--recording",
        str(RECORDINGS / "kv-pressure-cascade.om.gz"),
        "--html",
        str(tmp_path / "missing" / "week.html"),
        "--no-progress",
    )
    assert code == 3 and "--html: directory" in err and "does not exist" in err


def test_report_does_not_create_a_store_that_is_not_there(capsys, tmp_path):
    store = tmp_path / "typo.sqlite"
    code, err = run_cli(capsys, "report", "weekly", "--store", str(store), "--no-progress")
    assert code == 4 and "does not exist" in err
    assert not store.exists()


def test_report_on_an_empty_store_says_there_is_no_data(capsys, tmp_path):
    from kvscope.agent.store.sqlite import SqliteStore

    path = tmp_path / "kvscope.db"
    SqliteStore(str(path), background=False).close()
    code, err = run_cli(capsys, "report", "weekly", "--store", str(path), "--no-progress")
    assert code == 4 and "has no kvscope samples between" in err


def test_report_refuses_a_non_positive_gpu_hour_cost(capsys):
    code, err = run_cli(
        capsys, "report", "weekly", "--prometheus", "http://127.0.0.1:1", "--gpu-hour-cost", "0", "--no-progress"
    )
    assert code == 3 and "--gpu-hour-cost" in err


def test_listen_addresses_are_checked():
    assert parse_listen("--listen", "127.0.0.1:9465") == ("127.0.0.1", 9465)
    assert parse_listen("--listen", ":9465") == ("127.0.0.1", 9465)
    assert parse_listen("--listen", "[::1]:9465") == ("::1", 9465)
    for bad in ("127.0.0.1", "127.0.0.1:99999", "127.0.0.1:http"):
        with pytest.raises(ValueError, match="--listen"):
            parse_listen("--listen", bad)


def test_serve_refuses_a_port_out_of_range(capsys):
    code, err = run_cli(capsys, "serve", "--prometheus", "http://127.0.0.1:9090", "--listen", "127.0.0.1:99999")
    assert code == 3 and "port 0-65535" in err


def test_serve_says_when_its_port_is_taken(capsys, tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, err = run_cli(
            capsys,
            "serve",
            "--prometheus",
            "http://127.0.0.1:9090",
            "--listen",
            f"127.0.0.1:{port}",
            "--store",
            str(tmp_path / "d.sqlite"),
        )
    assert code == 1 and f"cannot listen on 127.0.0.1:{port}" in err and "--listen" in err


def test_ui_says_when_its_port_is_taken(capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, err = run_cli(
            capsys, "ui", "--recording", str(RECORDINGS / "kv-pressure-cascade.om.gz"), "--port", str(port)
        )
    assert code == 3 and f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err


# --- agent / record configuration -------------------------------------------------------


@pytest.mark.parametrize(
    "text, typo, meant",
    [("scrapes:\n  interval_s: 5\n", "scrapes", "scrape"), ("colectors: {nvml: false}\n", "colectors", "collectors")],
)
def test_a_misspelt_config_section_stops_the_agent_instead_of_running_on_defaults(capsys, tmp_path, text, typo, meant):
    config = tmp_path / "kvscope.yaml"
    config.write_text(text)
    code, err = run_cli(capsys, "record", "--config", str(config), "--duration", "1s", "--out", str(tmp_path / "x.om"))
    assert code == 2
    assert f"{typo}: unknown section; did you mean {meant}?" in err
    assert not (tmp_path / "x.om").exists()


def test_record_exits_non_zero_when_every_scrape_failed(capsys, tmp_path):
    """Issue 57 S9: it exited 0 with a recording of nothing but `up 0`; the file is kept."""
    out = tmp_path / "x.om"
    target = f"http://127.0.0.1:{_closed_port()}/metrics"
    argv = ["record", "--target", target, "--duration", "1s", "--interval", "1s", "--no-progress", "--out", str(out)]
    code, err = run_cli(capsys, *argv)
    assert code == 1, err
    assert "all 1 scrape(s) failed" in err and "Traceback" not in err, err
    assert "up{" in out.read_text()


def test_an_unrelated_unknown_section_is_still_kept_for_extensions():
    from kvscope.agent.config import build_config

    cfg = build_config({"my_extension": {"a": 1}, "scrape": {}}, environ={})  # no error: not a near miss
    assert cfg.extensions["my_extension"] == {"a": 1}, cfg.extensions


def test_render_config_refuses_a_misspelt_section():
    from kvscope.commands.deploy import DeployError, check_agent_config

    with pytest.raises(DeployError, match="stor: unknown section; did you mean store"):
        check_agent_config("stor: {path: x.db}\n", "agent.yaml.tmpl")


# --- sources that answer but are the wrong thing ----------------------------------------


def test_a_source_without_any_rule_signal_is_exit_4_not_an_all_clear(capsys, tmp_path):
    rec = tmp_path / "node.om"
    rec.write_text(
        "# TYPE node_load1 gauge\n"
        + "".join(f'node_load1{{job="node",instance="a:9100"}} 0.5 {1_700_000_000 + 15 * i}\n' for i in range(4))
        + "# EOF\n"
    )
    code, err = run_cli(capsys, "diagnose", "--recording", str(rec))
    assert code == 4
    assert "none of the" in err and "could be evaluated" in err and "not an all-clear" in err


@pytest.mark.parametrize(
    "kind, url, called",
    [
        ("prometheus", "http://h:9464", "http://h:9464/api/v1/query_range"),
        ("agent", "http://h:9464/metrics", "http://h:9464/metrics/api/v1/samples"),
    ],
)
def test_an_http_4xx_from_the_source_asks_whether_the_url_is_the_right_server(kind, url, called):
    from kvscope.commands._checks import source_hint

    text = source_hint(kind, url, f"{kind} {url}: HTTP Error 404: Not Found")
    assert f"kvscope calls {called} (no /metrics path;" in text
    assert ("--agent for a kvscope agent" if kind == "prometheus" else "--prometheus for a Prometheus") in text
    assert source_hint(kind, url, "HTTP 500: boom") == "HTTP 500: boom"  # not a wrong-server sign


def test_demo_refuses_a_non_openmetrics_recording(capsys, not_openmetrics):
    code, err = run_cli(capsys, "demo", "--check", "--recording", str(not_openmetrics))
    assert code == 4 and "is not OpenMetrics text" in err


@pytest.mark.parametrize(
    "argv", [("rules", "check"), ("rules", "build", "--check"), ("diagnose", "--prometheus", "http://127.0.0.1:1")]
)
def test_a_missing_rules_dir_is_an_error_not_zero_rules(capsys, tmp_path, argv):
    code, err = run_cli(capsys, *argv, "--rules-dir", str(tmp_path / "nope"))
    assert code == 3 and "--rules-dir:" in err and "is not a directory" in err


@pytest.mark.parametrize("url", ["kvscope-ui.example", "ftp://kvscope-ui.example", "https://"])
def test_a_runbook_base_url_that_is_no_http_url_is_a_usage_error(capsys, tmp_path, url):
    code, err = run_cli(capsys, "rules", "build", "--runbook-base-url", url, "--out", str(tmp_path / "rules"))
    assert code == 3 and "--runbook-base-url: expected an http:// or https:// URL" in err and repr(url) in err
    assert not (tmp_path / "rules").exists()


def test_a_rules_dir_without_rule_files_is_an_error(capsys, tmp_path):
    code, err = run_cli(capsys, "rules", "check", "--rules-dir", str(tmp_path))
    assert code == 3 and "no rule files" in err


def test_report_period_is_optional_and_not_taken_for_a_recording(capsys, tmp_path, not_openmetrics):
    # `weekly` after --recording FILE... is the period, not a file; without it the period defaults
    for argv in (
        ("report", "--recording", str(not_openmetrics), "weekly"),
        ("report", "--recording", str(not_openmetrics)),
    ):
        code, err = run_cli(capsys, *argv, "--no-progress")
        assert code == 4 and f"recording {not_openmetrics} is not OpenMetrics text" in err
        assert "recording weekly" not in err


def test_a_port_held_only_by_time_wait_connections_is_free_and_a_listening_one_is_not():
    import socket

    from kvscope.commands._checks import check_port_free

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    with pytest.raises(ValueError, match="--port: cannot listen on 127.0.0.1"):
        check_port_free("--port", "127.0.0.1", port)
    conn.close()  # the server side closes first: its end waits in TIME_WAIT
    cli.close()
    srv.close()
    check_port_free("--port", "127.0.0.1", port)  # a restarted server may bind it again


def test_diagnose_keeps_the_findings_when_what_changed_cannot_be_read(capsys, monkeypatch):
    """The curve is a second read of the source (an agent or TSDB can go away between the two):
    its failure costs the "what changed" section, said on stderr, never the findings or a traceback."""
    from kvscope.diagnoser.curve import report as curve_report
    from kvscope.diagnoser.sources import SourceError

    def gone(*args, **kwargs):
        raise SourceError("agent http://127.0.0.1:9: connection refused")

    monkeypatch.setattr(curve_report, "window_curves", gone)
    code = main(["diagnose", "--recording", str(RECORDINGS / "kv-pressure-cascade.om.gz"), "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and '"likely_cause": {' in out  # 2: a rule fired
    assert "what changed in the window could not be read: agent http://127.0.0.1:9" in err and "Traceback" not in err


def test_diagnose_an_unreachable_prometheus_says_not_diagnosed_in_text_and_json(capsys):
    """Issue 57: exit 4 with "not diagnosed: <reason>"; with --json stdout says so too (it was empty)."""
    import json

    url = f"http://127.0.0.1:{_closed_port()}"
    code = main(["diagnose", "--prometheus", url, "--since", "30m", "--json"])
    out, err = capsys.readouterr()
    assert code == 4 and "not diagnosed: prometheus" in err and "cannot connect" in err and "Traceback" not in err
    answer = json.loads(out)
    assert answer["status"] == "not_diagnosed" and "cannot connect" in answer["reason"]
    assert main(["diagnose", "--prometheus", url, "--since", "30m"]) == 4
    out, err = capsys.readouterr()
    assert out == "" and "not diagnosed: prometheus" in err


def test_the_window_of_a_live_source_ends_now_on_the_lattice_a_recording_is_whole():
    import argparse
    import time

    from kvscope.commands._source import window

    live = argparse.Namespace(start=None, end=None, recording=None, prometheus="http://p:9090", agent=None)
    start, end = window(live, 600.0, 15.0)  # goodput's flags: no --log
    assert end is not None and end % 15 == 0 and time.time() - 15 < end <= time.time() and start == end - 600
    _, end = window(argparse.Namespace(**{**vars(live), "end": 1000.0}), 600.0, 15.0)
    assert end == 1000.0
    _, end = window(argparse.Namespace(**{**vars(live), "log": None}), 600.0, None)  # no lattice: now
    assert end is not None and time.time() - 5 < end <= time.time()
    recording = argparse.Namespace(**{**vars(live), "recording": "x.om", "prometheus": None, "log": None})
    assert window(recording, 600.0, 15.0) == (None, None)
