"""Agent configuration: a YAML file (example in README.md) < `KVSCOPE_*` environment variables <
command-line flags. Every scalar key is declared once in `KEYS`; the merged layers are validated
once, and a bad value stops the agent with a message naming the key, what is allowed and where the
value came from (`scrape.timeout_s: must be ..., got "abc" (from KVSCOPE_SCRAPE_TIMEOUT_S)`).
Other top-level sections (`otlp`, ...) go to `AgentConfig.extensions` for the extension that
registered them (`register_section`); an unregistered one is a warning, never silently dropped.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import accumulate
from typing import Any
from urllib.parse import SplitResult, urlsplit

import yaml

from kvscope.core.objectives import ObjectiveSet, merge_flags, parse_objectives
from kvscope.core.scalars import parse_bool, parse_duration, split_host_port
from kvscope.core.signals import load_catalog

LIMIT_KEYS = ("sample_limit", "label_limit", "label_name_length_limit", "label_value_length_limit")
"""Prometheus' per-target limits (agent/scrape/exposition.py `Limits`), under `scrape:` or per target."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and what is allowed."""


_UNITS_B = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_gpu_mapping(raw: Any) -> dict[str, tuple[str, ...]]:
    """The `gpu_mapping` config value (agent/derive/gpu_join.py): GPU uuid or index -> instance(s).
    Raises ValueError naming the bad entry."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"gpu_mapping: expected a mapping of GPU uuid or index to instance, got {type(raw).__name__}")
    out: dict[str, tuple[str, ...]] = {}
    for key, value in raw.items():
        values = value if isinstance(value, list | tuple) else [value]
        if not values or not all(isinstance(v, str) and v for v in values):
            raise ValueError(f"gpu_mapping.{key}: expected an instance name or a list of them, got {value!r}")
        out[str(key)] = tuple(values)
    return out


def parse_bytes(value: Any) -> int:
    """A number of bytes, or a size string like `16MiB`, `1GB`, `4096`."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a size")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]i?b|b)?\s*", str(value), re.I)
    if m is None:
        raise ValueError("not a size")
    return int(float(m.group(1)) * _UNITS_B[(m.group(2) or "").lower()])


def parse_count(value: Any) -> int:
    """A non-negative integer (a limit: 0 = none)."""
    if isinstance(value, bool) or not str(value).strip().isdecimal() or not str(value).strip().isascii():
        raise ValueError("not a count")
    return int(str(value).strip())


parse_seconds = partial(parse_duration, loose=True)
"""A config duration: seconds, or `500ms`, `15s`, `10m`, `1h`, `1m30s`."""
_COUNT = "an integer >= 0 (0 = no limit)"


@dataclass(frozen=True)
class Key:
    """One scalar configuration key: its dotted YAML path, default, parser, and the bound its
    parsed value must meet (`ok`), said in words in `allowed` for the error message."""

    path: str
    default: Any
    parse: Callable[[Any], Any] = str
    ok: Callable[[float], bool] = lambda v: v > 0
    allowed: str = "a number > 0"

    @property
    def name(self) -> str:
        """The key's name in its section (the path's last part)."""
        return self.path.rpartition(".")[2]

    @property
    def env(self) -> str:
        """`KVSCOPE_<AREA>_<KEY>`, units in the name as the YAML key has them."""
        return "KVSCOPE_" + self.path.replace(".", "_").upper()


def count_key(path: str, default: int, low: int, high: int) -> Key:
    """A key whose value is an integer from `low` to `high`."""
    return Key(path, default, parse_count, lambda v: low <= v <= high, f"an integer from {low} to {high}")


def duration_key(path: str, default: float, low: str, high: str) -> Key:
    """A key whose value is a duration from `low` to `high`, both spelled as in a config (`100ms`)."""
    lo, hi = parse_seconds(low), parse_seconds(high)
    return Key(path, default, parse_seconds, lambda v: lo <= v <= hi, f"a duration from {low} to {high}")


def size_key(path: str, default: int, low: str, high: str) -> Key:
    """A key whose value is a size from `low` to `high`, both spelled as in a config (`1KiB`)."""
    lo, hi = parse_bytes(low), parse_bytes(high)
    return Key(path, default, parse_bytes, lambda v: lo <= v <= hi, f"a size from {low} to {high}")


def switch_key(path: str, default: bool) -> Key:
    """A key whose value is true or false (`yes`, `off`... as core/scalars.py parse_bool reads them)."""
    return Key(path, default, parse_bool, lambda v: True, "true or false")


# What each key means: README.md (configuration) and docs/collectors.md (scrape limits).
KEYS: tuple[Key, ...] = (
    Key("listen_address", "127.0.0.1:9464"),  # loopback by default; port 0 picks a free port
    # ranges: a value outside them is a typo or a unit slip (1ms, 1e308 s, 1e20GiB), refused at start
    Key("scrape.interval_s", 15.0, parse_seconds, lambda v: 0.1 <= v <= 86400, "a duration from 100ms to 1d"),
    Key("scrape.timeout_s", 5.0, parse_seconds),  # < interval; unset: min(5, 0.8 x interval)
    Key(
        "scrape.max_body_bytes", 16 << 20, parse_bytes, lambda v: 1024 <= v <= 1 << 30, "a size from 1024 bytes to 1GiB"
    ),
    *(
        Key(f"scrape.{n}", 50_000 if n == "sample_limit" else 0, parse_count, lambda v: v >= 0, _COUNT)
        for n in LIMIT_KEYS
    ),
    Key("store.path", "kvscope.db"),  # "" keeps history in memory only (SQLite, 128 MiB at most)
    Key(
        "store.retention_s", 7 * 86400.0, parse_seconds, lambda v: 60 <= v <= 3660 * 86400, "a duration from 1m to 10y"
    ),
    Key("store.max_bytes", 1 << 30, parse_bytes, lambda v: 1 << 20 <= v <= 1 << 50, "a size from 1MiB to 1PiB"),
    Key("store.max_series_per_target", 50_000, parse_count, lambda v: 1 <= v <= 200_000, "an integer from 1 to 200000"),
    # every listener of the agent (/metrics and API, OTLP receiver): agent/serve/limits.py
    Key("server.header_timeout_s", 10.0, parse_seconds, lambda v: 0.1 <= v <= 3600, "a duration from 100ms to 1h"),
    Key("server.request_timeout_s", 60.0, parse_seconds, lambda v: 0.1 <= v <= 3600, "a duration from 100ms to 1h"),
    Key("server.idle_timeout_s", 75.0, parse_seconds, lambda v: 0.1 <= v <= 86400, "a duration from 100ms to 1d"),
    Key("server.max_connections", 256, parse_count, lambda v: 1 <= v <= 1_000_000, "an integer from 1 to 1000000"),
)
KEY_BY_PATH = {k.path: k for k in KEYS}

SECTIONS = ("scrape", "store", "server", "targets", "collectors", "gpu_mapping", "objectives")
"""Declared top-level sections besides the scalar `listen_address` (README.md shows each)."""

_EXTENSIONS: dict[str, Callable[[Any], Any] | None] = {}
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def register_section(name: str, validate: Callable[[Any], Any] | None = None) -> None:
    """Declare a top-level section owned by an extension (e.g. `otlp`). `validate(raw)` may return
    a parsed value and must raise ConfigError naming the key."""
    _EXTENSIONS[name] = validate


@dataclass(frozen=True)
class ServerLimits:
    """Per-listener limits (config `server.*`), applied by agent/serve/limits.py."""

    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    max_connections: int = 256
    request_timeout_s: float = 60.0
    """A request's body must arrive whole within this of its head (however slowly it trickles)."""

    def __post_init__(self) -> None:
        timeouts = (self.header_timeout_s, self.idle_timeout_s, self.request_timeout_s)
        if not (all(t > 0 for t in timeouts) and self.max_connections >= 1):
            raise ValueError("header/idle/request timeouts must be > 0 and max_connections >= 1")


@dataclass(frozen=True)
class Target:
    """One HTTP endpoint to scrape."""

    url: str
    job: str
    instance: str
    engine: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    limits: tuple[tuple[str, int], ...] = ()  # every LIMIT_KEYS: scrape.*, overridden by the target's

    def target_labels(self) -> dict[str, str]:
        """Labels added to every sample of this target: job, instance and the configured ones."""
        return {"job": self.job, "instance": self.instance, **dict(self.labels)}


@dataclass(frozen=True)
class CollectorConfig:
    enabled: bool
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentConfig:
    """The validated agent configuration. Collector factories receive this object."""

    listen_address: str = "127.0.0.1:9464"
    interval_s: float = 15.0
    timeout_s: float = 5.0
    max_body_bytes: int = 16 << 20
    targets: list[Target] = field(default_factory=list)
    collectors: dict[str, CollectorConfig] = field(default_factory=dict)
    store_path: str = "kvscope.db"
    retention_s: float = 7 * 86400.0
    store_max_bytes: int = 1 << 30
    store_max_series_per_target: int = 50_000
    gpu_mapping: Any = None
    server_limits: ServerLimits = field(default_factory=ServerLimits)
    objectives: ObjectiveSet = field(default_factory=ObjectiveSet)
    """The latency objectives a request must meet to be good (core/objectives.py; docs/goodput.md)."""
    extensions: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def collector_enabled(self, name: str, default: bool) -> bool:
        c = self.collectors.get(name)
        return default if c is None else c.enabled

    def collector_options(self, name: str) -> dict[str, Any]:
        c = self.collectors.get(name)
        return dict(c.options) if c else {}


# ------------------------------------------------------------------------------------------- layers


@dataclass
class Layers:
    """The raw merged document plus where each overridden value came from."""

    doc: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)

    def set(self, path: str, value: Any, origin: str) -> None:
        """Override one key. Under `collectors`, a switch and options merge: `true`/`false`
        onto a mapping sets its `enabled`, an option onto a switch keeps the switch."""
        node = self.doc
        *parents, leaf = path.split(".")
        for depth, p in enumerate(parents):
            child = node.get(p)
            if not isinstance(child, dict):
                keep = {"enabled": child} if depth == 1 and parents[0] == "collectors" and child is not None else {}
                child = node[p] = keep
            node = child
        if parents == ["collectors"] and isinstance(node.get(leaf), dict) and not isinstance(value, dict):
            node[leaf]["enabled"] = value
        else:
            node[leaf] = value
        self.origin[path] = origin

    def get(self, path: str, default: Any = None) -> Any:
        node: Any = self.doc
        for p in path.split("."):
            if not isinstance(node, dict) or p not in node:
                return default
            node = node[p]
        return node

    def where(self, path: str) -> str:
        return f" (from {self.origin[path]})" if path in self.origin else ""


def read_config_file(path: str | os.PathLike[str], flag: str = "--config") -> dict[str, Any]:
    """Load the YAML file `flag` names (bounded, safe_load). Raises ConfigError for unreadable or
    non-mapping files."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot read: {e.strerror or e}") from e
    return parse_config_yaml(raw, f"{flag} {path}")


def parse_config_yaml(raw: bytes, where: str) -> dict[str, Any]:
    """The config document in `raw` (bounded: size, nesting, aliases followed); ConfigError
    naming `where`, the key and its line otherwise."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_CONFIG_BYTES} bytes; not an agent config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text: {e}") from e
    if max(accumulate(map(_FLOW.__getitem__, re.sub(r"[^\[\]{}]", "", text))), default=0) > MAX_CONFIG_DEPTH:
        # before the parser: PyYAML's scanner is quadratic in flow nesting ([[[[...)
        raise ConfigError(f"{where}: brackets nested deeper than {MAX_CONFIG_DEPTH} levels")
    try:
        _check_yaml_shape(yaml.compose(text, Loader=yaml.SafeLoader), where)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {e}") from e
    except ValueError as e:  # a scalar PyYAML cannot convert, e.g. an integer past 4300 digits
        raise ConfigError(f"{where}: a value cannot be read: {e}") from e
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be an agent config") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: the top level must be a mapping of sections, got {type(doc).__name__}")
    return doc


MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_NODES = 100_000
"""Values a config may expand to once its YAML aliases are followed (alias bombs stop here)."""
MAX_CONFIG_DEPTH = 50
_FLOW = {"[": 1, "{": 1, "]": -1, "}": -1}


def _check_yaml_shape(root: yaml.Node | None, where: str) -> None:
    """Refuse a recursive alias, an alias bomb or deep nesting before anything is built from the
    document: the message names the key path and its line."""
    budget = MAX_CONFIG_NODES
    todo: list[tuple[yaml.Node, str, tuple[int, ...]]] = [(root, "", ())] if root is not None else []
    while todo:
        node, key, above = todo.pop()
        at = f"{where}: line {node.start_mark.line + 1}: {_short(key) or 'top level'}"
        if id(node) in above:
            raise ConfigError(f"{at}: a YAML alias refers to a value that contains it (recursive alias)")
        budget -= 1
        if budget < 0:
            raise ConfigError(
                f"{at}: the document expands to more than {MAX_CONFIG_NODES} values "
                "once its aliases are followed (an alias bomb?)"
            )
        if len(above) > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{at}: nested deeper than {MAX_CONFIG_DEPTH} levels")
        inner = (*above, id(node))
        if isinstance(node, yaml.MappingNode):
            _no_duplicate_keys(node, key, where)
            todo += [(v, f"{key}.{k.value}" if key else str(k.value), inner) for k, v in node.value]
        elif isinstance(node, yaml.SequenceNode):
            todo += [(v, f"{key}[{i}]", inner) for i, v in enumerate(node.value)]


def _no_duplicate_keys(node: yaml.MappingNode, key: str, where: str) -> None:
    """ConfigError naming a key that a mapping repeats (PyYAML would keep the last one silently)."""
    first: dict[str, int] = {}
    for k, _ in node.value:
        if not isinstance(k, yaml.ScalarNode):
            continue
        if k.value in first:
            path = _short(f"{key}.{k.value}" if key else str(k.value))
            raise ConfigError(
                f"{where}: line {k.start_mark.line + 1}: {path}: duplicate key (first on line {first[k.value] + 1}); "
                "YAML would keep only the last one"
            )
        first[k.value] = k.start_mark.line


def _short(key: str) -> str:
    return key if len(key) <= 80 else key[:40] + "..." + key[-37:]


def env_overrides(environ: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    """(path, value, origin) for every `KVSCOPE_*` variable that names a key.

    Besides the scalar keys: `KVSCOPE_TARGETS` (comma-separated URLs, replacing the file's
    targets) and `KVSCOPE_COLLECTOR_<NAME>` (true | false).
    """
    out: list[tuple[str, Any, str]] = [(key.path, environ[key.env], key.env) for key in KEYS if key.env in environ]
    if "KVSCOPE_TARGETS" in environ:
        urls = [u.strip() for u in environ["KVSCOPE_TARGETS"].split(",") if u.strip()]
        out.append(("targets", [{"url": u} for u in urls], "KVSCOPE_TARGETS"))
    prefix = "KVSCOPE_COLLECTOR_"
    return out + [(f"collectors.{n[len(prefix) :].lower()}", v, n) for n, v in environ.items() if n.startswith(prefix)]


def build_config(
    file_doc: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    flags: list[tuple[str, Any, str]] | None = None,
    known_collectors: Mapping[str, bool] | None = None,
) -> AgentConfig:
    """Merge defaults < file < env < flags and validate. Raises ConfigError.

    `flags` are (path, value, flag spelling) triples produced by the command line.
    `known_collectors` maps registered collector names to their default (for validation).
    """
    layers = Layers(doc=copy.deepcopy(file_doc or {}))
    for path, value, origin in [*env_overrides(environ if environ is not None else os.environ), *(flags or [])]:
        layers.set(path, value, origin)
    return _validate(layers, known_collectors)


# --------------------------------------------------------------------------------------- validation


def _validate(layers: Layers, known_collectors: Mapping[str, bool] | None) -> AgentConfig:
    cfg = AgentConfig()
    _check_sections(layers, cfg)
    cfg.listen_address = _address(layers)
    cfg.interval_s = _number(layers, "scrape.interval_s")
    if layers.get("scrape.timeout_s") is None:  # like Prometheus: the default never exceeds the interval
        layers.set("scrape.timeout_s", min(5.0, 0.8 * cfg.interval_s), "default, 0.8 x interval")
    timeout = replace(
        KEY_BY_PATH["scrape.timeout_s"],
        ok=lambda v: 0 < v < cfg.interval_s,
        allowed="a number > 0 and < scrape.interval_s",
    )
    cfg.timeout_s = _number(layers, timeout)
    cfg.max_body_bytes = int(_number(layers, "scrape.max_body_bytes"))
    cfg.store_path = str(_value(layers, "store.path") or "")
    cfg.retention_s = _number(layers, "store.retention_s")
    cfg.store_max_bytes = int(_number(layers, "store.max_bytes"))
    cfg.store_max_series_per_target = int(_number(layers, "store.max_series_per_target"))
    cfg.server_limits = ServerLimits(
        header_timeout_s=_number(layers, "server.header_timeout_s"),
        idle_timeout_s=_number(layers, "server.idle_timeout_s"),
        max_connections=int(_number(layers, "server.max_connections")),
        request_timeout_s=_number(layers, "server.request_timeout_s"),
    )
    limits = {n: int(_number(layers, f"scrape.{n}")) for n in LIMIT_KEYS}
    cfg.targets = [replace(t, limits=tuple({**limits, **dict(t.limits)}.items())) for t in _targets(layers)]
    cfg.collectors = _collectors(layers, known_collectors)
    cfg.gpu_mapping = layers.get("gpu_mapping")
    try:
        parse_gpu_mapping(cfg.gpu_mapping)  # fail at start, not per cycle of the join
    except ValueError as e:
        raise ConfigError(f"{e}{layers.where('gpu_mapping')}") from None
    try:
        cfg.objectives = parse_objectives(layers.get("objectives"))
    except ValueError as e:
        raise ConfigError(f"{e}{layers.where('objectives')}") from None
    return cfg


def _check_sections(layers: Layers, cfg: AgentConfig) -> None:
    """Unknown top-level sections are kept for extensions, with a warning, but one spelled like a
    known section (`scrapes:`, `colectors:`) is a typo that would silently run on defaults."""
    known = sorted({"listen_address", *SECTIONS, *_EXTENSIONS})
    for name, value in layers.doc.items():
        if name == "listen_address" or name in SECTIONS:
            continue
        validate = _EXTENSIONS.get(name)
        cfg.extensions[name] = validate(value) if validate else value
        if name not in _EXTENSIONS:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.75)
            if close:
                raise ConfigError(f"{name}: unknown section; did you mean {close[0]}? (sections: {', '.join(known)})")
            cfg.warnings.append(
                f"{name}: unknown section, kept for extensions (declared: listen_address, {', '.join(SECTIONS)})"
            )
    for section in ("scrape", "store", "server"):
        body = layers.get(section, {})
        if not isinstance(body, dict):
            raise ConfigError(f"{section}: must be a mapping, got {_show(body)}")
        allowed = sorted(k.path.split(".", 1)[1] for k in KEYS if k.path.startswith(section + "."))
        for key in body:
            if key not in allowed:
                raise ConfigError(f"{section}.{key}: unknown key (allowed: {', '.join(allowed)})")


def _value(layers: Layers, path: str) -> Any:
    return layers.get(path, KEY_BY_PATH[path].default)


def _number(layers: Layers, key: str | Key) -> float:
    """The value of a numeric key, parsed and within its bound; ConfigError naming it otherwise."""
    key = KEY_BY_PATH[key] if isinstance(key, str) else key
    return float(key_value(key, layers.get(key.path, key.default), layers.where(key.path)))


def key_value(key: Key, raw: Any, where: str = "") -> Any:
    """`raw` as `key.parse` reads it, within `key.ok`; ConfigError naming the key, what is allowed
    and the value (and `where` it came from, e.g. ` (from KVSCOPE_X)`) otherwise."""
    try:
        value = key.parse(raw)
        number = float(value)
    except (ValueError, TypeError, OverflowError):  # OverflowError: float() of a huge integer
        value, number = None, math.nan
    if math.isnan(number) or math.isinf(number) or not key.ok(number):
        raise ConfigError(f"{key.path}: must be {key.allowed}, got {_show(raw)}{where}")
    return value


def section_values(section: Mapping[str, Any], keys: Iterable[Key]) -> dict[str, Any]:
    """An extension section's scalar keys that it sets, by name, each read and checked by
    `key_value`; a key the section leaves out is absent (the extension's default applies)."""
    return {key.name: key_value(key, section[key.name]) for key in keys if key.name in section}


def _show(raw: Any) -> str:
    return f'"{raw}"' if isinstance(raw, str) else repr(raw)


def _address(layers: Layers) -> str:
    key = KEY_BY_PATH["listen_address"]
    return address_value(key, layers.get(key.path, key.default), layers.where(key.path))


def address_value(key: Key, raw: Any, where: str = "") -> str:
    """A listen address as `split_host_port` reads it; ConfigError naming the key, an example (its
    default) and the value (and `where` it came from) otherwise."""
    try:
        split_host_port(str(raw))
    except ValueError:
        raise ConfigError(f"{key.path}: must be host:port (e.g. {key.default}), got {_show(raw)}{where}") from None
    return str(raw)


def _targets(layers: Layers) -> list[Target]:
    raw = layers.get("targets", [])
    where = layers.where("targets")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"targets: must be a list of {{url, job, engine, labels}}, got {_show(raw)}{where}")
    out = [_target(i, item, where) for i, item in enumerate(raw)]
    first: dict[str, int] = {}  # instance identifies one serving process: health, facts, recordings
    for i, t in enumerate(out):
        if (j := first.setdefault(t.instance, i)) != i:
            raise ConfigError(
                f"targets[{i}]: instance {t.instance!r} repeats targets[{j}]; set labels.instance on one of them{where}"
            )
    return out


_TARGET_KEYS = ("url", "job", "engine", "labels", *LIMIT_KEYS)


def _target(i: int, item: Any, where: str) -> Target:
    key = f"targets[{i}]"
    if isinstance(item, str):
        item = {"url": item}
    if not isinstance(item, dict):
        raise ConfigError(f"{key}: must be a mapping {{url, job, engine, labels}} or a URL, got {_show(item)}{where}")
    for k in item:
        if k not in _TARGET_KEYS:
            raise ConfigError(f"{key}.{k}: unknown key (allowed: {', '.join(_TARGET_KEYS)}){where}")
    url = item.get("url")
    parts = _target_url(key, url, where)
    job = item.get("job", "engine")
    if not isinstance(job, str) or not job:
        raise ConfigError(f"{key}.job: must be a non-empty string, got {_show(job)}{where}")
    engine = item.get("engine")
    dialects = sorted(load_catalog().dialects)
    if engine is not None and engine not in dialects:
        raise ConfigError(
            f"{key}.engine: must be one of {', '.join(dialects)} (or absent to detect), got {_show(engine)}{where}"
        )
    labels = _target_labels(key, item.get("labels") or {}, where)
    instance = dict(labels).pop("instance", None) or parts.netloc.rpartition("@")[2]
    labels = tuple((k, v) for k, v in labels if k != "instance")
    own = []
    for name in (n for n in LIMIT_KEYS if n in item):
        try:
            own.append((name, parse_count(item[name])))
        except ValueError:
            raise ConfigError(f"{key}.{name}: must be {_COUNT}, got {_show(item[name])}{where}") from None
    return Target(url=str(url), job=job, instance=instance, engine=engine, labels=labels, limits=tuple(own))


def _target_url(key: str, url: Any, where: str) -> SplitResult:
    """A target's URL, split: http(s) with a host and a valid port, else a ConfigError."""
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
    except ValueError:  # "Invalid IPv6 URL": an unbalanced [ in the host
        parts = None
    if isinstance(url, str) and (bad := next((c for c in url if not c.isprintable() or c.isspace()), None)):
        raise ConfigError(
            f"{key}.url: must not contain whitespace or control characters (found {bad!r}), got {url[:200]!r}{where}"
        )
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}.url: must be an http:// or https:// URL with a host, got {_show(url)}{where}")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as e:
        raise ConfigError(f"{key}.url: bad port in {_show(url)}{where}") from e
    return parts


def _target_labels(key: str, raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}.labels: must be a mapping of label name to string, got {_show(raw)}{where}")
    out = []
    for name, value in raw.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise ConfigError(f"{key}.labels: {_show(name)} is not a valid label name{where}")
        if name in ("job", "engine"):
            raise ConfigError(f"{key}.labels.{name}: set it with {key}.{name} instead{where}")
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"{key}.labels.{name}: must be a string, got {_show(value)}{where}")
        out.append((name, str(value)))
    return tuple(sorted(out))


def _collectors(layers: Layers, known: Mapping[str, bool] | None) -> dict[str, CollectorConfig]:
    raw = layers.get("collectors", {}) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"collectors: must be a mapping of collector name to true/false, got {_show(raw)}")
    out = {}
    for name, value in raw.items():
        path = f"collectors.{name}"
        if known is not None and name not in known:
            raise ConfigError(f"{path}: unknown collector (known: {', '.join(sorted(known))}){layers.where(path)}")
        out[name] = _collector(path, value, layers.where(path))
    return out


def _collector(path: str, value: Any, where: str) -> CollectorConfig:
    options = {k: v for k, v in value.items() if k != "enabled"} if isinstance(value, dict) else {}
    value = value.get("enabled", True) if isinstance(value, dict) else value
    try:
        return CollectorConfig(enabled=parse_bool(value), options=options)
    except ValueError:
        raise ConfigError(
            f"{path}: must be true or false (or a mapping with enabled), got {_show(value)}{where}"
        ) from None


def describe_keys() -> str:
    """Text table of every scalar key, its env variable and default (for --help)."""
    return "\n".join(f"  {k.path:<22} {k.env:<30} default {k.default!r}" for k in KEYS)


def read_objectives(path: str | None, flags: Mapping[str, Any]) -> ObjectiveSet:
    """The `objectives:` section of the YAML at `path` (None: no file) with `flags` ({kind or "target": text})
    set over it, through the one parser. ValueError naming the flag or key that is wrong."""
    doc: Any = read_config_file(path).get("objectives") if path else None
    try:
        return parse_objectives(merge_flags(doc, flags))
    except ValueError as exc:
        flag = next((k for k, v in flags.items() if v is not None and str(exc).startswith(f"objectives.{k}:")), None)
        if flag is None:
            raise
        raise ValueError(f"--slo-{flag}: {str(exc).split(': ', 1)[1]}") from None
