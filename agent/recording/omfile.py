"""Recordings: what was scraped, as OpenMetrics text with a timestamp on every sample.

`promtool tsdb create-blocks-from openmetrics` reads the format too. Samples keep their native
names plus the target labels (`job`, `instance`, configured ones such as a Kubernetes `pod`), and
every scrape adds `up` and `scrape_duration_seconds` as Prometheus does (a failed scrape: `up 0`
only). A scraped label a target label also names is kept as `exported_<name>`; reading a scrape
back undoes that (`Scrape.labels` holds the target's). The writer spools each family to its own
file so that families stay contiguous; `.gz` paths are compressed."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar

from kvscope.agent.recording.timespan import drop_time_outliers
from kvscope.agent.scrape.exposition import (
    Exposition,
    Limits,
    RawSample,
    format_name,
    format_series,
    format_value,
    parse_exposition,
)
from kvscope.core.signals import Labels

_OM_TYPES = {"counter", "gauge", "histogram", "summary", "info", "stateset", "gaugehistogram", "unknown"}


@dataclass(frozen=True)
class RecordingLimits:
    """What one read of a recording holds at most, checked as it is read (before the series are
    normalized or gridded): decompressed text, distinct series (name and labels) and targets (job,
    instance). The defaults sit far above a real recording (the largest under tests/recordings:
    69 MB of text, 2,062 series, 10 targets; an engine exports about 500 series, so 100,000 is a
    200-engine fleet, which `kvscope diagnose` could not grid at 60 points anyway) and far below
    what exhausts memory (a recording of one gauge from 1,000,000 instances, 6.5 MB gzipped, took
    3.7 GB before failing). Each has a flag of `kvscope diagnose` (`flag`), named in the error."""

    max_bytes: int = 1 << 30
    max_series: int = 100_000
    max_targets: int = 1_000

    FLAGS: ClassVar[dict[str, str]] = {
        "max_bytes": "--max-recording-mib",
        "max_series": "--max-series",
        "max_targets": "--max-targets",
    }


class RecordingTooLarge(ValueError):
    """A recording past one of its RecordingLimits; the message names the cap and the flag."""


@dataclass
class Scrape:
    """One scrape of one target as read back from a recording."""

    job: str
    instance: str
    timestamp: float
    up: bool
    samples: list[RawSample] = field(default_factory=list)
    duration_s: float | None = None
    labels: dict[str, str] = field(default_factory=dict)  # target labels besides job/instance


def _open_text(path: str | os.PathLike[str], mode: str) -> IO[str]:
    if str(path).endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


def om_family(sample_name: str, expo: Exposition) -> tuple[str, str] | None:
    """(family name, OpenMetrics type) for a sample, or None for `_created` noise."""
    if sample_name.endswith("_created"):
        return None
    declared = expo.types.get(sample_name)
    if declared == "counter" and sample_name.endswith("_total"):
        return sample_name[:-6], "counter"
    if declared is not None:
        if declared == "counter":  # a counter without _total is not valid OpenMetrics
            return sample_name, "unknown"
        return sample_name, declared if declared in _OM_TYPES else "unknown"
    for suffix in ("_bucket", "_count", "_sum", "_total"):
        base = sample_name[: -len(suffix)] if sample_name.endswith(suffix) else None
        if base and expo.types.get(base) in ("histogram", "summary", "gaugehistogram", "counter"):
            return base, expo.types[base]
    return sample_name, "unknown"


class RecordingWriter:
    """Accumulates scrapes and writes one OpenMetrics file on `close()`."""

    def __init__(self, path: str | os.PathLike[str], spool_dir: str | None = None) -> None:
        self.path = Path(path)
        self._spool = Path(tempfile.mkdtemp(prefix="kvscope-rec-", dir=spool_dir))
        self._files: dict[str, IO[str]] = {}
        self._meta: dict[str, tuple[str, str]] = {}  # family -> (type, help)
        self.scrapes = 0
        self.samples = 0

    def add_scrape(
        self,
        job: str,
        instance: str,
        timestamp: float,
        expo: Exposition | None,
        duration_s: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Append one scrape. `expo=None` records a failed scrape (`up 0`). `labels` are the
        target's other labels (a `job`/`instance` among them is ignored): on every sample."""
        extra = {k: v for k, v in (labels or {}).items() if k not in ("job", "instance")}
        target = tuple(sorted({"instance": instance, "job": job, **extra}.items()))
        ts = format_value(round(timestamp, 3))
        self._write_sample(("up", "gauge"), "1 if the scrape succeeded.", "up", target, 1.0 if expo else 0.0, ts)
        if duration_s is not None:
            dur = "scrape_duration_seconds"
            self._write_sample((dur, "gauge"), "Scrape duration.", dur, target, duration_s, ts)
        self.scrapes += 1
        if expo is None:
            return
        for raw in expo.samples:
            fam = om_family(raw.name, expo)
            if fam is None:
                continue
            own = tuple(sorted(export_conflicts(raw.labels, extra) + target))
            self._write_sample(fam, expo.helps.get(fam[0], ""), raw.name, own, raw.value, ts)

    def _write_sample(self, fam: tuple[str, str], help_: str, name: str, labels: Labels, value: float, ts: str) -> None:
        family, kind = fam
        f = self._files.get(family)
        if f is None:
            f = self._files[family] = open(self._spool / f"{len(self._files)}.om", "w", encoding="utf-8")
            self._meta[family] = (kind, help_)
        f.write(f"{format_series(name, labels)} {format_value(value)} {ts}\n")
        self.samples += 1

    def close(self) -> Path:
        """Write the OpenMetrics file and remove the spool. Returns the path written."""
        tmp = self.path.with_name(".partial-" + self.path.name)
        with _open_text(tmp, "w") as out:
            for family, f in self._files.items():
                f.close()
                kind, help_ = self._meta[family]
                out.write(f"# TYPE {format_name(family)} {kind}\n")
                if help_:
                    out.write(f"# HELP {format_name(family)} {_escape_help(help_)}\n")
                with open(f.name, encoding="utf-8") as src:
                    shutil.copyfileobj(src, out)
            out.write("# EOF\n")
        os.replace(tmp, self.path)
        shutil.rmtree(self._spool, ignore_errors=True)
        return self.path

    def abort(self) -> None:
        for f in self._files.values():
            f.close()
        shutil.rmtree(self._spool, ignore_errors=True)


def export_conflicts(labels: Labels, target: Mapping[str, str]) -> Labels:
    """A scraped sample's labels beside the target's: `job`/`instance` dropped, any other name
    the target also has renamed `exported_<name>` (again while that name is taken), as
    Prometheus does without `honor_labels`."""
    out = dict(labels)
    out.pop("job", None)
    out.pop("instance", None)
    for name in [k for k in out if k in target]:
        value = out.pop(name)
        new = "exported_" + name
        while new in out or new in target:
            new = "exported_" + new
        out[new] = value
    return tuple(out.items())


def restore_exported(labels: Labels, target: Mapping[str, str]) -> Labels:
    """The inverse of `export_conflicts` for one recorded sample (job/instance already split
    off): the target's labels removed, `exported_<name>` of a target label named back."""
    out = {k: v for k, v in labels if target.get(k) != v}
    for name in sorted((k for k in out if k.startswith("exported_")), key=len):
        base = name.removeprefix("exported_")
        if base in target and base not in out:
            out[base] = out.pop(name)
    return tuple(sorted(out.items()))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def read_recording_text(path: str | os.PathLike[str], max_chars: int = 0) -> str:
    """The recording's text (decompressed); RecordingTooLarge past `max_chars` (0: no cap), found
    after reading one character more, never the whole."""
    with _open_text(path, "r") as f:
        text = f.read(max_chars + 1) if max_chars else f.read()
    if max_chars and len(text) > max_chars:
        raise RecordingTooLarge(
            f"recording {path} holds more than {max_chars / (1 << 20):,.0f} MiB of text (decompressed): read "
            f"a shorter part of it, or raise the cap with {RecordingLimits.FLAGS['max_bytes']}"
        )
    return text


def read_recording(
    path: str | os.PathLike[str], limits: RecordingLimits | None = None
) -> tuple[list[Scrape], Exposition]:
    """All scrapes in a recording, ordered by (job, instance, timestamp), and the parsed exposition of
    the whole file; far-off timestamps are dropped and reported in it (timespan.py). With `limits`,
    RecordingTooLarge as soon as the text, its series or its targets pass one."""
    text = read_recording_text(path, limits.max_bytes if limits else 0)
    expo = parse_exposition(text, openmetrics=True, limits=Limits(series_limit=limits.max_series if limits else 0))
    if limits and any(i.reason == "series_limit_exceeded" for i in expo.issues):
        raise RecordingTooLarge(
            f"recording {path} holds more than {limits.max_series:,} series (distinct names and labels; "
            f"line {expo.issues[-1].line:,} is the first past the cap): split it by target, or raise the cap "
            f"with {RecordingLimits.FLAGS['max_series']}"
        )
    drop_time_outliers(expo, text, path)
    del text
    return group_scrapes(expo.samples, limits.max_targets if limits else 0, str(path)), expo


def group_scrapes(samples: Iterable[RawSample], max_targets: int = 0, path: str = "") -> list[Scrape]:
    """Group timestamped samples into scrapes by (job, instance, timestamp). A scrape's first `up`
    carries its target labels (`Scrape.labels`, taken off its other samples again) and a
    `scrape_duration_seconds` with just those labels is its duration. RecordingTooLarge (naming
    `path`) at the first target past `max_targets` (0: no cap)."""
    groups: dict[tuple[str, str, float], Scrape] = {}
    targets: set[tuple[str, str]] = set()
    split: dict[Labels, tuple[str, str, Labels]] = {}  # a series' labels -> job, instance, the rest: split once
    for raw in samples:
        hit = split.get(raw.labels)
        if hit is None:
            rest = dict(raw.labels)  # the parser refuses a repeated label name
            hit = split[raw.labels] = (rest.pop("job", ""), rest.pop("instance", ""), tuple(rest.items()))
        job, instance, labels = hit
        ts = raw.timestamp if raw.timestamp is not None else 0.0
        scrape = groups.get((job, instance, ts))
        if scrape is None:
            targets.add((job, instance))
            if len(targets) > max_targets > 0:
                raise RecordingTooLarge(
                    f"recording {path} holds more than {max_targets:,} targets (job, instance): split it by "
                    f"target, or raise the cap with {RecordingLimits.FLAGS['max_targets']}"
                )
            scrape = groups[(job, instance, ts)] = Scrape(job=job, instance=instance, timestamp=ts, up=True)
        scrape.samples.append(RawSample(raw.name, labels, raw.value, raw.timestamp))
    for scrape in groups.values():
        _split_scrape_series(scrape)
    return [groups[k] for k in sorted(groups)]


def _split_scrape_series(scrape: Scrape) -> None:
    """Take the scrape's own `up` and `scrape_duration_seconds` (and its target labels) out of
    the samples grouped into it."""
    up = next((i for i, r in enumerate(scrape.samples) if r.name == "up"), None)
    if up is None:
        return
    own = scrape.samples.pop(up)
    scrape.up = own.value == 1.0
    scrape.labels = dict(own.labels)
    dur = next(
        (i for i, r in enumerate(scrape.samples) if r.name == "scrape_duration_seconds" and r.labels == own.labels),
        None,
    )
    if dur is not None:
        scrape.duration_s = scrape.samples.pop(dur).value
    if scrape.labels:
        scrape.samples = [
            RawSample(r.name, restore_exported(r.labels, scrape.labels), r.value, r.timestamp) for r in scrape.samples
        ]


def scrapes_by_target(scrapes: Iterable[Scrape]) -> Iterator[tuple[tuple[str, str], list[Scrape]]]:
    """Yield ((job, instance), scrapes in time order) per target."""
    by: dict[tuple[str, str], list[Scrape]] = defaultdict(list)
    for s in scrapes:
        by[(s.job, s.instance)].append(s)
    for key in sorted(by):
        yield key, sorted(by[key], key=lambda s: s.timestamp)
