"""Command-line flags shared by `kvscope agent` and `kvscope record`, mapped onto config keys.

Flags follow node_exporter's spelling (`--web.listen-address`, `--collector.<name>`,
`--no-collector.<name>`) and override `KVSCOPE_*` environment variables, which override the
config file.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvscope.agent.collectors.base import collector_option_help
from kvscope.agent.config import AgentConfig, build_config, describe_keys, read_config_file
from kvscope.core.signals import load_catalog

ENV_HELP = f"""\
configuration precedence: flag > KVSCOPE_* environment variable > --config file > default.
keys (YAML path, environment variable, default):
{describe_keys()}
  targets                KVSCOPE_TARGETS (comma-separated URLs)
  collectors.<name>      KVSCOPE_COLLECTOR_<NAME> (true|false)
  collectors.<name>.<option>  --collector.<name>.<option> VALUE (repeat the flag for list options)
"""

# (flag, dest, config path, help)
_SCALAR_FLAGS = (
    ("--scrape.interval", "scrape_interval", "scrape.interval_s", "time between scrapes: seconds or 500ms, 15s, 1m"),
    ("--scrape.timeout", "scrape_timeout", "scrape.timeout_s", "time one target may take, body included (< interval)"),
    (
        "--scrape.max-body-bytes",
        "scrape_max_body",
        "scrape.max_body_bytes",
        "largest /metrics body read from one target (e.g. 16MiB); past it: body_too_large",
    ),
    *(
        (
            f"--scrape.{n.replace('_', '-')}",
            f"scrape_{n}",
            f"scrape.{n}",
            f"Prometheus' {n} per target (0 = none); past it the scrape fails: {n}_exceeded",
        )
        for n in ("sample_limit", "label_limit", "label_name_length_limit", "label_value_length_limit")
    ),
)


def add_scrape_flags(parser: argparse.ArgumentParser) -> None:
    """--config, --target, --job and the scrape.* flags."""
    parser.add_argument("--config", metavar="FILE", help="YAML config file (see README, 'Run the agent')")
    target_help = "engine or dcgm-exporter /metrics URL; repeat for several (replaces the config file's targets)"
    parser.add_argument("--target", action="append", metavar="URL", help=target_help)
    parser.add_argument("--job", default="engine", metavar="NAME", help="job label of the --target URLs")
    engines = sorted(load_catalog().dialects)
    parser.add_argument("--engine", choices=engines, help="force the dialect of the --target URLs (default: detect)")
    for flag, dest, _, help_ in _SCALAR_FLAGS:
        parser.add_argument(flag, dest=dest, metavar="VALUE", help=help_)


_OPTION_DEST = "collector_option__"


def add_agent_flags(parser: argparse.ArgumentParser, collectors: dict[str, bool]) -> None:
    """--web.listen-address, --store.* and --[no-]collector.<name> for every registered collector."""
    listen_help = "where the agent serves /metrics and /api/v1 (default 127.0.0.1:9464)"
    parser.add_argument("--web.listen-address", dest="listen_address", metavar="HOST:PORT", help=listen_help)
    store_help = "SQLite history file (default kvscope.db); '' keeps history in memory"
    parser.add_argument("--store.path", dest="store_path", metavar="FILE", help=store_help)
    retention_help = "keep samples this long (default 7d)"
    parser.add_argument("--store.retention", dest="store_retention", metavar="DURATION", help=retention_help)
    for name in sorted(collectors):
        default = "enabled" if collectors[name] else "disabled"
        parser.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            help=f"run the {name} collector ({default} by default)",
        )
    for name, options in sorted(collector_option_help().items()):
        for option, text in sorted(options.items()):
            many = text.startswith("list:")
            parser.add_argument(
                f"--collector.{name}.{option}",
                dest=f"{_OPTION_DEST}{name}__{option}",
                metavar="VALUE",
                action="append" if many else "store",
                help=text.removeprefix("list:").strip() + (" (repeatable)" if many else ""),
            )


def flags_of(args: argparse.Namespace) -> list[tuple[str, Any, str]]:
    """(config path, value, flag spelling) for every flag given on the command line."""
    out: list[tuple[str, Any, str]] = []
    for flag, dest, path, _ in _SCALAR_FLAGS:
        if getattr(args, dest, None) is not None:
            out.append((path, getattr(args, dest), flag))
    if getattr(args, "target", None):
        targets = [{"url": u, "job": args.job, **({"engine": args.engine} if args.engine else {})} for u in args.target]
        out.append(("targets", targets, "--target"))
    for attr, path, flag in (
        ("listen_address", "listen_address", "--web.listen-address"),
        ("store_path", "store.path", "--store.path"),
        ("store_retention", "store.retention_s", "--store.retention"),
    ):
        if getattr(args, attr, None) is not None:
            out.append((path, getattr(args, attr), flag))
    for key, value in vars(args).items():
        if key.startswith(_OPTION_DEST) and value is not None:
            name, option = key[len(_OPTION_DEST) :].split("__", 1)
            out.append((f"collectors.{name}.{option}", value, f"--collector.{name}.{option}"))
        elif key.startswith("collector_") and value is not None:
            name = key[len("collector_") :]
            out.append((f"collectors.{name}", value, f"--{'' if value else 'no-'}collector.{name}"))
    return out


def config_from_args(args: argparse.Namespace, collectors: dict[str, bool] | None) -> AgentConfig:
    """Read --config (if any), apply env and flags, validate. Raises ConfigError."""
    doc = read_config_file(args.config) if args.config else {}
    return build_config(doc, flags=flags_of(args), known_collectors=collectors)
