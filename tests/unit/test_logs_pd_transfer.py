"""P/D KV transfer failures and lease expiries in vLLM's NIXL log lines (issue 59 part 2).

Parse tests read lines as upstream threads posted them (provenance beside each); the others are
built in the exact shapes of vLLM 0.32's format strings (nixl/base_worker.py
`_reap_expired_send_leases`, nixl/pull_worker.py, nixl/push_worker.py, nixl/stats.py `reduce()` as
kv_connector/v1/metrics.py prints it) with numbers chosen for the case. Expected verdicts, written
before the first run:
* the `KV Transfer metrics:` line's `Num KV expired reqs` and `Num notifs after expiry` are summed
  into kv_transfer_expired_requests_total / kv_transfer_notifications_after_expiry_total, and the
  per-request expiry lines count one event each, but not again where the metrics line counts them;
* 10 min of healthy NIXL lines (all failure counts 0) with stats lines -> quiet; the same with one
  interval reporting a read after expiry -> pd_kv_transfer_failing critical, the likely cause; the
  same with 2 failed transfers while the engine generates -> critical; with 1 expiry only ->
  a warning, nothing critical.
"""

from __future__ import annotations

import datetime
import io
import json
from pathlib import Path

from kvscope.agent.logs.lines import Line, parse_line
from kvscope.agent.logs.series import read_log
from kvscope.cli import main

DAY = datetime.date(2026, 8, 16)
# aws-samples/aws-do-eks PR #84 (the prefill worker's log, each line as posted, wrap joined)
EXPIRED_84 = (
    "WARNING 08-16 08:09:07 [worker.py:2967] Releasing expired KV blocks for request 8f07dfc0-...-a2f0e657 "
    "which were retrieved by 0 remote worker(s) before lease expired."
)
LATE_84 = (
    "ERROR   08-16 08:09:28 [worker.py:3004] Potentially invalid KV blocks for unrecognized request "
    "8f07dfc0-...-a2f0e657 were retrieved by a decode worker. They may have expired."
)
# vllm-project/aibrix#1772 (a 2P2D benchmark's prefill log)
LATE_1772 = (
    "ERROR 11-19 10:12:21 [distributed/.../v1/nixl_connector.py:1068] Potentially invalid KV blocks for "
    "unrecognized request chatcmpl-129a69c8-cd1a-40e0-aa3e-94662fd8cc2b were retrieved by a decode worker. "
    "They may have expired."
)
# vllm-project/vllm PR #21753 (merged 2025-07): the first wording, with the timeout
EXPIRED_21753 = (
    "WARNING 07-28 10:00:00 [nixl_connector.py:1032] Releasing expired KV blocks for request cmpl-1 which were "
    "retrieved by 0 decode worker(s) within 120 seconds."
)
# vLLM 0.32 push mode (push_worker.py) and the bidirectional turn-2 read (pull_worker.py): no posted line seen
LATE_PUSH = (
    "(Worker pid=7) ERROR 08-16 08:10:00 [push_worker.py:790] Unrecognized request cmpl-2 notif (may have expired)."
)
DECLINED = "(Worker pid=7) WARNING 08-16 08:10:01 [pull_worker.py:153] Declining expired remote read for cmpl-3 from engine e1."


def test_expiry_lines_as_posted():
    got = [parse_line(text, DAY) for text in (EXPIRED_84, LATE_84, LATE_1772, EXPIRED_21753, LATE_PUSH, DECLINED)]
    assert all(isinstance(g, Line) and g.kind == "xferevent" and g.engine == "vllm" for g in got)
    assert [g.fields for g in got if isinstance(g, Line)] == [
        {"xfer_expired": 1.0},
        {"xfer_late": 1.0},
        {"xfer_late": 1.0},
        {"xfer_expired": 1.0},
        {"xfer_late": 1.0},
        {"xfer_expired": 1.0},
    ]
    assert isinstance(got[1], Line) and got[1].ts - got[0].ts == 21
    # an unrelated line that mentions an unrecognized request is not an expiry
    assert parse_line("INFO 08-16 08:10:02 [api.py:1] Unrecognized request field ignored", DAY) == "other"


def _read(lines: list[str]) -> dict[str, float]:
    last: dict[str, float] = {}
    for _, _, samples in read_log(io.BytesIO("\n".join(lines).encode()), "p0", day=DAY).scrapes:
        last |= {s.name: s.value for s in samples}
    return last


T0 = datetime.datetime(2026, 8, 16, 9, 0, 0)


def _nixl(t: datetime.datetime, failed: int = 0, expired: int = 0, late: int = 0) -> str:
    """NIXL's reduce() as KVConnectorLogging prints it (vLLM 0.32), 6 transfers of 70 MiB."""
    return (
        f"(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [metrics.py:103] KV Transfer metrics: Num successful transfers=6, "
        "Avg xfer time (ms)=10.0, P90 xfer time (ms)=12.0, Avg post time (ms)=0.5, P90 post time (ms)=0.6, "
        "Avg MB per transfer=70.0, Throughput (MB/s)=7000.0, Avg number of descriptors=56.0, "
        f"Num failed transfers={failed}, Num KV expired reqs={expired}, Num notifs after expiry={late}"
    )


def _released(t: datetime.datetime, k: int) -> str:
    return (
        f"(Worker pid=7) WARNING {t:%m-%d %H:%M:%S} [base_worker.py:3032] Releasing expired KV blocks for request "
        f"cmpl-{k} which were retrieved by 0 remote worker(s) before lease expired."
    )


def test_metrics_line_and_request_lines_count_each_event_once():
    t1 = T0 + datetime.timedelta(seconds=10)
    # per-request lines alone: one event each
    assert _read([_released(T0, 1), _released(t1, 2), LATE_84.replace("08-16 08:09:28", f"{t1:%m-%d %H:%M:%S}")]) == {
        "kv_transfer_expired_requests_total": 2.0,
        "kv_transfer_notifications_after_expiry_total": 1.0,
    }
    # the metrics line counts the same two expiries: summed from it, the request lines not again
    last = _read([_nixl(T0), _released(t1, 1), _released(t1, 2), _nixl(t1, failed=3, expired=2, late=1)])
    assert last["kv_transfer_expired_requests_total"] == 2
    assert last["kv_transfer_notifications_after_expiry_total"] == 1
    assert last["kv_transfer_failures_total"] == 3


def _stats(t: datetime.datetime) -> str:
    """vLLM 0.32's stats line (loggers.py): the engine generates."""
    return (
        f"(APIServer pid=1) INFO {t:%m-%d %H:%M:%S} [loggers.py:259] Engine 000: Avg prompt throughput: 800.0 tokens/s, "
        "Avg generation throughput: 300.0 tokens/s, Running: 8 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 35.0%, Prefix cache hit rate: 40.0%"
    )


def _diagnose(capsys, tmp_path: Path, event: dict[str, int]) -> list[tuple[str, str]]:
    lines = []
    for k in range(60):  # 10 minutes at vLLM's 10 s interval; the event in the 50th interval
        t = T0 + datetime.timedelta(seconds=10 * k)
        lines += [_stats(t), _nixl(t, **(event if k == 50 else {}))]
    log = tmp_path / "p0.log"
    log.write_text("\n".join(lines) + "\n")
    main(["diagnose", "--log", str(log), "--date", str(DAY), "--json"])
    result = json.loads(capsys.readouterr().out)
    every = ([result["likely_cause"]] if result.get("likely_cause") else []) + result.get("competing", [])
    every += result.get("other", [])
    return [(f["rule_id"], f["severity"]) for f in every if f["severity"] in ("warning", "critical")]


def test_healthy_nixl_log_is_quiet(capsys, tmp_path):
    assert _diagnose(capsys, tmp_path, {}) == []


def test_read_after_expiry_is_critical(capsys, tmp_path):
    assert _diagnose(capsys, tmp_path, {"late": 1, "expired": 1}) == [("pd_kv_transfer_failing", "critical")]


def test_failed_transfers_while_generating_are_critical(capsys, tmp_path):
    assert _diagnose(capsys, tmp_path, {"failed": 2}) == [("pd_kv_transfer_failing", "critical")]


def test_expiry_alone_is_a_warning(capsys, tmp_path):
    assert _diagnose(capsys, tmp_path, {"expired": 1}) == [("pd_kv_transfer_failing", "warning")]
