"""`kvscope tap`: help text and argument errors (the proxy itself: test_tap_proxy.py)."""

import subprocess
import sys


def _kvscope(*args):
    return subprocess.run(
        [sys.executable, "-m", "kvscope", "tap", *args], capture_output=True, text=True, timeout=300
    )  # a hang guard only (slow on a loaded 2-core box)


def test_help_explains_tenants_reuse_and_reserved_paths():
    r = _kvscope("--help")
    assert r.returncode == 0
    for words in ("--upstream", "--tenant-header", "cached_tokens", "/kvscope/fairness", "never the key"):
        assert words in " ".join(r.stdout.split()), words


def test_bad_listen_address_is_a_clear_error():
    r = _kvscope("--upstream", "http://127.0.0.1:9", "--listen", "nowhere")
    assert r.returncode == 2 and "bad argument" in r.stdout


def test_upstream_is_required():
    r = _kvscope()
    assert r.returncode == 2 and "--upstream" in r.stderr
