"""A real vLLM OpenAI server on CPU as a context manager.

    with VllmServer(VllmConfig(num_gpu_blocks=64)) as srv:
        srv.url            # http://127.0.0.1:PORT
        srv.metrics_url    # .../metrics

Each server gets a free 127.0.0.1 port, its own process group, and a private temp dir used as
HOME / TMPDIR / XDG_CACHE_HOME / VLLM_CACHE_ROOT so nothing is written elsewhere. Start waits for
/health (900 s by default) and fails fast with the log tail if the process dies. Exit always
SIGTERMs the whole group, then SIGKILLs what is left after a grace period.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from testbed.procs import ServerProcess
from testbed.tiny_model import SERVED_NAME, ensure_tiny_model
from testbed.vllm_env import vllm_python


@dataclass(frozen=True)
class VllmConfig:
    """Engine flags. Defaults: the small-KV CI fixture (preemption reachable, every signal on).

    128 blocks x 32 tokens = 4096 KV tokens: about 8 requests of 500 tokens fill it.
    """

    max_model_len: int = 1024
    block_size: int = 32  # the CPU attention backend needs a multiple of 32
    num_gpu_blocks: int | None = 128  # None: size the pool from VLLM_CPU_KVCACHE_SPACE (1 GiB)
    max_num_seqs: int = 16
    prefix_caching: bool = True
    prompt_tokens_details: bool = True
    kv_cache_metrics: bool = True
    otlp_endpoint: str | None = None  # e.g. http://127.0.0.1:4318/v1/traces (http/protobuf)
    kv_events_endpoint: str | None = None  # ipc:///path.sock (vLLM binds, a subscriber connects);
    #                                        "auto": a socket in the server's private temp dir
    service_name: str = "vllm-testbed"
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def args(self, kv_events_endpoint: str | None = None) -> list[str]:
        """The command-line flags this config stands for (`kv_events_endpoint` resolves "auto")."""
        a = [
            "--served-model-name",
            SERVED_NAME,
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "--max-model-len",
            str(self.max_model_len),
            "--block-size",
            str(self.block_size),
            "--max-num-seqs",
            str(self.max_num_seqs),
        ]
        if self.num_gpu_blocks is not None:
            a += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        a.append("--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching")
        if self.prompt_tokens_details:
            a.append("--enable-prompt-tokens-details")
        if self.kv_cache_metrics:
            a += ["--kv-cache-metrics", "--kv-cache-metrics-sample", "1.0"]
        if self.otlp_endpoint:
            a += ["--otlp-traces-endpoint", self.otlp_endpoint]
        endpoint = kv_events_endpoint or self.kv_events_endpoint
        if endpoint:
            a += [
                "--kv-events-config",
                json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "kv"}),
            ]
        return a + list(self.extra_args)


def pd_configs(storage_dir: str | Path, base: VllmConfig | None = None) -> tuple[VllmConfig, VllmConfig]:
    """A prefill/decode (P/D) pair: `base` as a KV producer and as a KV consumer of vLLM's
    ExampleConnector, the one KV connector of vLLM 0.32 that runs without a GPU or RDMA.

    The producer writes each new prompt's KV (whole blocks of all but the last prompt token) as
    safetensors files under `storage_dir`, one folder per hash of those tokens; the consumer, asked for
    the same prompt, finds the folder and injects the KV in its first step instead of computing it
    (`vllm:prompt_tokens_by_source{source="external_kv_transfer"}`). Prompts need more than one block.
    Service names get `-prefill` / `-decode` appended, so a trace receiver can tell the halves apart.
    """
    base = base or VllmConfig()
    out = []
    for role, suffix in (("kv_producer", "prefill"), ("kv_consumer", "decode")):
        transfer = {
            "kv_connector": "ExampleConnector",
            "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(storage_dir)},
        }
        out.append(
            dataclasses.replace(
                base,
                service_name=f"{base.service_name}-{suffix}",
                extra_args=(*base.extra_args, "--kv-transfer-config", json.dumps(transfer)),
            )
        )
    return out[0], out[1]


# exec the real command with PR_SET_PDEATHSIG = SIGTERM (it survives execve)
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0); "
    "os.getppid() == 1 and sys.exit(1); os.execv(sys.argv[1], sys.argv[1:])"
)


ERROR_LINE = re.compile(r"died unexpectedly|exit code|Traceback|Error:|ERROR", re.IGNORECASE)
KERNEL_KILL = re.compile(r"out of memory|oom-kill|killed process|segfault|general protection", re.IGNORECASE)


def kernel_kill_lines(limit: int = 8) -> list[str]:
    """The kernel log's last lines about processes it killed or that crashed (the OOM killer, a
    segfault), or why they cannot be read (dmesg needs privileges on some hosts)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"(dmesg: {e})"]
    if out.returncode != 0:
        return [f"(dmesg exited {out.returncode}: {out.stderr.strip()[:200]})"]
    return [ln for ln in out.stdout.splitlines() if KERNEL_KILL.search(ln)][-limit:] or ["(no OOM kill or crash)"]


def memory_left() -> str:
    """MemAvailable of /proc/meminfo and the OOM kills since boot (/proc/vmstat), in words."""
    try:
        with open("/proc/meminfo") as f:
            info = dict(ln.split(":", 1) for ln in f if ":" in ln)
        with open("/proc/vmstat") as f:
            kills = next((ln.split()[1] for ln in f if ln.startswith("oom_kill ")), "unknown")
        free, total = (int(info[k].split()[0]) / 2**20 for k in ("MemAvailable", "MemTotal"))
        return f"{free:.1f} of {total:.1f} GiB available, {kills} OOM kills since boot"
    except (OSError, KeyError, ValueError) as e:
        return f"(unknown: {e})"


class VllmStartError(RuntimeError):
    """The server died or never became healthy; the message carries the log tail."""


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer(ServerProcess):
    """One vLLM server process group. Reusable: `start()` / `stop()` / `restart()`."""

    stop_grace_s = 15.0

    def __init__(
        self,
        config: VllmConfig | None = None,
        *,
        port: int | None = None,
        model: Path | None = None,
        startup_timeout_s: float | None = None,
        python: Path | None = None,
    ) -> None:
        self.config = config or VllmConfig()
        self.port = port or free_port()
        self.model = model
        # A start takes ~30 s on an idle 2-core box and took 410 s on one shared by other test runs (load
        # average 25): 180 s failed every start there. The wait only ends early on a hang (a dead
        # process fails at once), so the default is generous; KVSCOPE_VLLM_STARTUP_TIMEOUT sets it.
        self.startup_timeout_s = startup_timeout_s or float(os.environ.get("KVSCOPE_VLLM_STARTUP_TIMEOUT") or 900)
        self.python = python or vllm_python()
        super().__init__("vllm")
        self.startup_s: float | None = None
        self._t0 = time.monotonic()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    @property
    def kv_events_endpoint(self) -> str | None:
        """The ZMQ endpoint KV events are published on (connect a SUB socket), or None."""
        if self.config.kv_events_endpoint == "auto":
            return f"ipc://{self.workdir}/kv-events.sock"
        return self.config.kv_events_endpoint

    def _env(self) -> dict[str, str]:
        home = self.workdir / "home"
        tmp = self.workdir / "tmp"
        for d in (home, tmp):
            d.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "OTEL_"))}
        env.update(
            HOME=str(home),
            XDG_CACHE_HOME=str(home / ".cache"),
            TMPDIR=str(tmp),
            VLLM_CACHE_ROOT=str(home / ".cache" / "vllm"),
            VLLM_HOST_IP="127.0.0.1",
            VLLM_CPU_KVCACHE_SPACE="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
            OTEL_SERVICE_NAME=self.config.service_name,
        )
        env.pop("VIRTUAL_ENV", None)
        return env

    def command(self) -> list[str]:
        model = self.model or ensure_tiny_model(self.python)
        cmd = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.config.args(self.kv_events_endpoint),
        ]
        if threading.current_thread() is threading.main_thread():
            # If the test process dies without tearing down (SIGKILL, a timeout), the kernel sends the
            # server SIGTERM. PR_SET_PDEATHSIG follows the creating *thread*, so only from the main one.
            cmd = [str(self.python), "-c", _DIE_WITH_PARENT, *cmd]
        return cmd

    def start(self) -> VllmServer:
        """Launch and block until /health answers 200."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        return self.launch().wait_ready()

    def launch(self) -> VllmServer:
        """Start the process without waiting (`wait_ready()` waits), so several servers can boot at once."""
        self._t0 = time.monotonic()
        cmd = self.command()
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')}: {' '.join(cmd)}\n".encode())
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env(), cwd=self.workdir, start_new_session=True
            )
        return self

    def wait_ready(self) -> VllmServer:
        """Block until /health answers 200 (stops the server and raises VllmStartError if it never does)."""
        try:
            self._wait_healthy(self._t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - self._t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        while time.monotonic() - t0 < self.startup_timeout_s:
            if self.proc.poll() is not None:
                raise VllmStartError(f"vLLM exited with {self.proc.returncode} during startup:\n" + self.log_tail())
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        raise VllmStartError(f"vLLM not healthy after {self.startup_timeout_s:.0f} s:\n" + self.log_tail())

    def failure_evidence(self, lines: int = 12) -> str:
        """Why a request to this server failed, from its own log and the kernel: the log's error
        lines (a worker that died names its exit code there: -9 is SIGKILL, as the OOM killer sends,
        -7 SIGBUS, -11 SIGSEGV), the log's last lines, the kernel's OOM-killer lines and the memory
        left. A test that gets an HTTP 5xx puts this in its failure message."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            text = []
        errors = [ln for ln in text if ERROR_LINE.search(ln)][-lines:]
        return "\n".join(
            [f"--- {self.config.service_name} log, error lines:", *errors, "--- last lines:", *text[-lines:]]
            + ["--- kernel:", *kernel_kill_lines(), "--- memory: " + memory_left()]
        )

    def restart(self) -> VllmServer:
        """Stop and start again on the same port: the prefix cache comes back cold."""
        self.stop()
        return self.start()
