"""A read engine log (agent/logs) as a recording: written as kvscope's own series (`kvscope_<signal>`,
as the agent exports them, with `up` per log time) or replayed in memory, so that
`diagnose --log` and `diagnose --recording` on what `record --log` wrote read the same frame."""

from __future__ import annotations

import os
from pathlib import Path

from kvscope.agent.logs.series import HELP, LogRead
from kvscope.agent.recording.omfile import RecordingWriter
from kvscope.agent.recording.replay import KVSCOPE, Replay, render_engine_gpu_rounds
from kvscope.agent.scrape.exposition import Exposition, RawSample
from kvscope.core.signals import KVSCOPE_PREFIX, Sample, load_catalog, make_labels


def log_replay(read: LogRead) -> Replay:
    """What `replay_recording` gives for the recording `write_log_recording` writes of `read`."""
    out = Replay()
    for instance, ts, samples in read.scrapes:
        out.engines[instance] = KVSCOPE
        out.samples.append(Sample("kvscope_target_up", make_labels({"job": read.job, "instance": instance}), 1.0, ts))
        out.samples.extend(samples)
        out.start = ts if out.start is None else min(out.start, ts)
        out.end = ts if out.end is None else max(out.end, ts)
    out.samples.extend(render_engine_gpu_rounds(out))
    return out


def write_log_recording(read: LogRead, path: str | os.PathLike[str]) -> Path:
    """Write `read` as an OpenMetrics recording (one scrape per instance and log time)."""
    catalog = load_catalog()
    writer = RecordingWriter(path)
    try:
        for instance, ts, samples in read.scrapes:
            expo = Exposition()
            for s in samples:
                name, sig = KVSCOPE_PREFIX + s.name, catalog.signals[s.name]
                labels = tuple((k, v) for k, v in s.labels if k not in ("job", "instance"))
                expo.samples.append(RawSample(name, labels, s.value))
                expo.types[name] = sig.kind
                expo.helps[name.removesuffix("_total")] = HELP.get(s.name, sig.help)
            writer.add_scrape(read.job, instance, ts, expo)
    except BaseException:
        writer.abort()
        raise
    return writer.close()
