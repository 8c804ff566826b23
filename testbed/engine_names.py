"""Regenerate tests/fixtures/engine_names/<engine>-<version>.yaml from an engine's own source.

Maintenance tool, not run by the tests. The name lists are data facts (metric name, type,
labels, the file that declares it) read from an engine release; the engine's code is not kept.

* `python SRC`: an unpacked Python package (e.g. a wheel's `vllm/` or `sglang/`). Every
  prometheus_client constructor call (Gauge, Counter, Histogram, Summary, Info, and vLLM's
  `_gauge_cls`/`_counter_cls`/`_histogram_cls`) whose name resolves to a string constant with the
  engine's prefix is listed with its kind and, when they are literal, its label names. With
  `--registry JSON` (what testbed/engine_names_introspect.py printed after constructing the
  engine's own metric classes) the kind and labels of every metric those classes registered
  are taken from the registry instead: exact, `labels.keys()` resolved.
* `dcgm CHECKOUT REF`: dcgm-exporter's shipped counter CSVs at a git ref (etc/default-counters.csv,
  etc/dcp-metrics-included.csv), read with `git show`.

examples:
  python -m testbed.engine_names python /tmp/vllm-0.11.0/vllm --engine vllm --version 0.11.0 \\
      --repo vllm-project/vllm --ref v0.11.0 --via "PyPI wheel vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl" \\
      --exclude vllm/engine/ > tests/fixtures/engine_names/vllm-0.11.0.yaml
  python -m testbed.engine_names dcgm /path/to/dcgm-exporter 4.5.3-4.8.2 \\
      > tests/fixtures/engine_names/dcgm-exporter-4.5.3-4.8.2.yaml
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

_KINDS = (
    ("GaugeHistogram", "histogram"),
    ("Histogram", "histogram"),
    ("Counter", "counter"),
    ("Gauge", "gauge"),
    ("Summary", "summary"),
    ("Info", "info"),
)
_VLLM_FACTORIES = {"_histogram_cls": "histogram", "_counter_cls": "counter", "_gauge_cls": "gauge"}


def _kind(func: ast.AST) -> str | None:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name in _VLLM_FACTORIES:
        return _VLLM_FACTORIES[name]
    for key, kind in _KINDS:
        if name == key or name.endswith(key) and not name.startswith("_"):
            return kind
    return None


def _bindings(tree: ast.AST) -> tuple[dict[str, str], dict[str, list[str]]]:
    """String constants and literal string lists bound to a name or attribute in the module."""
    strings: dict[str, str] = {}
    lists: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for t in targets:
            key = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
            if key is None:
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                strings[key] = value.value
            elif (
                isinstance(value, (ast.List, ast.Tuple))
                and value.elts
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts)
            ):
                lists[key] = [e.value for e in value.elts]  # type: ignore[attr-defined]
    return strings, lists


def _resolve(expr: ast.AST | None, strings: dict[str, str]) -> str | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.Name):
        return strings.get(expr.id)
    if isinstance(expr, ast.Attribute):
        return strings.get(expr.attr)
    return None


def _labels(expr: ast.AST | None, lists: dict[str, list[str]]) -> list[str] | None:
    """Literal label names, or None when any part is not literal."""
    if expr is None:
        return []
    if isinstance(expr, (ast.List, ast.Tuple)):
        out: list[str] = []
        for e in expr.elts:
            if isinstance(e, ast.Constant) and isinstance(e.value, str):
                out.append(e.value)
            else:
                return None
        return out
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = _labels(expr.left, lists), _labels(expr.right, lists)
        return None if left is None or right is None else left + right
    key = expr.id if isinstance(expr, ast.Name) else expr.attr if isinstance(expr, ast.Attribute) else None
    return list(lists[key]) if key in lists else None


def scan_python(root: Path, prefix: str, exclude: list[str]) -> dict[str, dict]:
    """name -> {name, type, labels, path} for every metric constructor in the package."""
    pattern = re.compile("^" + re.escape(prefix) + "[A-Za-z0-9_]+$")
    found: dict[str, dict] = {}
    trees: list[tuple[str, ast.AST]] = []
    shared: dict[str, str] = {}  # NAME = "prefix:x" bindings of every module (constants imported elsewhere)
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        if any(rel.startswith(x) for x in exclude) or "/test" in rel or "/benchmarks/" in rel:
            continue
        text = path.read_text(errors="replace")
        if prefix not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        trees.append((rel, tree))
        shared.update({k: v for k, v in _bindings(tree)[0].items() if pattern.match(v)})
    for rel, tree in trees:
        strings, lists = _bindings(tree)
        strings = {**shared, **strings}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not (kind := _kind(node.func)):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            name = _resolve(kw.get("name") or (node.args[0] if node.args else None), strings)
            if not name or not pattern.match(name):
                continue
            labels = _labels(kw.get("labelnames"), lists)
            found.setdefault(name, {"name": name, "type": kind, "labels": labels, "path": rel})
        for node in ast.walk(tree):  # {NAME: CounterMetadata(...)} or d[NAME] = CounterMetadata(...)
            pairs = []
            if isinstance(node, ast.Dict):
                pairs = list(zip(node.keys, node.values, strict=True))
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                pairs = [(node.targets[0].slice, node.value)]
            if pairs:
                for key, value in pairs:
                    name = _resolve(key, strings) if key is not None else None
                    if name and pattern.match(name) and isinstance(value, ast.Call):
                        func = ast.unparse(value.func)
                        kind = next((k for key_, k in _KINDS if key_ in func), None)
                        if kind:
                            found.setdefault(name, {"name": name, "type": kind, "labels": None, "path": rel})
    for rel, tree in trees:  # any other exact-name string: listed, kind from the registry or unknown
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value):
                found.setdefault(node.value, {"name": node.value, "type": "unknown", "labels": None, "path": rel})
    return found


def merge_registry(found: dict[str, dict], registry: list[dict]) -> None:
    """Kind and labels from the engine's own registry (prometheus_client strips `_total`)."""
    by_name = {m["name"]: m for m in registry}
    for name, entry in found.items():
        reg = by_name.get(name) or by_name.get(name.removesuffix("_total"))
        if reg is not None:
            entry["type"], entry["labels"] = reg["type"], list(reg["labels"])
            entry["registered"] = True
    unknown = sorted(n for n, e in found.items() if e["type"] == "unknown")
    if unknown:
        print("kind unknown (not a constructor argument, not registered): " + ", ".join(unknown), file=sys.stderr)


def render(meta: dict, names: list[dict]) -> str:
    """The fixture YAML: a header, then one flow mapping per name (stable, diff-friendly)."""
    out = [
        f"# Metric names {meta['engine']} {meta['version']} exports, read from the engine's own source or output.",
        "# Generated by testbed/engine_names.py; see README.md in this directory for the method.",
        f"engine: {meta['engine']}",
        f"dialect: {meta['dialect']}",
        f'version: "{meta["version"]}"',
    ]
    if meta.get("role"):
        out.append(f"role: {meta['role']}")
    out.append("source:")
    for key in ("repo", "ref", "via", "method"):
        if meta.get(key):
            out.append(f"  {key}: {json.dumps(meta[key])}")
    out.append("names:")
    for n in sorted(names, key=lambda e: e["name"]):
        labels = "null" if n.get("labels") is None else "[" + ", ".join(n["labels"]) + "]"
        extra = "" if n.get("registered", True) else ", labels_from: source"
        if "enabled" in n:
            extra += f", enabled: {str(n['enabled']).lower()}"
        out.append(
            f"  - {{name: {json.dumps(n['name'])}, type: {n['type']}, labels: {labels}, path: {n['path']}{extra}}}"
        )
    return "\n".join(out) + "\n"


def dcgm_names(checkout: Path, ref: str) -> list[dict]:
    """dcgm-exporter's shipped CSVs at `ref`: field, Prometheus type, help; `#` lines are off."""
    out: dict[str, dict] = {}
    for rel in ("etc/default-counters.csv", "etc/dcp-metrics-included.csv"):
        try:
            text = subprocess.run(
                ["git", "-C", str(checkout), "show", f"{ref}:{rel}"], check=True, capture_output=True, text=True
            ).stdout
        except subprocess.CalledProcessError:
            continue
        for row in csv.reader(io.StringIO(text)):
            if not row or not row[0].strip():
                continue
            field = row[0].strip()
            enabled = not field.startswith("#")
            field = field.lstrip("# ").strip()
            if not field.startswith(("DCGM_FI_", "DCGM_EXP_")) or len(row) < 2:
                continue
            kind = row[1].strip()
            prev = out.get(field)
            if prev is not None and prev["enabled"] and not enabled:
                continue  # the enabled row wins over a commented-out alternative
            out[field] = {"name": field, "type": kind, "labels": None, "path": rel, "enabled": enabled}
    return list(out.values())


_GO_NEW = re.compile(
    r"prometheus\.New(Counter|Gauge|Histogram|Summary)(Vec)?\(\s*&?prometheus\.\w+Opts\{(.*?)\n\s*\}"
    r"(?:,\s*\n?\s*(.*?)\s*,?\s*\n?\s*\))?",
    re.S,
)
_GO_FIELD = re.compile(r"(Namespace|Subsystem|Name):\s*([\w.]+|\"[^\"]*\")")


def go_names(text: str, rel: str) -> list[dict]:
    """client_golang constructors: `prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: s,
    Name: "n"}, labels)` with string constants and `[]string{...}` label variables resolved."""
    consts = dict(re.findall(r"^\s*(\w+)\s*=\s*\"([^\"]*)\"", text, re.M))
    lists = re.findall(r"^\s*(\w+)\s*=\s*\[\]string\{([^}]*)\}", text, re.M)
    label_vars = {k: re.findall(r"\"([^\"]*)\"", v) for k, v in lists}

    def value(tok: str) -> str:
        return tok.strip('"') if tok.startswith('"') else consts.get(tok.split(".")[-1], "?" + tok)

    def labels(expr: str | None) -> list[str] | None:
        if expr is None:
            return []
        expr = expr.strip()
        if expr.startswith("[]string{"):
            return re.findall(r"\"([^\"]*)\"", expr)
        m = re.match(r"append\((\w+),\s*(.*)\)$", expr, re.S)
        if m and m.group(1) in label_vars:
            return label_vars[m.group(1)] + re.findall(r"\"([^\"]*)\"", m.group(2))
        return label_vars.get(expr)

    out = []
    for kind, vec, body, lab in _GO_NEW.findall(text):
        fields = {k: value(v) for k, v in _GO_FIELD.findall(body)}
        name = "_".join(x for x in (fields.get("Namespace"), fields.get("Subsystem"), fields.get("Name")) if x)
        out.append({"name": name, "type": kind.lower(), "labels": labels(lab) if vec else [], "path": rel})
    return out


def body_names(bodies: list[str], path: str) -> list[dict]:
    """Families of real exposition bodies: declared name (counters without `_total`, as in
    prometheus_client), TYPE, and the union of label names their samples carry."""
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for text in bodies:
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, fam, kind = line.split(" ", 3)
                types[fam] = kind.strip()
                labels.setdefault(fam, set())
            elif line and not line.startswith("#"):
                name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0)
                fam = next(
                    (
                        f
                        for f in (
                            name,
                            *(name[: -len(s)] for s in ("_bucket", "_sum", "_count", "_total") if name.endswith(s)),
                        )
                        if f in types
                    ),
                    None,
                )
                if fam is None:
                    continue
                labels[fam].update(k for k in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=\"", line) if k != "le")
    return [{"name": f, "type": types[f], "labels": sorted(labels[f]), "path": path} for f in sorted(types)]


DCGM_METHOD = (
    "etc/default-counters.csv and etc/dcp-metrics-included.csv at the tag (enabled: false = commented "
    "out, off by default). Labels are the exporter's per-GPU set (gpu, UUID, pci_bus_id, device, "
    "modelName, Hostname/hostname; pod, namespace, container with Kubernetes; GPU_I_ID, GPU_I_PROFILE "
    "under MIG), not listed per name"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    py = sub.add_parser("python", help="an unpacked Python package")
    py.add_argument("src", type=Path)
    py.add_argument("--prefix", default=None, help="name prefix (default: '<engine>:')")
    py.add_argument("--repo-path-prefix", default="", help="the package's folder in the repository (sglang: python/)")
    py.add_argument("--exclude", action="append", default=[], help="package-relative path prefix to skip")
    py.add_argument("--registry", type=Path, default=None)
    go = sub.add_parser("go", help="client_golang metric constructors in files of a git checkout at a ref")
    go.add_argument("checkout", type=Path)
    go.add_argument("files", nargs="+")
    bd = sub.add_parser("body", help="real /metrics bodies: every family with its TYPE and its samples' labels")
    bd.add_argument("bodies", nargs="+", type=Path)
    bd.add_argument("--path", default="", help="what to cite as the path of every name")
    dc = sub.add_parser("dcgm", help="dcgm-exporter's counter CSVs at a git ref")
    dc.add_argument("checkout", type=Path)
    for cmd in (py, go, bd, dc):
        cmd.add_argument("--engine", default="dcgm-exporter" if cmd is dc else None, required=cmd is not dc)
        cmd.add_argument("--dialect", default=None)
        cmd.add_argument("--version", default=None, required=cmd is not dc)
        cmd.add_argument("--repo", default="NVIDIA/dcgm-exporter" if cmd is dc else None, required=cmd is not dc)
        cmd.add_argument("--ref", required=True)
        cmd.add_argument("--via", default="")
        cmd.add_argument(
            "--role", default=None, help="router | gateway | tier (what its series describe); default engine"
        )
    return p


def _python(args: argparse.Namespace) -> tuple[list[dict], str]:
    found = scan_python(args.src, args.prefix or f"{args.engine}:", args.exclude)
    method = "AST scan of the package's metric constructors"
    if args.registry is not None:
        merge_registry(found, json.loads(args.registry.read_text())["metrics"])
        method += "; kind and labels from the registry after constructing the engine's own metric classes"
    for entry in found.values():
        entry["path"] = args.repo_path_prefix + entry["path"]
        entry.setdefault("registered", args.registry is None)
    return list(found.values()), method


def _go(args: argparse.Namespace) -> tuple[list[dict], str]:
    names = []
    for rel in args.files:
        text = subprocess.run(
            ["git", "-C", str(args.checkout), "show", f"{args.ref}:{rel}"], check=True, capture_output=True, text=True
        ).stdout
        names += go_names(text, rel)
    return names, "client_golang constructors (Namespace_Subsystem_Name, label variables resolved)"


def _body(args: argparse.Namespace) -> tuple[list[dict], str]:
    names = body_names([b.read_text() for b in args.bodies], args.path)
    return names, "families of real /metrics bodies (TYPE lines; labels the samples carry)"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "dcgm":
        names = dcgm_names(args.checkout, args.ref)
        args.dialect, args.version, method = args.dialect or "dcgm", args.version or args.ref, DCGM_METHOD
    else:
        names, method = {"python": _python, "go": _go, "body": _body}[args.cmd](args)
    meta = {
        "engine": args.engine,
        "dialect": args.dialect or ("null" if args.cmd in ("go", "body") else args.engine),
        "version": args.version,
        "role": args.role,
        "repo": args.repo,
        "ref": args.ref,
        "via": args.via,
        "method": method,
    }
    sys.stdout.write(render(meta, [{"registered": True, **n} for n in names]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
