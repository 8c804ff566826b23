"""Host collector: CPU, memory and network of the node, and CPU time / resident memory of the
local engine processes (vLLM, SGLang), read through psutil; which processes, and how each is tied
to the `instance` of the local target it serves: docs/collectors.md "host". The command line is
only matched, never recorded (it can carry model paths, tokens, API keys): a process is labelled
only with its `pid` and its short `process` name.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psutil

from kvscope.agent.collectors.base import Collection, Health, register_collector
from kvscope.core.signals import Sample, make_labels

NAME = "host"
DEFAULT_PATTERNS = (
    r"(^|/)vllm\s+serve\b",
    r"-m\s+vllm\.entrypoints\b",  # vLLM API server (CLI or module)
    r"^VLLM::",
    r"^ray::RayWorkerWrapper",  # vLLM EngineCore/Worker titles, Ray workers
    r"-m\s+sglang\.launch_server\b",
    r"(^|/)sglang\s+serve\b",  # SGLang server
    r"^sglang::",  # SGLang scheduler/detokenizer titles
)
"""Regular expressions searched in each process's command line (joined by spaces). They name
the serving commands and process titles, not any path containing "vllm": a helper process run
from a vLLM virtualenv (multiprocessing's resource tracker) is not an engine."""
DEFAULT_EXCLUDE = (r"(^|/)kvscope(\s|$)", r"-m kvscope(\s|$)")
"""Command lines that never count as engines: the kvscope agent itself (its flags may name
engines). Only the command, not any path: vLLM may well live under a directory called kvscope."""
MAX_PROCESS_NAME = 32
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}


@dataclass(frozen=True)
class EngineProcess:
    """What the collector keeps about one matching process: never its command line."""

    pid: int
    ppid: int
    name: str
    ports: tuple[int, ...] = ()


def parse_cpu_ratio(prev: Any, cur: Any) -> float | None:
    """Busy fraction of all CPUs between two `psutil.cpu_times()` readings; None without a
    previous reading or when no time passed."""
    if prev is None:
        return None
    total = _cpu_total(cur) - _cpu_total(prev)
    if total <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - (_cpu_idle(cur) - _cpu_idle(prev)) / total))


def _cpu_total(t: Any) -> float:
    # Linux counts guest time inside user/nice as well: leave it out so it is not counted twice.
    return float(sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))


def _cpu_idle(t: Any) -> float:
    return float(t.idle + getattr(t, "iowait", 0.0))


def resolve_instances(procs: Sequence[EngineProcess], port_to_instance: dict[int, str]) -> dict[int, str]:
    """pid -> target instance: a process listening on a target's port serves it, and a matching
    process without such a port inherits the instance of its nearest matching ancestor."""
    by_pid = {p.pid: p for p in procs}
    out: dict[int, str] = {}
    for p in procs:
        seen: set[int] = set()
        cur: EngineProcess | None = p
        while cur is not None and cur.pid not in seen:
            seen.add(cur.pid)
            hit = next((port_to_instance[port] for port in cur.ports if port in port_to_instance), None)
            if hit is not None:
                out[p.pid] = hit
                break
            cur = by_pid.get(cur.ppid)
    return out


def local_target_ports(targets: Iterable[Any], local_hosts: set[str]) -> dict[int, str]:
    """port -> instance for the configured targets that live on this host."""
    out: dict[int, str] = {}
    for t in targets:
        parts = urlsplit(getattr(t, "url", ""))
        if parts.hostname in local_hosts:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            out[port] = str(getattr(t, "instance", parts.netloc))
    return out


def _local_hosts() -> set[str]:
    hosts = set(LOCAL_HOSTS) | {socket.gethostname()}
    for addrs in psutil.net_if_addrs().values():
        hosts.update(a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    return hosts


@register_collector(NAME, default_enabled=True)
class HostCollector:
    """Node CPU, memory and network, plus CPU seconds and RSS of local engine processes.
    Its options (`collectors: {host: {...}}`) are in OPTIONS."""

    name = NAME
    OPTIONS = {
        "node": "value of the node label (default: the host name)",
        "process_patterns": "list: regular expression over a process command line that marks an engine process",
        "exclude_patterns": "list: regular expression of command lines never counted as engines",
        "interfaces_exclude": "regular expression of network interface names to skip",
    }

    def __init__(self, config: Any = None, targets: Sequence[Any] | None = None) -> None:
        opts = config.collector_options(NAME) if hasattr(config, "collector_options") else {}
        self.node = str(opts.get("node") or socket.gethostname())
        self.patterns = [re.compile(p) for p in opts.get("process_patterns", DEFAULT_PATTERNS)]
        self.exclude = [re.compile(p) for p in opts.get("exclude_patterns", DEFAULT_EXCLUDE)]
        skip = opts.get("interfaces_exclude")
        self.interfaces_exclude = re.compile(skip) if skip else None
        self.targets = list(targets if targets is not None else getattr(config, "targets", []) or [])
        self._prev_cpu: Any = None
        self._hosts: set[str] | None = None

    async def collect(self) -> Collection:
        return await asyncio.to_thread(self.collect_sync)

    def collect_sync(self) -> Collection:
        """One blocking psutil read (collect() runs it off the event loop)."""
        t0 = time.perf_counter()
        health = Health(collector=NAME)
        now = time.time()
        samples = [*self._node_samples(now, health), *self._engine_samples(now, health)]
        health.series = len(samples)
        health.duration_s = time.perf_counter() - t0
        return Collection(samples=samples, health=[health])

    def _labels(self, **extra: str) -> tuple[tuple[str, str], ...]:
        return make_labels({"node": self.node, **extra})

    def _node_samples(self, now: float, health: Health) -> Iterator[Sample]:
        cpu = psutil.cpu_times()
        ratio = parse_cpu_ratio(self._prev_cpu, cpu)
        self._prev_cpu = cpu
        if ratio is not None:
            yield Sample("host_cpu_utilization_ratio", self._labels(), ratio, now)
        mem = psutil.virtual_memory()
        yield Sample("host_memory_used_bytes", self._labels(), float(mem.total - mem.available), now)
        yield Sample("host_memory_total_bytes", self._labels(), float(mem.total), now)
        try:
            nics = psutil.net_io_counters(pernic=True)
        except OSError as exc:  # /proc/net/dev unreadable (sandboxes)
            health.errors[f"net_{type(exc).__name__}"] += 1
            nics = {}
        for dev, io in sorted(nics.items()):
            if self.interfaces_exclude is not None and self.interfaces_exclude.search(dev):
                continue
            yield Sample("host_network_receive_bytes_total", self._labels(device=dev), float(io.bytes_recv), now)
            yield Sample("host_network_transmit_bytes_total", self._labels(device=dev), float(io.bytes_sent), now)

    def find_engine_processes(self) -> list[tuple[EngineProcess, psutil.Process]]:
        """Local processes whose command line matches the patterns (and no exclude pattern)."""
        found: list[tuple[EngineProcess, psutil.Process]] = []
        own = os.getpid()
        for proc in psutil.process_iter(["pid", "ppid", "name", "cmdline"]):
            info = proc.info
            if info["pid"] == own:
                continue
            cmdline = " ".join(info.get("cmdline") or ())
            if not cmdline or not any(p.search(cmdline) for p in self.patterns):
                continue
            if any(p.search(cmdline) for p in self.exclude):
                continue
            name = (info.get("name") or "?")[:MAX_PROCESS_NAME]
            # Asked per process: a system-wide scan attributes a socket shared by a parent and its
            # forked child to only one of them, and could hide the listener.
            found.append((EngineProcess(info["pid"], info.get("ppid") or 0, name, _listen_ports(proc)), proc))
        return found

    def _engine_samples(self, now: float, health: Health) -> Iterator[Sample]:
        found = self.find_engine_processes()
        if self._hosts is None:
            self._hosts = _local_hosts()
        instances = resolve_instances([e for e, _ in found], local_target_ports(self.targets, self._hosts))
        for eng, proc in found:
            try:
                with proc.oneshot():
                    cpu, mem = proc.cpu_times(), proc.memory_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
                health.errors[f"process_{type(exc).__name__}"] += 1  # exited or not ours: skip it
                continue
            extra = {"pid": str(eng.pid), "process": eng.name}
            if eng.pid in instances:
                extra["instance"] = instances[eng.pid]
            labels = self._labels(**extra)
            yield Sample("engine_process_cpu_seconds_total", labels, float(cpu.user + cpu.system), now)
            yield Sample("engine_process_resident_memory_bytes", labels, float(mem.rss), now)

    async def close(self) -> None:
        return None


def _listen_ports(proc: psutil.Process) -> tuple[int, ...]:
    try:
        conns = proc.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ()
    return tuple(sorted({c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}))
