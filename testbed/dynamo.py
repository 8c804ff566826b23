"""NVIDIA Dynamo (PyPI ai-dynamo) on CPU: its OpenAI frontend + router over its mocker engines.

`scripts/install-dynamo.sh` installs ai-dynamo 1.6.1 into its own venv under
`${KVSCOPE_DYNAMO_HOME:-~/.cache/kvscope/dynamo}`. No GPU, etcd or NATS: both processes share a
file-discovery directory (`--discovery-backend file`, DYN_FILE_KV), requests go over the TCP
request plane and KV events over ZMQ (the defaults with file discovery).

    with DynamoFleet(model_dir, router_mode="kv", workers=2) as fleet:
        fleet.url                 # the frontend's OpenAI API (and its /metrics)
        fleet.metrics_urls        # {"frontend": ..., "mocker": ...} (the mocker's system port)
        fleet.restart_frontend("round-robin")   # same workers, another router mode
        fleet.relay_kv_events()   # the workers' KV-event feeds through relays (restarts the frontend)
        fleet.stall_kv_events()   # the relays stop moving bytes: a silent event-plane partition

The mocker (`python -m dynamo.mocker --num-workers N`) simulates vLLM's scheduler and KV cache
(blocks, prefix caching, KV events) without running a model; it needs only the model's tokenizer
and config, here the test bed's tiny Llama. Facts measured with 1.6.1 (2 workers, 12 requests
of 3 tenants sharing a system prompt): with `--router-mode kv` the frontend exports the router's
`dynamo_component_router_kv_selected_cached_prefix_tokens_total` (cached prefix on the worker it
chose) next to `..._kv_best_eligible_cached_prefix_tokens_total` (on the best worker), the
`dynamo_component_router_kv_hit_rate` histogram and `..._non_max_overlap_selections_total`; with
`round-robin` those KV-router families are absent. The mocker's system /metrics has
`dynamo_component_*` request counters and a few `vllm:*` gauges (KV usage, running, waiting).
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import re
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path

from testbed.procs import ProcessGroup, free_port, http_get, signal_group, wait_until

DYNAMO_VERSION = "1.6.1"
"""Pinned in scripts/install-dynamo.sh."""
MODEL_NAME = "tiny-llama"


def dynamo_home() -> Path:
    """Where the install script puts Dynamo (same default, same override)."""
    return Path(os.environ.get("KVSCOPE_DYNAMO_HOME", Path.home() / ".cache" / "kvscope" / "dynamo"))


def dynamo_unavailable_reason() -> str | None:
    """None when Dynamo is installed and stamped; otherwise why not (a skip reason)."""
    home = dynamo_home()
    if not (home / ".kvscope-dynamo-stamp").is_file() or not (home / "venv" / "bin" / "python").exists():
        return (
            f"real Dynamo not installed at {home}: run scripts/install-dynamo.sh "
            "(make setup-dynamo does it; `make test` depends on it)"
        )
    return None


def _i16_port() -> int:
    """A free port below 32768: Dynamo 1.6.1 parses DYN_SYSTEM_PORT as a signed 16-bit integer and
    exits on a larger value, and the kernel's ephemeral range (what free_port gets) starts at 32768."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32768)
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    raise RuntimeError("no free port in 20000-32767")


class DynamoFleet:
    """One mocker process (N simulated workers) and one frontend, stopped together."""

    def __init__(
        self, model_dir: Path, router_mode: str = "kv", workers: int = 2, startup_timeout_s: float = 120.0
    ) -> None:
        self.model_dir = model_dir
        self.router_mode = router_mode
        self.workers = workers
        self.startup_timeout_s = startup_timeout_s
        self.workdir = Path(tempfile.mkdtemp(prefix="kvs-dynamo-"))
        self.port = free_port()
        self.system_port = _i16_port()
        self.procs = ProcessGroup(self.workdir)
        self._frontends = 0
        self.relays: list[PausableRelay] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_urls(self) -> dict[str, str]:
        return {"frontend": self.url + "/metrics", "mocker": f"http://127.0.0.1:{self.system_port}/metrics"}

    def _env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "VIRTUAL_ENV"))}
        env.update(
            DYN_FILE_KV=str(self.workdir / "discovery"),
            DYN_DISCOVERY_BACKEND="file",
            DYN_REQUEST_PLANE="tcp",
            DYN_EVENT_PLANE="zmq",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            NO_COLOR="1",
            PYTHONUNBUFFERED="1",
            **extra,
        )
        return env

    def _python(self) -> str:
        return str(dynamo_home() / "venv" / "bin" / "python")

    def start(self) -> DynamoFleet:
        """Start the mocker, then the frontend; block until the model is served and both answer /metrics."""
        reason = dynamo_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        try:
            self.procs.start(
                "mocker",
                [
                    self._python(),
                    "-m",
                    "dynamo.mocker",
                    "--model-path",
                    str(self.model_dir),
                    "--model-name",
                    MODEL_NAME,
                    "--num-workers",
                    str(self.workers),
                    "--block-size",
                    "16",
                    "--num-gpu-blocks-override",
                    "256",
                    "--enable-prefix-caching",
                ],
                env=self._env(DYN_SYSTEM_ENABLED="true", DYN_SYSTEM_PORT=str(self.system_port)),
                cwd=self.workdir,
                start_new_session=True,
            )
            self._start_frontend()
            self._wait(lambda: http_get(self.metrics_urls["mocker"])[0] == 200, "the mocker's /metrics")
        except BaseException:
            self.close()
            raise
        return self

    def _start_frontend(self) -> None:
        self._frontends += 1
        self.procs.start(
            f"frontend-{self._frontends}",
            [
                self._python(),
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(self.port),
                "--router-mode",
                self.router_mode,
                "--discovery-backend",
                "file",
            ],
            env=self._env(),
            cwd=self.workdir,
            start_new_session=True,
        )
        self._wait(lambda: MODEL_NAME.encode() in http_get(self.url + "/v1/models")[1], "the model served")

    def restart_frontend(self, router_mode: str) -> DynamoFleet:
        """Stop the frontend and start one with another router mode on the same port (same workers)."""
        frontend = next(p for p in reversed(self.procs.procs) if getattr(p, "name", "").startswith("frontend"))
        signal_group(frontend.pid, signal.SIGTERM)
        frontend.wait(20)
        self.procs.procs.remove(frontend)
        self.router_mode = router_mode
        self._start_frontend()
        return self

    def relay_kv_events(self) -> DynamoFleet:
        """Put a TCP relay between each worker's ZMQ KV-event publisher and the frontend's KV router:
        rewrite the endpoints in the file discovery's kv-events channels, then restart the frontend so
        it subscribes through them (the requests and every other channel stay direct)."""
        for path in glob.glob(str(self.workdir / "discovery" / "v1" / "event_channels" / "*kv%2Devents*")):
            text = Path(path).read_text()
            m = re.search(r"tcp://([0-9.]+):([0-9]+)", text)
            if m:
                self.relays.append(PausableRelay((m.group(1), int(m.group(2)))))
                Path(path).write_text(text.replace(m.group(0), f"tcp://127.0.0.1:{self.relays[-1].port}"))
        if not self.relays:
            raise RuntimeError("no kv-events channel found in the file discovery")
        return self.restart_frontend(self.router_mode)

    def stall_kv_events(self, stalled: bool = True) -> None:
        """Stop (or resume) the relays: the connections stay open and no event reaches the router."""
        for relay in self.relays:
            relay.flowing.clear() if stalled else relay.flowing.set()

    def _wait(self, check, what: str) -> None:
        wait_until(
            check, self.startup_timeout_s, what, procs=self.procs.procs, interval_s=0.5, logs=lambda: self.procs.logs()
        )

    def close(self) -> None:
        for relay in self.relays:
            relay.close()
        for proc in self.procs.procs:  # each runs in its own group: take its children along
            signal_group(proc.pid, signal.SIGTERM)
        self.procs.stop_all()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> DynamoFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class PausableRelay:
    """A TCP forwarder to `target` on 127.0.0.1:`port`; clearing `flowing` holds every byte (the
    connections stay open, as in a network partition that drops nothing visibly)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.flowing = target, threading.Event()
        self.flowing.set()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                if self.sock.fileno() < 0:
                    return
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                self.flowing.wait()
                dst.sendall(data)
        for s in (src, dst):
            s.close()

    def close(self) -> None:
        self.flowing.set()
        self.sock.close()
