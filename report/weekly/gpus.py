"""Which pool each GPU serves (the engine-GPU join, else a node running one pool), and why some
GPUs cannot be attributed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvscope.diagnoser.evaluate.frame import Frame
from kvscope.report.weekly.series import Columns, columns, utilisation_signal


def pools(ss: Columns) -> np.ndarray:
    """'model / role' per sid (role defaults to unified)."""
    return ss.label("model", "unknown") + " / " + ss.label("role", "unified")


def gpu_pools(ss: Columns) -> np.ndarray:
    """The pool each series' GPU serves: via the engine-GPU join (engine_gpu_memory_used_bytes by
    gpu_uuid), else via a node that runs engines of a single pool; 'unattributed' otherwise."""
    out = np.full(len(ss.series), "unattributed", dtype=object)
    names = ss.series["name"].to_numpy()
    engine = np.array([str(n).startswith("engine_") for n in names]) & (names != "engine_gpu_memory_used_bytes")
    pool = pools(ss)
    inst_pool = dict(zip(ss.label("instance")[engine], pool[engine], strict=True))
    uuid = ss.label("gpu_uuid")
    join = names == "engine_gpu_memory_used_bytes"
    by_uuid = {u: inst_pool.get(i) for u, i in zip(uuid[join], ss.label("instance")[join], strict=True)}
    node = ss.label("node")
    node_pools: dict[str, set[str]] = {}
    for n, p in zip(node[engine], pool[engine], strict=True):
        if n:
            node_pools.setdefault(n, set()).add(p)
    for i in range(len(out)):
        p = by_uuid.get(uuid[i]) if uuid[i] else None
        if p is None and len(node_pools.get(node[i], ())) == 1:
            p = next(iter(node_pools[node[i]]))
        if p is not None:
            out[i] = p
    return out


def attribution_note(frame: Frame) -> str:
    """'' when every GPU series is attributed to a pool; else why some are not (which labels the
    source lacks) and the config that fixes it. Fleet totals count those GPUs either way."""
    ss = columns(frame)
    gpu = ss.of(utilisation_signal(ss))
    if not gpu.sid.size:
        return ""
    sids = np.unique(gpu.sid)
    lost = sids[gpu_pools(ss)[sids] == "unattributed"]
    if not lost.size:
        return ""
    uuid, node, gpu_index = ss.label("gpu_uuid"), ss.label("node"), ss.label("gpu")
    devices = {uuid[i] or f"{node[i]}/{gpu_index[i]}" for i in lost}
    nodes = sorted({node[i] for i in lost if node[i]})
    names = ss.series["name"].to_numpy()
    engine = np.array([str(n).startswith("engine_") for n in names])
    engine_nodes = {node[i] for i in np.flatnonzero(engine) if node[i]}
    why = []
    if not (names == "engine_gpu_memory_used_bytes").any():
        pods = "" if (ss.label("pod")[lost] != "").any() else "; the GPU series carry no pod/namespace labels"
        why.append(
            "no engine-GPU join (engine_gpu_memory_used_bytes) in the source (it comes from a "
            f"gpu_mapping, Kubernetes pod labels or the NVML process list{pods})"
        )
    if not engine_nodes:
        why.append("the engine series carry no node label, so a node's GPUs cannot be matched to its engines")
    elif shared := [n for n in nodes if n in engine_nodes]:
        why.append(f"{_few(shared)} run engines of more than one pool, so a node does not name the pool")
    fixes = [
        "map GPUs to engines with gpu_mapping: {<gpu_uuid>: <instance>} (the agent's config, or "
        "--gpu-mapping for this report)"
    ]
    if not engine_nodes:
        fixes.append(
            "give each engine target its node (targets: [{url: ..., labels: {node: <node>}}]; "
            "attributes a node's GPUs where it runs one pool)"
        )
    fixes.append("run dcgm-exporter with Kubernetes pod mapping and scrape engines with their pod/namespace labels")
    where = f" on {_few(nodes)}" if nodes else ""
    return (
        f"{len(devices)} GPU(s){where} are not attributed to a pool (per-pool GPU-hours, tokens per "
        f"GPU-hour and cost are absent; fleet totals count them): {'; '.join(why)}. "
        f"Fix: {', or '.join(fixes)}."
    )


def _few(names: Sequence[str], shown: int = 4) -> str:
    """'a, b, c' or 'a, b, c, d and 9 more'."""
    head = ", ".join(names[:shown])
    return head + (f" and {len(names) - shown} more" if len(names) > shown else "")
