"""Record the bundled demo incident: real vLLM on CPU, a small KV pool, 16 concurrent clients.

.venv/bin/python testbed/record_kv_pressure.py OUT.om    (from the repository root)
"""

import asyncio
import subprocess
import sys
import time

from testbed.loadgen import LoadSpec, run_load
from testbed.tenants import Dist, Tenant
from testbed.vllm_server import VllmConfig, VllmServer

cfg = VllmConfig(num_gpu_blocks=64, max_num_seqs=16)
with VllmServer(cfg) as srv:
    print("up", srv.url, flush=True)
    rec = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvscope",
            "record",
            "--target",
            srv.metrics_url,
            "--job",
            "vllm",
            "--duration",
            "150s",
            "--interval",
            "2s",
            "--out",
            sys.argv[1],
            "--no-progress",
        ]
    )
    time.sleep(20)
    tenants = [
        Tenant(f"t{i}", system_words=300, share=1.0, prompt_words=Dist("fixed", 200), output_tokens=Dist("fixed", 96))
        for i in range(4)
    ]
    res = asyncio.run(run_load(LoadSpec(tenants=tenants, max_requests=400, duration_s=100, concurrency=16), [srv.url]))
    print(res.summary(), flush=True)
    rec.wait()
print("done")
