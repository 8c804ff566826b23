"""The tap as an agent collector: config section, lazy start, its series, and the fairness derive hook over them."""

import asyncio
import types

import aiohttp
import pytest

from kvscope.agent.config import ConfigError, build_config
from kvscope.agent.derive.fairness import fairness_hook
from kvscope.agent.tap.collector import TapCollector, parse_tap_config
from tests.unit.test_tap_proxy import Stub


def test_section_validation_names_the_key():
    assert parse_tap_config({"upstreams": "http://e:8000"})["tap"].upstreams == ("http://e:8000",)
    for raw, key in (
        ({"upstreams": []}, "tap.upstreams"),
        ({"upstreams": ["x"], "lsten": 1}, "unknown keys"),
        ({"upstreams": ["http://e"], "listen": "nope"}, "tap.listen"),
    ):
        with pytest.raises(ConfigError, match=key):
            parse_tap_config(raw)


def test_collector_is_inert_without_a_section():
    coll = asyncio.run(TapCollector(types.SimpleNamespace(extensions={})).collect())
    assert coll.samples == [] and coll.health == []


def test_collector_serves_and_reports_tenant_and_fairness_series():
    async def main():
        stub = Stub()
        await stub.start()
        cfg = build_config(
            {"tap": {"upstreams": [f"http://127.0.0.1:{stub.port}"], "listen": "127.0.0.1:0"}}, environ={}
        )
        c = TapCollector(cfg)
        try:
            first = await c.collect()
            async with aiohttp.ClientSession() as s:
                for _ in range(6):
                    async with s.post(
                        f"http://127.0.0.1:{c.tap.port}/v1/completions",
                        json={"model": "m", "prompt": "shared prefix " * 20, "user": "acme"},
                    ) as r:
                        await r.read()
            second = await c.collect()
        finally:
            await c.close()
            await stub.runner.cleanup()
        return first, second

    first, second = asyncio.run(main())
    assert first.health[0].up
    hook = fairness_hook(300.0)  # what the agent runtime runs over each cycle
    derived = hook(first.samples) + hook(second.samples)
    by = {(s.name, s.label("tenant")): s.value for s in second.samples + derived}
    assert by[("tenant_requests_total", "acme")] == 6
    assert by[("tenant_prefix_hit_ratio", "acme")] == pytest.approx(8 / 12)
    assert ("fleet_tenant_hit_jain_ratio", None) in by
