"""Sizing calculator: 002's formulas with the working shown (kvscope.diagnoser.sizing).

With a source, the fleet section's C_max and usable RPS start from the measured operating curve
(ui/operating.py `measured_sizing`, `kvscope curve`'s numbers); the user can type over them.
"""

from __future__ import annotations

import math

import streamlit as st

from kvscope.core.objectives import ObjectiveSet
from kvscope.diagnoser import sizing
from kvscope.diagnoser.curve.report import PoolCurve, pool_name
from kvscope.ui.operating import MeasuredSizing, fleet_ttft, measured_sizing, pool_objectives

GB = 1e9
TYPED_C_MAX, TYPED_USABLE = 48.0, 12.0
"""The calculator's own example values, used where no curve gives a C_max."""


def render(
    curves: list[PoolCurve] | None = None, source: str = "", error: str = "", objectives: ObjectiveSet | None = None
) -> None:
    """`curves`: the source's measured curves (None: no source); `error`: why they could not be read;
    `objectives`: what C_max is judged at (`kvscope ui --objectives/--slo-*`; None: the defaults)."""
    st.title("Sizing calculator")
    st.caption(
        "Pure arithmetic from Sizing LLM Inference for Production §2, §6.5, §8.3 and §9.4. "
        "KV bytes per token is computed from first "
        "principles (2 × layers × KV heads × head dim × bytes), not from the documents' rounded figures."
    )
    memory_section()
    fleet_section(curves, source, error, objectives)
    queue_section()
    pd_section()


def memory_section() -> None:
    st.header("Memory floor and KV cache (Sizing LLM Inference for Production §2)")
    c = st.columns(4)
    params_b = c[0].number_input("Parameters (billions)", 0.1, 2000.0, 70.0, key="params_b")
    wdtype = c[1].selectbox("Weight dtype", list(sizing.BYTES_PER_DTYPE), index=1, key="wdtype")
    kvdtype = c[2].selectbox("KV cache dtype", list(sizing.BYTES_PER_DTYPE), index=1, key="kvdtype")
    gpu_gb = c[3].number_input("GPU memory (GB)", 1.0, 400.0, 80.0, key="gpu_gb")
    c = st.columns(4)
    layers = c[0].number_input("Layers", 1, 512, 80, key="layers")
    kv_heads = c[1].number_input("KV heads (not attention heads)", 1, 256, 8, key="kv_heads")
    head_dim = c[2].number_input("Head dim", 1, 1024, 128, key="head_dim")
    headroom = c[3].slider("Headroom", 0.0, 1.0, 0.3, 0.05, key="headroom")
    c = st.columns(3)  # type: ignore[assignment]  # streamlit types columns(n) as an n-tuple
    context = c[0].number_input("P95 context (tokens)", 1, 2_000_000, 8000, key="context")
    concurrency = c[1].number_input("Peak concurrency", 1, 100_000, 50, key="concurrency")
    activations_gb = c[2].number_input("Activations (GB)", 0.0, 1000.0, 0.0, key="activations_gb")
    try:
        kv = sizing.kv_bytes_per_token(layers, kv_heads, head_dim, sizing.dtype_bytes(kvdtype))
        budget = sizing.memory_budget(
            weights=sizing.weights_bytes(params_b * 1e9, sizing.dtype_bytes(wdtype)),
            kv_per_token=kv,
            context_tokens=context,
            concurrency=concurrency,
            gpu_memory=gpu_gb * GB,
            activations=activations_gb * GB,
            headroom=headroom,
        )
    except sizing.SizingError as exc:
        st.error(str(exc))
        return
    m = st.columns(4)
    m[0].metric("KV bytes / token", f"{kv:,.0f}")
    m[1].metric("Total memory", f"{budget.total_bytes / GB:,.1f} GB")
    m[2].metric("Minimum GPUs", budget.min_gpus)
    m[3].metric("With headroom", budget.recommended_gpus)
    st.caption(
        f"2 × {layers} × {kv_heads} × {head_dim} × {sizing.dtype_bytes(kvdtype):g} B = {kv:,.0f} B/token. "
        f"Weights {budget.weights_bytes / GB:,.1f} GB + KV {budget.kv_bytes / GB:,.1f} GB + activations "
        f"{budget.activations_bytes / GB:,.1f} GB + overhead {budget.overhead_bytes / GB:,.1f} GB "
        "(5 % of VRAM per GPU, Sizing LLM Inference for Production §2.4)."
    )


def measured(
    curves: list[PoolCurve] | None, source: str, error: str, objectives: ObjectiveSet
) -> tuple[MeasuredSizing | None, str]:
    """The measured C_max and usable RPS of the pool the user picks at its objectives (the TTFT
    input over them where changed: `pool_objectives`), and a key suffix so the inputs start again
    from the measurement when the pool or the SLO changes. Says where the numbers come from."""
    if error:
        st.warning(f"The measured curve could not be read ({error}): C_max and usable RPS are typed values.")
        return None, ""
    if curves is None:
        st.caption("No source: C_max and usable RPS are typed values (start kvscope ui with a source to measure them).")
        return None, ""
    if not curves:
        st.caption(f"{source} has no operating curve (no engine_requests_running): C_max and usable RPS are typed.")
        return None, ""
    c = st.columns(2)
    names = [pool_name(pc) for pc in curves]
    name = c[0].selectbox("Measured pool", names, key="sizing_pool") if len(names) > 1 else names[0]
    slo = c[1 if len(names) > 1 else 0].number_input(
        "TTFT p99 SLO (s) for C_max", 0.001, 3600.0, fleet_ttft(objectives), key="sizing_slo"
    )
    pc = curves[names.index(name)]
    own = pool_objectives(objectives, pc, float(slo))
    found = measured_sizing(pc, own.ttft if own.ttft is not None else float(slo), source, own)
    st.info(found.provenance)
    return found, f"{name}@{slo:g}"


def _same(typed: tuple, measured_: tuple) -> bool:
    return all(m is not None and math.isclose(t, m, rel_tol=1e-6) for t, m in zip(typed, measured_, strict=True))


def fleet_section(
    curves: list[PoolCurve] | None = None, source: str = "", error: str = "", objectives: ObjectiveSet | None = None
) -> None:
    st.header("Fleet size with a Little's Law check (Sizing LLM Inference for Production §8.3)")
    found, suffix = measured(curves, source, error, objectives or ObjectiveSet())
    usable_0 = found.usable_rps if found and found.usable_rps is not None else TYPED_USABLE
    c_max_0 = found.c_max if found and found.c_max is not None else TYPED_C_MAX
    c = st.columns(6)
    peak = c[0].number_input("Peak RPS", 0.01, 1e6, 120.0, key="peak")
    usable = c[1].number_input("Usable RPS / instance at C_max", 0.001, 1e5, usable_0, key=f"usable{suffix}")
    tp = c[2].number_input("TP degree", 1, 64, 4, key="tp")
    safety = c[3].number_input("Safety factor", 1.0, 3.0, 1.3, key="safety")
    c_max = c[4].number_input("C_max (concurrency at SLO)", 0.001, 1e5, c_max_0, key=f"c_max{suffix}")
    if found and found.c_max is not None and not _same((c_max, usable), (found.c_max, found.usable_rps)):
        st.caption(
            f"Overridden: typed C_max {c_max:g} and usable RPS {usable:g} "
            f"(measured {found.c_max:g} and {found.usable_rps:.2f})."
        )
    latency = c[5].number_input("Average latency (s)", 0.001, 3600.0, 2.0, key="latency")
    fleet = sizing.fleet_size(
        peak_rps=peak,
        usable_rps_per_instance=usable,
        tp_degree=tp,
        safety_factor=safety,
        c_max=c_max,
        avg_latency_s=latency,
    )
    m = st.columns(3)
    m[0].metric("Instances", fleet.instances)
    m[1].metric("GPUs", fleet.total_gpus)
    m[2].metric(
        "Little's Law ceiling",
        f"{fleet.little_ceiling_rps:,.1f} RPS",
        f"gap {fleet.little_gap:.2f}×",
        delta_color="off",
    )
    if fleet.benchmark_trustworthy:
        st.success(f"Gap {fleet.little_gap:.2f}× ≤ 2×: the benchmark reflects production conditions.")
    else:
        st.warning(
            f"Gap {fleet.little_gap:.2f}× > 2×: the benchmark inputs do not match production "
            "(prompt lengths or arrival pattern). Fix the benchmark before sizing."
        )


def queue_section() -> None:
    st.header("Maximum queue depth (Sizing LLM Inference for Production §9.4)")
    c = st.columns(2)
    wait = c[0].number_input("Acceptable queue wait (s)", 0.01, 3600.0, 2.0, key="wait")
    arrival = c[1].number_input("Arrival rate (RPS)", 0.01, 1e6, 50.0, key="arrival")
    limit = sizing.max_queue_depth(max_wait_s=wait, arrival_rps=arrival)
    st.metric("Maximum safe queue depth", f"{limit.max_depth:,.0f}")
    st.caption(f"Circuit breaker at 80–90 %: {limit.breaker_low}–{limit.breaker_high} queued requests.")


def pd_section() -> None:
    st.header("Prefill : decode ratio (Sizing LLM Inference for Production §6.5)")
    c = st.columns(5)
    rps = c[0].number_input("Peak RPS", 0.01, 1e6, 10.0, key="pd_rps")
    isl = c[1].number_input("Avg input tokens", 1.0, 1e7, 4000.0, key="isl")
    ptp = c[2].number_input("Prefill tok/s/GPU", 1.0, 1e8, 20000.0, key="ptp")
    osl = c[3].number_input("Avg output tokens", 1.0, 1e7, 200.0, key="osl")
    dtp = c[4].number_input("Decode tok/s/GPU", 1.0, 1e8, 250.0, key="dtp")
    pd_ = sizing.pd_ratio(
        peak_rps=rps,
        avg_input_tokens=isl,
        prefill_tokens_per_s_per_gpu=ptp,
        avg_output_tokens=osl,
        decode_tokens_per_s_per_gpu=dtp,
    )
    m = st.columns(3)
    m[0].metric("P:D ratio", pd_.render_ratio())
    m[1].metric("Prefill GPUs", f"{pd_.prefill_gpus:,.1f}")
    m[2].metric("Decode GPUs", f"{pd_.decode_gpus:,.1f}")
    if isl < 500:
        st.info(
            "Prompts under ~500 tokens: Sizing LLM Inference for Production §6.5 suggests chunked prefill "
            "on a colocated system instead."
        )
