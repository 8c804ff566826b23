"""diagnoser/routing.py on frames of our own making (the logic only; the real router recordings
are read in tests/e2e/test_ui_browser.py and tests/integration/test_alertmanager_routers.py)."""

import numpy as np

from kvscope.core.signals import make_labels
from kvscope.diagnoser.evaluate.frame import Block, Frame
from kvscope.diagnoser.routing import router_decisions, router_line

NAN = float("nan")


def _frame(**blocks: list[tuple[dict, list[float]]]) -> Frame:
    ts = np.arange(5) * 15.0
    return Frame(
        ts,
        {
            n: Block([make_labels(lbl) for lbl, _ in rows], np.array([v for _, v in rows], dtype=float))
            for n, rows in blocks.items()
        },
    )


def test_smg_branches_give_kept_given_away_and_load_only_with_a_reset():
    smg = {"instance": "smg", "job": "smg", "policy": "cache_aware"}
    frame = _frame(
        router_policy_branch_total=[
            ({**smg, "branch": "tree_match"}, [10, 20, 30, 5, 15]),  # reset after 30: 20 + 5 + 10
            ({**smg, "branch": "spill"}, [0, 1, 2, 3, 5]),
            ({**smg, "branch": "expected_wait_fallback"}, [NAN, NAN, 1, 2, 4]),
        ],
        router_decisions_total=[
            ({"instance": "smg", "job": "smg", "policy": "cache_aware", "worker": "w0"}, [0, 10, 20, 30, 40])
        ],
    )
    (row,) = router_decisions(frame)
    assert row["branches"] == {
        "cache_aware:expected_wait_fallback": 3,
        "cache_aware:spill": 5,
        "cache_aware:tree_match": 35,
    }
    assert (row["kept"], row["gave_away"], row["load_only"], row["kept_share"]) == (35, 5, 3, 0.875)
    assert row["decisions"] == {"cache_aware": 40}
    assert "prefix_tokens_kept_share" not in row
    assert "to the worker holding the prefix 88% (35 kept, 5 given away)" in router_line(row)


def test_dynamo_tokens_and_absent_series_stay_absent():
    fe = {"instance": "fe", "job": "dynamo"}
    frame = _frame(
        router_selected_cached_prefix_tokens_total=[(fe, [0, 100, 200, 300, 300])],
        router_best_cached_prefix_tokens_total=[(fe, [0, 100, 200, 400, 600])],
        router_decisions_total=[({"instance": "idle", "job": "x", "policy": "random"}, [NAN] * 5)],
    )
    assert router_decisions(frame) == [{"instance": "fe", "job": "dynamo", "prefix_tokens_kept_share": 0.5}]
    assert router_decisions(_frame()) == []
