"""The server matrix really switches servers: each half runs the generation it names
(testbed/servers.py). Without this, a `current` half whose PATH change was lost would test
Debian 12's servers twice and pass."""

from __future__ import annotations

import pytest

from kvscope.diagnoser.promql.ranges import range_text
from testbed import servers
from testbed.prometheus import promtool_test_rules

pytestmark = [pytest.mark.servers, pytest.mark.needs("prometheus", "promtool", "prometheus-alertmanager")]


def test_the_servers_on_path_are_the_generation_under_test():
    prom, tool, am = (
        servers.prometheus_version(),
        servers.prometheus_version("promtool"),
        servers.alertmanager_version(),
    )
    vm = servers.victoria_version()
    assert None not in (prom, tool, am, vm), (prom, tool, am, vm)
    if servers.generation() == "debian12":
        assert prom[:2] == tool[:2] == (2, 42)
        assert am[:2] == (0, 25)
        assert vm[:2] == (1, 79)
    else:  # sid moves: any 3.x, and the floors scripts/install-servers-current.sh checks
        assert prom[0] == tool[0] == 3
        assert am >= (0, 28)
        assert vm >= (1, 100)


def test_the_generated_ranges_read_the_same_samples_on_either_promtool(tmp_path):
    """The difference `range_text` handles (diagnoser/promql/ranges.py), on the promtool of this
    half: over 10 s samples at t = 60 s, `[20s]` holds 3 samples on 2.x ([t - r, t]) and 2 on 3.x
    ((t - r, t]); the generated `[20s1ms]` holds 3 on both."""
    plain, edged = "count_over_time(x[20s])", f"count_over_time(x[{range_text('20s')}])"
    major = servers.prometheus_version("promtool")[0]
    test = {
        "interval": "10s",
        "input_series": [{"series": "x", "values": "0 1 2 3 4 5 6 7"}],
        "promql_expr_test": [
            {
                "expr": plain,
                "eval_time": "60s",
                "exp_samples": [{"labels": "{}", "value": 3 if major == 2 else 2}],
            },
            {"expr": edged, "eval_time": "60s", "exp_samples": [{"labels": "{}", "value": 3}]},
        ],
    }
    returncode, out = promtool_test_rules(tmp_path, [test], evaluation_interval="10s")
    assert returncode == 0, out
