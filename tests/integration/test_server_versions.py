"""The server matrix really switches servers: each half runs the generation it names
(testbed/servers.py). Without this, a `current` half whose PATH change was lost would test
Debian 12's servers twice and pass."""

from __future__ import annotations

import pytest

from testbed import servers

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
