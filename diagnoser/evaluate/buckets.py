"""How a histogram's bucket series form groups, for quantiles on the grid (expr.py).

A grouping (`by` labels plus `le`) turns bucket rows into groups with sorted bounds; quantiles
need, per group, the row of each bucket in bound order, and the bucket counters themselves
(the block's rows, or their sums when several series fall into one group).
"""

from __future__ import annotations

import numpy as np

from kvscope.diagnoser.evaluate import grid


def bucket_layout(
    keys: list[tuple[str, ...]], inv: np.ndarray, adj: np.ndarray, n_by: int
) -> tuple[list, np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """(groups, cumulative bucket counters per key, [(les, group indices, rows [G, buckets])]).

    With one series per (group, le) key the counters are the block's own rows; otherwise the
    rows of a key are summed (grid.sum_dense_groups). Groups with too few buckets or no +Inf
    bucket are in no set (their quantiles stay absent)."""
    if len(keys) == adj.shape[0]:
        source, key_rows = adj, np.empty(len(keys), dtype=np.int64)
        key_rows[inv] = np.arange(len(keys))
    else:
        source, key_rows = grid.sum_dense_groups(adj, inv, len(keys)), np.arange(len(keys))
    groups, key_sets = group_buckets(keys, n_by)
    sets = []
    for bounds, gis, idx in key_sets:
        rows = key_rows[idx]
        # groups in the order of their rows: a bucket's rows are then usually evenly spaced
        # (le-major or group-major blocks alike), so planes read them in place
        order = np.argsort(rows[:, 0], kind="stable")
        sets.append((bounds, gis[order], rows[order]))
    return groups, source, sets


def group_buckets(
    keys: list[tuple[str, ...]], n_by: int
) -> tuple[list[tuple[str, ...]], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Bucket keys `(group..., le)` -> (sorted groups, [(bounds, group indices, key indices
    [G, buckets] in bound order)]), one entry per distinct bound set. Keys whose `le` is not a
    number are ignored; groups with fewer than two bounds or no +Inf bound are in no set."""
    by_group: dict[tuple[str, ...], list[tuple[float, int]]] = {}
    for i, k in enumerate(keys):
        try:
            le = float(k[n_by])
        except ValueError:
            continue
        by_group.setdefault(k[:n_by], []).append((le, i))
    groups = sorted(by_group)
    by_les: dict[tuple[float, ...], list[int]] = {}
    for gi, g in enumerate(groups):
        les = tuple(sorted(le for le, _ in by_group[g]))
        if len(les) >= 2 and np.isinf(les[-1]):
            by_les.setdefault(les, []).append(gi)
    return groups, [
        (np.array(les), np.array(gis), np.array([[i for _, i in sorted(by_group[groups[gi]])] for gi in gis]))
        for les, gis in by_les.items()
    ]
