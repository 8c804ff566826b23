"""`kvscope serve`: Alertmanager webhook receiver that attaches a kvscope diagnosis to each alert."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import TYPE_CHECKING

from kvscope.commands._checks import check_http_url, parse_listen, parse_seconds
from kvscope.commands._common import add_command, fail
from kvscope.commands._params import add_param_flag, parse_params

if TYPE_CHECKING:
    from kvscope.agent.config import ServerLimits

QUEUE_SIZE = 100
"""Webhooks waiting for a diagnosis at most (more: 503 with Retry-After); --max-stored's floor."""

DESCRIPTION = """\
Receive Alertmanager webhooks, diagnose every firing alert's instance and time window from
Prometheus with kvscope's rule engine, store the result and serve it back:

  POST /api/v1/alerts            point an Alertmanager webhook_config here
  GET  /api/v1/diagnoses         recent webhooks with the likely cause of each alert (paged)
  GET  /api/v1/diagnoses/<id>    the enriched payload (findings, evidence, levers)
  GET  /metrics                  the receiver's own counters

The alerts come from kvscope's generated rule files (kvscope rules build; docs/alerting.md);
the diagnosis reads the engines' own series and the agent's kvscope_* series from the same
Prometheus. With --forward-url the enriched payload is POSTed on (to a chat bridge, an
incident tool, another webhook). An alert whose Prometheus could not be read is stored and
forwarded as "not diagnosed: <reason>" (status not_diagnosed), never as an all-clear.
Exit status: 1 cannot listen, 3 bad usage.

example:
  kvscope serve --prometheus http://127.0.0.1:9090 --forward-url http://127.0.0.1:8080/hook
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "serve", "Alertmanager webhook that attaches a diagnosis to alerts", DESCRIPTION)
    p.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus HTTP API base URL")
    p.add_argument("--listen", default="127.0.0.1:9465", metavar="HOST:PORT", help="address to serve on")
    p.add_argument("--forward-url", metavar="URL", help="POST every enriched payload here")
    store_help = (
        "SQLite file for the enriched webhooks, apart from the agent's history (kvscope.db); ':memory:' keeps none"
    )
    p.add_argument("--store", default="kvscope-diagnoses.db", metavar="FILE", help=store_help)
    stored_help = (
        f"keep the newest N webhooks, at least {QUEUE_SIZE} (the diagnosis queue's size: a webhook waiting "
        "for its diagnosis is never deleted)"
    )
    p.add_argument("--max-stored", type=int, default=1000, metavar="N", help=stored_help)
    p.add_argument(
        "--step",
        default="15s",
        metavar="DURATION",
        help="diagnosis grid step (what changed is read at the scrape interval Prometheus holds: docs/curve.md)",
    )
    p.add_argument("--before", default="30m", metavar="DURATION", help="diagnose from this long before the alert began")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="webhooks diagnosed at once")
    timeout_help = "one webhook's whole diagnosis, every Prometheus read in it included; later: recorded as an error"
    p.add_argument("--diagnosis-timeout", default="2m", metavar="DURATION", help=timeout_help)
    query_help = "one Prometheus read, connect to last byte; later: that read fails and the alert is not diagnosed"
    p.add_argument("--timeout", default="30s", metavar="DURATION", help=query_help)
    request_help = "a webhook's body must arrive whole within this of its head; later: 408, connection closed"
    p.add_argument("--request-timeout", default="60s", metavar="DURATION", help=request_help)
    body_help = "largest webhook body accepted; larger gets 413"
    p.add_argument("--max-body-bytes", type=int, default=1024 * 1024, metavar="N", help=body_help)
    add_param_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvscope.agent.config import ServerLimits
    from kvscope.diagnoser.alertmanager.server import ServeConfig, WebhookServer
    from kvscope.diagnoser.alertmanager.store import DiagnosisStore
    from kvscope.diagnoser.rulebook.rule import read_rules

    try:
        listen = parse_listen("--listen", args.listen)
        check_http_url("--prometheus", args.prometheus)
        if args.forward_url:
            check_http_url("--forward-url", args.forward_url, "http://127.0.0.1:8080/hook")
        params = parse_params(args.param, {r.id: r.params for r in read_rules()})
        config = ServeConfig(
            prometheus_url=args.prometheus,
            forward_url=args.forward_url,
            step_s=parse_seconds("--step", args.step),
            before_s=parse_seconds("--before", args.before),
            workers=_workers(args.workers),
            queue_size=QUEUE_SIZE,
            diagnosis_timeout_s=parse_seconds("--diagnosis-timeout", args.diagnosis_timeout),
            query_timeout_s=parse_seconds("--timeout", args.timeout),
            max_body_bytes=args.max_body_bytes,
            params=params,
        )
        limits = ServerLimits(request_timeout_s=parse_seconds("--request-timeout", args.request_timeout))
        _max_stored(args.max_stored)
    except ValueError as exc:
        return fail("serve", exc, 3)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store = DiagnosisStore(args.store, max_rows=args.max_stored)
    try:
        asyncio.run(_serve(WebhookServer(config, store), limits, *listen))
    except OSError as exc:
        return fail("serve", f"cannot listen on {args.listen}: {exc.strerror or exc}; pick another with --listen", 1)
    finally:
        store.close()
    return 0


def _max_stored(n: int) -> int:
    if n < QUEUE_SIZE:
        raise ValueError(
            f"--max-stored: at least {QUEUE_SIZE}, the diagnosis queue's size (up to {QUEUE_SIZE} webhooks wait "
            f"for their diagnosis, and the store holds each of them until it is done), got {n}"
        )
    return n


def _workers(n: int) -> int:
    if not 1 <= n <= 64:
        raise ValueError(f"--workers: between 1 and 64, got {n}")
    return n


async def _serve(server: object, limits: ServerLimits, host: str, port: int) -> None:
    from kvscope.agent.serve.site import HttpSite

    site = HttpSite(server.app(), limits, name="kvscope serve", access_log=None)  # type: ignore[attr-defined]
    bound = await site.start(host, port)
    server.connections_closed = lambda: site.closed  # type: ignore[attr-defined]
    logging.getLogger("kvscope.serve").info("listening on http://%s:%d", host, bound)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await site.stop()
