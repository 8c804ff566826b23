"""Real processes for tests and benches: free ports, readiness waits, start/stop that always reaps.

Every server a test starts binds 127.0.0.1. Two ways to get its port:

* `free_port()` asks the kernel for one and hands it to the process (`--web.listen-address`);
  fine for binaries that cannot report the port they bound.
* `start_reporting_port()` starts the process on port 0 and reads the bound port from its
  output: no race with another process taking the port in between.

`LoggedProcess` writes stdout+stderr to a log file, so a failed wait can show what the process
said. `stop_process()` signals, waits, kills what does not stop and reaps it; `ProcessGroup`
does that for everything one test started; `running()` is the one-process context manager.
Waits raise `ProcessExited` / `WaitTimeout` (both AssertionError: a test fails, a bench stops)
with the log tail in the message.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

LOOPBACK = "127.0.0.1"


class ProcessExited(AssertionError):
    """A process a test waits on exited before it was ready."""


class WaitTimeout(AssertionError):
    """What a test waited for did not happen in time."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on right now (another process may take it before you do)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


T = TypeVar("T")
PORT_CLASH = re.compile(r"address already in use", re.IGNORECASE)


def retry_port_clash(start: Callable[[], T], cleanup: Callable[[], None], attempts: int = 3) -> T:
    """`start()` (which picks ports with free_port and starts servers on them), again with
    `cleanup()` between tries when a server exited because another process took its port first
    (free_port can only say a port was free a moment ago)."""
    for attempt in range(attempts):
        try:
            return start()
        except ProcessExited as exc:
            if attempt == attempts - 1 or not PORT_CLASH.search(str(exc)):
                raise
            cleanup()
    raise AssertionError("unreachable")


def read_tail(path: Path | None, chars: int = 3000) -> str:
    """The last `chars` characters of a log file, or "" when there is none."""
    if path is None or not path.exists():
        return ""
    return path.read_text(errors="replace")[-chars:]


class LoggedProcess(subprocess.Popen):
    """A Popen whose stdout and stderr go to `log_path` (appended; None: discarded).

    stdin is /dev/null unless given. The parent does not keep the log open: the child has its
    own descriptor, so nothing leaks when a test forgets the file.
    """

    def __init__(self, argv: list[str], log_path: Path | None = None, name: str | None = None, **popen_kw: Any) -> None:
        self.name = name or Path(argv[0]).name
        self.log_path = log_path
        popen_kw.setdefault("stdin", subprocess.DEVNULL)
        if log_path is None:
            super().__init__(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen_kw)
            return
        with open(log_path, "ab") as log:
            super().__init__(argv, stdout=log, stderr=subprocess.STDOUT, **popen_kw)

    def log_tail(self, chars: int = 3000) -> str:
        return read_tail(self.log_path, chars)


def _describe_exit(proc: subprocess.Popen) -> str:
    name = getattr(proc, "name", None) or str(proc.args[0] if isinstance(proc.args, list) else proc.args)
    tail = proc.log_tail() if isinstance(proc, LoggedProcess) else ""
    return f"{name} exited with {proc.returncode}" + (f":\n{tail}" if tail else "")


def check_alive(procs: Iterable[subprocess.Popen]) -> None:
    """Raise ProcessExited (with its log tail) if any of `procs` has exited."""
    for proc in procs:
        if proc.poll() is not None:
            raise ProcessExited(_describe_exit(proc))


def wait_until(
    check: Callable[[], Any],
    timeout_s: float,
    what: str,
    *,
    procs: Iterable[subprocess.Popen] = (),
    interval_s: float = 0.3,
    logs: Callable[[], str] | str = "",
) -> Any:
    """Poll `check()` until it returns something truthy, and return that.

    An OSError from `check` (connection refused, timeout) counts as "not yet". Any of `procs`
    exiting fails at once. On timeout, WaitTimeout names `what`, the last result and `logs`
    (a string or a callable read only then).
    """
    procs = list(procs)
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        check_alive(procs)
        try:
            last = check()
            if last:
                return last
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            extra = logs() if callable(logs) else logs
            raise WaitTimeout(
                f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}" + (f"\n{extra}" if extra else "")
            )
        time.sleep(interval_s)


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; (0, b"") when nothing answers. HTTP errors give their status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()
    except OSError:
        return 0, b""


def wait_http(
    url: str,
    timeout_s: float,
    *,
    procs: Iterable[subprocess.Popen] = (),
    request_timeout_s: float = 2.0,
    interval_s: float = 0.3,
) -> bytes:
    """Wait until GET `url` answers 200 and return its body; fail early if any of `procs` exits."""
    procs = list(procs)

    def answered() -> tuple[bytes] | None:
        status, body = http_get(url, request_timeout_s)
        return (body,) if status == 200 else None

    return wait_until(
        answered,
        timeout_s,
        f"200 from {url}",
        procs=procs,
        interval_s=interval_s,
        logs=lambda: "\n".join(p.log_tail() for p in procs if isinstance(p, LoggedProcess)),
    )[0]


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
    """Send `sig` (if it still runs), wait `timeout_s`, then SIGKILL; reap it, join its output
    reader (see start_reporting_port) and close its pipes. Returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    reader = getattr(proc, "reader", None)
    if reader is not None:
        reader.join(10)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return rc


@contextlib.contextmanager
def running(
    argv: list[str],
    log_path: Path | None = None,
    *,
    ready_url: str | None = None,
    ready_timeout_s: float = 60.0,
    stop_timeout_s: float = 20.0,
    **popen_kw: Any,
) -> Iterator[LoggedProcess]:
    """Start `argv` (output to `log_path`), wait for `ready_url` to answer 200 if given, yield the
    process; on exit, whatever happened, stop and reap it."""
    proc = LoggedProcess(argv, log_path, **popen_kw)
    try:
        if ready_url is not None:
            wait_http(ready_url, ready_timeout_s, procs=(proc,))
        yield proc
    finally:
        stop_process(proc, timeout_s=stop_timeout_s)


class ProcessGroup:
    """The processes one test starts, each logging to `<logdir>/<name>.log`.

    `stop_all()` sends SIGTERM to all of them (newest first), then waits for each and kills
    what is left after `stop_timeout_s`. Processes started elsewhere join with `adopt()`.
    """

    def __init__(self, logdir: Path, stop_timeout_s: float = 10.0) -> None:
        self.logdir = logdir
        self.stop_timeout_s = stop_timeout_s
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], **popen_kw: Any) -> LoggedProcess:
        proc = LoggedProcess(argv, self.logdir / f"{name}.log", name=name, **popen_kw)
        self.procs.append(proc)
        return proc

    def adopt(self, proc: subprocess.Popen) -> subprocess.Popen:
        self.procs.append(proc)
        return proc

    def log(self, name: str, chars: int = 3000) -> str:
        return read_tail(self.logdir / f"{name}.log", chars)

    def logs(self, chars: int = 3000) -> str:
        """Every log's tail, for a failure message."""
        return "\n".join(f"--- {p.name}\n{read_tail(p, chars)}" for p in sorted(self.logdir.glob("*.log")))

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            stop_process(proc, timeout_s=self.stop_timeout_s)
        self.procs.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def start_reporting_port(
    argv: list[str], pattern: str, timeout_s: float = 60.0, stream: str = "stderr", **popen_kw: Any
) -> tuple[subprocess.Popen, int]:
    """Start a server told to bind port 0 and read the port it got from its output.

    `pattern` is a regex with one group, the port, matched line by line on `stream` ("stderr",
    or "stdout" with stderr merged into it). A thread keeps draining the stream so the child
    never blocks on a full pipe; the lines it read are `proc.output_lines`. Fails (after killing
    the process) if no port shows within `timeout_s`.
    """
    pipes = (
        {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
        if stream == "stdout"
        else {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
    )
    proc = subprocess.Popen(argv, text=True, **pipes, **popen_kw)
    out = proc.stdout if stream == "stdout" else proc.stderr
    found: list[int] = []
    seen: list[str] = []

    def read() -> None:
        for line in out:
            seen.append(line)
            m = re.search(pattern, line)
            if m and not found:
                found.append(int(m.group(1)))

    proc.reader = threading.Thread(target=read, daemon=True)  # type: ignore[attr-defined]
    proc.reader.start()  # type: ignore[attr-defined]
    proc.output_lines = seen  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while not found and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not found:
        stop_process(proc, signal.SIGKILL)
        raise ProcessExited(f"{argv[:4]} did not report its port:\n{''.join(seen)[-2000:]}")
    return proc, found[0]


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a whole process group; a group that is gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ServerProcess:
    """What the test bed's real servers (vLLM, llama.cpp, the SGLang router) share: a process
    started in its own group (`self.proc`), a log file (`self.log_path`), a private work dir
    (`self.workdir`), and stopping the whole group. Subclasses define `start()`."""

    proc: subprocess.Popen | None
    log_path: Path
    workdir: Path
    stop_grace_s: float = 10.0

    def __init__(self, name: str, log_name: str = "server.log") -> None:
        """No process yet; a fresh work dir `kvs-<name>-*` holding the log `log_name`."""
        self.proc = None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"kvs-{name}-"))
        self.log_path = self.workdir / log_name

    def start(self) -> ServerProcess:
        raise NotImplementedError  # each server knows how it starts and when it is ready

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM the process group, SIGKILL what is left after the grace period (children such
        as vLLM's EngineCore may outlive the parent), wait until the group is gone. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_grace_s if grace_s is None else grace_s)
        signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):  # noqa: ANN204 - the subclass
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
