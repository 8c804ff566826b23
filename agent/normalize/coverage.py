"""Which canonical signals each engine version gives kvscope, from name lists of the engines' own
releases (tests/fixtures/engine_names/*.yaml) and the catalog. For one signal and release:

* `maps`: an alias of the engine's dialect names a metric the release exports, with a kind and
  labels it can read (`maps (off)` when the exporter ships it disabled);
* `unmapped`: the release exports a metric for the signal that no alias reads: a name the meanings
  list (meanings.yaml, judged by hand) ties to the signal and the catalog lacks, or an alias whose
  name is there but whose kind or `match` labels do not fit;
* `renamed`: an alias name an earlier listed release exported is gone, and nothing else gives it;
* `absent`: the release exports nothing for it (kvscope reports it absent, never zero).

Which signals to check is the caller's input (`kvscope rules coverage` passes those the diagnosis
rules, dashboards and generated Prometheus rules read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kvscope.core.signals import Alias, Catalog, Signal

MAPS, MAPS_OFF, UNMAPPED, RENAMED, ABSENT = "maps", "maps (off)", "unmapped", "renamed", "absent"
PROBLEMS = (UNMAPPED, RENAMED)
GPU_DIALECTS = ("dcgm",)  # GPU exporters: their domain is the gpu_* signals, an engine's the rest
FRONTS = ("router", "gateway", "tier")  # roles whose series describe themselves, not the engines behind


@dataclass(frozen=True)
class UpstreamName:
    """One metric of one engine release: declared name, kind, label names (None: not known)."""

    name: str
    kind: str
    labels: tuple[str, ...] | None
    enabled: bool = True


@dataclass
class NameList:
    """One engine release's metric names (one tests/fixtures/engine_names/*.yaml file)."""

    engine: str
    dialect: str | None
    version: str
    source: dict[str, str]
    names: dict[str, UpstreamName] = field(default_factory=dict)  # declared name -> entry
    path: str = ""
    role: str = "engine"  # engine | gpu | router | gateway | tier (what its series describe)

    @property
    def key(self) -> str:
        return f"{self.engine} {self.version}"


@dataclass(frozen=True)
class Cell:
    """The status of one signal for one engine release, and why."""

    status: str
    detail: str = ""


def load_name_list(path: Path) -> NameList:
    """Read one name-list file; raises ValueError naming the file when it is malformed."""
    doc = yaml.safe_load(path.read_text()) or {}
    try:
        dialect = doc.get("dialect")
        out = NameList(str(doc["engine"]), dialect, str(doc["version"]), dict(doc.get("source") or {}), path=str(path))
        out.role = str(doc.get("role") or ("gpu" if dialect in GPU_DIALECTS else "engine"))
        for entry in doc.get("names") or []:
            kind, labels = str(entry["type"]), entry.get("labels")
            name = str(entry["name"])
            name = name.removesuffix("_total") if kind == "counter" else name  # the catalog's spelling
            out.names[name] = UpstreamName(
                name, kind, None if labels is None else tuple(labels), bool(entry.get("enabled", True))
            )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a name list ({exc})") from None
    return out


def load_name_lists(directory: Path) -> list[NameList]:
    """Every name list of a directory (meanings.yaml and allow.yaml are not name lists)."""
    return [
        load_name_list(p) for p in sorted(directory.glob("*.yaml")) if p.name not in ("meanings.yaml", "allow.yaml")
    ]


def load_meanings(path: Path) -> dict[str, dict[str, str]]:
    """engine -> {upstream name (declared) -> canonical signal}."""
    doc = yaml.safe_load(path.read_text()) or {}
    return {str(engine): {str(k): str(v) for k, v in (names or {}).items()} for engine, names in doc.items()}


def version_key(version: str) -> tuple:
    """Sort key: numeric parts compared as numbers (0.5.23 after 0.5.8)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.\-+]", version))


class Coverage:
    """Statuses of signals over name lists, for one catalog and one meanings list."""

    def __init__(self, catalog: Catalog, lists: list[NameList], meanings: dict[str, dict[str, str]]) -> None:
        self.catalog = catalog
        self.lists = sorted(lists, key=lambda nl: (nl.engine, version_key(nl.version)))
        self.meanings = meanings
        self._routers = {nl.dialect for nl in lists if nl.role in FRONTS}

    def cell(self, signal: str, nl: NameList) -> Cell:
        """The status of `signal` for one release."""
        sig = self.catalog.signals[signal]
        aliases = [a for a in sig.aliases if nl.dialect is not None and a.engine == nl.dialect]
        whys = [(alias, _unreadable(alias, sig, nl)) for alias in aliases]
        readable = [alias for alias, why in whys if why is None]
        problems = [why for _, why in whys if why]
        meant = sorted(n for n, s in self.meanings.get(nl.engine, {}).items() if s == signal and n in nl.names)
        if readable:
            off = all(not nl.names[a.name].enabled for a in readable)
            return Cell(MAPS_OFF if off else MAPS, ", ".join(sorted({a.name for a in readable})))
        missing = [n for n in meant if n not in {a.name for a in aliases}]
        if problems or missing:
            detail = "; ".join(problems + [f"{n} has no alias" for n in missing])
            if nl.dialect is not None and nl.dialect not in self.catalog.dialects:
                detail = f"no {nl.dialect} dialect in the catalog: {detail}"
            return Cell(UNMAPPED, detail)
        if gone := self._gone(aliases, nl):
            return Cell(RENAMED, f"{', '.join(gone)} no longer exported")
        return Cell(ABSENT)

    def _gone(self, aliases: list[Alias], nl: NameList) -> list[str]:
        """Alias names an earlier release of the same engine exported and this one does not."""
        earlier = [o for o in self.lists if o.engine == nl.engine and version_key(o.version) < version_key(nl.version)]
        return sorted({a.name for a in aliases if a.name not in nl.names and any(a.name in o.names for o in earlier)})

    def relevant(self, signal: str, nl: NameList) -> bool:
        """The signal is in the release's domain: a GPU exporter's signals for dcgm-exporter, the
        engine signals for an engine (not those only routers, gateways or tiers export)."""
        dialects = {a.engine for a in self.catalog.signals[signal].aliases}
        gpu = bool(dialects & set(GPU_DIALECTS))
        return gpu == (nl.dialect in GPU_DIALECTS) and (gpu or not dialects <= self._routers)

    def table(self, signals: list[str]) -> dict[str, dict[str, Cell]]:
        """signal -> release key -> cell."""
        return {s: {nl.key: self.cell(s, nl) for nl in self.lists} for s in signals}


def _unreadable(alias: Alias, sig: Signal, nl: NameList) -> str | None:
    """None when the alias reads this release's metric; "" when the release lacks the name;
    else why the name is there but cannot be read."""
    up = nl.names.get(alias.name)
    if up is None:
        return ""
    want = "histogram" if alias.part else sig.kind
    if up.kind not in (want, "unknown") and not (want == "gauge" and up.kind == "info"):
        return f"{alias.name} is a {up.kind}, the alias reads a {want}"
    if up.labels is not None:
        for label, allowed in alias.match.items():
            if label not in up.labels and "" not in allowed:
                return f"{alias.name} has no {label} label (the alias matches {label}={'|'.join(allowed)})"
        missing = [label for label in alias.info_label if label not in up.labels]
        if missing:
            return f"{alias.name} has no {', '.join(missing)} label"
    return None


# ------------------------------------------------------------------ allow-list
@dataclass(frozen=True)
class Allowed:
    """An unmapped or renamed status accepted on purpose, with the reason."""

    engine: str
    signal: str  # "*" for every signal
    status: str
    reason: str
    versions: tuple[str, ...] = ()  # empty: every version

    def covers(self, engine: str, version: str, signal: str, status: str) -> bool:
        return (
            self.engine == engine
            and self.status == status
            and self.signal in ("*", signal)
            and (not self.versions or version in self.versions)
        )


def load_allowed(path: Path) -> list[Allowed]:
    doc = yaml.safe_load(path.read_text()) or []
    if unexplained := [entry for entry in doc if not entry.get("reason")]:
        raise ValueError(f"{path}: every allowed entry needs a reason: {unexplained[0]}")
    return [
        Allowed(
            str(e["engine"]),
            str(e.get("signal", "*")),
            str(e["status"]),
            str(e["reason"]).strip(),
            tuple(map(str, e.get("versions") or ())),
        )
        for e in doc
    ]


def problems(cov: Coverage, signals: list[str], allowed: list[Allowed]) -> tuple[list[str], list[Allowed]]:
    """Unmapped and renamed cells no allow-list entry covers, and allow-list entries that cover
    nothing any more (stale)."""
    used: set[Allowed] = set()
    bad = []
    for signal, row in cov.table(signals).items():
        for nl in cov.lists:
            cell = row[nl.key]
            if cell.status not in PROBLEMS:
                continue
            hit = [a for a in allowed if a.covers(nl.engine, nl.version, signal, cell.status)]
            used.update(hit)
            if not hit:
                bad.append(f"{nl.key}: {signal} {cell.status}: {cell.detail}")
    return bad, [a for a in allowed if a not in used]


# ------------------------------------------------------------------ rendering
_SHORT = {MAPS: "maps", MAPS_OFF: "off", UNMAPPED: "UNMAPPED", RENAMED: "RENAMED", ABSENT: "-"}


def render_markdown(cov: Coverage, signals: list[str], allowed: list[Allowed], header: str = "") -> str:
    """The per-engine, per-version table (signals x releases) and, per release, what it lacks."""
    table = cov.table(signals)
    keys = [nl.key for nl in cov.lists]
    out = [header] if header else []
    out += ["| signal | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for signal in signals:
        out.append(f"| `{signal}` | " + " | ".join(_SHORT[table[signal][k].status] for k in keys) + " |")
    out += [
        "",
        "`maps`: a catalog alias reads it; `off`: it maps, but the exporter ships it disabled; "
        "`-`: the release exports nothing for it (absent); `UNMAPPED` / `RENAMED`: see below.",
        "",
    ]
    out += ["## What each release lacks that kvscope reads", ""]
    for nl in cov.lists:
        src = f"{nl.source.get('repo', '')} {nl.source.get('ref', '')}; `{Path(nl.path).name}`"
        if nl.role in FRONTS:
            out.append(
                f"* **{nl.key}** ({src}): a {nl.role}; its series describe the {nl.role}, and kvscope "
                "reads the engines behind it under their own names (nothing of theirs is lacking here)."
            )
            continue
        domain = [s for s in signals if cov.relevant(s, nl)]
        absent = [s for s in domain if table[s][nl.key].status == ABSENT]
        mapped = sum(table[s][nl.key].status in (MAPS, MAPS_OFF) for s in domain)
        kind = "GPU" if nl.role == "gpu" else "engine"
        lacking = ", ".join(f"`{s}`" for s in absent) or "none"
        out.append(f"* **{nl.key}** ({src}): {mapped} of the {len(domain)} {kind} signals map. Absent: {lacking}.")
    issues = [(nl, s, table[s][nl.key]) for nl in cov.lists for s in signals if table[s][nl.key].status in PROBLEMS]
    if issues:
        out += ["", "## Unmapped and renamed, and why that is accepted", ""]
        for nl, s, cell in issues:
            why = next((a.reason for a in allowed if a.covers(nl.engine, nl.version, s, cell.status)), "NOT ALLOWED")
            out.append(f"* {nl.key}, `{s}` {cell.status}: {cell.detail}. {why}")
    return "\n".join(out) + "\n\n" + OTHER_CONVENTIONS + "\n"


OTHER_CONVENTIONS = """\
## The same quantities under other conventions

kvscope pushes the OpenTelemetry GenAI server histograms (docs/otel.md). The Gateway API Inference
Extension (and llm-d's EPP, which took it over) names the gateway-side view of the same
quantities differently, and its model-server protocol reads only load gauges from the engine:

| canonical signal | OTel GenAI (pushed by kvscope) | GIE / llm-d EPP (gateway side) | engine metric the EPP scrapes |
|---|---|---|---|
| `request_e2e_seconds` | `gen_ai.server.request.duration` | `inference_objective_request_duration_seconds` → `llm_d_epp_request_duration_seconds` | – |
| `request_ttft_seconds` | `gen_ai.server.time_to_first_token` | `inference_objective_request_ttft_seconds` → `llm_d_epp_request_ttft_seconds` | – |
| `request_tpot_seconds` | `gen_ai.server.time_per_output_token` | `inference_objective_request_tpot_seconds` → `llm_d_epp_request_streaming_tpot_seconds` (`…_ntpot_seconds` is e2e ÷ output tokens, a different quantity) | – |
| `engine_requests_waiting` | – | `inference_pool_average_queue_size` → `llm_d_epp_average_queue_size` | `vllm:num_requests_waiting`, `sglang:num_queue_reqs` |
| `engine_requests_running` | – | `inference_pool_average_running_requests` → `llm_d_epp_average_running_requests` | `vllm:num_requests_running`, `sglang:num_running_reqs` |
| `engine_kv_cache_usage_ratio` | – | `inference_pool_average_kv_cache_utilization` → `llm_d_epp_average_kv_cache_utilization` | `vllm:kv_cache_usage_perc`, `sglang:token_usage` |

The gateway's histograms include the network and the gateway's own queueing; the engine's (and so
kvscope's `gen_ai.server.*`) start when the engine receives the request."""  # noqa: E501
"""The canonical latency and load signals under the OpenTelemetry GenAI conventions (agent/otel/) and
the Gateway API Inference Extension / llm-d EPP names, closing docs/engine-coverage.md."""
