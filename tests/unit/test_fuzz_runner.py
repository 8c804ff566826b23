"""bench/fuzz.py finds what it is built to find: a crash, a hang past the time bound and an input
over the memory bound are counted and saved; clean targets pass; inputs are reproducible."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz = _load("fuzz")


def _bad(data: bytes) -> object:
    if b"{{{" in data:
        raise ValueError("a crash the runner must count")
    if b"}}}}}}}}" in data:
        time.sleep(30)  # a hang: killed past 2 x time bound + 1 s
    if b"====" in data:
        return bytearray(2 << 30)  # over the memory bound
    return None


@pytest.fixture
def runner(monkeypatch, tmp_path):
    targets = {"bad": (_bad, lambda: [b'm{a="1"} 1\n'], [b"{", b"}", b"="]), "clean": (len, lambda: [b"x 1\n"], [])}
    monkeypatch.setattr(fuzz, "load_targets", lambda: targets)
    monkeypatch.setattr(fuzz, "ARTIFACTS", tmp_path)
    return tmp_path


def test_the_runner_counts_and_saves_crashes_hangs_and_memory(runner):
    totals = fuzz.run_target("bad", 400, 1, time_s=0.2, memory_mib=256)
    assert totals["inputs"] == 400
    assert totals["crashes"] > 0 and totals["hangs"] >= 1 and totals["memory"] > 0
    kinds = {p.name.split("-")[0] for p in (runner / "bad").glob("*.bin")}
    assert kinds == {"crash", "hang", "memory"}
    # a generous bound: the runner kills a worker stuck past 2 x --time-s + 1 s of wall time, and a
    # stalled process on a loaded box must not turn a clean input into a hang
    assert fuzz.main(["--target", "clean", "--inputs", "200", "--time-s", "60"]) == 0
    assert fuzz.main(["--target", "bad", "--inputs", "50", "--time-s", "0.2"]) == 1


def test_an_input_is_made_again_from_its_index():
    seeds, tokens = [b'm{a="1"} 1\n', b"# EOF\n"], [b"{"]
    assert fuzz.make_input(7, 123, seeds, tokens) == fuzz.make_input(7, 123, seeds, tokens)
    assert len({fuzz.make_input(7, i, seeds, tokens) for i in range(50)}) > 40
    assert max(len(fuzz.make_input(1, i, seeds, tokens)) for i in range(2000)) <= fuzz.MAX_INPUT


def test_the_exposition_targets_run_clean_on_their_seeds():
    area = _load("fuzz_exposition")
    for parse, seeds_fn, _ in area.TARGETS.values():
        seeds = seeds_fn()
        assert 5 <= len(seeds) <= 60
        for seed in seeds:
            parse(seed)
