"""Turn a recording back into canonical samples, through the same dialects as live scrapes."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from kvscope.agent.engines.dialect import detect_engine, normalize
from kvscope.agent.exposition import Exposition
from kvscope.agent.recording import read_recording, scrapes_by_target
from kvscope.agent.signals import Catalog, Sample, load_catalog, make_labels


@dataclass
class Replay:
    """Canonical series of a whole recording, plus what each target was and knew."""

    samples: list[Sample] = field(default_factory=list)
    engines: dict[str, str | None] = field(default_factory=dict)        # instance -> engine
    facts: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # instance -> rank -> facts
    unmapped: Counter[str] = field(default_factory=Counter)            # instance -> count
    start: float | None = None
    end: float | None = None


def replay_recording(path: str | os.PathLike[str], catalog: Catalog | None = None) -> Replay:
    """Read a recording and normalize every scrape of every target.

    Each target's engine is detected once from all its samples. A failed scrape contributes
    only `kvscope_target_up 0` at its time.
    """
    catalog = catalog or load_catalog()
    scrapes, whole = read_recording(path)
    out = Replay()
    for (job, instance), target_scrapes in scrapes_by_target(scrapes):
        union = Exposition(samples=[s for sc in target_scrapes for s in sc.samples[:2000]],
                           types=whole.types)
        engine = detect_engine(union, catalog)
        out.engines[instance] = engine
        for sc in target_scrapes:
            out.samples.append(Sample("kvscope_target_up", make_labels(
                {"job": job, "instance": instance}), 1.0 if sc.up else 0.0, sc.timestamp))
            if not sc.samples:
                continue
            norm = normalize(Exposition(samples=sc.samples, types=whole.types), engine,
                             {"job": job, "instance": instance}, sc.timestamp, catalog)
            out.samples.extend(norm.samples)
            out.unmapped[instance] += norm.unmapped
            for rank, facts in norm.facts.items():
                out.facts.setdefault(instance, {}).setdefault(rank, {}).update(facts)
        ts = [sc.timestamp for sc in target_scrapes]
        out.start = min(ts) if out.start is None else min(out.start, min(ts))
        out.end = max(ts) if out.end is None else max(out.end, max(ts))
    return out
