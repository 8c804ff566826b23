"""The diagnosis of the incident library survives recordings made differently (metamorphic).

Each case rewrites a recording of tests/recordings/ with one variant of
testbed/recording_variants.py (slower scrapes, the other metric spelling, Ray names, extra
labels, clock offset, staggered targets, late start, early end, an outage, a counter reset on
another replica) and asks for the same verdict as test_diagnose_recordings.py: the expected
LEVERS.md row ranked first, healthy recordings quiet. This is a representative subset, one case
per variant, chosen where the variant bites (each once broke a diagnosis or exercises the
engine path it changes); bench/diagnose_robustness.py runs every variant on every recording.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from kvscope.diagnoser.evaluate.evaluator import diagnose, sample_names
from kvscope.diagnoser.rulebook.rule import read_rules
from kvscope.diagnoser.sources.recording import RecordingSource
from testbed.recording_variants import (
    VARIANTS,
    applicable,
    check_diagnosis,
    read_variant_source,
    scrape_interval,
    write_variant,
)

LIBRARY = Path(__file__).resolve().parents[1] / "recordings"

CASES = [
    ("fleet-8-replicas-round-robin", "stagger"),  # replicas first seen one by one: not a scale event
    ("fleet-scale-out-hash-mod", "resample_30s"),  # a 76 s miss storm seen at 30 s scrapes
    ("noisy-tenant-long-prompts", "gap"),  # the only replica down mid-incident
    ("healthy-shared-prefix", "gap"),  # an outage alone is no finding
    ("healthy-shared-prefix", "resample_5s"),
    ("fleet-sglang-dp-split-cache", "gap"),  # a 90 s outage inside a for: 5m (scaled) run
    ("kv-pressure-cascade", "extra_labels"),
    ("spec-decode-poor-acceptance", "rename"),  # vLLM's other spellings
    ("fleet-sglang-hicache-reload-stalls", "ray_names"),  # sglang_ spelling
    ("fleet-sglang-dp-split-cache", "shift"),  # clock days off
    ("fleet-pd-kv-transfer-rising", "counter_reset"),  # a decode server restarts its counters
    ("fleet-pd-kv-transfer-rising", "cut_tail_10"),
    ("prefix-caching-disabled", "cut_head_20"),
    ("kv-pressure-cascade", "metrics_only"),  # spans dropped: K1-K3 need none of them
    # P2 on a 160 s window at 15 s: its 2m rates, shortened to 20 s, read one step, which scrape
    # times drifting against the grid leave holding one sample (no increase); rate_steps keeps two
    ("round-robin-vs-sticky", "resample_15s"),
    # a target first scraped most of a 30 s interval after its peers is no replica that joins
    ("blind-vllm-long-prompt-surge", "stagger"),
]


@pytest.fixture(scope="module")
def rules():
    return read_rules()


def _diagnose(path: Path, rules):
    source = RecordingSource(path)
    names = set().union(*(sample_names(r) for r in rules))
    frame = source.read_frame(names, None, None, source.natural_step())
    return diagnose(frame, rules, source=source.description)


@pytest.mark.parametrize(("scenario", "variant"), CASES, ids=[f"{s}:{v}" for s, v in CASES])
def test_variant_keeps_the_diagnosis(scenario, variant, rules, tmp_path):
    meta = yaml.safe_load((LIBRARY / f"{scenario}.yaml").read_text())
    src = LIBRARY / meta["recording"]
    assert applicable(variant, meta, read_variant_source(src)) is None
    spans = LIBRARY / meta["spans"] if meta.get("spans") else None
    out = write_variant(src, VARIANTS[variant], meta, tmp_path, spans)
    problem = check_diagnosis(meta, _diagnose(out, rules), rules)
    assert problem is None, f"{scenario} {variant}: {problem}"


def test_every_variant_is_in_the_subset():
    assert {v for _, v in CASES} >= set(VARIANTS) - {"resample_10s", "resample_15s", "resample_60s"}


# ---------------------------------------------------------------------------- the variants do what they say
@pytest.fixture(scope="module")
def fleet():
    """The 8-replica fleet recording, read once (variants return new recordings)."""
    meta = yaml.safe_load((LIBRARY / "fleet-8-replicas-round-robin.yaml").read_text())
    return meta, read_variant_source(LIBRARY / meta["recording"])


def test_resample_slows_the_scrape_interval(fleet):
    meta, rec = fleet
    slow = VARIANTS["resample_30s"].apply(rec, meta)
    assert scrape_interval(rec) == pytest.approx(10.0, abs=0.5)
    assert scrape_interval(slow) == pytest.approx(30.0, abs=0.5)


def test_rename_uses_the_other_catalog_spelling(fleet):
    meta, rec = fleet
    renamed = VARIANTS["rename"].apply(rec, meta)
    assert "vllm:gpu_cache_usage_perc" in renamed.types and "vllm:kv_cache_usage_perc" not in renamed.types
    assert "vllm:gpu_prefix_cache_hits" in renamed.types
    names = {s.name for sc in renamed.scrapes[:50] for s in sc.samples}
    assert "vllm:gpu_prefix_cache_hits_total" in names


def test_ray_names_fold_the_prefix(fleet):
    meta, rec = fleet
    ray = VARIANTS["ray_names"].apply(rec, meta)
    names = {s.name for sc in ray.scrapes[:50] for s in sc.samples}
    assert "vllm_num_requests_running" in names and not any(n.startswith("vllm:") for n in names)


def test_gap_and_counter_reset_touch_one_target_only(fleet):
    meta, rec = fleet
    gapped = VARIANTS["gap"].apply(rec, meta)
    down = {(sc.job, sc.instance) for sc in gapped.scrapes if not sc.up}
    assert len(down) == 1
    n_down = sum(1 for sc in gapped.scrapes if not sc.up)
    # a quarter of the 360 s round-robin phase (shorter than GAP_S) at 10 s scrapes
    assert n_down == pytest.approx(90.0 / scrape_interval(rec), abs=1)
    reset = VARIANTS["counter_reset"].apply(rec, meta)
    drops = set()
    prev: dict = {}
    for sc in sorted(reset.scrapes, key=lambda s: s.timestamp):
        for s in sc.samples:
            if s.name == "vllm:prompt_tokens_total":
                key = (sc.instance, s.labels)
                if key in prev and s.value < prev[key]:
                    drops.add(sc.instance)
                prev[key] = s.value
    assert len(drops) == 1


def test_shift_and_stagger_move_timestamps(fleet):
    meta, rec = fleet
    shifted = VARIANTS["shift"].apply(rec, meta)
    assert shifted.start - rec.start > 86_400
    staggered = VARIANTS["stagger"].apply(rec, meta)
    firsts = {}
    for sc in staggered.scrapes:
        firsts[sc.instance] = min(firsts.get(sc.instance, sc.timestamp), sc.timestamp)
    assert statistics.pstdev(firsts.values()) > 1.0


def test_cut_keeps_the_middle(fleet):
    meta, rec = fleet
    cut = VARIANTS["cut_head_20"].apply(rec, meta)
    assert cut.start - rec.start == pytest.approx(0.2 * (rec.end - rec.start), abs=scrape_interval(rec))
    assert cut.end == rec.end


def test_metrics_only_drops_the_tap_targets_and_the_spans(tmp_path):
    meta = yaml.safe_load((LIBRARY / "round-robin-vs-sticky.yaml").read_text())
    src = LIBRARY / meta["recording"]
    rec = read_variant_source(src)
    assert {job for job, _ in rec.targets()} == {"vllm", "kvscope-tap"}
    only = VARIANTS["metrics_only"].apply(rec, meta)
    assert {job for job, _ in only.targets()} == {"vllm"}
    assert not any(s.name.startswith("kvscope_") for sc in only.scrapes for s in sc.samples)
    assert len(only.scrapes) == sum(1 for sc in rec.scrapes if sc.job == "vllm")
    out = write_variant(src, VARIANTS["metrics_only"], meta, tmp_path, LIBRARY / meta["spans"])
    assert not list(tmp_path.glob("*.spans.jsonl.gz")) and out.exists()
    fleet_meta = yaml.safe_load((LIBRARY / "fleet-8-replicas-round-robin.yaml").read_text())
    assert (
        applicable("metrics_only", fleet_meta, read_variant_source(LIBRARY / fleet_meta["recording"]))
        == "already engine metrics only"
    )


def test_counter_reset_keeps_counting_through_the_recordings_own_restarts():
    """A replica the recording itself restarts (scaled in and out) keeps counting after the
    injected reset: wherever the recorded counter rose between two scrapes, the variant's rises
    too. Subtracting the earlier base from a series that already restarted (clamped at 0) made
    replica-5 of the flapping recording count nothing for minutes with 43 requests running."""
    meta = yaml.safe_load((LIBRARY / "blind-vllm-replica-flapping.yaml").read_text())
    rec = read_variant_source(LIBRARY / meta["recording"])
    reset = VARIANTS["counter_reset"].apply(rec, meta)

    def generated(r):
        out = {}
        for sc in r.scrapes:
            if sc.instance == "replica-5":
                out[sc.timestamp] = sum(s.value for s in sc.samples if s.name == "vllm:generation_tokens_total")
        return out

    before, after = generated(rec), generated(reset)
    assert before.keys() == after.keys()
    times = sorted(before)
    rose = [(a, b) for a, b in zip(times, times[1:], strict=False) if before[b] > before[a]]
    assert rose
    assert all(after[b] > after[a] for a, b in rose)
