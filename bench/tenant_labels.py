"""Tenant labelling cost per request: traffic-ranked top-K (agent/tenants.py) vs first come.

The tap labels every request it measures. Measured in one run, on the same request stream:

* baseline   first come, first served: a set of admitted tenants, `other` once it is full (what
             the tap did before ranking by traffic; kept here only as the reference);
* ranked     `TenantLimiter.label`: decayed counts, heavy-hitter sketch, promotion.

Stream: `--requests` requests over `--tenants` tenants with Zipf-like shares (a few big tenants,
a long tail) that arrive in reverse order of size, so the big ones come last, mixed with
`--random-share` one-off random ids (a caller inventing tenants). Reports ns per request (CPU
time, so other load on a shared box distorts it little), the ratio to the baseline, entries held,
and the share of the top-10 tenants' requests that got their own label (the point of ranking).

    .venv/bin/python bench/tenant_labels.py --requests 1000000
"""

from __future__ import annotations

import argparse
import random
import time

from kvscope.agent.tenants import OTHER, TenantLimiter


class FirstCome:
    """The reference: the first `max_tenants` distinct tenants keep their label forever."""

    def __init__(self, max_tenants: int) -> None:
        self.max_tenants, self.admitted = max_tenants, set()

    def label(self, tenant: str) -> str:
        if tenant in self.admitted:
            return tenant
        if len(self.admitted) < self.max_tenants:
            self.admitted.add(tenant)
            return tenant
        return OTHER


def build_stream(n: int, tenants: int, random_share: float, seed: int) -> tuple[list[str], set[str]]:
    rng = random.Random(seed)
    names = [f"t{i:04d}" for i in range(tenants)]  # t0000 is the biggest
    weights = [1.0 / (i + 1) ** 1.1 for i in range(tenants)]
    out = []
    for k in range(n):
        if rng.random() < random_share:
            out.append(f"r{rng.getrandbits(48):x}")
            continue
        # small tenants are active from the start, big ones join as the stream goes on
        active = max(1, int(tenants * (1 - k / n)))
        lo = tenants - active if k < n // 2 else 0
        out.append(rng.choices(names[lo:], weights[lo:])[0])
    return out, set(names[:10])


def measure(limiter, stream: list[str], top: set[str]) -> tuple[float, float]:
    t0 = time.process_time()
    labels = [limiter.label(t) for t in stream]
    ns = (time.process_time() - t0) / len(stream) * 1e9
    second_half = range(len(stream) // 2, len(stream))
    top_reqs = [i for i in second_half if stream[i] in top]
    kept = sum(1 for i in top_reqs if labels[i] != OTHER) / max(1, len(top_reqs))
    return ns, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--tenants", type=int, default=500)
    ap.add_argument("--max-tenants", type=int, default=50)
    ap.add_argument("--random-share", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    stream, top = build_stream(args.requests, args.tenants, args.random_share, args.seed)
    base_ns, base_kept = measure(FirstCome(args.max_tenants), stream, top)
    ranked = TenantLimiter(args.max_tenants)
    ns, kept = measure(ranked, stream, top)
    print(f"requests {len(stream):,}  tenants {args.tenants}  random ids {args.random_share:.0%}  K={args.max_tenants}")
    print(f"baseline first-come   {base_ns:8.0f} ns/request   top-10 requests labelled (2nd half) {base_kept:6.1%}")
    print(
        f"ranked   TenantLimiter {ns:7.0f} ns/request   top-10 requests labelled (2nd half) {kept:6.1%}"
        f"   ratio {ns / base_ns:.1f}x   entries held {len(ranked)}   promotions {ranked.stats['promoted']}"
    )


if __name__ == "__main__":
    main()
