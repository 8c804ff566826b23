"""Ranking between the two rules that explain the same ITL tail (p99 far above p50).

K7 (offload_stalls_interactive) observes its cause, the offload tier being read back; L3
(itl_tail_prefill_interference) infers prefill collisions from the prompt-length spread. When
both hold over the same window, the observed cause must lead (scenario
fleet-sglang-hicache-reload-stalls: "a diagnoser must prefer K7 here"), and L3 stays visible as
a competing hypothesis rather than being dropped.
"""

from __future__ import annotations

import pytest

from kvscope.diagnoser.evaluate.evaluator import diagnose
from kvscope.diagnoser.evaluate.frame import frame_from_samples
from kvscope.diagnoser.rulebook.rule import read_rules
from testbed.rulecases import Case, case_samples

RULE_IDS = ("offload_stalls_interactive", "itl_tail_prefill_interference")


def _frame(itl_counts: list[int]):
    inputs = [
        {"series": 'engine_kv_offload_loaded_tokens_total{instance="e0"}', "values": "0+3000x80"},
        {"series": 'engine_prompt_tokens_total{instance="e0"}', "values": "0+15000x80"},
        {
            "histogram": 'request_itl_seconds{instance="e0"}',
            "buckets": [0.02, 0.05, 0.2, 0.5],
            "phases": [{"steps": 80, "counts": itl_counts}],
        },
        {
            "histogram": 'request_prompt_tokens{instance="e0"}',
            "buckets": [100, 1000, 10000],
            "phases": [{"steps": 80, "counts": [80, 10, 10, 0]}],
        },
    ]
    case = Case("both", inputs, 1200.0, [], {}, 0, {})
    return frame_from_samples(case_samples(case, 15.0), 0.0, 1200.0, 15.0)


@pytest.mark.parametrize("itl_counts", [[90, 5, 0, 5, 0], [98, 0, 1, 1, 0]], ids=["5pct-tail", "2pct-tail"])
def test_reload_stream_outranks_prefill_interference_behind_the_same_tail(itl_counts):
    rules = [r for r in read_rules() if r.id in RULE_IDS]
    d = diagnose(_frame(itl_counts), rules, time_scale=1.0)
    assert {f.levers_md for f in d.findings} == {"K7", "L3"}  # both hold from the same onset
    assert d.likely_cause.levers_md == "K7"
    assert [f.levers_md for f in d.competing] == ["L3"]
