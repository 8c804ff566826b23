"""Metamorphic variants of an incident recording: changes that must not change the diagnosis.

The diagnoser will meet recordings made by other people: other scrape intervals, the other
accepted upstream spelling of a metric, Ray's `vllm_` names, extra target labels, clock
offsets, recordings that start late or end early, a target that was down for a while, a counter
reset on a healthy replica. Each `Variant` rewrites a recording (tests/recordings/*.om.gz) into
such a recording, at the level of the raw upstream samples, and writes it next to a link to the
original spans sidecar, so `kvscope diagnose --recording` reads it exactly as it would read one
recorded that way. `check_diagnosis` says whether a Diagnosis still matches the scenario YAML.

Renames are derived from core/catalog.yaml only: a name is replaced by another alias
of the same signal for the same engine with the same scale, label handling and filter.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvscope.agent.recording.omfile import RecordingWriter, Scrape, om_family, read_recording
from kvscope.agent.scrape.exposition import Exposition, RawSample
from kvscope.core.signals import Alias, Catalog, load_catalog

SHIFT_S = 86_400.0 * 3 + 17.3
"""Clock offset of the `shift` variant: three days and an odd number of seconds."""
EXTRA_LABELS = {"pod": "inference-7f9c", "namespace": "llm-serving", "container": "engine"}
"""Labels a Kubernetes scrape adds that no rule groups by (the dialects drop them)."""
GAP_S = 120.0
"""Length of the `gap` variant's outage (a target down for two minutes)."""


@dataclass
class Recording:
    """A recording as scrapes (time-ordered per target) plus the declared family types."""

    scrapes: list[Scrape]
    types: dict[str, str]
    helps: dict[str, str]

    @property
    def start(self) -> float:
        return min(s.timestamp for s in self.scrapes)

    @property
    def end(self) -> float:
        return max(s.timestamp for s in self.scrapes)

    def targets(self) -> list[tuple[str, str]]:
        """(job, instance) of every target, sorted."""
        return sorted({(s.job, s.instance) for s in self.scrapes})


@dataclass(frozen=True)
class Variant:
    """A named rewrite of a recording that must leave the diagnosis unchanged. `apply` returns a
    new Recording and leaves its argument as it was."""

    name: str
    description: str
    apply: Callable[[Recording, dict[str, Any]], Recording]
    shift_spans_s: float = 0.0
    keeps_spans: bool = True  # False: the variant is written without its spans sidecar


# ---------------------------------------------------------------------------- reading / writing
def read_variant_source(path: str | os.PathLike[str]) -> Recording:
    """Read a recording for rewriting (samples keep their upstream names)."""
    scrapes, expo = read_recording(path)
    return Recording(scrapes=scrapes, types=dict(expo.types), helps=dict(expo.helps))


def write_recording(rec: Recording, path: str | os.PathLike[str]) -> Path:
    """Write the scrapes as an OpenMetrics recording (the agent's writer, so the same format)."""
    writer = RecordingWriter(path, spool_dir=str(Path(path).parent))
    try:
        for sc in sorted(rec.scrapes, key=lambda s: (s.timestamp, s.job, s.instance)):
            expo = Exposition(samples=sc.samples, types=rec.types, helps=rec.helps) if sc.up else None
            writer.add_scrape(sc.job, sc.instance, sc.timestamp, expo, sc.duration_s, sc.labels)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def write_variant(
    src: str | os.PathLike[str],
    variant: Variant,
    meta: dict[str, Any],
    out_dir: str | os.PathLike[str],
    spans: str | os.PathLike[str] | None = None,
) -> Path:
    """Rewrite recording `src` with `variant` into `out_dir` (plus its spans sidecar); returns the path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(src).name.removesuffix(".gz").removesuffix(".om")
    out = out_dir / f"{stem}.om"
    write_recording(variant.apply(read_variant_source(src), meta), out)
    sidecar = out_dir / f"{stem}.spans.jsonl.gz"
    if not variant.keeps_spans and (sidecar.exists() or sidecar.is_symlink()):
        sidecar.unlink()
    if spans and variant.keeps_spans:
        write_spans(spans, out_dir / f"{stem}.spans.jsonl.gz", variant.shift_spans_s)
    return out


def write_spans(src: str | os.PathLike[str], dest: Path, shift_s: float) -> None:
    """The spans sidecar for a variant: a link when unchanged, else every span shifted in time."""
    if dest.exists() or dest.is_symlink():
        dest.unlink()
    if not shift_s:
        dest.symlink_to(Path(src).resolve())
        return
    shift_ns = int(round(shift_s * 1e9))
    with gzip.open(src, "rt", encoding="utf-8") as fin, gzip.open(dest, "wt", encoding="utf-8") as fout:
        for line in fin:
            if not line.strip():
                continue
            d = json.loads(line)
            for key in ("start_ns", "end_ns"):
                if key in d:
                    d[key] = int(d[key]) + shift_ns
            fout.write(json.dumps(d) + "\n")


# ---------------------------------------------------------------------------- transforms
def resample(interval_s: float, snap: bool = False) -> Callable[[Recording, dict[str, Any]], Recording]:
    """Keep, per target, the first scrape of every `interval_s` slot: a slower scrape interval.
    `snap`: each kept scrape stamped at its slot's start, as a scraper on a fixed interval stamps
    them (moved by less than the native interval); else at its own time, so that an interval the
    native one does not divide (15 s of 2 s scrapes) alternates 14 and 16 s, and a grid of 15 s
    reads every other sample twice."""

    def apply(rec: Recording, meta: dict[str, Any]) -> Recording:
        t0 = rec.start
        seen: set[tuple[str, str, int]] = set()
        kept = []
        for sc in sorted(rec.scrapes, key=lambda s: s.timestamp):
            k = int(math.floor((sc.timestamp - t0) / interval_s))
            if (sc.job, sc.instance, k) not in seen:
                seen.add((sc.job, sc.instance, k))
                kept.append(replace(sc, timestamp=t0 + k * interval_s) if snap else sc)
        return replace(rec, scrapes=kept)

    return apply


def alternative_names(catalog: Catalog, engine: str) -> dict[str, str]:
    """Declared upstream name -> another accepted spelling of the same signal (old <-> new).

    Two aliases are interchangeable when they feed the same signal for the same engine with the
    same scale, label renames, filter and info label; the first other such alias is chosen.
    """
    out: dict[str, str] = {}
    for sig in catalog.signals.values():
        group = [a for a in sig.aliases if a.engine == engine]
        for a in group:
            same = [b for b in group if b.name != a.name and _interchangeable(a, b)]
            if same:
                out[a.name] = same[0].name
    return out


def _interchangeable(a: Alias, b: Alias) -> bool:
    return (a.scale, a.rename, a.match, a.info_label) == (b.scale, b.rename, b.match, b.info_label)


def rename_to_alternative(rec: Recording, meta: dict[str, Any]) -> Recording:
    """Every upstream name that has another accepted spelling in the catalog takes it.

    A family is not renamed onto a name the recording already uses (an engine exporting both
    spellings during a deprecation keeps them as they are)."""
    catalog = load_catalog()
    mapping: dict[str, str] = {}
    for engine in catalog.dialects:
        mapping.update(alternative_names(catalog, engine))
    present = set(rec.types)
    families = {f: t for f, t in mapping.items() if f in present and t not in present}
    return _rename_families(rec, families)


def ray_spelling(rec: Recording, meta: dict[str, Any]) -> Recording:
    """`vllm:x` -> `vllm_x`, `sglang:x` -> `sglang_x`: the spelling of Ray-backed loggers and some
    SGLang builds (the dialects' prefixes from the catalog)."""
    prefixes = [p for d in load_catalog().dialects.values() for p in d.prefixes if p.endswith(":")]
    families = {f: f.replace(":", "_", 1) for f in rec.types if any(f.startswith(p) for p in prefixes)}
    return _rename_families(rec, families)


def _rename_families(rec: Recording, families: dict[str, str]) -> Recording:
    """Rename families (and their _total/_bucket/_sum/_count/_info samples) and their types."""
    if not families:
        return rec
    expo = Exposition(types=rec.types)
    cache: dict[str, str] = {}

    def new_name(name: str) -> str:
        hit = cache.get(name)
        if hit is None:
            fam = om_family(name, expo)
            base = fam[0] if fam else name
            hit = families[base] + name[len(base) :] if base in families and name.startswith(base) else name
            cache[name] = hit
        return hit

    scrapes = [
        replace(sc, samples=[RawSample(new_name(s.name), s.labels, s.value, s.timestamp) for s in sc.samples])
        for sc in rec.scrapes
    ]
    types = {families.get(f, f): t for f, t in rec.types.items()}
    helps = {families.get(f, f): h for f, h in rec.helps.items()}
    return Recording(scrapes, types, helps)


def extra_labels(rec: Recording, meta: dict[str, Any]) -> Recording:
    """Add Kubernetes target labels (pod, namespace, container) to every sample that lacks them."""

    def relabel(s: RawSample) -> RawSample:
        have = {k for k, _ in s.labels}
        add = tuple((k, v) for k, v in EXTRA_LABELS.items() if k not in have)
        return RawSample(s.name, tuple(sorted(s.labels + add)), s.value, s.timestamp)

    return replace(rec, scrapes=[replace(sc, samples=[relabel(s) for s in sc.samples]) for sc in rec.scrapes])


def shift_time(rec: Recording, meta: dict[str, Any]) -> Recording:
    """Every timestamp moved by SHIFT_S (a recorder whose clock is off by days)."""
    scrapes = [
        replace(
            sc,
            timestamp=sc.timestamp + SHIFT_S,
            samples=[s._replace(timestamp=None if s.timestamp is None else s.timestamp + SHIFT_S) for s in sc.samples],
        )
        for sc in rec.scrapes
    ]
    return replace(rec, scrapes=scrapes)


def stagger_targets(rec: Recording, meta: dict[str, Any]) -> Recording:
    """Each target's scrapes offset by a different fraction of the scrape interval (targets
    scraped at different phases, as a real Prometheus spreads them)."""
    step = scrape_interval(rec)
    offsets = {t: (i * 0.37 % 1.0) * step for i, t in enumerate(rec.targets())}
    scrapes = []
    for sc in rec.scrapes:
        d = offsets[(sc.job, sc.instance)]
        scrapes.append(
            replace(
                sc,
                timestamp=sc.timestamp + d,
                samples=[s._replace(timestamp=None if s.timestamp is None else s.timestamp + d) for s in sc.samples],
            )
        )
    return replace(rec, scrapes=scrapes)


def cut(head: float = 0.0, tail: float = 0.0) -> Callable[[Recording, dict[str, Any]], Recording]:
    """Drop the first `head` and the last `tail` fraction of the recording's duration."""

    def apply(rec: Recording, meta: dict[str, Any]) -> Recording:
        t0, t1 = rec.start, rec.end
        lo, hi = t0 + head * (t1 - t0), t1 - tail * (t1 - t0)
        return replace(rec, scrapes=[sc for sc in rec.scrapes if lo <= sc.timestamp <= hi])

    return apply


def gap(rec: Recording, meta: dict[str, Any]) -> Recording:
    """One target down (scrapes fail: `up 0`) in the middle of the expected phase, for GAP_S or
    less: at most 15 % of the recording and half the phase (an outage that hides the
    whole incident would change the diagnosis rightly). The target: the last engine target."""
    target = _chosen_target(rec)
    lo, hi = _phase_span(rec, meta)
    length = min(GAP_S, 0.15 * (rec.end - rec.start), 0.5 * (hi - lo))
    mid = (lo + hi) / 2
    a, b = mid - length / 2, mid + length / 2
    scrapes = [
        replace(sc, up=False, samples=[], duration_s=None)
        if (sc.job, sc.instance) == target and a <= sc.timestamp < b
        else sc
        for sc in rec.scrapes
    ]
    return replace(rec, scrapes=scrapes)


def counter_reset(rec: Recording, meta: dict[str, Any]) -> Recording:
    """One replica restarts its counters mid-recording (every counter and histogram restarts
    from 0 and keeps counting at the same rate, until the recording's own next restart of that
    series); its gauges are unchanged."""
    target = _chosen_target(rec)
    mine = sorted((sc for sc in rec.scrapes if (sc.job, sc.instance) == target), key=lambda s: s.timestamp)
    lo, hi = _phase_span(rec, meta)
    at = next((sc.timestamp for sc in mine if sc.timestamp >= (lo + hi) / 2 and sc.up), None)
    if at is None:
        return rec
    expo = Exposition(types=rec.types)
    before = [sc for sc in mine if sc.timestamp < at and sc.up]
    if not before:
        return rec
    # the restart happened right after the previous scrape: from `at` on, each counter shows
    # what it counted since then. A series that falls below its previous recorded value has
    # restarted on its own (a replica the recording itself restarts): from there on it already
    # counts from 0 and is kept as recorded. Subtracting the earlier base from it (clamped at 0)
    # would make a counter that stays at 0 while the replica's gauges show it busy: a replica
    # counting nothing, which no restart produces (it is what a hung engine looks like).
    base = {(s.name, s.labels): s.value for s in before[-1].samples if _is_counter(s.name, expo)}
    last = dict(base)

    def shifted(s: Any) -> Any:
        key = (s.name, s.labels)
        if key not in base:
            return s
        if s.value < last[key]:  # the recording's own restart of this series
            del base[key]
            return s
        last[key] = s.value
        return s._replace(value=s.value - base[key])

    def restarted(sc: Scrape) -> Scrape:
        if (sc.job, sc.instance) != target or sc.timestamp < at:
            return sc
        return replace(sc, samples=[shifted(s) for s in sc.samples])

    ordered = sorted(rec.scrapes, key=lambda sc: sc.timestamp)
    new = {id(sc): restarted(sc) for sc in ordered}
    return replace(rec, scrapes=[new[id(sc)] for sc in rec.scrapes])


def metrics_only(rec: Recording, meta: dict[str, Any]) -> Recording:
    """Only what the engines (and exporters such as dcgm-exporter) serve on their own /metrics:
    every target that serves kvscope's own series (the request tap's `/kvscope/metrics`, an
    agent's `/metrics` with KV-event series) is dropped. The variant is written without the
    spans sidecar (no OTLP), so the recording is what a fleet without kvscope's sidecars has."""
    drop = set(kvscope_targets(rec))
    return replace(rec, scrapes=[sc for sc in rec.scrapes if (sc.job, sc.instance) not in drop])


def kvscope_targets(rec: Recording) -> list[tuple[str, str]]:
    """Targets that serve kvscope's own series (`kvscope_<signal>`: request tap, agent)."""
    found = {(sc.job, sc.instance) for sc in rec.scrapes if any(x.name.startswith("kvscope_") for x in sc.samples)}
    return sorted(found)


def _is_counter(name: str, expo: Exposition) -> bool:
    fam = om_family(name, expo)
    if fam is None:
        return False
    kind = fam[1]
    if kind == "counter":
        return True
    return kind in ("histogram", "summary") and name.endswith(("_bucket", "_count", "_sum"))


def _chosen_target(rec: Recording) -> tuple[str, str]:
    """The target a one-target change applies to: the last one serving engine series."""
    engine = [
        t
        for t in rec.targets()
        if any(
            s.samples and any(x.name.startswith(("vllm", "sglang")) for x in s.samples[:50])
            for s in rec.scrapes
            if (s.job, s.instance) == t
        )
    ]
    return (engine or rec.targets())[-1]


def engine_targets(rec: Recording) -> list[tuple[str, str]]:
    """Targets that serve vLLM or SGLang series."""
    out = []
    for t in rec.targets():
        if any(
            x.name.startswith(("vllm", "sglang"))
            for s in rec.scrapes
            if (s.job, s.instance) == t
            for x in s.samples[:50]
        ):
            out.append(t)
    return out


def _phase_span(rec: Recording, meta: dict[str, Any]) -> tuple[float, float]:
    """Absolute [start, end] of the first expected phase (the whole recording when none)."""
    phases = {p["name"]: p for p in meta.get("phases") or []}
    expected = meta.get("expected")
    if isinstance(expected, list) and expected and expected[0].get("phase") in phases:
        p = phases[expected[0]["phase"]]
        return rec.start + float(p["start_s"]), min(rec.end, rec.start + float(p["end_s"]))
    return rec.start, rec.end


def scrape_interval(rec: Recording) -> float:
    """Median gap between one target's scrapes."""
    by: dict[tuple[str, str], list[float]] = {}
    for sc in rec.scrapes:
        by.setdefault((sc.job, sc.instance), []).append(sc.timestamp)
    gaps = sorted(b - a for ts in by.values() for a, b in zip(sorted(ts), sorted(ts)[1:], strict=False))
    return gaps[len(gaps) // 2] if gaps else 15.0


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("resample_5s", "scraped every 5 s", resample(5.0)),
        Variant("resample_10s", "scraped every 10 s", resample(10.0)),
        Variant("resample_15s", "scraped every 15 s", resample(15.0)),
        Variant("resample_30s", "scraped every 30 s", resample(30.0)),
        Variant("resample_60s", "scraped every 60 s", resample(60.0)),
        Variant(
            "rename", "the other accepted upstream spelling of each metric (catalog aliases)", rename_to_alternative
        ),
        Variant("ray_names", "vllm_/sglang_ spelling (Ray, some SGLang builds)", ray_spelling),
        Variant("extra_labels", "pod/namespace/container labels on every sample", extra_labels),
        Variant("shift", f"every timestamp +{SHIFT_S:.1f} s", shift_time, shift_spans_s=SHIFT_S),
        Variant("stagger", "targets scraped at different phases of the interval", stagger_targets),
        Variant("cut_head_20", "starts 20 % later (mid-incident)", cut(head=0.2)),
        Variant("cut_tail_10", "ends 10 % earlier", cut(tail=0.1)),
        Variant("gap", "one target down for 2 min (15 % of a short recording) mid-incident", gap),
        Variant("counter_reset", "one replica's counters restart mid-recording", counter_reset),
        Variant(
            "metrics_only",
            "engine /metrics only: no request tap or agent targets, no spans (no OTLP)",
            metrics_only,
            keeps_spans=False,
        ),
    )
}


def applicable(variant: str, meta: dict[str, Any], rec: Recording) -> str | None:
    """None when the variant makes sense for this recording, else why not.

    A resample must be slower than the recording's own interval and leave at least 8 scrapes per
    target and 4 in the expected phase (a shorter incident is below the interval's resolution);
    a cut must leave the expected phase at least half inside; a counter reset needs a second
    engine replica (a restart of the only replica is an incident of its own).
    """
    native = scrape_interval(rec)
    duration = rec.end - rec.start
    if variant.startswith("resample_"):
        interval = float(variant.removeprefix("resample_").removesuffix("s"))
        if interval <= native * 1.01:
            return f"not slower than the recording's own {native:g} s"
        if duration / interval < 8:
            return f"{duration:.0f} s recording would keep {duration / interval:.0f} scrapes"
        lo, hi = _phase_span(rec, meta)
        if hi > lo and (hi - lo) / interval < 4:
            return f"the {hi - lo:.0f} s expected phase would keep {(hi - lo) / interval:.0f} scrapes"
    if variant.startswith("cut_"):
        lo, hi = _phase_span(rec, meta)
        keep_lo = rec.start + (0.2 * duration if variant == "cut_head_20" else 0.0)
        keep_hi = rec.end - (0.1 * duration if variant == "cut_tail_10" else 0.0)
        inside = max(0.0, min(hi, keep_hi) - max(lo, keep_lo))
        if hi > lo and inside < 0.5 * (hi - lo):
            return "the expected phase would be mostly cut away"
    if variant == "counter_reset" and len(engine_targets(rec)) < 2:
        return "one engine replica only"
    if variant == "metrics_only" and not meta.get("spans") and not kvscope_targets(rec):
        return "already engine metrics only"
    return None


# ---------------------------------------------------------------------------- judging
def check_diagnosis(meta: dict[str, Any], diagnosis: Any, rules: list[Any]) -> str | None:
    """None when the diagnosis matches the scenario, else what went wrong.

    Healthy scenarios (`expected: no warning`) must exit 0. Otherwise the likely cause must be
    one of the expected LEVERS.md rows, or, when none of them fired, every rule of those rows
    must have been reported unevaluable for absent signals and nothing may warn instead.
    """
    expected = meta.get("expected") or []
    found = [(f.levers_md, f.rule_id, f.severity) for f in diagnosis.findings]
    if not expected or expected == "no warning":
        return None if diagnosis.exit_status() == 0 else f"healthy recording warns: {found}"
    rows = {row for item in expected for row in item["levers"]}
    if diagnosis.likely_cause is None or not any(f.levers_md in rows for f in diagnosis.findings):
        row_rules = [r.id for r in rules if r.doc.get("levers_md") in rows]
        reasons = {s.rule_id: s.reason for s in diagnosis.skipped}
        if any("signal(s) absent" in reasons.get(rid, "") for rid in row_rules) and diagnosis.exit_status() == 0:
            return None
        return f"expected {sorted(rows)} not found; findings {found}"
    if diagnosis.likely_cause.levers_md not in rows:
        return (
            f"likely cause {diagnosis.likely_cause.levers_md} {diagnosis.likely_cause.rule_id}, "
            f"expected one of {sorted(rows)}; findings {found}"
        )
    return None
