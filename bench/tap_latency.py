"""Latency the request tap adds, against a direct connection and Debian nginx, in one run.

Upstream is a local *benchmark stub* (not an engine): an aiohttp server that streams an
OpenAI-style completion as SSE (`--chunks` chunks, `--chunk-gap-ms` apart, a usage chunk when
asked, then [DONE]), so the numbers measure proxies, not model speed. Three paths are measured
with the same client load (`--requests` streams in total), in one of two shapes:

* closed loop (default): `--concurrency` workers send streams back to back. Everything runs
  saturated, so latency is mostly waiting for a CPU: a stress test of CPU per stream.
* open loop (`--arrival poisson`): streams arrive at random at `--rate` per second (default:
  `--concurrency` in flight on average) whatever is in flight, as users arrive at a service.
  With engine-like pacing (`--chunks 64 --chunk-gap-ms 20`: ~50 tokens/s per stream) this is the
  regime a proxy in front of an engine lives in.

Paths:

* direct   client -> stub
* tap      client -> `kvscope tap` (the real CLI, its own process) -> stub
* nginx    client -> nginx `proxy_pass` (proxy_buffering off, upstream keepalive) -> stub
* relay    (`--relay-floor`) client -> a blind byte relay on the tap's event loop (uvloop), one
           upstream connection per client connection, no parsing: what any Python proxy costs
           before it does any work, so "tap - relay" is the tap's own work

`--pin` puts every proxy on the last CPU and the client and stub on the others (one proxy is
busy at a time), so the added latency is the proxy's own work and queueing, not its fight with
the load generator for a core (in production a proxy does not share its core with the clients).

Fair by construction: one proxy process each (nginx `worker_processes 1`, master idle; the tap is
one process on one event loop), both keep upstream connections alive, neither buffers the
response (nginx `proxy_buffering off`; the tap writes each upstream read on at once), both speak
HTTP/1.1 to the stub. The tap does more per request (parses the JSON body, scans the SSE events,
hashes the prompt, counts per tenant); nginx only forwards.

Per request the client measures TTFT (request sent -> first SSE event) and the full stream time.
Printed: TTFT p50/p99 per path, the added p50/p99 over direct (goal: tap < 1 ms p99 and <= nginx),
throughput (streams/s) and the proxy process's CPU time per stream (nginx: master + worker), split
into user (the proxy's own code) and system (the kernel: socket reads and writes);
with `--repeat N` the paths are run N rounds (order rotated each round) and the medians are
printed too. Then the tap's own processing cost, measured with the tap inside the client
process (no cross-process wakeups), one stream at a time. Every process runs on this machine:
on a small shared box the client, stub and proxy compete for cores, so compare within one run.

    .venv/bin/python bench/tap_latency.py --requests 2000 --concurrency 200 --repeat 3
    .venv/bin/python bench/tap_latency.py --arrival poisson --chunks 64 --chunk-gap-ms 20 \
        --requests 3000 --relay-floor --repeat 3
    .venv/bin/python bench/tap_latency.py --lean --pin --arrival poisson --chunks 64 \
        --chunk-gap-ms 20 --prefill-ms 20 --requests 3000 --repeat 3  # engine-like stub
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
from tqdm import tqdm

sys.path.append(str(Path(__file__).resolve().parents[1]))  # testbed/ (test tooling, not installed)
from testbed.procs import LOOPBACK, ProcessGroup, free_port, wait_until  # noqa: E402

STUB = r"""
import asyncio, json, sys
from aiohttp import web
CHUNKS, GAP, PREFILL = int(sys.argv[2]), float(sys.argv[3]) / 1000, float(sys.argv[4]) / 1000
async def handle(request):
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if PREFILL:
        await asyncio.sleep(PREFILL)
    for i in range(CHUNKS):
        await resp.write(b'data: {"id":"cmpl-1","object":"text_completion","model":"stub",'
                         b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}\n\n')
        if GAP:
            await asyncio.sleep(GAP)
    if (body.get("stream_options") or {}).get("include_usage"):
        await resp.write(b'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":'
                         + str(CHUNKS).encode() + b',"prompt_tokens_details":{"cached_tokens":32}}}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
app = web.Application()
app.router.add_post("/v1/completions", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""

RELAY = r"""
import asyncio, sys
try:
    import uvloop
except ImportError:
    uvloop = None
UPSTREAM = ("127.0.0.1", int(sys.argv[2]))
class Up(asyncio.Protocol):
    def __init__(self, down):
        self.down = down
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.down.transport.write(data)
    def connection_lost(self, exc):
        self.down.transport.close()
class Down(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.up, self.early = transport, None, []
        asyncio.get_running_loop().create_task(self.connect())
    async def connect(self):
        _, self.up = await asyncio.get_running_loop().create_connection(lambda: Up(self), *UPSTREAM)
        for data in self.early:
            self.up.transport.write(data)
    def data_received(self, data):
        if self.up is None:
            self.early.append(data)
        else:
            self.up.transport.write(data)
    def connection_lost(self, exc):
        if self.up is not None:
            self.up.transport.close()
async def main():
    await asyncio.get_running_loop().create_server(Down, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    await asyncio.Event().wait()
(uvloop.run if uvloop else asyncio.run)(main())
"""

LEAN_STUB = r"""
import asyncio, sys
import uvloop
CHUNKS, GAP, PREFILL = int(sys.argv[2]), float(sys.argv[3]) / 1000, float(sys.argv[4]) / 1000
def chunk(b):
    return b"%x\r\n%s\r\n" % (len(b), b)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
TOKEN = chunk(b'data: {"id":"cmpl-1","object":"text_completion","model":"stub",'
              b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}\n\n')
USAGE = chunk(b'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":'
              + str(CHUNKS).encode() + b',"prompt_tokens_details":{"cached_tokens":32}}}\n\n')
END = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
class Stub(asyncio.Protocol):
    def connection_made(self, t):
        self.t, self.buf, self.busy, self.timer = t, b"", False, None
    def connection_lost(self, exc):
        if self.timer is not None:
            self.timer.cancel()
    def data_received(self, data):
        self.buf += data
        self.next()
    def next(self):
        i = self.buf.find(b"\r\n\r\n")
        if self.busy or i < 0:
            return
        head = self.buf[:i].lower()
        j = head.find(b"content-length:")
        n = int(head[j + 15:].split(b"\r\n", 1)[0]) if j >= 0 else 0
        if len(self.buf) < i + 4 + n:
            return
        body, self.buf = self.buf[i + 4:i + 4 + n], self.buf[i + 4 + n:]
        self.busy, self.left = True, CHUNKS
        self.usage = b'"include_usage":true' in body.replace(b" ", b"")
        self.t.write(HEAD)
        if PREFILL:
            self.timer = asyncio.get_running_loop().call_later(PREFILL, self.tick)
        else:
            self.tick()
    def tick(self):
        if self.left:
            self.left -= 1
            self.t.write(TOKEN)
            self.timer = asyncio.get_running_loop().call_later(GAP, self.tick)
            return
        self.t.write((USAGE if self.usage else b"") + END)
        self.busy, self.timer = False, None
        self.next()
async def main():
    await asyncio.get_running_loop().create_server(Stub, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    await asyncio.Event().wait()
uvloop.run(main())
"""


class LeanStream(asyncio.Protocol):
    """One keep-alive client connection of the lean load generator: sends a request, notes when
    the first SSE bytes arrive and when the chunked end marker does (no HTTP client library)."""

    def __init__(self, idle: list[LeanStream]) -> None:
        self.idle, self.transport, self.fut, self.tail = idle, None, None, b""

    def connection_made(self, transport):
        self.transport = transport

    def start(self, request: bytes, t0: float) -> asyncio.Future:
        self.t0, self.first, self.tail, self.ok = t0, None, b"", None
        self.fut = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.fut

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.ok is None:
            self.ok = data.startswith(b"HTTP/1.1 200")
        if self.first is None and b"data:" in data:
            self.first = now
        tail = (self.tail + data)[-5:]
        self.tail = tail
        if tail == b"0\r\n\r\n" and self.fut is not None and not self.fut.done():
            self.fut.set_result((self.first - self.t0, now - self.t0) if self.ok and self.first else None)
            self.idle.append(self)

    def connection_lost(self, exc):
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(None)
        if self in self.idle:
            self.idle.remove(self)


class LeanClient:
    """Streams over raw keep-alive connections on the running (uv)loop: the load generator's own
    CPU per token is a few microseconds instead of aiohttp's tens, so it adds less noise."""

    def __init__(self, port: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.port, self.idle, self.failed = port, [], 0
        self.request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )

    async def one(self, out: list[tuple[float, float]]) -> None:
        t0 = time.perf_counter()
        if self.idle:
            conn = self.idle.pop()
        else:
            _, conn = await asyncio.get_running_loop().create_connection(
                lambda: LeanStream(self.idle), LOOPBACK, self.port
            )
        row = await conn.start(self.request, t0)
        if row is None:
            self.failed += 1
        else:
            out.append(row)


NGINX_CONF = """
worker_processes 1;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fcgi;
  uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


def wait_port(port: int, group: ProcessGroup, timeout_s: float = 20.0) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:`port`; fail at once if a
    process of `group` exits (its log tail in the message)."""

    def accepts() -> bool:
        with socket.create_connection((LOOPBACK, port), timeout=1.0):
            return True

    wait_until(accepts, timeout_s, f"a listener on port {port}", procs=group.procs, interval_s=0.1, logs=group.logs)


async def one(session: aiohttp.ClientSession, url: str, body: dict, out: list[tuple[float, float]]) -> None:
    t0 = time.perf_counter()
    first = None
    async with session.post(url, json=body) as r:
        async for _ in r.content.iter_any():
            if first is None:
                first = time.perf_counter()
    out.append((first - t0, time.perf_counter() - t0))


BODY = {"model": "stub", "prompt": "the cache prefix metric trace span latency " * 8, "stream": True, "max_tokens": 16}


@contextlib.asynccontextmanager
async def client(base: str, lean: bool, limit: int):
    """`send(out)`: one stream to `base`, its (TTFT, total) appended to out. aiohttp, or with
    `lean` the raw keep-alive connections of `LeanClient`."""
    if lean:
        c = LeanClient(int(base.rsplit(":", 1)[1]), BODY)
        yield c.one
        for conn in c.idle:
            conn.transport.close()
        if c.failed:
            print(f"  {c.failed} streams failed")
        return
    conn = aiohttp.TCPConnector(limit=limit)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
        yield lambda out: one(s, base + "/v1/completions", BODY, out)


async def drive(
    base: str, requests: int, concurrency: int, label: str, lean: bool = False
) -> tuple[list[tuple[float, float]], float]:
    """Closed loop: `concurrency` workers, each sends its next stream when the last one ended
    (the proxy runs saturated: the client, stub and proxy take every CPU cycle they can get)."""
    out: list[tuple[float, float]] = []
    left = [requests]
    bar = tqdm(total=requests, desc=label, unit="req", leave=False)

    async def worker(send):
        while left[0] > 0:
            left[0] -= 1
            await send(out)
            bar.update()

    async with client(base, lean, concurrency) as send:
        await send([])  # warm the connection path
        t = time.perf_counter()
        await asyncio.gather(*(worker(send) for _ in range(concurrency)))
        dt = time.perf_counter() - t
    bar.close()
    return out, dt


async def drive_open(
    base: str, requests: int, rate: float, label: str, seed: int = 7, lean: bool = False
) -> tuple[list[tuple[float, float]], float, float, int]:
    """Open loop: streams start at Poisson arrival times (`rate` per second, the same schedule
    for every path: `seed`), whether or not earlier ones have ended, as users arrive at a
    service. Returns the rows, the wall time, and the mean and peak number of streams in flight."""
    rng = random.Random(seed)
    starts, t = [], 0.0
    for _ in range(requests):
        t += rng.expovariate(rate)
        starts.append(t)
    out: list[tuple[float, float]] = []
    inflight, area, peak = [0], [0.0], [0]
    bar = tqdm(total=requests, desc=label, unit="req", leave=False)

    async def at(send, when: float, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + when - time.perf_counter()))
        inflight[0] += 1
        peak[0] = max(peak[0], inflight[0])
        begin = time.perf_counter()
        try:
            await send(out)
        finally:
            inflight[0] -= 1
            area[0] += time.perf_counter() - begin
            bar.update()

    async with client(base, lean, 0) as send:
        await send([])  # warm the connection path
        t0 = time.perf_counter()
        await asyncio.gather(*(at(send, w, t0) for w in starts))
        dt = time.perf_counter() - t0
    bar.close()
    return out, dt, area[0] / dt, peak[0]


async def sequential_inproc(stub_port: int, n: int) -> dict[str, list[float]]:
    """TTFT direct vs through a RequestTap running in this process, one stream at a time."""
    from kvscope.agent.tap.proxy import RequestTap, TapConfig

    tap = RequestTap(TapConfig(upstreams=(f"http://127.0.0.1:{stub_port}",), listen="127.0.0.1:0"))
    await tap.start()
    body = {"model": "stub", "prompt": "the cache prefix metric trace span latency " * 8, "stream": True}
    out: dict[str, list[float]] = {"direct": [], "tap": []}
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(n):
                for name, port in (("direct", stub_port), ("tap", tap.port)):
                    rows: list[tuple[float, float]] = []
                    await one(s, f"http://127.0.0.1:{port}/v1/completions", body, rows)
                    out[name].append(rows[0][0])
    finally:
        await tap.stop()
    return out


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) > 1 else xs[0]


def proxy_cpu_s(proc: subprocess.Popen | None) -> tuple[float, float]:
    """CPU seconds (user, system) a proxy process and its children (nginx workers) used so far."""
    if proc is None:
        return 0.0, 0.0
    p = psutil.Process(proc.pid)
    user = system = 0.0
    for q in [p, *p.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = q.cpu_times()
            user, system = user + t.user, system + t.system
    return user, system


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--chunks", type=int, default=16, help="SSE chunks per stream (default 16)")
    ap.add_argument("--sequential", type=int, default=300, help="streams for the in-process overhead line")
    ap.add_argument("--chunk-gap-ms", type=float, default=2.0, help="stub delay between chunks (default 2)")
    ap.add_argument(
        "--prefill-ms",
        type=float,
        default=0.0,
        help="stub delay between the response head and the first chunk (default 0: the head and "
        "the first chunk leave together). A real engine sends the head at once and the first "
        "token after prefill (vLLM: head ~3-12 ms after the request, first token 10-20 ms "
        "later on the CPU test bed), so a proxy handles the head off the TTFT path",
    )
    ap.add_argument(
        "--arrival",
        choices=("closed", "poisson"),
        default="closed",
        help="closed: --concurrency workers back to back (saturation, the default); poisson: "
        "streams arrive at random at --rate per second whatever is in flight (open loop)",
    )
    ap.add_argument(
        "--rate",
        type=float,
        default=None,
        help="poisson arrivals per second (default: --concurrency / stream duration, i.e. "
        "--concurrency streams in flight on average)",
    )
    ap.add_argument(
        "--relay-floor",
        action="store_true",
        help="also measure 'relay': a blind byte relay on the same event loop as the tap (one "
        "upstream connection per client connection, no parsing): the floor of any Python proxy",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="give the proxies (tap, nginx, relay) the last CPU and the client and stub the others, so "
        "a proxy's latency is its own work and not its fight with the load generator for a core",
    )
    ap.add_argument(
        "--lean",
        action="store_true",
        help="a lean load generator: raw uvloop client connections and a raw uvloop stub instead of "
        "aiohttp on both ends, so the client's and stub's own CPU adds less noise to the latencies",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds over all paths (path order rotates each round); >1 adds per-column medians",
    )
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-tapbench-"))
    try:
        with ProcessGroup(tmp) as group:  # logs to <tmp>/<name>.log; stops and reaps all on exit
            run_paths(args, tmp, group)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def run_paths(args: argparse.Namespace, tmp: Path, group: ProcessGroup) -> None:
    """Start the stub, the tap and nginx in `group`, measure every path, then the in-process tap."""
    stub_port, tap_port, nginx_port = free_port(), free_port(), free_port()
    group.start(
        "stub",
        [
            sys.executable,
            "-c",
            LEAN_STUB if args.lean else STUB,
            str(stub_port),
            str(args.chunks),
            str(args.chunk_gap_ms),
            str(args.prefill_ms),
        ],
        start_new_session=True,
    )
    tap = group.start(
        "tap",
        [
            sys.executable,
            "-m",
            "kvscope",
            "tap",
            "--upstream",
            f"http://127.0.0.1:{stub_port}",
            "--listen",
            f"127.0.0.1:{tap_port}",
        ],
        start_new_session=True,
    )
    paths = {"direct": stub_port, "tap": tap_port}
    owner: dict[str, subprocess.Popen | None] = {"direct": None, "tap": tap}
    if args.relay_floor:
        relay_port = free_port()
        owner["relay"] = group.start(
            "relay", [sys.executable, "-c", RELAY, str(relay_port), str(stub_port)], start_new_session=True
        )
        paths["relay"] = relay_port
    if shutil.which("nginx") or Path("/usr/sbin/nginx").exists():
        for d in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
            (tmp / d).mkdir()
        (tmp / "nginx.conf").write_text(NGINX_CONF.format(dir=tmp, upstream=stub_port, port=nginx_port))
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        owner["nginx"] = group.start(
            "nginx", [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"], start_new_session=True
        )
        paths["nginx"] = nginx_port
    for port in paths.values():
        wait_port(port, group)
    if args.pin:
        pin(owner, group)
    if args.arrival == "poisson" and args.rate is None:
        args.rate = args.concurrency / max(args.chunks * args.chunk_gap_ms / 1000, 1e-3)
    load = (
        f"Poisson arrivals at {args.rate:.0f}/s (open loop)"
        if args.arrival == "poisson"
        else f"{args.concurrency} concurrent (closed loop)"
    )
    print(
        f"{args.requests} streams, {load}, {args.chunks} chunks "
        f"{args.chunk_gap_ms} ms apart (benchmark stub upstream); os.cpu_count()={os.cpu_count()}; "
        f"load average at start {os.getloadavg()[0]:.2f}"
    )
    rounds = []
    names = list(paths)
    for r in range(args.repeat):
        results = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            u0, s0 = proxy_cpu_s(owner[name])
            url = f"http://127.0.0.1:{paths[name]}"
            if args.arrival == "poisson":
                drive_it = drive_open(url, args.requests, args.rate, name, lean=args.lean)
                rows, dt, mean_inflight, peak = run_loop(drive_it, args.lean)
                print(f"  {name}: {mean_inflight:.0f} streams in flight on average, peak {peak}")
            else:
                rows, dt = run_loop(drive(url, args.requests, args.concurrency, name, lean=args.lean), args.lean)
            u1, s1 = proxy_cpu_s(owner[name])
            results[name] = (rows, dt, (u1 - u0) / max(len(rows), 1), (s1 - s0) / max(len(rows), 1))
        rounds.append(summarize({k: results[k] for k in names}))
        report(rounds[-1], f"round {r + 1}/{args.repeat} (load average {os.getloadavg()[0]:.2f})")
    if args.repeat > 1:
        report(
            {k: tuple(statistics.median(rd[k][i] for rd in rounds) for i in range(8)) for k in names},
            f"median of {args.repeat} rounds",
        )
    inproc = asyncio.run(sequential_inproc(stub_port, args.sequential))
    d, t = (pct(inproc[k], 50) for k in ("direct", "tap"))
    d99, t99 = (pct(inproc[k], 99) for k in ("direct", "tap"))
    pairs = [(b - a) * 1e3 for a, b in zip(inproc["direct"], inproc["tap"], strict=True)]
    print(
        f"in-process tap, {args.sequential} sequential streams (proxy work without cross-process "
        f"scheduling): added TTFT p50 {(t - d) * 1e3:.2f} ms, p99 {(t99 - d99) * 1e3:.2f} ms (goal p99 < 1 ms); "
        f"per pair (tap minus the direct stream just before it) p50 {pct(pairs, 50):.2f} ms, "
        f"p99 {pct(pairs, 99):.2f} ms"
    )


def run_loop(main, lean: bool):
    """The client's event loop: uvloop for the lean load generator, asyncio's otherwise (as before)."""
    if lean:
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def pin(owner: dict[str, subprocess.Popen | None], group: ProcessGroup) -> None:
    """Proxies (and nginx's workers) on the last CPU; this process (the client) and the stub on the rest."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("--pin: only one CPU available, not pinning")
        return
    proxy_cpu, rest = cpus[-1:], cpus[:-1]
    for proc in owner.values():
        if proc is not None:
            p = psutil.Process(proc.pid)
            for q in [p, *p.children(recursive=True)]:
                q.cpu_affinity(proxy_cpu)
    for proc in group.procs:
        if proc.name == "stub":
            psutil.Process(proc.pid).cpu_affinity(rest)
    os.sched_setaffinity(0, rest)
    print(f"pinned: proxies on CPU {proxy_cpu[0]}, client and stub on CPU {', '.join(map(str, rest))}")


def summarize(results: dict) -> dict[str, tuple[float, ...]]:
    """Per path: TTFT p50 and p99 (ms), added p50 and p99 over direct (ms), streams/s, proxy CPU
    us/stream (user + system), then its user and system parts."""
    d50, d99 = (pct([t for t, _ in results["direct"][0]], q) for q in (50, 99))
    out = {}
    for name, (rows, dt, user, system) in results.items():
        p50, p99 = (pct([t for t, _ in rows], q) for q in (50, 99))
        out[name] = (
            p50 * 1e3,
            p99 * 1e3,
            (p50 - d50) * 1e3,
            (p99 - d99) * 1e3,
            len(rows) / dt,
            (user + system) * 1e6,
            user * 1e6,
            system * 1e6,
        )
    return out


def report(table: dict[str, tuple[float, ...]], title: str) -> None:
    print(title)
    print(
        f"{'path':<8} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'added p50':>10} {'added p99':>10} {'streams/s':>10}"
        f" {'proxy CPU us/stream':>20} {'(user / sys)':>13}"
    )
    for name, (p50, p99, a50, a99, rate, cpu, user, system) in table.items():
        cpu_s = f"{cpu:>20.0f} {f'{user:.0f} / {system:.0f}':>13}" if name != "direct" else f"{'-':>20}"
        print(f"{name:<8} {p50:>12.2f} {p99:>12.2f} {a50:>10.2f} {a99:>10.2f} {rate:>10.0f} {cpu_s}")
    if "nginx" in table:
        t, n = table["tap"], table["nginx"]
        print(
            f"tap / nginx: TTFT p99 {ratio(t[1], n[1])}, p50 {ratio(t[0], n[0])} (goal <= 1.00), streams/s "
            f"{ratio(t[4], n[4])} (goal >= 1.00), CPU per stream {ratio(t[5], n[5])} (user {ratio(t[6], n[6])}, "
            f"sys {ratio(t[7], n[7])}); tap added p99 {t[3]:.2f} ms (goal < 1 ms)"
        )
    if "relay" in table:
        t, r = table["tap"], table["relay"]
        print(
            f"tap / relay (the tap's own work over a blind Python relay): CPU per stream {ratio(t[5], r[5])}, "
            f"{t[5] - r[5]:+.0f} us (user {t[6] - r[6]:+.0f}, sys {t[7] - r[7]:+.0f})"
        )


def ratio(a: float, b: float) -> str:
    """a / b to two places, or 'n/a' when b is 0 (a short run where nginx used no measurable CPU)."""
    return f"{a / b:.2f}" if b else "n/a"


if __name__ == "__main__":
    raise SystemExit(main())
