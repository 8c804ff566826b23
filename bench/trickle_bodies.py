"""Benchmark: a real `kvscope serve` while clients trickle request bodies at it (slowloris on bodies).

Each slow client sends a whole webhook request head (`POST /api/v1/alerts`, Content-Length 400)
and then one body byte every 0.5 s. The listener cuts each one `--request-timeout` after its head
(408, counted `request_timeout`); until then it holds a connection. Meanwhile a prober asks
`GET /metrics` every 0.1 s, as a Prometheus scrape or a health check would.

Measured in one run, per number of slow clients (`--slow`, some under and some over the
listener's 256-connection cap): the prober's answers (ok, refused 503, failed), its p50/p99
latency, and the listener's own count of connections closed unserved by reason; baseline: the
same prober with no slow client. Printed as ratios to the baseline.

    .venv/bin/python bench/trickle_bodies.py [--slow 50,300] [--seconds 20] [--request-timeout 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from testbed.procs import LoggedProcess, free_port, stop_process, wait_http  # noqa: E402

BODY = 400


async def trickle(port: int, stop: asyncio.Event) -> str:
    """One slow client: a whole head, then a byte every 0.5 s; what the server answered first."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return f"connect failed: {type(exc).__name__}"
    head = (
        f"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
    )
    writer.write(head.encode())

    async def drip() -> None:
        with contextlib.suppress(OSError):
            for _ in range(BODY):
                await asyncio.sleep(0.5)
                writer.write(b"x")
                await writer.drain()

    dripping = asyncio.create_task(drip())
    reading = asyncio.create_task(reader.read(64))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if reading.done():
            line = reading.result().split(b"\r\n", 1)[0].decode(errors="replace")
            return line or "closed"
        return "open at the end"
    except OSError as exc:
        return f"reset: {type(exc).__name__}"
    finally:
        for task in (dripping, reading, stopping):
            task.cancel()
        writer.close()


async def probe(url: str, seconds: float) -> dict:
    """GET /metrics every 0.1 s for `seconds`: latencies of answered scrapes and what failed."""
    lat, statuses = [], []
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as s:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                async with s.get(url) as r:
                    await r.read()
                    statuses.append(str(r.status))
                    if r.status == 200:
                        lat.append(time.perf_counter() - t0)
            except (aiohttp.ClientError, TimeoutError) as exc:
                statuses.append(type(exc).__name__)
            await asyncio.sleep(0.1)
    return {"lat": lat, "statuses": statuses}


async def phase(port: int, slow: int, seconds: float) -> tuple[dict, list[str]]:
    stop = asyncio.Event()
    slows = [asyncio.create_task(trickle(port, stop)) for _ in range(slow)]
    await asyncio.sleep(1.0 if slow else 0.0)  # every slow head is in
    got = await probe(f"http://127.0.0.1:{port}/metrics", seconds)
    stop.set()
    return got, list(await asyncio.gather(*slows))


def closed_counts(port: int) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:  # noqa: S310 - loopback
        text = r.read().decode()
    out = {}
    for m in re.finditer(r'kvscope_connections_closed_total\{[^}]*reason="([^"]+)"[^}]*\} ([0-9.e+]+)', text):
        out[m.group(1)] = float(m.group(2))
    return out


def _p(lat: list[float], q: float) -> float:
    """The q-quantile of sorted latencies, in ms (NaN when none)."""
    return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")


def show(name: str, got: dict, base: dict | None) -> str:
    lat = sorted(got["lat"])
    ok = len(lat) / max(1, len(got["statuses"]))
    counts: dict[str, int] = {}
    for s in got["statuses"]:
        counts[s] = counts.get(s, 0) + 1
    p50, p99 = _p(lat, 0.5), _p(lat, 0.99)
    text = (
        f"{name:<22} scrapes {len(got['statuses']):4d}, answered 200: {ok:6.1%}, p50 {p50:7.1f} ms, p99 {p99:7.1f} ms"
    )
    if base and base["lat"]:
        b = sorted(base["lat"])
        text += f"  (x{p50 / _p(b, 0.5):.2f} p50, x{p99 / _p(b, 0.99):.2f} p99)"
    return text + f"  {counts}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slow", default="50,300", help="numbers of slow clients, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0, help="probing time per phase")
    ap.add_argument("--request-timeout", type=float, default=10.0, help="serve's --request-timeout, seconds")
    args = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvscope-trickle-") as d:
        argv = [str(ROOT / ".venv" / "bin" / "kvscope"), "serve", "--prometheus", "http://127.0.0.1:9"]
        argv += [
            "--listen",
            f"127.0.0.1:{port}",
            "--store",
            ":memory:",
            "--request-timeout",
            f"{args.request_timeout:g}s",
        ]
        proc = LoggedProcess(argv, Path(d) / "serve.log", name="serve")
        try:
            wait_http(f"http://127.0.0.1:{port}/-/healthy", 60, procs=(proc,))
            base, _ = asyncio.run(phase(port, 0, args.seconds))
            print(
                f"kvscope serve, --request-timeout {args.request_timeout:g}s, "
                f"probing /metrics every 0.1 s for {args.seconds:g} s"
            )
            print(show("baseline (no slow)", base, None))
            for n in (int(x) for x in args.slow.split(",") if x):
                before = closed_counts(port)
                got, answers = asyncio.run(phase(port, n, args.seconds))
                after = closed_counts(port)
                first: dict[str, int] = {}
                for a in answers:
                    key = a.split(" ", 2)[1] if a.startswith("HTTP/") else a
                    first[key] = first.get(key, 0) + 1
                delta = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
                print(show(f"{n} slow clients", got, base))
                print(f"{'':<22} slow clients' first answer: {first}; closed unserved meanwhile: {delta}")
                time.sleep(args.request_timeout + 2)  # the next phase starts with every slow one cut
        finally:
            stop_process(proc, timeout_s=20.0)


if __name__ == "__main__":
    main()
