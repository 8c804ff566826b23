"""The log lines of a real KV-pressure run on vLLM (CPU) read into what its /metrics said.

The same run as test_cascade_vllm.py (fill the small pool, then a wave); afterwards the server's
own log is read with `read_log` and compared with the scrapes taken during the run.
"""

import datetime
import io
import os
import time
import urllib.request

import pytest
from test_cascade_vllm import _canonical, _run_pressure

from kvscope.agent.logs.series import read_log

pytestmark = pytest.mark.vllm


def test_log_of_a_real_kv_pressure_run_matches_its_scrapes(vllm_small_kv):
    srv = vllm_small_kv
    start = os.path.getsize(srv.log_path)
    scrapes, requests, root_t, _ = _run_pressure(srv)
    assert root_t is not None and {s for s, _, _ in requests} == {200}
    time.sleep(12)  # the stats interval holding the end of the run is logged (10 s in 0.32)
    t = time.time()  # when it was sent, like `_scrape_until`'s
    with urllib.request.urlopen(srv.metrics_url, timeout=30) as r:
        scrapes.append((t, r.read().decode()))
    with open(srv.log_path, "rb") as f:
        f.seek(start)
        text = f.read()
    if os.environ.get("KVSCOPE_KEEP_LOG"):
        with open(os.environ["KVSCOPE_KEEP_LOG"], "wb") as out:
            out.write(b"".join(ln + b"\n" for ln in text.splitlines() if b"[loggers.py" in ln))
    read = read_log(io.BytesIO(text), "vllm-0", day=datetime.datetime.now(datetime.UTC).date())
    summary = read.summary
    assert summary.formats.get("vLLM V1 stats lines", 0) >= 2, summary.text()  # one 10 s interval at least
    assert not set(summary.skipped) - {"other"} and not summary.unknown_fields, summary.text()
    logged: dict[str, list[tuple[float, float]]] = {}
    for _, ts, samples in read.scrapes:
        for s in samples:
            logged.setdefault(s.name, []).append((ts, s.value))
    scraped: dict[str, list[tuple[float, float]]] = {}
    for s in _canonical(scrapes):
        if not dict(s.labels).get("dp_rank", "0") == "0" or s.name.endswith(("_bucket", "_sum", "_count")):
            continue
        scraped.setdefault(s.name, []).append((s.timestamp, s.value))
    times = [t for t, _ in scrapes]
    preempted = scraped["engine_preemptions_total"][-1][1] - scraped["engine_preemptions_total"][0][1]
    print(summary.text(), f"preemptions in the run: {preempted:.0f}")
    # vLLM 0.12-0.33 build a `Preemptions: N` part but zero N (`_update_stats` -> `_reset`) before
    # testing N > 0, so no stats line prints it (docs/logs.md): the log has no preemption counter
    # even where /metrics counted some. Absent, not zero.
    assert "engine_preemptions_total" not in logged
    # The log's KV usage is the engine's own gauge, printed once per 10 s interval, and /metrics
    # samples the same gauge at other instants: a line is compared with the scrape read last before
    # its second and the one read first after it, and only where nothing could have moved the gauge
    # up and back between those two (a percent read unscaled or a wrong field would be far off).
    # Between two scrapes with no request sent or answered by this client and no preemption, the
    # pool only grows as running requests decode, so the line lies between them. Elsewhere it is
    # not compared: one baseline request (300-token prefill, 8 tokens out) held 0.47 of the pool for
    # under a second, between two scrapes of a loaded box 1.3 s apart that both read 0 (the last
    # CI run), and under the wave one run's log caught 0.89 where its scrapes read 0.386.
    kv_scraped = _observed(scraped["engine_kv_cache_usage_ratio"])
    preemptions = _observed(scraped["engine_preemptions_total"])
    kv_logged = logged["engine_kv_cache_usage_ratio"]
    assert all(0.0 <= v <= 1.0 for _, v in kv_logged) and max(v for _, v in kv_logged) > 0.0, kv_logged
    # Within one line, KV usage and `Running:` come from the same scheduler snapshot: a running
    # request holds at least one of the pool's 128 blocks (0.8 %, printed as > 0), and with nothing
    # running no block is held (preempted requests give theirs back; cached free blocks count as
    # free). This holds at any instant, however far the scrapes are.
    running = dict(logged["engine_requests_running"])
    assert all((running[ts] > 0) == (v > 0) for ts, v in kv_logged), (kv_logged, running)
    compared, moving = [], []
    for ts, v in kv_logged:
        pair = _bracket(kv_scraped, ts)
        if pair is None or _moved(pair, requests, preemptions):
            moving.append((round(ts - times[0], 1), v))
            continue
        (_, _, before), (_, _, after) = pair
        compared.append((round(ts - times[0], 1), v, before, after))
        assert min(before, after) - 0.05 <= v <= max(before, after) + 0.05, (
            ts - times[0],
            v,
            pair,
            _gaps(times),
        )
    print(f"KV lines (s, logged, scraped before, after) {compared}; lines where the pool could move {moving}")
    # tokens/s x the time between stats lines: the run's generated tokens to within the one-second
    # resolution of the log's times. The counter only grows, so the scrapes bound what was generated
    # between the first and the last line however far apart they are
    (t0, _), (t1, got) = logged["engine_generation_tokens_total"][0], logged["engine_generation_tokens_total"][-1]
    gen = _observed(scraped["engine_generation_tokens_total"])
    lo = _at_most(gen, t1) - _at_least(gen, t0 + 1)  # seen by the end of the last line's second ...
    hi = _at_least(gen, t1 + 1) - _at_most(gen, t0)  # ... and from before the first line's second
    print(f"generation tokens: log {got:.0f}, scrapes between {lo:.0f} and {hi:.0f}")
    assert lo * 0.75 <= got <= hi * 1.25, (got, lo, hi, _gaps(times))


NEAR_S = 3.0  # a log line is compared with the scrapes observed within this many seconds of it


Observed = tuple[float, float, float]  # (sent, next sent, value): see _observed


def _observed(points: list[tuple[float, float]]) -> list[Observed]:
    """(sent, next sent, value) per scrape: `_scrape_until` sends the next scrape after the answer
    to this one, so the engine's value was read somewhere in between (the last: within 30 s)."""
    ends = [t for t, _ in points[1:]] + [points[-1][0] + 30.0]
    return [(t, end, v) for (t, v), end in zip(points, ends, strict=True)]


def _bracket(points: list[Observed], ts: float) -> tuple[Observed, Observed] | None:
    """The scrape read last before a log line stamped `ts` (printed within [ts, ts + 1): its time is
    truncated to the second) and the one read first after it, or None unless both lie within NEAR_S
    of it."""
    before = [p for p in points if ts - NEAR_S <= p[0] and p[1] <= ts]
    after = [p for p in points if ts + 1 <= p[0] and p[1] <= ts + 1 + NEAR_S]
    if not before or not after:
        return None
    return max(before), min(after)


def _moved(pair: tuple[Observed, Observed], requests, preemptions: list[Observed]) -> bool:
    """Whether the pool could have grown and shrunk between the two scrapes: a request of this
    client was sent or answered around them, or the engine preempted one (its counter differs
    between them). Around, by NEAR_S on the outer side: a request sent just before the first
    scrape can reach the engine after it, and the answer reaches this client after the engine
    freed its blocks."""
    (a, _, _), (c, d, _) = pair
    came_or_went = any(a - NEAR_S <= sent <= d or a <= answered <= d + NEAR_S for _, sent, answered in requests)
    count = {t: v for t, _, v in preemptions}
    return came_or_went or count.get(a) != count.get(c)


def _at_most(points: list[Observed], t: float) -> float:
    """A counter's value at `t` or below: the last one read entirely before `t`."""
    return max((v for _, b, v in points if b <= t), default=0.0)


def _at_least(points: list[Observed], t: float) -> float:
    """A counter's value at `t` or above: the first one read entirely after `t`."""
    return min((v for a, _, v in points if a >= t), default=points[-1][2])


def _gaps(times: list[float]) -> str:
    """The scrape gaps over 1 s (offset from the first scrape: length), the evidence of a CPU-starved
    API server."""
    return "scrape gaps " + ", ".join(
        f"{a - times[0]:.1f}: {b - a:.1f} s" for a, b in zip(times, times[1:], strict=False) if b - a > 1
    )
