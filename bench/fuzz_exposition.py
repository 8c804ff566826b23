"""Fuzz targets of the exposition parsers (run by bench/fuzz.py).

* `exposition`: a scraped body as the agent reads it: UTF-8 (fetch.py refuses other bytes with
  decode_error, so the fuzzer's bytes are decoded with replacement), parsed with the format
  detected, under limits, then normalized twice with one target's memo as the engine collector does.
* `openmetrics-recording`: a recording as `read_recording` reads it (OpenMetrics, then grouped
  into scrapes by target and timestamp).

Neither parser has an error type: any exception is a crash. Seeds: the scrape fixtures, the
shared reference capture, the OpenMetrics peer cases and records of the test recordings
(decompressed, cut at line boundaries), each cut to ~3 KiB at a line boundary (a few families).
The normalize passes run on one input in 8.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from kvscope.agent.normalize.dialect import MappingMemo, normalize
from kvscope.agent.recording.omfile import group_scrapes
from kvscope.agent.scrape.exposition import Limits, parse_exposition
from kvscope.core.signals import load_catalog

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "reference"
CAP = 3 << 10  # a few families per seed keeps ~1M inputs within minutes
_CATALOG = load_catalog()
_LIMITS = Limits(sample_limit=5000, label_limit=64, label_name_length_limit=256, label_value_length_limit=4096)
TOKENS = [
    b"# TYPE ",
    b"# HELP ",
    b"# UNIT ",
    b"# EOF\n",
    b" counter\n",
    b" histogram\n",
    b'_bucket{le="',
    b"_total",
    b"{",
    b"}",
    b'="',
    b'",',
    b"\\n",
    b'\\"',
    b"\\\\",
    b' # {trace_id="',
    b"+Inf",
    b"-Inf",
    b"NaN",
    b"1e-3",
    b"1_0",
    b"0x1p3",
    b"\xd9\xa3",
    b" 1700000000000",
    b" 1700000000.5",
    b'{"a.b"',
    b"  ",
    b"\t",
    b"\r\n",
]


def _cut(data: bytes, size: int = CAP) -> bytes:
    return data if len(data) <= size else data[: data.rfind(b"\n", 0, size) + 1]


def _text_seeds() -> list[bytes]:
    files = sorted((ROOT / "tests" / "fixtures" / "scrapes").glob("*.txt"))
    files += sorted((SHARED / "captures").glob("*.txt"))
    return [_cut(p.read_bytes()) for p in files]


def _om_seeds() -> list[bytes]:
    peer = SHARED / "peer-testdata" / "openmetrics-parsers"
    out = [p.read_bytes() for p in sorted(peer.glob("*/metrics"))[::6]] if peer.is_dir() else []
    for rec in sorted((ROOT / "tests" / "recordings").glob("*.om.gz"))[:6]:
        with gzip.open(rec) as f:
            head = f.read(64 << 10)
        out.append(_cut(head) + b"# EOF\n")
    return out


def fuzz_exposition(data: bytes) -> object:
    text = data.decode("utf-8", "replace")
    expo = parse_exposition(text, limits=_LIMITS)
    if len(data) % 8 == 0:  # 1 in 8: normalized as a target's first and second scrape
        memo = MappingMemo()
        for ts in (1.0, 2.0):
            normalize(expo, "vllm", {"job": "j", "instance": "i"}, ts, _CATALOG, memo)
    return expo


def fuzz_recording(data: bytes) -> object:
    expo = parse_exposition(data.decode("utf-8", "replace"), openmetrics=True)
    return group_scrapes(expo.samples)


TARGETS = {
    "exposition": (fuzz_exposition, lambda: _text_seeds() + _om_seeds()[:8], TOKENS),
    "openmetrics-recording": (fuzz_recording, _om_seeds, TOKENS),
}
