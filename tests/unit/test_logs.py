"""Engine log lines -> canonical series (agent/logs): each format's excerpt in tests/fixtures/logs
(provenance in its README) read into exactly the values its lines print."""

from __future__ import annotations

import datetime
import io
import math
import time
from pathlib import Path

import pytest

from kvscope.agent.logs.lines import MAX_LINE, Line, parse_line
from kvscope.agent.logs.series import read_log
from kvscope.core.scalars import parse_timestamp as rfc3339

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
DAY = datetime.date(2026, 11, 24)


def series(name: str, **kw) -> tuple[dict[str, list[tuple[float, float]]], object, dict]:
    """signal -> [(time, value)], the summary and the labels of the first sample."""
    read = read_log(io.BytesIO((LOGS / name).read_bytes()), "eng", day=kw.pop("day", DAY), **kw)
    out: dict[str, list[tuple[float, float]]] = {}
    for _, ts, samples in read.scrapes:
        for s in samples:
            out.setdefault(s.name, []).append((ts, round(s.value, 6)))
    labels = dict(read.scrapes[0][2][0].labels) if read.scrapes else {}
    return out, read.summary, labels


def values(got: dict, name: str) -> list[float]:
    return [v for _, v in got[name]]


def test_vllm_v0_stats_and_every_50th_preemption_warning():
    got, summary, labels = series("vllm-0.6-v0-kv-pressure.log")
    assert summary.formats == {"vLLM V0 stats lines": 9, "vLLM V0 preemption warnings": 3}
    assert summary.skipped == {"other": 1}
    assert labels == {"engine": "vllm", "instance": "eng", "job": "engine"}  # V0: one engine, no dp_rank
    t0 = datetime.datetime(2026, 3, 2, 14, 10, tzinfo=datetime.UTC).timestamp()
    assert [t - t0 for t, _ in got["engine_requests_running"]] == [0, 5, 10, 15, 20, 22, 25, 30, 32, 35, 40, 42]
    assert values(got, "engine_requests_waiting")[::3] == [0, 14, 37, 66]  # `Pending`
    assert values(got, "engine_kv_cache_usage_ratio")[:5] == [0.61, 0.784, 0.931, 0.992, 1.0]
    # the warning's own cumulative count, held between warnings; 0 before (its first is preemption 1)
    assert values(got, "engine_preemptions_total") == [0, 0, 0, 0, 0, 1, 1, 1, 51, 51, 51, 101]
    # tokens/s x 5 s between stats lines (vLLM V0 logs every 5 s)
    assert values(got, "engine_prompt_tokens_total")[:5] == [0, 7500, 12000, 14000, 14600]
    assert values(got, "engine_generation_tokens_total")[1] == 402.5 * 5
    assert "engine_prefix_cache_hit_ratio" not in got  # no prefix-cache line: absent, not zero


def test_vllm_v1_kubectl_timestamps_engine_index_and_no_preemption_counter():
    got, summary, labels = series("vllm-0.10-v1-kv-pressure.kubectl.log")
    assert summary.formats == {"vLLM V1 stats lines": 8} and summary.skipped == {"other": 1}
    assert labels["dp_rank"] == "0"  # `Engine 000:`
    first = got["engine_requests_running"][0][0]
    assert rfc3339("2026-06-01T12:00:00.417512934Z") == pytest.approx(1780315200.417513, abs=1e-6)
    assert first == 1780315200.418  # kubectl's time, to the ms a recording keeps
    assert values(got, "engine_requests_running") == [48, 52, 55, 51, 46, 42, 39, 35]
    assert values(got, "engine_requests_waiting") == [0, 3, 11, 24, 39, 55, 71, 88]
    assert values(got, "engine_kv_cache_usage_ratio")[-1] == 1.0
    assert values(got, "engine_prefix_cache_hit_ratio")[0] == 0.03
    assert "engine_preemptions_total" not in got  # V1 before `Preemptions:` logs none
    assert values(got, "engine_prompt_tokens_total")[1] == pytest.approx(4100.0 * 10.001)


def test_vllm_v1_preemptions_field_is_summed_and_waiting_includes_deferred():
    """The `Preemptions: N` part vLLM 0.12-0.33's logger builds (never printed by those releases:
    N is zeroed before it is tested; docs/logs.md) is read should a release print it."""
    lines = [
        f"INFO 11-20 07:00:{10 * i:02d} [loggers.py:335] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
        f"Running: 9 reqs, Waiting: {w} reqs{extra}, GPU KV cache usage: 99.0%"
        for i, (w, extra) in enumerate(
            ((0, ""), (4, ", Preemptions: 2"), (13, ", Deferred: 1 reqs, Preemptions: 5"), (21, ""))
        )
    ]
    read = read_log(io.BytesIO("\n".join(lines).encode()), "e", day=DAY)
    got = {}
    for _, _, ss in read.scrapes:
        for s in ss:
            got.setdefault(s.name, []).append(s.value)
    assert got["engine_preemptions_total"] == [0, 2, 7, 7]
    assert got["engine_requests_waiting"] == [0, 4, 13, 21]  # vLLM's `Waiting` already includes deferred


def test_real_vllm_032_cpu_lines_name_the_cpu_kv_cache():
    got, summary, _ = series("vllm-0.32-cpu-testbed.log")
    assert summary.formats == {"vLLM V1 stats lines": 3}
    assert values(got, "engine_kv_cache_usage_ratio") == [0.228, 0.0, 0.0]
    assert values(got, "engine_prefix_cache_hit_ratio") == [0.566, 0.492, 0.492]
    got, summary, _ = series("vllm-0.32-cpu-kv-pressure.log")
    assert values(got, "engine_kv_cache_usage_ratio") == [0.992, 0.858, 0.0]
    assert values(got, "engine_requests_waiting") == [30, 1, 0]
    assert "engine_preemptions_total" not in got


def test_gap_longer_than_the_logging_interval_counts_only_the_interval():
    """vLLM V1 logs idle intervals at debug level: the rate of the next line covers one interval."""
    lines = [
        f"INFO 05-01 10:{m:02d}:{s:02d} [loggers.py:1] Engine 000: Avg prompt throughput: 100.0 tokens/s, "
        f"Avg generation throughput: 10.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%"
        for m, s in ((0, 0), (0, 10), (0, 20), (5, 0))
    ]
    read = read_log(io.BytesIO("\n".join(lines).encode()), "e", day=DAY)
    prompt = [s.value for _, _, ss in read.scrapes for s in ss if s.name == "engine_prompt_tokens_total"]
    assert prompt == [0, 1000, 2000, 3000]


def test_sglang_prefill_decode_and_retractions():
    got, summary, labels = series("sglang-0.4-kv-pressure.log")
    assert summary.formats == {"SGLang prefill lines": 4, "SGLang decode lines": 8, "SGLang retraction warnings": 3}
    assert labels == {"engine": "sglang", "instance": "eng", "job": "engine"}
    assert values(got, "engine_requests_running") == [40, 44, 47, 48, 46, 42, 38, 35]  # Decode line: last at its time
    assert values(got, "engine_requests_waiting") == [0, 2, 5, 9, 15, 22, 30, 37]
    assert values(got, "engine_kv_cache_usage_ratio")[-3:] == [1.0, 1.0, 1.0]
    assert values(got, "engine_preemptions_total") == [0, 0, 0, 0, 0, 2, 5, 9]  # #retracted_reqs summed
    assert values(got, "engine_prompt_tokens_total")[:4] == [2200, 4550, 7050, 9700]  # new + cached, exact
    assert values(got, "engine_prefix_cache_hits_tokens_total")[3] == 400 + 450 + 500 + 550
    assert values(got, "engine_generation_tokens_total")[:3] == [0, 1840 * 2, 1840 * 2 + 1780 * 2]


def test_sglang_newer_format_dp_tag_and_tp_copies():
    got, summary, labels = series("sglang-0.5-dp-healthy.log")
    assert summary.skipped == {"tp_rank_copy": 6}  # TP1 prints what TP0 printed
    assert summary.formats == {"SGLang prefill lines": 6, "SGLang decode lines": 6}
    assert labels["dp_rank"] == "0"
    assert values(got, "engine_requests_running") == [8] * 6
    assert values(got, "engine_prefix_cache_hit_ratio")[0] == 0.75
    assert "engine_preemptions_total" not in got  # no retraction line in the log: absent


def test_sglang_undated_lines_take_the_given_date_and_roll_over_midnight():
    got, summary, _ = series("sglang-0.3-undated.log", day=datetime.date(2025, 3, 1))
    assert summary.formats["SGLang retraction warnings"] == 1  # `Decode out of memory happened.`
    t0 = datetime.datetime(2025, 3, 1, 16, 43, 29, tzinfo=datetime.UTC).timestamp()
    assert got["engine_requests_running"][0][0] == t0
    assert values(got, "engine_preemptions_total") == [0, 0, 2, 2]
    text = "[23:59:59 TP0] Decode batch. #running-req: 1, #queue-req: 0\n[00:00:01 TP0] Decode batch. #running-req: 2, #queue-req: 0\n"
    read = read_log(io.BytesIO(text.encode()), "e", day=datetime.date(2025, 12, 31))
    assert [ts for _, ts, _ in read.scrapes] == [
        t0 + d
        for d in (
            datetime.datetime(2025, 12, 31, 23, 59, 59, tzinfo=datetime.UTC).timestamp() - t0,
            datetime.datetime(2026, 1, 1, 0, 0, 1, tzinfo=datetime.UTC).timestamp() - t0,
        )
    ]


def test_vllm_year_rolls_over_at_new_year():
    text = (
        "INFO 12-31 23:59:55 metrics.py:1] Avg prompt throughput: 0.0 tokens/s, Running: 1 reqs\n"
        "INFO 01-01 00:00:05 metrics.py:1] Avg prompt throughput: 0.0 tokens/s, Running: 2 reqs\n"
    )
    read = read_log(io.BytesIO(text.encode()), "e", day=datetime.date(2025, 6, 1))
    assert [ts for _, ts, _ in read.scrapes] == [
        datetime.datetime(2025, 12, 31, 23, 59, 55, tzinfo=datetime.UTC).timestamp(),
        datetime.datetime(2026, 1, 1, 0, 0, 5, tzinfo=datetime.UTC).timestamp(),
    ]


def test_vllm_070_v1_line_has_only_running_and_waiting():
    """vLLM 0.7.0's V1 logger printed `Running: %d reqs, Waiting: %d reqs ` and nothing else."""
    read = read_log(io.BytesIO(b"INFO 01-27 10:00:00 loggers.py:37] Running: 3 reqs, Waiting: 1 reqs \n"), "e", day=DAY)
    assert {s.name: s.value for s in read.scrapes[0][2]} == {
        "engine_requests_running": 3.0,
        "engine_requests_waiting": 1.0,
    }  # no token counters


def test_sglang_020_lines_carry_no_time_but_kubectl_gives_one():
    line = (
        "2026-01-02T03:04:05Z [gpu_id=0] Decode batch. #running-req: 4, #token: 900, token usage: 0.50, "
        "gen throughput (token/s): 12.00, #queue-req: 1"
    )
    got = parse_line(line, DAY)
    assert isinstance(got, Line) and got.ts == rfc3339("2026-01-02T03:04:05Z")
    assert got.fields == {"running": 4, "kv": 0.5, "gen_tps": 12.0, "waiting": 1}
    untimed = parse_line(line.partition(" ")[2], DAY)  # no time at all: placed by the reader, in order
    assert isinstance(untimed, Line) and untimed.missing == "time" and math.isnan(untimed.ts)
    retract = parse_line(
        "2026-01-02T03:04:06Z decode out of memory happened, #retracted_reqs: 3, #new_token_ratio: 0.4000 -> 0.6000",
        DAY,
    )
    assert isinstance(retract, Line) and retract.fields == {"retracted": 3}


def test_sglang_mixed_prefill_header_carries_the_running_count():
    got = parse_line(
        "[10:00:00 TP0] Prefill batch(mixed #running-req: 3). #new-seq: 1, #new-token: 5, "
        "#cached-token: 0, cache hit rate: 0.00%, #queue-req: 2",
        DAY,
    )
    assert isinstance(got, Line) and got.fields == {"running": 3, "new": 5, "cached": 0, "waiting": 2}


def test_vllm_aggregated_engines_are_one_stream_without_a_rank():
    got = parse_line(
        "INFO 05-01 10:00:00 [loggers.py:1] 2 Engines Aggregated: Avg prompt throughput: 1.0 tokens/s, Running: 9 reqs",
        DAY,
    )
    assert isinstance(got, Line) and got.rank == "" and got.fields["running"] == 9


def test_kubectl_prefix_names_the_instance():
    text = (
        "[pod/vllm-1/vllm] INFO 05-01 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
        "Running: 3 reqs\n[pod/vllm-2/vllm] INFO 05-01 10:00:00 [loggers.py:1] Engine 000: Avg prompt "
        "throughput: 1.0 tokens/s, Running: 5 reqs\n"
    )
    read = read_log(io.BytesIO(text.encode()), "default", day=DAY)
    assert sorted((i, ss[0].value) for i, _, ss in read.scrapes) == [("vllm-1", 3.0), ("vllm-2", 5.0)]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.9.0", "other"),
        ("INFO 13-01 10:00:00 x] Avg prompt throughput: 1.0 tokens/s, Running: 3 reqs", "no_timestamp"),
        ("INFO 05-01 10:00:00 x] Avg prompt throughput: 1.0 tokens/s, Running: many reqs", "bad_value"),
        ("INFO 05-01 10:00:00 x] Avg prompt throughput: 1e5 tokens/s", "bad_value"),
        ("INFO 05-01 10:00:00 x] Avg prompt throughput: \u0661\u0662 tokens/s", "bad_value"),  # Arabic-Indic digits
        ("INFO 05-01 10:00:00 x] Avg prompt throughput: , Foo: 1", "bad_value"),
        ("[2025-01-01 00:00:00 TP3] Decode batch. #running-req: 1", "tp_rank_copy"),
        ("2026-13-01T00:00:00Z [2025-01-01 00:00:00] Decode batch. #running-req: 1", "no_timestamp"),
        ("x" * (MAX_LINE + 1), "too_long"),
        ("[2025-01-01 00:00:00 DP" + "1" * 5000 + "] Decode batch. #running-req: 1", "ok"),  # no int() of 5000 digits
        ("INFO 05-01 10:00:00 x] Engine " + "1" * 5000 + ": Avg prompt throughput: 1.0 tokens/s", "ok"),
    ],
)
def test_lines_that_are_not_stats_say_why(line: str, reason: str):
    got = parse_line(line, DAY)
    assert got.rank == "" if reason == "ok" else got == reason, got  # type: ignore[union-attr]


def test_unknown_fields_are_counted_not_guessed():
    got = parse_line(
        "INFO 05-01 10:00:00 x] Avg prompt throughput: 1.0 tokens/s, Avg step: 2.1 ms, Running: 3 reqs", DAY
    )
    assert isinstance(got, Line) and got.fields == {"prompt_tps": 1.0, "running": 3.0} and got.unknown == ("Avg step",)


def test_unknown_field_names_are_bounded():
    text = "".join(f"INFO 05-01 10:00:00 x] Avg prompt throughput: 1.0 tokens/s, f{i}: 1\n" for i in range(500))
    summary = read_log(io.BytesIO(text.encode()), "e", day=DAY).summary
    assert len(summary.unknown_fields) == 65 and summary.unknown_fields["(others)"] == 436


def test_long_lines_are_skipped_while_reading_without_holding_them():
    text = b"x" * (MAX_LINE * 10) + b"\nINFO 05-01 10:00:00 x] Avg prompt throughput: 1.0 tokens/s, Running: 3 reqs\n"
    read = read_log(io.BytesIO(text), "e", day=DAY)
    assert read.summary.lines == 2 and read.summary.skipped == {"too_long": 1} and len(read.scrapes) == 1


def _cpu_seconds_per_parse(line: str) -> float:
    """Best-of-5 CPU seconds for one parse_line: CPU time, so a descheduled process accrues none."""
    start = time.process_time()
    parse_line(line, DAY)
    reps = max(1, min(500, int(0.01 / max(time.process_time() - start, 1e-7))))
    best = math.inf
    for _ in range(5):
        start = time.process_time()
        for _ in range(reps):
            parse_line(line, DAY)
        best = min(best, (time.process_time() - start) / reps)
    return best


def test_parsing_is_linear_on_hostile_lines():
    """Lines built to make a backtracking parser work hard, up to the longest allowed: 4x the
    length costs well under the 16x of a quadratic parser (CPU-time ratio, no absolute bound)."""
    hostile = [
        lambda n: "INFO 05-01 10:00:00 x] Avg prompt throughput: " + "1, " * (n // 4),
        lambda n: "[2025-01-01 00:00:00" + " DP0" * (n // 5) + "] Prefill batch",
        lambda n: "INFO " + "05-01 " * (n // 7) + "Avg prompt throughput: 1",
        lambda n: "Prefill batch(mixed " + "(" * (n - 30),
    ]
    for make in hostile:
        short, full = make(MAX_LINE // 4)[: MAX_LINE // 4], make(MAX_LINE)[:MAX_LINE]
        assert _cpu_seconds_per_parse(full) < 8 * _cpu_seconds_per_parse(short), full[:40]


# ------------------------------------------------------------ issue 38: header shapes users paste
OUTSIDE_LOGS = Path(__file__).resolve().parents[1] / "outside" / "logs"


def test_sglang_lines_under_an_unbracketed_date_time_header_are_read_with_their_times():
    """sglang-omni PR #712's server log (Python logging's default header) and the fork shape
    `YYYY-MM-DD HH:MM:SS LEVEL PID [file.py:line] Decode batch ...`."""
    with open(OUTSIDE_LOGS / "sglang-omni-unbracketed-header-712.log", "rb") as f:
        read = read_log(f, "omni")
    assert read.summary.formats == {"SGLang decode lines": 3, "SGLang prefill lines": 2}, read.summary.text()
    assert read.summary.untimed == 0
    assert read.scrapes[0][1] == rfc3339("2026-06-07T10:59:31Z")
    fork = "2026-05-24 03:51:44 INFO 1234 [scheduler.py:1502] Decode batch, #running-req: 4, token usage: 0.50"
    got = parse_line(fork, DAY)
    assert isinstance(got, Line) and got.ts == rfc3339("2026-05-24T03:51:44Z") and got.fields["running"] == 4


def test_an_excerpt_without_any_time_is_ordered_as_printed_and_says_the_times_are_unknown():
    text = (OUTSIDE_LOGS / "sglang-no-timestamp-938.log").read_bytes()
    read = read_log(io.BytesIO(text + text.replace(b"0.93", b"0.95")), "s938", day=DAY)
    assert read.summary.untimed == 2 and "times unknown" in read.summary.text()
    (_, t0, first), (_, t1, second) = read.scrapes
    assert t1 - t0 == 10.0
    kv = [next(s.value for s in samples if s.name == "engine_kv_cache_usage_ratio") for samples in (first, second)]
    assert kv == [0.93, 0.95]


def test_a_line_without_a_time_in_a_log_with_times_is_skipped_not_placed():
    timed = b"[2025-02-27 04:46:39 TP0] Decode batch. #running-req: 8, token usage: 0.12, #queue-req: 0\n"
    untimed = b"Decode batch. #running-req: 9, token usage: 0.13, #queue-req: 0\n"
    read = read_log(io.BytesIO(timed + untimed), "x", day=DAY)
    assert read.summary.untimed == 0 and read.summary.skipped["no_timestamp"] == 1 and len(read.scrapes) == 1
