"""vLLM V0's `Speculative metrics:` log line (issue 38): the V0 spec-decode logger's totals read into
the same canonical speculation counters as V1's `SpecDecoding metrics:` line.

Source: vllm-project/vllm, vllm/engine/metrics.py `LoggingStatLogger._format_spec_decode_metrics_str`
(commit f0afa0c28a3160de7a2ece6eeda2afc8abba8b39, the 0.6-0.9 wording):
    "Speculative metrics: "
    f"Draft acceptance rate: {metrics.draft_acceptance_rate:.3f}, "
    f"System efficiency: {metrics.system_efficiency:.3f}, "
    f"Number of speculative tokens: {metrics.num_spec_tokens}, "
    f"Number of accepted tokens: {metrics.accepted_tokens}, "
    f"Number of draft tokens: {metrics.draft_tokens}, "
    f"Number of emitted tokens: {metrics.emitted_tokens}."
and the earlier wording at commit 00c33e81b526a179a6afb86512d1e8198965ee2f (`Number of draft tokens
tokens:`, `Number of emitted tokens tokens:`). The counts are the rejection sampler's running totals
since the engine started: vllm/spec_decode/metrics.py (commit 027b4855494f178fa4745d3e84fed815b7b935a8)
`_copy_rejsample_metrics_async` copies `num_accepted_tokens` / `num_draft_tokens` whole and divides
them for the acceptance rate; draft tokens // k is the number of speculated sequences. V1's line
prints per-interval counts instead (tests/unit/test_logs_connectors.py).

Expected readings, written before the first run:
* vllm#9539 (0.6.3): accepted 8547, draft 13311, k 3 -> counters 8547 / 13311, draft rounds 4437.
* vllm#22230 (0.9.1, `[metrics.py:439]` header): 8485 / 12564, k 4 -> 3141 rounds.
* vllm#8620 (0.6.1, pasted without a header): 0 / 483, k 3; no time (an untimed line).
* three lines with totals 100/500, 150/700, 400/1000 -> the counters read 400 / 1000 (the values,
  not the sum 650 / 2200); a restart (totals 20/100) leaves the counter at 20 (a reset); a stats line
  before the first speculative line carries no speculation counter (absent, not 0).
* 15 min of lines at 5 s (V0's local logging interval) whose totals start at 80000/100000 (80 % over
  the engine's past) and then grow by 120 accepted per 600 drafted (20 %) -> spec_decode_ineffective
  (L10), although the printed whole-run acceptance rate stays above 50 % for most of the window;
  starting at 20000/100000 and growing at 75 % -> quiet, although the printed rate starts at 20 %.
* malformed variants (a non-number, a negative, k 0, a huge line, nested separators) do not raise.
"""

from __future__ import annotations

import datetime
import io
import json
from pathlib import Path

from kvscope.agent.logs.lines import Line, parse_line
from kvscope.agent.logs.series import read_log
from kvscope.cli import main

DAY = datetime.date(2026, 11, 24)

# vllm-project/vllm#9539 ([Usage]: how to understand logs (when speculative decoding), vLLM 0.6.3)
V0_9539 = (
    "INFO 10-16 19:05:47 metrics.py:367] Speculative metrics: Draft acceptance rate: 0.642, System efficiency: 0.598, "
    "Number of speculative tokens: 3, Number of accepted tokens: 8547, Number of draft tokens: 13311, "
    "Number of emitted tokens: 10616."
)
# vllm-project/vllm#22230 (vLLM 0.9.1, V0 engine; 0.9's bracketed file:line header)
V0_22230 = (
    "INFO 08-05 11:34:35 [metrics.py:439] Speculative metrics: Draft acceptance rate: 0.675, System efficiency: 0.531, "
    "Number of speculative tokens: 4, Number of accepted tokens: 8485, Number of draft tokens: 12564, "
    "Number of emitted tokens: 8347."
)
# vllm-project/vllm#8620 (vLLM 0.6.1, medusa; the line as the reporter pasted it, no header)
V0_8620 = (
    "Speculative metrics: Draft acceptance rate: 0.000, System efficiency: 0.250, Number of speculative tokens: 3, "
    "Number of accepted tokens: 0, Number of draft tokens: 483, Number of emitted tokens: 161."
)


def _ts(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()


def test_v0_lines_of_three_releases():
    got = parse_line(V0_9539, DAY)
    assert isinstance(got, Line) and (got.engine, got.kind, got.ts) == ("vllm", "spec0", _ts("2026-10-16 19:05:47"))
    assert got.fields == {"spec_k": 3.0, "spec_acc_total": 8547.0, "spec_draft_total": 13311.0} and got.unknown == ()
    got = parse_line(V0_22230, DAY)
    assert isinstance(got, Line) and got.ts == _ts("2026-08-05 11:34:35")
    assert got.fields == {"spec_k": 4.0, "spec_acc_total": 8485.0, "spec_draft_total": 12564.0}
    got = parse_line(V0_8620, DAY)
    assert isinstance(got, Line) and got.missing == "time"
    assert got.fields == {"spec_k": 3.0, "spec_acc_total": 0.0, "spec_draft_total": 483.0}
    earlier = V0_9539.replace("draft tokens:", "draft tokens tokens:").replace(
        "emitted tokens:", "emitted tokens tokens:"
    )
    got = parse_line(earlier, DAY)
    assert isinstance(got, Line) and got.fields["spec_draft_total"] == 13311 and got.unknown == ()


def _last(log: str) -> tuple[dict[str, float], list[dict[str, float]]]:
    read = read_log(io.BytesIO(log.encode()), "eng", day=DAY)
    snaps = [{s.name: s.value for s in samples} for _, _, samples in read.scrapes]
    return snaps[-1], snaps


def _v0(t: datetime.datetime, acc: int, draft: int, k: int = 3) -> str:
    """V0's line in the 0.6-0.9 wording (vllm/engine/metrics.py @f0afa0c2), 0.6's header."""
    rate = acc / draft if draft else float("nan")
    emitted = acc + (draft // k if k else 0)
    eff = emitted / (draft // k * (k + 1)) if draft and k else float("nan")
    return (
        f"INFO {t:%m-%d %H:%M:%S} metrics.py:367] Speculative metrics: Draft acceptance rate: {rate:.3f}, "
        f"System efficiency: {eff:.3f}, Number of speculative tokens: {k}, Number of accepted tokens: {acc}, "
        f"Number of draft tokens: {draft}, Number of emitted tokens: {emitted}."
    )


def _stats(t: datetime.datetime, running: int = 8) -> str:
    """V0's stats line (vllm/engine/metrics.py, 0.6)."""
    return (
        f"INFO {t:%m-%d %H:%M:%S} metrics.py:351] Avg prompt throughput: 400.0 tokens/s, Avg generation throughput: "
        f"250.0 tokens/s, Running: {running} reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 30.0%, "
        "CPU KV cache usage: 0.0%."
    )


T0 = datetime.datetime(2026, 11, 24, 9, 0, 0)


def _at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def test_totals_are_the_counters_values_not_increases():
    lines = [_stats(_at(0)), _v0(_at(10), 100, 500), _v0(_at(20), 150, 700), _v0(_at(30), 400, 1000)]
    last, snaps = _last("\n".join(lines))
    assert "engine_spec_accepted_tokens_total" not in snaps[0]  # before the first line: absent, not 0
    assert last["engine_spec_accepted_tokens_total"] == 400
    assert last["engine_spec_draft_tokens_total"] == 1000
    assert last["engine_spec_drafts_total"] == 1000 / 3
    restarted, _ = _last("\n".join([*lines, _v0(_at(40), 20, 100)]))
    assert restarted["engine_spec_accepted_tokens_total"] == 20  # a restart: the counter resets
    no_k, _ = _last(_v0(_at(0), 0, 0, k=0))
    assert "engine_spec_drafts_total" not in no_k and no_k["engine_spec_draft_tokens_total"] == 0


def test_malformed_variants_do_not_raise_and_stay_linear():
    for bad in (
        V0_9539.replace("8547", "lots"),
        V0_9539.replace("8547", "-8547"),
        V0_9539.replace("13311", "1e99999"),
        V0_9539.replace(", ", ",, : : , "),
        V0_9539.replace("Number of", "Number of: Number of"),
        "Speculative metrics: ",
        "Speculative metrics: : : : : ,,,,",
    ):
        assert isinstance(parse_line(bad, DAY), Line | str)
    assert parse_line(V0_9539.replace("8547", "-8547"), DAY) == "bad_value"
    many = "INFO 10-16 19:05:47 metrics.py:367] Speculative metrics: " + "Number of: 1, " * 1000
    assert parse_line(many, DAY) == "no_fields"  # a thousand unknown parts: read once each, nothing kept
    assert parse_line("x" * 20000 + V0_9539, DAY) == "too_long"


def _diagnose(capsys, tmp_path: Path, lines: list[str]) -> dict:
    log = tmp_path / "engine.log"
    log.write_text("\n".join(lines) + "\n")
    main(["diagnose", "--log", str(log), "--date", str(DAY), "--json"])
    return json.loads(capsys.readouterr().out)


def _loud(result: dict) -> list[tuple[str, str]]:
    every = ([result["likely_cause"]] if result.get("likely_cause") else []) + result.get("competing", [])
    return [(f["rule_id"], f["levers_md"]) for f in every + result.get("other", []) if f["severity"] in BAD]


BAD = ("warning", "critical")


def _run(acc0: int, per_line: int) -> list[str]:
    """15 min of V0 stats + speculative lines every 5 s; 600 draft tokens per line, k 3."""
    out = []
    for j in range(180):
        t = _at(5 * j)
        out += [_stats(t), _v0(t, acc0 + per_line * j, 100_000 + 600 * j)]
    return out


def test_low_recent_acceptance_fires_spec_decode_ineffective_though_the_printed_rate_is_high(capsys, tmp_path):
    lines = _run(80_000, 120)
    assert "Draft acceptance rate: 0.800" in lines[1] and "Draft acceptance rate: 0.641" in lines[1 + 2 * 60]
    loud = _loud(_diagnose(capsys, tmp_path, lines))
    assert ("spec_decode_ineffective", "L10") in loud, loud


def test_high_recent_acceptance_stays_quiet_though_the_printed_rate_is_low(capsys, tmp_path):
    lines = _run(20_000, 450)
    assert "Draft acceptance rate: 0.200" in lines[1]
    assert _loud(_diagnose(capsys, tmp_path, lines)) == []
