#!/usr/bin/env python3
"""Record tests/recordings/dynamo-kv-event-feed-stalled: a real KV router whose event feed stops.

Two identical real NVIDIA Dynamo fleets (testbed/dynamo.py: frontend with `--router-mode kv` over
one mocker process with 2 workers) get the same open-loop traffic, one chat request with a new
prompt every 2 s each (so every request stores new KV blocks and the workers publish events).
Each worker's ZMQ KV-event feed reaches its router through a TCP relay (`relay_kv_events`). After
HEALTHY_S the relays of fleet `stalled` stop moving bytes (the connections stay open: a silent
event-plane partition); the router keeps routing on its stale index and the requests keep
succeeding. Fleet `healthy` is the twin whose relays never stop. `kvscope record` scrapes both
frontends and both mockers every 5 s for HEALTHY_S + STALLED_S.

Needs scripts/install-dynamo.sh and the tiny model (make setup-dynamo). About 18 minutes.
Run with the kvscope venv: .venv/bin/python scripts/record-dynamo-feed-stall.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed.dynamo import DYNAMO_VERSION, MODEL_NAME, DynamoFleet  # noqa: E402
from testbed.tiny_model import cache_root, model_key  # noqa: E402

NAME = "dynamo-kv-event-feed-stalled"
HEALTHY_S, STALLED_S, INTERVAL_S, EVERY_S = 660, 390, 5, 2.0
# Written before the first run: R2 fires on the stalled fleet's frontend in the stalled phase
# (its router took events in before, takes none now, while its gateway keeps serving); the twin's
# frontend, on the same traffic with its feed flowing, raises nothing.
EXPECTED = [
    {
        "levers": ["R2"],
        "phase": "stalled",
        "likely": True,
        "where": {"instance": "frontend-stalled"},
        "why": "the KV router's applied events stop while its frontend keeps serving (LEVERS.md R2)",
    }
]
QUIET = {"instance": "frontend-healthy", "why": "the same traffic with its feed flowing"}


def chat(url: str, i: int) -> int | str:
    """One request with a prompt no earlier request shared (new blocks, hence new KV events)."""
    system = f"request {i} " * 20 + "shared words here " * 40
    body = {"model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "system", "content": system}]}
    req = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except Exception as e:  # noqa: BLE001 - counted per phase, the load goes on
        return type(e).__name__


def drive(url: str, phase: list[str], tally: dict[str, dict[str, int]], stop: threading.Event) -> None:
    i, t0 = 0, time.monotonic()
    while not stop.is_set():
        outcome = str(chat(url, i))
        per = tally.setdefault(phase[0], {})
        per[outcome] = per.get(outcome, 0) + 1
        i += 1
        stop.wait(max(0.0, t0 + i * EVERY_S - time.monotonic()))


def main() -> int:
    out = REPO / "tests" / "recordings"
    model = cache_root() / "models" / f"tiny-llama-{model_key()}"
    tmp = Path(tempfile.mkdtemp(prefix="kvs-r2-"))
    with DynamoFleet(model, "kv", workers=2) as stalled, DynamoFleet(model, "kv", workers=2) as healthy:
        fleets = {"stalled": stalled.relay_kv_events(), "healthy": healthy.relay_kv_events()}
        targets = [
            {"url": u, "job": f"dynamo-{part}", "labels": {"instance": f"{part}-{name}"}}
            for name, fleet in fleets.items()
            for part, u in fleet.metrics_urls.items()
        ]
        (tmp / "targets.yaml").write_text(json.dumps({"targets": targets}))
        phase, stop, tallies = ["healthy"], threading.Event(), {n: {} for n in fleets}
        rec = subprocess.Popen(
            [sys.executable, "-m", "kvscope", "record", "--config", str(tmp / "targets.yaml"), "--no-progress"]
            + [
                "--duration",
                f"{HEALTHY_S + STALLED_S}s",
                "--interval",
                f"{INTERVAL_S}s",
                "--out",
                str(out / f"{NAME}.om.gz"),
            ]
        )
        t0 = time.time()
        drivers = [
            threading.Thread(target=drive, args=(f.url, phase, tallies[n], stop), daemon=True)
            for n, f in fleets.items()
        ]
        for d in drivers:
            d.start()
        time.sleep(HEALTHY_S)
        stalled.stall_kv_events()
        phase[0] = "stalled"
        print(f"feed stalled at +{time.time() - t0:.0f} s", flush=True)
        rc = rec.wait()
        stop.set()
        for d in drivers:
            d.join(40)
    meta = {
        "scenario": NAME,
        "summary": (
            "Two identical real Dynamo fleets (frontend --router-mode kv over 2 mocker workers), the same "
            f"traffic (a new prompt every {EVERY_S:g} s each). After {HEALTHY_S} s the KV-event feed of fleet "
            "`stalled` stops: the relay between its workers' ZMQ publishers and its router holds every byte "
            "(connections open, nothing lost visibly); requests keep being routed and served. Fleet `healthy` "
            "is the twin with its feed flowing."
        ),
        "source": f"real ai-dynamo {DYNAMO_VERSION} on CPU (mocker engines, file discovery, zmq event plane), "
        "2-core shared box; scripts/record-dynamo-feed-stall.py",
        "recording": f"{NAME}.om.gz",
        "recorded_at_unix": round(t0, 3),
        "duration_s": HEALTHY_S + STALLED_S,
        "scrape_interval_s": INTERVAL_S,
        "phases": [
            {
                "name": "healthy",
                "start_s": 0,
                "end_s": HEALTHY_S,
                "client": {n: t.get("healthy") for n, t in tallies.items()},
            },
            {
                "name": "stalled",
                "start_s": HEALTHY_S,
                "end_s": HEALTHY_S + STALLED_S,
                "action": "fleet `stalled`: its relays stop forwarding the KV-event feed",
                "client": {n: t.get("stalled") for n, t in tallies.items()},
            },
        ],
        "expected": EXPECTED,
        "quiet": QUIET,
    }
    (out / f"{NAME}.yaml").write_text(yaml.safe_dump(meta, sort_keys=False, width=100))
    print(json.dumps(tallies), "record rc", rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
