"""Every recording in the incident library loads into a real Prometheus TSDB with promtool."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.prometheus, pytest.mark.servers]

LIBRARY = Path(__file__).resolve().parent.parent / "recordings"
RECORDINGS = sorted(LIBRARY.glob("*.om.gz"))
PROMTOOL = shutil.which("promtool")


def test_library_is_not_empty():
    assert len(RECORDINGS) >= 7, [p.name for p in RECORDINGS]


@pytest.mark.needs("promtool")
@pytest.mark.parametrize("recording", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_recording_backfills_into_prometheus_tsdb(recording: Path, tmp_path: Path):
    plain = tmp_path / recording.name.removesuffix(".gz")
    with gzip.open(recording, "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    data = tmp_path / "data"
    made = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(plain), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    listed = subprocess.run(
        [PROMTOOL, "tsdb", "list", str(data)], capture_output=True, text=True, timeout=300
    )  # a hang guard only (slow on a loaded 2-core box)
    assert listed.returncode == 0, listed.stderr
    # rows: BLOCK ULID, MIN TIME, MAX TIME, DURATION, NUM SAMPLES, NUM CHUNKS, NUM SERIES, SIZE
    rows = [line.split() for line in listed.stdout.splitlines()[1:] if line.strip()]
    assert rows, listed.stdout
    samples = sum(int(r[4]) for r in rows)
    with plain.open() as f:
        lines = sum(1 for line in f if line and not line.startswith("#"))
    assert samples == lines  # every sample line landed in the TSDB, none dropped
    min_ms = min(int(r[1]) for r in rows)
    assert re.fullmatch(r"1[0-9]{12}", str(min_ms)), "timestamps must be seconds in the file (ms in the TSDB)"
