"""`kvscope serve`: the Alertmanager webhook receiver that attaches a diagnosis to every alert.

Endpoints, status codes and the enriched payload: docs/alerting.md. `workers` tasks diagnose
webhooks in arrival order through the fleet path (diagnoser/pushdown/run.py), each within
`diagnosis_timeout_s` (every Prometheus read inside it ends by then too); a bad webhook is a 400,
a failed or timed-out diagnosis or forward is recorded on the stored row and the worker takes the
next one; nothing raises into the event loop. A webhook whose data could not be read is stored and
forwarded `not_diagnosed`, never as an all-clear. The queue holds row ids (payloads stay in the
store until their diagnosis starts); every store read and write, and every JSON encoding of a
stored payload, runs on a thread, so /-/healthy answers while a large listing is built. It answers
503 while a diagnosis thread runs on past its deadline (wedged), or a worker stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvscope.core.net import lookups, printable
from kvscope.core.resolve import Connector, daemon_call
from kvscope.diagnoser.alertmanager.payload import (
    MAX_ALERTS,
    NO_DATA_HEADLINE,
    NOT_DIAGNOSED,
    Alert,
    WebhookError,
    diagnosis_window,
    instance_places,
    not_diagnosed,
    parse_alert,
    parse_webhook,
    row_status,
    select_findings,
    window_status,
)
from kvscope.diagnoser.alertmanager.store import DiagnosisStore
from kvscope.diagnoser.findings import Diagnosis
from kvscope.diagnoser.routing import SIGNALS as ROUTER_SIGNALS
from kvscope.diagnoser.routing import router_decisions
from kvscope.diagnoser.rulebook.levers import load_levers
from kvscope.diagnoser.rulebook.rule import Rule, read_rules
from kvscope.diagnoser.sources import SourceError
from kvscope.diagnoser.sources.prometheus import PrometheusSource, scope_to_pool
from kvscope.diagnoser.sources.window import Span, read_window

if TYPE_CHECKING:
    from kvscope.diagnoser.curve.report import PoolCurve

log = logging.getLogger("kvscope.serve")

CHANGES_MARGIN_S = 5.0
"""The curve read for what changed ends this long before the diagnosis' deadline (findings kept)."""
MAX_PAGE = 100
"""Webhooks one GET /api/v1/diagnoses lists at most; `next` in the answer pages on."""
RETRY_AFTER_S = 10
"""Seconds a 503 for a full queue asks the sender to wait (`Retry-After`)."""
LOG_CHARS = 200
"""Characters of one outside text (a label, the webhook's status, an error) a log line keeps."""


@dataclass
class ServeConfig:
    """Settings of the webhook receiver (flags of `kvscope serve`)."""

    prometheus_url: str
    forward_url: str | None = None
    step_s: float = 15.0  # diagnosis grid step
    before_s: float = 1800.0  # diagnose from this long before the alert started
    max_window_s: float = 6 * 3600.0  # never read more than this from Prometheus
    max_body_bytes: int = 1024 * 1024
    queue_size: int = 100
    workers: int = 2  # diagnoses at once: one slow Prometheus call does not hold every alert
    diagnosis_timeout_s: float = 120.0  # one webhook's whole diagnosis, every query in it included
    query_timeout_s: float = 30.0  # one Prometheus read, connect to last byte
    wedged_after_s: float = 30.0  # a diagnosis thread this long past its deadline: /-/healthy 503
    forward_attempts: int = 3
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # rule id -> overrides


class WebhookServer:
    """The aiohttp application and its background worker."""

    def __init__(self, config: ServeConfig, store: DiagnosisStore, rules: list[Rule] | None = None) -> None:
        self.config, self.store = config, store
        self.rules = rules if rules is not None else read_rules()
        self.levers = load_levers()
        self.queue: asyncio.Queue[int] | None = None  # row ids: the payloads wait in the store
        self._admitting = 0  # webhooks being stored, their places in the queue held
        self.session: aiohttp.ClientSession | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._threads: dict[int, float] = {}  # diagnosis threads running: id -> deadline (monotonic)
        self._threads_lock = threading.Lock()
        self.counters: Counter[tuple[str, str]] = Counter()  # (metric, label value) -> count
        # client connections its listener closed unserved, by reason (set by whoever serves the app)
        self.connections_closed: Callable[[], Counter[str]] = Counter

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/api/v1/alerts", self.handle_alerts)
        app.router.add_get("/api/v1/diagnoses", self.handle_list)
        app.router.add_get("/api/v1/diagnoses/latest", self.handle_latest)
        app.router.add_get("/api/v1/diagnoses/{id}", self.handle_get)
        app.router.add_get("/-/healthy", self.handle_healthy)
        app.router.add_get("/metrics", self.handle_metrics)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    # ---------------------------------------------------------------- lifecycle
    async def _start(self, app: web.Application) -> None:
        self.queue = asyncio.Queue(maxsize=self.config.queue_size)
        for row_id in self.store.pending(self.config.queue_size):  # left over from a stop
            self.queue.put_nowait(row_id)
        self.session = aiohttp.ClientSession(connector=Connector())
        self._workers = [asyncio.create_task(self._run_worker()) for _ in range(max(1, self.config.workers))]

    async def _stop(self, app: web.Application) -> None:
        left = self.queue.qsize() if self.queue else 0
        log.info("shutting down: %d webhook(s) not yet diagnosed stay stored and are diagnosed on the next start", left)
        for worker in self._workers:
            worker.cancel()
            try:
                await worker
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - a dead worker was shown in /-/healthy
                pass
        if self.session:
            await self.session.close()

    # ---------------------------------------------------------------- handlers
    async def handle_alerts(self, request: web.Request) -> web.Response:
        try:
            response = await self._accept(request)
        except Exception:  # noqa: BLE001 - answered and counted like any other request
            log.exception("webhook request failed")
            response = _error(500, "internal error; see the receiver's log")
        self.counters["kvscope_webhook_requests_total", str(response.status)] += 1
        return response

    async def _accept(self, request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body over {self.config.max_body_bytes} bytes")
        if not self._room():  # before the body is decoded: a storm of webhooks costs no parse
            return _error(503, "diagnosis queue full; retry later", {"Retry-After": str(RETRY_AFTER_S)})
        try:
            doc = await asyncio.to_thread(parse_webhook, body)
        except WebhookError as exc:
            return _error(400, str(exc))
        if not self._room():
            return _error(503, "diagnosis queue full; retry later", {"Retry-After": str(RETRY_AFTER_S)})
        self._admitting += 1  # its place in the queue is held while it is stored
        try:
            row_id = await asyncio.to_thread(self.store.add, doc)
        finally:
            self._admitting -= 1
        assert self.queue is not None
        self.queue.put_nowait(row_id)
        status = shown(doc.get("status", "?"))
        log.info("webhook %s received: %d alert(s), status %s", row_id, len(doc["alerts"]), status)
        return web.json_response({"id": row_id, "status": "pending"})

    def _room(self) -> bool:
        """The queue has a place for one more webhook, counting those being stored now."""
        assert self.queue is not None
        return self.queue.qsize() + self._admitting < self.queue.maxsize

    async def handle_list(self, request: web.Request) -> web.Response:
        """A page of at most MAX_PAGE webhooks, newest first, each with a bounded summary; `next`
        (when more may follow) is the address of the next page (`before=<the last id>`)."""
        try:
            limit = min(max(int(request.query.get("limit", "50")), 1), MAX_PAGE)
            before = _row_id(request.query["before"]) if "before" in request.query else None
        except ValueError:
            return _error(400, "limit and before must be integers (before: a diagnosis id)")
        alertname = request.query.get("alertname")

        def page() -> str:
            rows = self.store.list(limit, alertname, before)
            answer: dict[str, Any] = {"diagnoses": rows}
            if len(rows) == limit:
                query = {
                    "limit": str(limit),
                    "before": str(rows[-1]["id"]),
                    **({"alertname": alertname} if alertname else {}),
                }
                answer["next"] = str(request.url.relative().with_query(query))
            return json.dumps(answer)

        return _json(await asyncio.to_thread(page))

    async def handle_get(self, request: web.Request) -> web.Response:
        try:
            row_id = _row_id(request.match_info["id"])
        except ValueError:
            return _error(400, "id must be an integer from 0 to 2^63-1")
        text = await asyncio.to_thread(self.store.get_json, row_id)
        return _json(text) if text is not None else _error(404, "no such diagnosis")

    async def handle_latest(self, request: web.Request) -> web.Response:
        """The stable address of an alert's diagnosis: `?alertname=X&label.instance=Y...` gives the
        newest stored diagnosis of that alert with those labels (what a generated alert's
        runbook_url leads the triage page to; diagnoser/promql/runbooklinks.py)."""
        alertname = request.query.get("alertname", "")
        if not alertname:
            return _error(400, "alertname is required (e.g. ?alertname=LlmTtftSloBurnRate&label.instance=host:8000)")
        labels = {k[len("label.") :]: v for k, v in request.query.items() if k.startswith("label.") and v}
        if len(labels) > 64:
            return _error(400, "at most 64 label.<name> parameters")

        def find() -> str | None:
            row = self.store.latest(alertname, labels)
            return None if row is None else json.dumps(row)

        text = await asyncio.to_thread(find)
        return _json(text) if text else _error(404, f"no stored diagnosis of {alertname} with those labels")

    async def handle_healthy(self, request: web.Request) -> web.Response:
        if any(worker.done() for worker in self._workers):
            return web.Response(status=503, text="a diagnosis worker stopped; see the log\n")
        wedged = self.wedged()
        if wedged:
            return web.Response(
                status=503,
                text=f"{wedged} diagnosis thread(s) still running more than {self.config.wedged_after_s:g} s "
                f"past their {self.config.diagnosis_timeout_s:g} s deadline (wedged); see the log\n",
            )
        return web.Response(text="ok\n")

    def wedged(self) -> int:
        """How many diagnosis threads run on more than `wedged_after_s` past their deadline."""
        now = time.monotonic()
        with self._threads_lock:
            return sum(now > deadline + self.config.wedged_after_s for deadline in self._threads.values())

    async def handle_metrics(self, request: web.Request) -> web.Response:
        try:
            stored: int | None = await asyncio.to_thread(self.store.count)
        except sqlite3.Error:  # a broken store: the counters still answer, the gauge is absent
            stored = None
        return web.Response(
            text=render_metrics(
                self.counters, self.queue.qsize() if self.queue else 0, stored, self.connections_closed()
            ),
            content_type="text/plain",
            charset="utf-8",
        )

    # ---------------------------------------------------------------- work
    async def _run_worker(self) -> None:
        assert self.queue is not None
        while True:
            row_id = await self.queue.get()
            try:
                await self._work(row_id)
            except Exception:  # noqa: BLE001 - one bad webhook must not stop the worker
                log.exception("diagnosis %s: could not be stored or forwarded", row_id)
                self.counters["kvscope_webhook_diagnoses_total", "error"] += 1
            finally:
                self.queue.task_done()

    async def _work(self, row_id: int) -> None:
        """One webhook: read from the store, diagnosed within the deadline, stored, forwarded. A
        diagnosis given up (timeout) or failed is stored and forwarded as `not_diagnosed` / `error`
        with its reason on every alert, never as an all-clear."""
        doc = await asyncio.to_thread(self.store.payload, row_id)
        if doc is None:
            log.warning("diagnosis %s: its webhook is no longer stored; skipped", row_id)
            return
        limit = self.config.diagnosis_timeout_s
        try:
            # reads end a second after the diagnosis is given up, so that its thread ends too
            enriched = await asyncio.wait_for(self.enrich(doc, time.monotonic() + limit + 1.0), limit)
            status = row_status(enriched)
            result = "done" if status == "done" else NOT_DIAGNOSED
        except TimeoutError:
            why = f"the diagnosis did not finish within {limit:g} s (Prometheus slow or stalled?)"
            log.warning("diagnosis %s: %s; not diagnosed", row_id, why)
            enriched, status, result = _unread(doc, why, NOT_DIAGNOSED), NOT_DIAGNOSED, "timeout"
        except Exception as exc:  # noqa: BLE001 - one bad webhook must not stop the worker
            log.exception("diagnosis %s failed", row_id)
            why = f"internal error: {type(exc).__name__}: {printable(exc, 500)}"
            enriched, status, result = _unread(doc, why, "error"), "error", "error"
        self.counters["kvscope_webhook_diagnoses_total", result] += 1
        await asyncio.to_thread(self.store.update, row_id, enriched, status)
        if self.config.forward_url:
            outcome = await self.forward(row_id, enriched)
            await asyncio.to_thread(self.store.set_forward, row_id, outcome)
            self.counters["kvscope_webhook_forwards_total", outcome.split(" ")[0]] += 1

    async def _in_thread(self, deadline: float | None, fn: Any, *args: Any) -> Any:
        """fn(*args) on a thread, registered until it returns (a thread cannot be cancelled: one
        that runs on long past `deadline` shows in /-/healthy)."""

        def run() -> Any:
            key = threading.get_ident()
            with self._threads_lock:
                self._threads[key] = deadline if deadline is not None else float("inf")
            try:
                return fn(*args)
            finally:
                with self._threads_lock:
                    self._threads.pop(key, None)

        # a thread of its own, not the loop's shared pool: a wedged diagnosis must not take a slot
        # that later diagnoses and the other handlers' store reads wait for
        return await daemon_call(run, name="kvscope-diagnosis")

    async def enrich(self, doc: dict[str, Any], deadline: float | None = None) -> dict[str, Any]:
        """The webhook with a `kvscope` object on every alert; Prometheus reads end by `deadline`
        (time.monotonic())."""
        now = time.time()
        cache: dict[tuple[float, float], tuple[dict[str, Any], list[str]]] = {}
        alerts = []
        for i, raw in enumerate(doc["alerts"]):
            if i >= MAX_ALERTS:
                alerts.append({**raw, "kvscope": {"status": "truncated"}})
                continue
            alert = parse_alert(raw, i)
            started = time.monotonic()
            if alert.status == "resolved":
                alerts.append({**raw, "kvscope": {"status": "resolved"}})
            else:
                alerts.append({**raw, "kvscope": await self._diagnose_alert(alert, now, cache, deadline)})
            _log_alert(alert, alerts[-1]["kvscope"], time.monotonic() - started)
        return {**doc, "alerts": alerts, "kvscope_version": 1}

    async def _diagnose_alert(
        self, alert: Alert, now: float, cache: dict, deadline: float | None = None
    ) -> dict[str, Any]:
        window = diagnosis_window(alert, now, self.config.before_s, self.config.max_window_s)
        window = (_floor(window[0], self.config.step_s), _floor(window[1], self.config.step_s))
        # the alert's pool from its own labels (the model, else the model its instance serves, from
        # the TSDB's index): its changes are read while the fleet path runs, not after it
        model = alert.labels.get("model")
        pool = (model, None if model else alert.labels.get("instance"))
        if (window, pool) not in cache:
            cache[window, pool] = asyncio.ensure_future(self._changes(*window, deadline, *pool))
        # the fleet path for the alert's place only (its findings there are the whole fleet's)
        place = tuple(sorted(alert.place().items()))
        if ("fleet", window, place) not in cache:
            cache["fleet", window, place] = await self._diagnose_window(*window, deadline=deadline, place=dict(place))
        fleet, routers, places, errors = cache["fleet", window, place]
        curves, change_errors, scope = await cache[window, pool]
        if fleet is None:  # Prometheus could not be read: said first, never an empty all-clear
            return not_diagnosed("; ".join(errors), alert.labels.get("rule_id"), list(window))
        if curves is not None:
            fleet, change_errors = _with_changes(fleet, curves, window)
        diagnosis = {**fleet.to_dict(), **routers}
        out = select_findings(diagnosis, alert, places)
        out["changes_read"] = scope
        status = window_status(diagnosis)
        if status == "no_data" and not out["findings"]:
            out["headline"] = NO_DATA_HEADLINE
        return {"status": status, "window": list(window), **out, "errors": errors + change_errors}

    async def _diagnose_window(
        self, start: float, end: float, deadline: float | None = None, place: dict[str, str] | None = None
    ) -> tuple[Diagnosis | None, dict[str, Any], dict[str, dict[str, str]], list[str]]:
        """(diagnosis, its routers' decisions, instance places, errors) of the fleet path over the
        window, for `place` only (`diagnose_fleet`: its findings there are the whole fleet's);
        no diagnosis when Prometheus could not be read (errors say why)."""
        from kvscope.diagnoser.pushdown.run import diagnose_fleet

        source = PrometheusSource(self.config.prometheus_url, timeout_s=self.config.query_timeout_s)
        source.client.deadline = deadline
        step = self.config.step_s
        try:
            args = (self.rules, self.config.params, None, self.levers, source.description, source.catalog, place)
            result, report = await self._in_thread(deadline, diagnose_fleet, source.client, start, end, step, *args)
            # the fleet path's frame holds only candidates' evidence: the routers are read apart
            routers = await self._in_thread(deadline, read_window, source, ROUTER_SIGNALS, Span(start, end), step)
        except SourceError as exc:
            return None, {}, {}, [str(exc)]
        parts = report.fetched.parts if report.fetched else []
        places = instance_places(
            [dict(lbl) for _, part in parts for block in part.blocks.values() for lbl in block.labels]
        )
        return result, {"routers": router_decisions(routers)}, places, []

    async def _changes(
        self,
        start: float,
        end: float,
        deadline: float | None,
        model: str | None = None,
        instance: str | None = None,
    ) -> tuple[list[PoolCurve] | None, list[str], str]:
        """The curves with what changed in the window and its effect at matched load, for the
        pools of `model` only when the alert's place names one, or of the model `instance` serves
        (its engines from the TSDB's index; every pool when neither is known): an alert is about
        one place, and one model's engines are a fraction of a fleet's. Where the TSDB keeps the
        curve's records (kvscope-curve.yml) over the window, read from them
        (`curve.recorded.recorded_curves`, as `kvscope curve --recorded`); else from the curve's
        signals of every engine of the pool, by the one function `kvscope diagnose` and the UI use
        (`curve.report.window_curves`, what `with_changes` attaches). Read on a thread of its own
        while the fleet path runs; its reads end CHANGES_MARGIN_S before the diagnosis' own
        deadline, so a slow curve read (or a fault in the curve) costs the changes (None, said in
        `errors`), never the findings. Third: which pools were read, in words."""
        from kvscope.diagnoser.curve.recorded import recorded_interval, recorded_pool_curves
        from kvscope.diagnoser.curve.report import window_curves

        source = PrometheusSource(self.config.prometheus_url, timeout_s=self.config.query_timeout_s)
        source.client.deadline = None if deadline is None else deadline - 1.0 - CHANGES_MARGIN_S

        def read() -> tuple[list[PoolCurve], str]:
            scope = scope_to_pool(source, model, instance, start, end)
            interval = recorded_interval(source.client, start, end)
            if interval is not None:
                return recorded_pool_curves(source, start, end, interval), f"{scope}, from the curve's records"
            return window_curves(source, start, end, self.config.step_s), scope

        try:
            got, scope = await self._in_thread(deadline, read)
        except SourceError as exc:
            return None, [f"what changed in the window could not be read: {exc}"], "none"
        except Exception as exc:  # noqa: BLE001 - a fault in the curve costs the changes, not the findings
            log.exception("what changed in [%s, %s] could not be computed", start, end)
            why = f"what changed in the window could not be computed: {type(exc).__name__}: {exc}"
            return None, [why], "none"
        return got, [], scope

    async def forward(self, row_id: int, payload: dict[str, Any]) -> str:
        """POST the enriched payload; returns what happened (stored on the row)."""
        assert self.session is not None and self.config.forward_url
        body = await asyncio.to_thread(json.dumps, {"kvscope_id": row_id, **payload})
        last = ""
        for attempt in range(self.config.forward_attempts):
            try:
                async with self.session.post(
                    self.config.forward_url,
                    data=body,
                    headers={"Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as resp:
                    if resp.status < 300:
                        return f"ok {resp.status}"
                    last = f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.5 * 2**attempt)
        log.warning("forward of %s to %s failed: %s", row_id, self.config.forward_url, last)
        return f"failed after {self.config.forward_attempts} attempts: {last}"


CLOSED_METRIC = "kvscope_connections_closed_total"
_METRICS = {
    "kvscope_webhook_requests_total": ("code", "Webhook POSTs by HTTP status answered."),
    "kvscope_webhook_diagnoses_total": (
        "result",
        "Webhooks diagnosed (done), not diagnosed for a source not read (not_diagnosed), "
        "failed (error) or timed out (timeout).",
    ),
    "kvscope_webhook_forwards_total": ("result", "Enriched payloads forwarded (ok) or given up (failed)."),
    CLOSED_METRIC: ("reason", "Client connections the listener closed unserved, by reason (agent/serve/limits.py)."),
}


def render_metrics(
    counters: Counter[tuple[str, str]], queued: int, stored: int | None, closed: Counter[str] | None = None
) -> str:
    """The receiver's own metrics in Prometheus text format 0.0.4, written by prometheus_client;
    `closed`: connections its listener closed unserved, by reason (agent/serve/limits.py), as the
    agent exports them; the name lookups of its Prometheus reads (core/net.py
    `lookups`: a resolver that never answers shows as abandoned lookups that stay in flight)."""
    counters = counters + Counter({(CLOSED_METRIC, reason): n for reason, n in (closed or Counter()).items()})
    families: list[Metric] = []
    for name, (label, help_) in _METRICS.items():
        family = CounterMetricFamily(name, help_, labels=[label])
        for (metric, value), n in sorted(counters.items()):
            if metric == name:
                family.add_metric([value], n)
        families.append(family)
    families.append(GaugeMetricFamily("kvscope_webhook_queue_length", "Webhooks waiting for diagnosis.", queued))
    resolver = lookups()
    abandoned = "Name lookups given up at a read's deadline, left to the resolver."
    families.append(CounterMetricFamily("kvscope_resolve_abandoned_total", abandoned, resolver.abandoned_total))
    in_flight = f"Name lookups waiting on the resolver now (at most {resolver.limit})."
    families.append(GaugeMetricFamily("kvscope_resolve_in_flight", in_flight, resolver.in_flight))
    if stored is not None:
        families.append(GaugeMetricFamily("kvscope_webhook_stored", "Diagnoses kept in the store.", stored))
    return generate_latest(_Families(families)).decode("utf-8")


class _Families(Collector):
    """One exposition's metric families, for prometheus_client's writer."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def shown(text: object, limit: int = LOG_CHARS) -> str:
    """Outside text (an alert's labels, a webhook's fields, an error that may echo them) as a log
    line may carry it: control characters and escape sequences shown as `?`, on one line
    (`printable`), a lone surrogate as U+FFFD, at most `limit` characters."""
    return printable(text, limit).encode("utf-8", "replace").decode("utf-8")


def _log_alert(alert: Alert, answer: dict[str, Any], seconds: float) -> None:
    """One line per alert: its name and place, what kvscope made of it, and how long it took;
    every outside text in it through `shown`."""
    name = shown(alert.labels.get("alertname", "?"))
    place = ",".join(f"{shown(k, 60)}={shown(v)}" for k, v in sorted(alert.place().items())) or "fleet"
    status = answer.get("status", "?")
    likely = (answer.get("likely_cause") or {}).get("rule_id", "-")
    errors = [shown(e, 500) for e in answer.get("errors") or []]
    level = logging.WARNING if errors else logging.INFO
    log.log(
        level,
        "alert %s {%s}: %s, likely cause %s, %.2f s%s",
        name,
        place,
        status,
        likely,
        seconds,
        f", error: {'; '.join(map(str, errors))}" if errors else "",
    )


def _unread(doc: dict[str, Any], why: str, status: str) -> dict[str, Any]:
    """The webhook as stored and forwarded when its diagnosis was given up or failed: every firing
    alert `not_diagnosed` (or `error`) with the reason in its headline, the reason on the payload.
    `doc` passed `parse_webhook` when it was received (its alerts objects, their labels too)."""

    def kvscope(i: int, alert: dict[str, Any]) -> dict[str, Any]:
        if i >= MAX_ALERTS:
            return {"status": "truncated"}
        if alert.get("status") != "firing":
            return {"status": "resolved"}
        return {**not_diagnosed(why, alert["labels"].get("rule_id")), "status": status}

    alerts = [{**a, "kvscope": kvscope(i, a)} for i, a in enumerate(doc["alerts"])]
    return {**doc, "alerts": alerts, "kvscope_error": why, "kvscope_version": 1}


def _with_changes(
    diagnosis: Diagnosis, curves: list[PoolCurve], window: tuple[float, float]
) -> tuple[Diagnosis, list[str]]:
    """The diagnosis with the curves' changes attached (`curve.report.attach`), and the error when
    that failed: a fault in the curve costs the changes, never the findings."""
    from kvscope.diagnoser.curve.report import attach

    try:
        return attach(diagnosis, curves), []
    except Exception as exc:  # noqa: BLE001 - a fault in the curve costs the changes, not the findings
        log.exception("what changed in [%s, %s] could not be computed", *window)
        return diagnosis, [f"what changed in the window could not be computed: {type(exc).__name__}: {exc}"]


def _row_id(text: str) -> int:
    """A diagnosis id from a request: an integer SQLite can hold; ValueError otherwise."""
    n = int(text)
    if not 0 <= n < 1 << 63:
        raise ValueError(f"id out of range: {text[:40]}")
    return n


def _json(text: str) -> web.Response:
    """A JSON answer encoded off the event loop (`text`, already JSON)."""
    return web.Response(text=text, content_type="application/json")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _floor(t: float, step: float) -> float:
    return float(int(t // step) * step)
