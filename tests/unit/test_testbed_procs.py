"""testbed/procs.py and testbed/httpstub.py on real child processes and sockets."""

from __future__ import annotations

import signal
import socket
import sys

import pytest

from testbed.httpstub import serving, static_body_handler
from testbed.procs import (
    ProcessExited,
    ProcessGroup,
    WaitTimeout,
    check_alive,
    free_port,
    http_get,
    retry_port_clash,
    running,
    start_reporting_port,
    stop_process,
    wait_http,
    wait_until,
)

PY = sys.executable
IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
)


def test_free_port_is_bindable_on_loopback():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_wait_until_returns_the_first_truthy_result_and_treats_oserror_as_not_yet():
    calls = iter([ConnectionRefusedError(), None, 0, "ready"])

    def check():
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    assert wait_until(check, 60, "ready", interval_s=0.01) == "ready"


def test_wait_until_times_out_with_what_and_the_logs():
    with pytest.raises(WaitTimeout, match=r"(?s)waiting for the thing.*last: None.*the log says"):
        wait_until(lambda: None, 0.2, "the thing", interval_s=0.05, logs=lambda: "the log says")


def test_a_process_that_exits_fails_the_wait_at_once_with_its_log(tmp_path):
    # Causal, not timed: ProcessExited (not WaitTimeout) before the 300 s ceiling means the wait
    # ended on the exit; a loaded box can slow that, never turn it into a timeout.
    with ProcessGroup(tmp_path) as group:
        proc = group.start("crasher", [PY, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"])
        with pytest.raises(ProcessExited, match=r"(?s)crasher exited with 3.*boom: bad flag"):
            wait_http(f"http://127.0.0.1:{free_port()}/", 300, procs=(proc,))


def test_running_kills_and_reaps_a_process_that_ignores_sigterm(tmp_path):
    log = tmp_path / "stubborn.log"
    with running([PY, "-u", "-c", IGNORES_SIGTERM], log, stop_timeout_s=0.5) as proc:
        wait_until(lambda: "up" in log.read_text(), 120, "the child to start")
    assert proc.returncode == -signal.SIGKILL


def test_process_group_stops_everything_even_when_the_test_fails(tmp_path):
    group = ProcessGroup(tmp_path, stop_timeout_s=0.5)
    with pytest.raises(RuntimeError), group:
        a = group.start("a", [PY, "-c", "import time; time.sleep(60)"])
        b = group.start("b", [PY, "-u", "-c", IGNORES_SIGTERM])
        wait_until(lambda: "up" in group.log("b"), 120, "b to start")
        raise RuntimeError("the test failed")
    assert a.returncode == -signal.SIGTERM and b.returncode == -signal.SIGKILL
    assert group.procs == []


def test_start_reporting_port_reads_the_bound_port(tmp_path):
    (tmp_path / "metrics").write_text("up 1\n")
    proc, port = start_reporting_port(
        [PY, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        r"port (\d+)",
        stream="stdout",
    )
    try:
        assert http_get(f"http://127.0.0.1:{port}/metrics") == (200, b"up 1\n")
    finally:
        assert stop_process(proc) == -signal.SIGTERM


def test_start_reporting_port_fails_with_the_output_when_no_port_shows():
    with pytest.raises(ProcessExited, match="no port here"):
        start_reporting_port([PY, "-c", "import sys; sys.stderr.write('no port here\\n')"], r"port (\d+)", timeout_s=10)


def test_static_body_handler_serves_the_body_and_404s_other_paths():
    with serving(static_body_handler(b"x 1\n", only_path="/metrics")) as server:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert http_get(base + "/metrics") == (200, b"x 1\n")
        assert http_get(base + "/other")[0] == 404
    assert http_get(base + "/metrics", timeout_s=2) == (0, b"")


def test_retry_port_clash_starts_again_only_when_a_port_was_taken(tmp_path):
    """A real clash: a server told to bind a port another socket holds exits 'in use'; the
    retry picks a fresh port. Any other exit is not retried."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [taken.getsockname()[1]]
        cleanups = []

        def start():
            port = ports[-1]
            ports.append(free_port())  # the next try's port
            with ProcessGroup(tmp_path) as procs:
                proc = procs.start("http", [PY, "-m", "http.server", "--bind", "127.0.0.1", str(port)])
                if port == ports[0]:
                    proc.wait(10)
                check_alive([proc])
            return port

        assert retry_port_clash(start, cleanup=lambda: cleanups.append(1)) != ports[0]
        assert cleanups == [1]

    def broken():
        raise ProcessExited("engine exited with 1: no model")

    with pytest.raises(ProcessExited, match="no model"):
        retry_port_clash(broken, cleanup=lambda: pytest.fail("not a port clash: no retry"))
