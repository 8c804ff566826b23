"""CPU per scrape cycle: the agent's aiohttp scrape client against the llhttp client it replaced.

Issue 28 asks for one HTTP client unless a measured user need keeps a second one. This measures
the need: --targets targets (default 100) each serving a --body-kb body (default 1024: a large
engine's /metrics; real vLLM 0.32 with many LoRA/histogram series is ~100-300 KB) are scraped
concurrently, once per cycle, by

* `aiohttp`: `read_exposition` with `new_session()` as the agent runs it now (agent/scrape/fetch.py);
* `llhttp`: the httptools client `agent/scrape/httpclient.py` as it was at --rev (default: the
  last commit that had it), loaded from git, with the same UTF-8 decode.

The targets are served by a child process (its CPU is not counted). Both clients run on uvloop,
as `kvscope agent` does, in interleaved rounds; each round measures this process's CPU
(user + system, all threads) over --cycles cycles. Printed: CPU-ms per cycle per client (median
of the rounds), the ratio aiohttp / llhttp, and the share of one core each would take at a 15 s
scrape interval.

    .venv/bin/python bench/scrape_client.py                       # 100 x 1 MB
    .venv/bin/python bench/scrape_client.py --gzip                # bodies sent gzip-compressed
    .venv/bin/python bench/scrape_client.py --targets 9 --body-kb 200
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/scrapes/vllm-0.32.0-cpu-after-load.txt"
OLD = "agent/scrape/httpclient.py"

SERVER = r"""
import asyncio, sys
body, n = open(sys.argv[1], "rb").read(), int(sys.argv[2])
gz = sys.argv[3] == "1"
head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n%s\r\n" % (
    len(body), b"Content-Encoding: gzip\r\n" if gz else b"")
async def handle(reader, writer):
    try:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(head + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    servers = [await asyncio.start_server(handle, "127.0.0.1", 0) for _ in range(n)]
    print(" ".join(str(s.sockets[0].getsockname()[1]) for s in servers), flush=True)
    await asyncio.sleep(1e9)
asyncio.run(main())
"""


def old_client(rev: str | None):
    """The llhttp client module as of `rev` (default: the last commit that had it)."""
    if rev is None:
        exists = subprocess.run(["git", "cat-file", "-e", f"HEAD:{OLD}"], cwd=ROOT, capture_output=True)
        if exists.returncode == 0:
            rev = "HEAD"
        else:
            deleted = subprocess.run(
                ["git", "rev-list", "-n", "1", "HEAD", "--", OLD], cwd=ROOT, capture_output=True, text=True, check=True
            )
            rev = deleted.stdout.strip() + "^"
    src = subprocess.run(["git", "show", f"{rev}:{OLD}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "llhttp_client.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("llhttp_client", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, rev


async def measure(urls: list[str], cycles: int, rounds: int, old) -> dict[str, list[float]]:
    from kvscope.agent.scrape.fetch import ACCEPT, new_session, read_exposition

    headers = (("Accept", ACCEPT), ("X-Prometheus-Scrape-Timeout-Seconds", "10"))

    async def new_cycle(session) -> int:
        pays = await asyncio.gather(*(read_exposition(session, u, 10.0, 64 << 20) for u in urls))
        return sum(p.size_bytes for p in pays)

    async def old_cycle(client) -> int:
        replies = await asyncio.gather(*(client.get(u, headers, 64 << 20) for u in urls))
        return sum(len(r.body.decode("utf-8")) for r in replies)

    out: dict[str, list[float]] = {"aiohttp": [], "llhttp": []}
    async with new_session() as session, old.HttpClient() as client:
        clients = {"aiohttp": (new_cycle, session), "llhttp": (old_cycle, client)}
        for cycle, c in clients.values():
            await cycle(c)  # connections opened, caches warm
        for r in range(rounds):
            for name in ("aiohttp", "llhttp") if r % 2 == 0 else ("llhttp", "aiohttp"):
                cycle, c = clients[name]
                t0 = time.process_time()
                for _ in range(cycles):
                    assert await cycle(c) > 0
                out[name].append((time.process_time() - t0) / cycles)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=100)
    ap.add_argument("--body-kb", type=int, default=1024)
    ap.add_argument("--gzip", action="store_true", help="serve the bodies gzip-compressed")
    ap.add_argument("--cycles", type=int, default=5, help="scrape cycles per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--rev", help="git revision of the llhttp client (default: the last one that had it)")
    args = ap.parse_args()

    text = FIXTURE.read_bytes()
    body = (text * (args.body_kb * 1024 // len(text) + 1))[: args.body_kb * 1024]
    body = body[: body.rindex(b"\n") + 1]
    wire = gzip.compress(body) if args.gzip else body
    old, rev = old_client(args.rev)
    with tempfile.NamedTemporaryFile() as f:
        f.write(wire)
        f.flush()
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, f.name, str(args.targets), "1" if args.gzip else "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            ports = server.stdout.readline().split()
            urls = [f"http://127.0.0.1:{p}/metrics" for p in ports]
            res = uvloop.run(measure(urls, args.cycles, args.rounds, old))
        finally:
            server.kill()
            server.wait()
    med = {k: statistics.median(v) for k, v in res.items()}
    print(
        f"{args.targets} targets x {len(body) / 1024:.0f} KB{' (gzip on the wire)' if args.gzip else ''}, "
        f"{args.rounds} rounds x {args.cycles} cycles; llhttp client from {rev}"
    )
    for name, v in res.items():
        print(
            f"  {name:8s} CPU per cycle {med[name] * 1e3:7.1f} ms (rounds {min(v) * 1e3:.1f}-{max(v) * 1e3:.1f}); "
            f"at a 15 s interval {med[name] / 15 * 100:.2f} % of a core"
        )
    print(f"  ratio aiohttp / llhttp: {med['aiohttp'] / med['llhttp']:.2f}")
    from kvscope.agent.scrape.exposition import parse_exposition

    t0 = time.process_time()
    parse_exposition(body.decode())
    parse = time.process_time() - t0
    print(f"  for scale: parsing the {args.targets} bodies (no memo) {parse * args.targets * 1e3:.0f} ms CPU")


if __name__ == "__main__":
    main()
