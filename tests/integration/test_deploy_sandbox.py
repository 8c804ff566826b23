"""The pods' securityContext, reproduced without a cluster: each container's command from the
manifests runs in a private mount namespace whose root filesystem is read-only, with a tmpfs
for each emptyDir, no capabilities at all and no_new_privs. It must start, serve and write only
where the manifests give it a volume.

What is not reproduced: the non-root uid. The test interpreter lives under /root (mode 0700
here), so the processes keep uid 0, but with every capability dropped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml

from testbed.httpstub import serving, static_body_handler
from testbed.procs import LoggedProcess, free_port, stop_process, wait_http
from testbed.prometheus import require_binaries

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
CAPTURE = ROOT / "tests" / "fixtures" / "scrapes" / "vllm-0.32.0-cpu-after-load.txt"
BIN = Path(sys.executable).parent
SANDBOX = """set -e
mount -o remount,ro,bind /
mount -t tmpfs -o size=64m,mode=0700 kvscope-emptydirs "$RW"
mkdir "$RW/config" "$RW/state" "$RW/tmp"
"""


@pytest.fixture(scope="module")
def sandbox_ok():
    require_binaries("unshare", "setpriv", "mount")  # util-linux
    probe = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -o remount,ro,bind / && ! touch /.kvscope-probe 2>/dev/null",
        ],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only: a loaded 2-core box can be slow to start processes
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only mount namespace here (needs root/CAP_SYS_ADMIN): {probe.stderr}")


def _without_ui_extras(tmp_path: Path) -> dict[str, str]:
    """Environment that makes the `[ui]` extra's modules unimportable, as in the `kvscope` image
    (Dockerfile target `agent`, which installs kvscope without `[ui]`)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ui"]
    modules = sorted(re.split(r"[=<>\[ ]", req)[0].replace("-", "_").lower() for req in extras)
    hook = tmp_path / "agent-image-site"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules))
    return {"PYTHONPATH": str(hook)}


def _image_env(container: dict, tmp_path: Path) -> dict[str, str]:
    return _without_ui_extras(tmp_path) if container["image"].split(":")[0] == "kvscope" else {}


def _sandboxed(rw: Path, shell: str, env: dict[str, str], log: Path) -> LoggedProcess:
    """Run `shell` (bash) in the sandbox; its last command should `exec` the long-running process."""
    prefix = "setpriv --no-new-privs --inh-caps=-all --bounding-set=-all --"
    script = SANDBOX + shell.replace("@DROP@", prefix)
    environ = {"PATH": f"{BIN}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "RW": str(rw), **env}
    return LoggedProcess(
        ["unshare", "-m", "--propagation", "private", "bash", "-c", script], log, name=log.stem, env=environ
    )


def _stop(proc: subprocess.Popen) -> None:
    stop_process(proc, timeout_s=15)


def _wait_http(url: str, proc: LoggedProcess, timeout_s: float = 180) -> bytes:
    """The body of the first 200 from `url`; fails with the log if the process exits first."""
    return wait_http(url, timeout_s, procs=(proc,), request_timeout_s=10, interval_s=0.5)


@pytest.fixture
def engine_port():
    with serving(static_body_handler(CAPTURE.read_bytes())) as server:
        yield server.server_address[1]


def _containers(manifest: str) -> dict[str, dict]:
    spec = yaml.safe_load((K8S / manifest).read_text())["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def _shell(argv: list[str], replace: dict[str, str]) -> str:
    out = []
    for arg in argv:
        for old, new in replace.items():
            arg = arg.replace(old, new)
        out.append("'" + arg.replace("'", "'\\''") + "'")
    return " ".join(out)


def _clean_log(log: Path) -> None:
    text = log.read_text()
    for needle in ("Read-only file system", "Permission denied", "Operation not permitted", "Traceback"):
        assert needle not in text, text[-3000:]


def test_agent_pod_runs_read_only_without_capabilities(sandbox_ok, tmp_path, engine_port):
    rw = tmp_path / "emptydirs"
    rw.mkdir()
    cm = yaml.safe_load((K8S / "agent-configmap.yaml").read_text())["data"]["kvscope.yaml.tmpl"]
    port, otlp = free_port(), free_port()
    # test ports instead of the node's well-known ones; everything else as shipped
    cm = (
        cm.replace("${NODE_IP}:8000", f"${{NODE_IP}}:{engine_port}")
        .replace("${NODE_IP}:30000", f"${{NODE_IP}}:{free_port()}")
        .replace("${NODE_IP}:9400", f"${{NODE_IP}}:{free_port()}")
        .replace("listen: 0.0.0.0:4318", f"listen: 127.0.0.1:{otlp}")
    )
    template = tmp_path / "configmap" / "kvscope.yaml.tmpl"
    template.parent.mkdir()
    template.write_text(cm)
    c = _containers("agent-daemonset.yaml")
    paths = {
        "/etc/kvscope-template": str(template.parent),
        "/etc/kvscope": f"{rw}/config",
        "0.0.0.0:9464": f"127.0.0.1:{port}",
    }
    init = _shell(c["render-config"]["command"], paths)
    agent = _shell(c["agent"]["command"] + c["agent"]["args"], paths)
    log = tmp_path / "agent.log"
    proc = _sandboxed(
        rw,
        f"@DROP@ {init}\nexec @DROP@ {agent}\n",
        {
            "NODE_IP": "127.0.0.1",
            "NODE_NAME": "gpu-node-test",
            # the image's HOME and the pod's /tmp are emptyDirs; the store path is the ConfigMap's
            # directory (/var/lib/kvscope) moved onto this sandbox's tmpfs
            "HOME": f"{rw}/state",
            "TMPDIR": f"{rw}/tmp",
            "KVSCOPE_STORE_PATH": f"{rw}/state/kvscope.db",
            **_image_env(c["agent"], tmp_path),
        },
        log,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/-/ready", proc)
        deadline = time.monotonic() + 120
        while True:
            metrics = _wait_http(f"http://127.0.0.1:{port}/metrics", proc).decode()
            up = {
                line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("kvscope_target_up{")
            }
            written = [
                float(x.rsplit(" ", 1)[1])
                for x in metrics.splitlines()
                if x.startswith("kvscope_store_samples_written_total")
            ]
            scrape_up = {k: v for k, v in up.items() if 'job="otlp"' not in k}
            if (sum(scrape_up.values()) == 1 and written and written[0] > 0) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert len(scrape_up) == 3 and sum(scrape_up.values()) == 1, up  # the stub up, the two absent ports down
        assert [k for k, v in scrape_up.items() if v == 1][0].count(f":{engine_port}") == 1
        # the ConfigMap's otlp section starts the receiver, and it accepts an OTLP/HTTP export
        assert up.get(f'kvscope_target_up{{instance="127.0.0.1:{otlp}",job="otlp"}}') == 1, up
        req = urllib.request.Request(
            f"http://127.0.0.1:{otlp}/v1/traces",
            data=b"",
            method="POST",
            headers={"Content-Type": "application/x-protobuf"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # an empty ExportTraceServiceRequest
            assert resp.status == 200
        assert written and written[0] > 0, "the store must write on its emptyDir"
        assert 'node="gpu-node-test"' in metrics  # from the init container's rendering
        health = json.loads(_wait_http(f"http://127.0.0.1:{port}/api/v1/health", proc))
        assert health
    finally:
        _stop(proc)
    _clean_log(log)


def test_console_pod_runs_read_only_without_capabilities(sandbox_ok, tmp_path):
    rw = tmp_path / "emptydirs"
    rw.mkdir()
    c = _containers("console-deployment.yaml")
    hook, ui = free_port(), free_port()
    replace = {
        "0.0.0.0:9465": f"127.0.0.1:{hook}",
        "--host=0.0.0.0": "--host=127.0.0.1",
        "--port=8501": f"--port={ui}",
        "$(PROMETHEUS_URL)": f"http://127.0.0.1:{free_port()}",
        "/var/lib/kvscope/": f"{rw}/state/",
    }
    procs = []
    try:
        for name, url in (
            ("webhook", f"http://127.0.0.1:{hook}/api/v1/diagnoses"),
            ("ui", f"http://127.0.0.1:{ui}/_stcore/health"),
        ):
            env = {e["name"]: e["value"] for e in c[name].get("env", []) if "value" in e}
            env = {k: v.replace("/tmp", f"{rw}/tmp") for k, v in env.items() if k != "PROMETHEUS_URL"}
            env.setdefault("HOME", f"{rw}/state")  # the image's HOME is a volume too
            log = tmp_path / f"{name}.log"
            argv = _shell(c[name]["command"] + c[name]["args"], replace)
            proc = _sandboxed(
                rw, f"exec @DROP@ {argv}\n", {"TMPDIR": f"{rw}/tmp", **env, **_image_env(c[name], tmp_path)}, log
            )
            procs.append((proc, log))
            body = _wait_http(url, proc)
            assert body.strip() in (b"ok",) or json.loads(body)["diagnoses"] == []
    finally:
        for proc, _ in procs:
            _stop(proc)
    for _, log in procs:
        _clean_log(log)


def test_the_agent_image_environment_lacks_the_ui_extras(tmp_path):
    env = {"PATH": f"{BIN}:/usr/bin:/bin", **_without_ui_extras(tmp_path)}
    res = subprocess.run([sys.executable, "-c", "import streamlit"], env=env, capture_output=True, text=True)
    assert res.returncode != 0 and "import of streamlit halted" in res.stderr, res.stderr


def test_the_sandbox_is_what_it_claims(sandbox_ok, tmp_path):
    rw = tmp_path / "emptydirs"
    rw.mkdir()
    log = tmp_path / "probe.log"
    probe = tmp_path / "outside"
    shell = (
        f"@DROP@ sh -c 'grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status; "
        f"touch {rw}/state/inside && echo inside-ok; touch {probe} || echo outside-refused'\n"
    )
    proc = _sandboxed(rw, shell, {}, log)
    proc.wait(timeout=300)  # a hang guard only
    out = log.read_text()
    assert "CapEff:\t0000000000000000" in out, out
    assert "NoNewPrivs:\t1" in out, out
    assert "inside-ok" in out and "outside-refused" in out and "Read-only file system" in out, out
    assert not probe.exists()
