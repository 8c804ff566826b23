"""`kvscope deploy`: turn the repository into what a cluster runs.

`render-config` fills the agent's config template with the node's identity (the DaemonSet's init
container, NODE_IP / NODE_NAME) and validates it; `prometheusrule` wraps rules/prometheus/*.yml
into Prometheus Operator PrometheusRule objects, so both installs run the same rule text.

examples:
  kvscope deploy prometheusrule --label release=kube-prometheus-stack -o prometheusrule.yaml
  kvscope deploy render-config --help
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kvscope import rules as rules_pkg
from kvscope.commands._common import add_command, fail

# kvscope.rules is the repository's rules/ directory (package-dir), installed or editable.
RULES_DIR = Path(rules_pkg.__file__).resolve().parent / "prometheus"
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")
MAX_TEMPLATE_BYTES = 1 << 20
API_VERSION = "monitoring.coreos.com/v1"


class DeployError(ValueError):
    """Input that cannot be deployed; the message names the file and the problem."""


def parse_template(text: str, environ: Mapping[str, str]) -> str:
    """Replace every `${NAME}` in `text` by `environ[NAME]`. Pure.

    Raises DeployError naming every placeholder that has no value (an empty value counts as
    missing: a target URL with an empty host is never what was meant). Other `$` text is kept.
    """
    missing = sorted({m.group(1) for m in _PLACEHOLDER.finditer(text) if not environ.get(m.group(1))})
    if missing:
        raise DeployError(
            f"no value for {', '.join('${' + n + '}' for n in missing)} (set {'/'.join(missing)} in the environment)"
        )
    return _PLACEHOLDER.sub(lambda m: environ[m.group(1)], text)


def check_agent_config(text: str, origin: str) -> list[str]:
    """Raise DeployError unless `text` is a configuration the agent accepts; return its warnings.

    Parsing and validation are the agent's own (`parse_config_yaml`, `build_config`), with every
    collector and extension loaded (`known_collectors`), so their config sections (the OTLP
    receiver's `otlp:`) are known.
    """
    from kvscope.agent.config import ConfigError, build_config, parse_config_yaml
    from kvscope.agent.runtime import known_collectors

    try:
        doc = parse_config_yaml(text.encode(), "after rendering")  # as the agent will read it
        return list(build_config(doc, environ={}, known_collectors=known_collectors()).warnings)
    except ConfigError as e:
        raise DeployError(f"{origin}: {e}") from e


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: never a half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _render_config(args: argparse.Namespace) -> int:
    template = Path(args.template)
    if template.stat().st_size > MAX_TEMPLATE_BYTES:
        raise DeployError(f"{template}: larger than {MAX_TEMPLATE_BYTES} bytes")
    text = parse_template(template.read_text(encoding="utf-8"), os.environ)
    for warning in check_agent_config(text, str(template)):
        print(f"render-config: warning: {warning}", file=sys.stderr)
    write_atomically(Path(args.output), text)
    print(f"render-config: wrote {args.output}", file=sys.stderr)
    return 0


def parse_rule_file(text: str, origin: str) -> list[dict[str, Any]]:
    """Return the rule groups of one Prometheus rule file. Pure; raises DeployError."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise DeployError(f"{origin}: not valid YAML: {e}") from e
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) and g.get("name") for g in groups):
        raise DeployError(f"{origin}: expected a rule file, `groups:` with a `name` on each group")
    return groups


def read_prometheusrules(rules_dir: Path, labels: Mapping[str, str]) -> list[dict]:
    """One Prometheus Operator PrometheusRule per `*.yml` file of `rules_dir` (groups unchanged), in file-name order."""
    files = sorted(p for p in rules_dir.glob("*.yml") if p.is_file())
    if not files:
        raise DeployError(f"{rules_dir}: no *.yml rule files (run `kvscope rules build` first)")
    out = []
    for path in files:
        groups = parse_rule_file(path.read_text(encoding="utf-8"), str(path))
        stem = _DNS_LABEL.sub("-", path.stem.lower()).strip("-").removeprefix("kvscope-")
        meta = {"name": f"kvscope-{stem}", "labels": dict(labels)}
        out.append({"apiVersion": API_VERSION, "kind": "PrometheusRule", "metadata": meta, "spec": {"groups": groups}})
    return out


def render_manifest(objects: list[dict], source: str) -> str:
    """Multi-document YAML with a header saying where it came from and how to rebuild it."""
    header = (
        f"# Generated by `kvscope deploy prometheusrule` from {source}.\n"
        "# Do not edit: change the rules, then rebuild this file.\n"
    )
    body = "---\n".join(yaml.safe_dump(o, sort_keys=False, default_flow_style=False, width=120) for o in objects)
    return header + body


def _prometheusrule(args: argparse.Namespace) -> int:
    labels = dict(_parse_label(x) for x in args.label)
    rules_dir = Path(args.rules_dir)
    objects = read_prometheusrules(rules_dir, labels)
    source = "rules/prometheus" if rules_dir.resolve() == RULES_DIR else str(rules_dir)
    text = render_manifest(objects, source)
    if args.check:
        if args.output == "-":
            raise DeployError("--check needs --output FILE to compare with")
        current = Path(args.output).read_text(encoding="utf-8") if Path(args.output).exists() else ""
        if current != text:
            print(f"prometheusrule: {args.output} is stale; rebuild it without --check", file=sys.stderr)
            return 1
        return 0
    if args.output == "-":
        sys.stdout.write(text)
    else:
        write_atomically(Path(args.output), text)
        n = sum(len(o["spec"]["groups"]) for o in objects)
        print(f"prometheusrule: wrote {len(objects)} objects, {n} groups to {args.output}", file=sys.stderr)
    return 0


def _parse_label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise DeployError(f"--label {text!r}: expected KEY=VALUE")
    return key, value


def _run(func):
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (DeployError, OSError) as e:
            return fail("deploy", f"error: {e}", 1)

    return wrapped


RENDER_CONFIG_HELP = """\
Replace ${NAME} placeholders in TEMPLATE with environment variables, check the result is a
configuration the agent accepts, and write it atomically to OUTPUT. An unset or empty variable,
invalid YAML or an invalid key stops with an error naming it, and OUTPUT is left untouched.

example (what the DaemonSet's init container runs):
  NODE_IP=10.0.0.7 NODE_NAME=gpu-7 kvscope deploy render-config \\
      --template /etc/kvscope-template/kvscope.yaml.tmpl --output /etc/kvscope/kvscope.yaml
"""

PROMETHEUSRULE_HELP = """\
Read every Prometheus rule file in RULES_DIR and print one Prometheus Operator PrometheusRule per
file (named kvscope-<file stem>), groups unchanged.

examples:
  kvscope deploy prometheusrule --label release=kube-prometheus-stack -o deploy/kubernetes/prometheusrule.yaml
  kvscope deploy prometheusrule --label release=kube-prometheus-stack \\
      -o deploy/kubernetes/prometheusrule.yaml --check      # exit 1 when stale
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    help = "render deployment artefacts (agent config on a node, PrometheusRule)"
    parser = add_command(subparsers, "deploy", help, __doc__)
    sub = parser.add_subparsers(dest="deploy_command", metavar="ACTION", required=True)

    rc = add_command(
        sub, "render-config", "fill ${VAR} placeholders of an agent config template and validate it", RENDER_CONFIG_HELP
    )
    rc.add_argument("--template", required=True, help="agent configuration template (YAML with ${VAR})")
    rc.add_argument("--output", required=True, help="where to write the rendered configuration")
    rc.set_defaults(func=_run(_render_config))

    pr = add_command(
        sub, "prometheusrule", "wrap rules/prometheus/*.yml into PrometheusRule objects", PROMETHEUSRULE_HELP
    )
    pr.add_argument("--rules-dir", default=str(RULES_DIR), help="directory of generated rule files")
    pr.add_argument("--output", "-o", default="-", help="output file, '-' for stdout")
    label_help = "label for the objects' metadata, repeatable; match your Prometheus' ruleSelector"
    pr.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help=label_help)
    pr.add_argument("--check", action="store_true", help="write nothing; exit 1 when --output is stale")
    pr.set_defaults(func=_run(_prometheusrule))
