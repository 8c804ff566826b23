"""A real Alertmanager (the Debian 0.25 `prometheus-alertmanager` binary) for tests.

Started standalone on 127.0.0.1 with clustering off (`--cluster.listen-address=`), so it
neither opens the gossip port nor waits for peers; ready when `/-/ready` answers 200.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from testbed.procs import LOOPBACK

BINARY = "prometheus-alertmanager"
READY_PATH = "/-/ready"


def alertmanager_argv(config: Path, storage: Path, port: int, binary: str = BINARY) -> list[str]:
    """Alertmanager with `config`, its state under `storage`, the API on 127.0.0.1:`port`."""
    return [
        binary,
        f"--config.file={config}",
        f"--storage.path={storage}",
        f"--web.listen-address={LOOPBACK}:{port}",
        "--cluster.listen-address=",
    ]


def post_alerts(url: str, alerts: list[dict], timeout_s: float = 5.0) -> int:
    """POST alerts to `/api/v2/alerts` (what Prometheus does); returns the HTTP status."""
    req = urllib.request.Request(
        f"{url}/api/v2/alerts",
        data=json.dumps(alerts).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.status
