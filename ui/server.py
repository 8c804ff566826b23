"""Run the Streamlit app as a child process bound to 127.0.0.1, wait until healthy, stop cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from kvscope.diagnoser.sources import SourceError, read_url
from kvscope.ui.data import ENV, ENV_END, ENV_OBJECTIVES, ENV_SERVE, ENV_SINCE, SourceSpec

APP = Path(__file__).with_name("app.py")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the parent dies, even by SIGKILL,
    so a killed `kvscope ui` never leaves an orphaned Streamlit behind."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # no prctl (e.g. a libc without it): SIGTERM handling in kvscope still stops the UI


class TerminateRequested(Exception):
    """SIGTERM arrived: stop the UI like Ctrl-C does."""


def stop_on_sigterm() -> None:
    """Turn SIGTERM into an exception so `finally: server.stop()` runs (main thread only), and
    make Ctrl-C (SIGINT) raise KeyboardInterrupt even when it was inherited as ignored: a shell
    starts background jobs with SIGINT ignored, and a foreground UI that says "Ctrl-C to stop"
    must stop on it."""

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        raise TerminateRequested()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


class UiServer:
    """`streamlit run ui/app.py` for one source; use as a context manager or start()/stop()."""

    def __init__(
        self,
        source: SourceSpec | None,
        port: int = 8501,
        host: str = "127.0.0.1",
        log_path: Path | None = None,
        serve_url: str | None = None,
        objectives: str | None = None,
    ) -> None:
        """`serve_url`: the `kvscope serve` whose stored diagnoses the triage page links to;
        `objectives`: the latency objectives' file and flags as ui/data.py's ENV_OBJECTIVES holds them."""
        self.source, self.port, self.host, self.log_path = source, port, host, log_path
        self.serve_url, self.objectives = serve_url, objectives
        self.proc: subprocess.Popen | None = None
        self._log: TextIO | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        flags = {
            "server.headless": "true",
            "server.address": self.host,
            "server.port": str(self.port),
            "browser.gatherUsageStats": "false",
            "server.fileWatcherType": "none",
            "global.developmentMode": "false",
            "client.toolbarMode": "minimal",
        }
        return [sys.executable, "-m", "kvscope.ui.launch", "run", str(APP)] + [
            arg for k, v in flags.items() for arg in (f"--{k}", v)
        ]

    def environment(self) -> dict[str, str]:
        ours = (*ENV.values(), ENV_SINCE, ENV_END, ENV_SERVE, ENV_OBJECTIVES)
        env = {k: v for k, v in os.environ.items() if k not in ours}
        if self.serve_url:
            env[ENV_SERVE] = self.serve_url
        if self.objectives:
            env[ENV_OBJECTIVES] = self.objectives
        if self.source is not None:
            env[ENV[self.source.kind]] = self.source.location
            env[ENV_SINCE] = str(self.source.since_s)
            if self.source.end is not None:
                env[ENV_END] = str(self.source.end)
        return env

    def start(self) -> UiServer:
        out: int | TextIO = subprocess.DEVNULL
        if self.log_path is not None:
            self._log = out = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.command(),
            env=self.environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        return self

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        """Block until /_stcore/health answers ok; raise RuntimeError if the process dies or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"the UI process exited with status {self.proc and self.proc.returncode}")
            with contextlib.suppress(SourceError):
                if read_url(f"{self.url}/_stcore/health", "ui", 2.0, 1024).strip() == b"ok":
                    return
            time.sleep(0.3)
        raise RuntimeError(f"the UI did not become healthy at {self.url} within {timeout_s:.0f} s")

    def wait(self) -> int:
        """Wait for the process (foreground use)."""
        return self.proc.wait() if self.proc else 0

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL if it lingers."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> UiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
