"""The fleet scenario generator speaks the real exporters' dialects and produces the dynamics
its YAML claims (checked through kvscope's own replay, i.e. the product's normalization)."""

from __future__ import annotations

import gzip
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from kvscope.agent.normalize.dialect import detect_engine, normalize
from kvscope.agent.recording.replay import replay_recording
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.core.signals import load_catalog
from testbed.fleetgen.families import (
    Histogram,
    SglangState,
    VllmState,
    render_sglang,
    render_vllm,
)
from testbed.fleetgen.sim import SCENARIOS, generate

CAL = {
    "ttft_vs_queue": {"idle_ttft_s": 0.05, "ratio_per_waiting_request": 0.4, "intercept": 1.0},
    "preemption": {"onset_kv_usage": 0.95},
    "routing_2_replicas": {"round-robin": 0.4, "sticky": 0.8, "rr_over_sticky": 0.5},
    "cold_start": {"warm_hit_rate": 0.8, "seconds_to_90pct_of_warm": 10, "requests_per_prefix_to_90pct": 2.0},
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fleet")
    for name in SCENARIOS:
        generate(name, out, CAL)
    return out


def _phase_bounds(out: Path, name: str) -> dict[str, tuple[float, float]]:
    meta = yaml.safe_load((out / f"{name}.yaml").read_text())
    t0 = meta["recorded_at_unix"]
    return {p["name"]: (t0 + p["start_s"], t0 + p["end_s"]) for p in meta["phases"]}


def _counter_delta(samples, name, t0, t1, key) -> dict[str, float]:
    first: dict[str, tuple[float, float]] = {}
    last: dict[str, tuple[float, float]] = {}
    for s in samples:
        if s.name != name or not (t0 <= s.timestamp <= t1):
            continue
        k = dict(s.labels)[key]
        if k not in first or s.timestamp < first[k][0]:
            first[k] = (s.timestamp, s.value)
        if k not in last or s.timestamp > last[k][0]:
            last[k] = (s.timestamp, s.value)
    return {k: last[k][1] - first[k][1] for k in first}


REAL_VLLM = Path(__file__).resolve().parents[1] / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"


def _ttft_les(expo) -> list[float]:
    """The finite TTFT bucket bounds of a vLLM exposition, as the normalizer reads them."""
    norm = normalize(expo, "vllm", {"job": "vllm", "instance": "r0"})
    les = {dict(x.labels)["le"] for x in norm.samples if x.name == "request_ttft_seconds_bucket"}
    return sorted(float(le) for le in les - {"+Inf"})


def test_catalog_ttft_buckets_are_a_real_vllms():
    assert _ttft_les(parse_exposition(REAL_VLLM.read_text())) == list(
        load_catalog().buckets("request_ttft_seconds", "vllm")
    )


def test_vllm_render_is_a_valid_vllm_exposition_with_real_buckets():
    s = VllmState()
    s.ttft.observe(0.03, 5)
    s.queries, s.hits = 1000.0, 400.0
    expo = parse_exposition(render_vllm(s))
    assert expo.issues == []
    assert detect_engine(expo) == "vllm"
    assert _ttft_les(expo) == _ttft_les(parse_exposition(REAL_VLLM.read_text()))  # a real vLLM's bounds
    norm = normalize(expo, "vllm", {"job": "vllm", "instance": "r0"})
    vals = {x.name: x.value for x in norm.samples if not x.name.startswith("request_")}
    assert vals["engine_prefix_cache_hits_tokens_total"] == 400.0
    assert vals["engine_prefix_cache_queries_tokens_total"] == 1000.0
    assert norm.facts["0"]["block_size"] == "16"


def test_histogram_is_cumulative_with_inf_equal_to_count():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 0.5, 5.0):
        h.observe(v)
    text = render_sglang(SglangState(ttft=Histogram((0.1, 1.0), h.counts, h.total)), scheduler=False)
    buckets = [ln for ln in text.splitlines() if ln.startswith("sglang:time_to_first_token_seconds_bucket")]
    assert [float(b.rsplit(" ", 1)[1]) for b in buckets] == [1.0, 3.0, 4.0]
    assert h.count == 4 and h.total == pytest.approx(6.05)


def test_recordings_are_reproducible(fleet, tmp_path):
    again = generate("fleet-pd-kv-transfer-rising", tmp_path, CAL)
    a = gzip.decompress((fleet / "fleet-pd-kv-transfer-rising.om.gz").read_bytes())
    b = gzip.decompress((again.parent / "fleet-pd-kv-transfer-rising.om.gz").read_bytes())
    assert a == b


def test_round_robin_over_8_replicas_cuts_hit_rate_to_about_one_eighth(fleet):
    rep = replay_recording(fleet / "fleet-8-replicas-round-robin.om.gz")
    assert set(rep.engines.values()) == {"vllm"} and len(rep.engines) == 8
    ph = _phase_bounds(fleet, "fleet-8-replicas-round-robin")
    rates = {}
    for name, (t0, t1) in ph.items():
        hits = _counter_delta(rep.samples, "engine_prefix_cache_hits_tokens_total", t0, t1, "instance")
        queries = _counter_delta(rep.samples, "engine_prefix_cache_queries_tokens_total", t0, t1, "instance")
        rates[name] = {i: hits[i] / queries[i] for i in queries}
    assert all(r == pytest.approx(0.8, abs=0.03) for r in rates["prefix-hash"].values())
    assert all(r == pytest.approx(0.8 / 8, abs=0.03) for r in rates["round-robin"].values())


def test_dcgm_trap_reports_busy_util_but_idle_engines(fleet):
    rep = replay_recording(fleet / "fleet-dcgm-utilization-trap.om.gz")
    by = defaultdict(list)
    nodes = set()
    for s in rep.samples:
        by[s.name].append(s.value)
        if s.name == "gpu_utilization_ratio":
            nodes.add(dict(s.labels).get("node"))
    mean = {k: sum(v) / len(v) for k, v in by.items()}
    assert mean["gpu_utilization_ratio"] > 0.85  # DCGM_FI_DEV_GPU_UTIL (%) scaled to a ratio
    assert mean["gpu_graphics_engine_active_ratio"] < 0.3
    assert mean["engine_requests_waiting"] == 0
    assert nodes == {"node-0", "node-1"}  # dcgm `Hostname` -> canonical node
    assert len(by["gpu_utilization_ratio"]) == 8 * 60


def test_pd_transfer_time_rises_while_decode_itl_stays_flat(fleet):
    rep = replay_recording(fleet / "fleet-pd-kv-transfer-rising.om.gz")
    ph = _phase_bounds(fleet, "fleet-pd-kv-transfer-rising")

    def mean_transfer(t0, t1):
        s = _counter_delta(rep.samples, "kv_transfer_seconds_sum", t0, t1, "instance")["prefill-0"]
        c = _counter_delta(rep.samples, "kv_transfer_seconds_count", t0, t1, "instance")["prefill-0"]
        return s / c

    normal, rising = mean_transfer(*ph["normal"]), mean_transfer(*ph["transfer-rising"])
    assert 0.01 < normal < 0.05  # ms histogram scaled to seconds by the catalog
    assert rising > 8 * normal
    roles = {dict(s.labels).get("role") for s in rep.samples if s.name == "engine_requests_running"}
    assert roles == {"prefill", "decode"}


def test_sglang_dp_ranks_have_split_hit_rates_then_converge(fleet):
    path = fleet / "fleet-sglang-dp-split-cache.om.gz"
    expo = parse_exposition(gzip.decompress(path.read_bytes()).decode(), openmetrics=True)
    assert expo.issues == []
    ph = _phase_bounds(fleet, "fleet-sglang-dp-split-cache")
    per_rank: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in expo.samples:
        if s.name == "sglang:cache_hit_rate":
            phase = next(n for n, (a, b) in ph.items() if a <= s.timestamp <= b)
            per_rank[phase][dict(s.labels)["dp_rank"]].append(s.value)
    spread = {r: sum(v) / len(v) for r, v in per_rank["spread"].items()}
    pinned = {r: sum(v) / len(v) for r, v in per_rank["pinned"].items()}
    assert set(spread) == {"0", "1", "2", "3"}
    assert max(spread.values()) > 2 * min(spread.values())
    assert max(pinned.values()) - min(pinned.values()) < 0.1
    # the tokenizer-side series exist once per server, not once per rank
    ttft_count = [s for s in expo.samples if s.name == "sglang:time_to_first_token_seconds_count"]
    assert len({s.labels for s in ttft_count}) == 1


def test_scale_out_with_hash_mod_collapses_every_replica_then_refills(fleet):
    rep = replay_recording(fleet / "fleet-scale-out-hash-mod.om.gz")
    ph = _phase_bounds(fleet, "fleet-scale-out-hash-mod")
    t_grow = ph["scaled-to-9"][0]
    hits = _counter_delta(rep.samples, "engine_prefix_cache_hits_tokens_total", t_grow, t_grow + 20, "instance")
    queries = _counter_delta(rep.samples, "engine_prefix_cache_queries_tokens_total", t_grow, t_grow + 20, "instance")
    early = {i: hits[i] / queries[i] for i in queries if queries[i]}
    assert len(early) == 9 and max(early.values()) < 0.4  # collapse everywhere at once (warm 0.8)
    late_t0 = ph["scaled-to-9"][1] - 60
    hits = _counter_delta(
        rep.samples, "engine_prefix_cache_hits_tokens_total", late_t0, ph["scaled-to-9"][1], "instance"
    )
    queries = _counter_delta(
        rep.samples, "engine_prefix_cache_queries_tokens_total", late_t0, ph["scaled-to-9"][1], "instance"
    )
    assert min(hits[i] / queries[i] for i in queries) > 0.7  # refilled after the cold-start time


def test_hicache_host_tier_serves_hits_and_stalls_the_itl_tail(fleet):
    rep = replay_recording(fleet / "fleet-sglang-hicache-reload-stalls.om.gz")
    ph = _phase_bounds(fleet, "fleet-sglang-hicache-reload-stalls")

    def itl_share_over(t0, t1, bound):
        first, last = {}, {}
        for s in rep.samples:
            if s.name == "request_itl_seconds_bucket" and t0 <= s.timestamp <= t1:
                le = dict(s.labels)["le"]
                first.setdefault(le, s.value)
                last[le] = s.value
        d = {le: last[le] - first[le] for le in last}
        under = max(v for le, v in d.items() if le != "+Inf" and float(le) <= bound)
        return 1 - under / d["+Inf"]

    host = _counter_delta(rep.samples, "engine_kv_offload_loaded_tokens_total", *ph["host-tier-in-use"], "instance")
    assert host["sglang-0"] > 0
    assert (
        _counter_delta(rep.samples, "engine_kv_offload_loaded_tokens_total", *ph["fits-on-device"], "instance")[
            "sglang-0"
        ]
        == 0
    )
    assert itl_share_over(*ph["fits-on-device"], 0.1) < 0.005  # p99 ITL under 100 ms
    assert itl_share_over(*ph["host-tier-in-use"], 0.1) > 0.015  # >1.5 % of tokens stall: p99 above 100 ms
    used = [s.value for s in rep.samples if s.name == "engine_kv_host_used_tokens"]
    assert max(used) > 10 * min(used)


def test_large_batches_of_observations_keep_count_and_mean():
    import random as _r

    from testbed.fleetgen.sim import _observe_lognormal

    h = Histogram((0.01, 0.02, 0.05, 0.1))
    _observe_lognormal(_r.Random(0), h, 0.02, 10_000, 0.15)
    assert h.count == 10_000 and h.total / h.count == pytest.approx(0.02)
    assert h.counts[1] > h.counts[0] and h.counts[1] > h.counts[2]  # mass around the mean


def test_blind_set_is_reproducible_and_speaks_the_real_dialects(tmp_path):
    from testbed.fleetgen.families import vllm_request_token_bounds
    from testbed.fleetgen.sim import blind_scenarios

    assert vllm_request_token_bounds(8192) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
    for name in ("blind-vllm-kv-too-small", "blind-sglang-queue-overload"):
        a, b = tmp_path / "a", tmp_path / "b"
        a.mkdir(exist_ok=True)
        b.mkdir(exist_ok=True)
        generate(name, a, CAL)
        generate(name, b, CAL)
        assert gzip.decompress((a / f"{name}.om.gz").read_bytes()) == gzip.decompress(
            (b / f"{name}.om.gz").read_bytes()
        )
        rep = replay_recording(a / f"{name}.om.gz")
        engine = "vllm" if "vllm" in name else "sglang"
        assert set(rep.engines.values()) == {engine}
        names = {s.name for s in rep.samples}
        assert {"request_prompt_tokens_bucket", "request_generation_tokens_bucket"} <= names
        meta = yaml.safe_load((a / f"{name}.yaml").read_text())
        assert meta["source"].startswith("synthetic") and meta["must_not"]
        intervals = {
            round(t1 - t0)
            for t0, t1 in zip(
                sorted({s.timestamp for s in rep.samples}), sorted({s.timestamp for s in rep.samples})[1:], strict=False
            )
        }
        assert intervals == {30}  # production-like scrape interval
    assert len(blind_scenarios()) == 11


def test_the_cut_pool_restarts_with_half_its_kv_cache():
    """CaptureFleet `cut`: model-1's engines (1 and 5 of 8) drop every counter at the cut and name
    half the KV blocks from then on, on a new cache_config_info series (the old one ends); no
    other engine restarts. Across chunk boundaries (50 scrapes a chunk, the cut at scrape 60)."""
    import io

    import numpy as np

    from testbed.fleetgen.capture_fleet import CaptureFleet, write_capture_fleet

    fleet = CaptureFleet(8, 0.0, 7200.0, 60.0, chunk_steps=50, cut=0.5)
    rows: dict[tuple, list] = defaultdict(list)
    for _, fams in fleet.chunks():
        for fam, arrays in fams:
            for (name, labels, _), arr in zip(fam.series, arrays, strict=True):
                rows[(name, labels.get("num_gpu_blocks"), tuple(sorted(labels.items())))].append(arr)
    counters = [k for k in rows if k[0].endswith(("_total", "_count", "_bucket"))]
    assert counters
    for key in counters:
        drops = np.diff(np.concatenate(rows[key], axis=1), axis=1) < 0
        assert {(int(e), int(i) + 1) for e, i in zip(*np.nonzero(drops), strict=True)} <= {(1, 60), (5, 60)}, key
    present = {
        blocks: ~np.isnan(np.concatenate(a, axis=1)) for (n, blocks, _), a in rows.items() if "cache_config" in n
    }
    assert present["128"][[1, 5], :60].all() and not present["128"][[1, 5], 60:].any()
    assert present["64"][[1, 5], 60:].all() and not present["64"][[1, 5], :60].any()
    assert present["128"][[0, 2, 3, 4, 6, 7]].all() and not present["64"][[0, 2, 3, 4, 6, 7]].any()
    out = io.StringIO()
    write_capture_fleet(out, 8, 0.0, 7200.0, 60.0, cut=0.5)
    info = [line for line in out.getvalue().splitlines() if line.startswith("vllm:cache_config_info")]
    assert len(info) == 8 * 121 and "nan" not in out.getvalue()
