"""Replica routing policies for the load driver (pure logic).

* `round_robin`: request i goes to replica i mod N (cache-oblivious: the thrash baseline).
* `hash_mod`: stable hash of the key mod N (sticky, but remaps ~all keys when N changes).
* `consistent_hash`: a hash ring with virtual nodes (remaps ~1/N of keys when N changes).
* `sticky_tenant`: the first request of a tenant goes to the least-assigned replica; the tenant
  stays there.
Keys are `tenant`, `session` or `prefix` strings from `Request.route_key`; hashes are blake2b so
routing is stable across processes (Python's `hash()` is salted).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools

POLICIES = ("round_robin", "hash_mod", "consistent_hash", "sticky_tenant")


def stable_hash(key: str) -> int:
    """64-bit hash, identical across processes and runs."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class Router:
    """Base: `route(key)` -> replica index in [0, n)."""

    def __init__(self, n: int) -> None:
        if n <= 0:
            raise ValueError("need at least one replica")
        self.n = n

    def route(self, key: str) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self._i = itertools.count()

    def route(self, key: str) -> int:
        return next(self._i) % self.n


class HashMod(Router):
    def route(self, key: str) -> int:
        return stable_hash(key) % self.n


class ConsistentHash(Router):
    """Ring of `vnodes` points per replica; a key goes to the first point clockwise."""

    def __init__(self, n: int, vnodes: int = 64) -> None:
        super().__init__(n)
        points = sorted((stable_hash(f"replica-{r}#{v}"), r) for r in range(n) for v in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._owners = [r for _, r in points]

    def route(self, key: str) -> int:
        i = bisect.bisect_right(self._hashes, stable_hash(key)) % len(self._hashes)
        return self._owners[i]


class StickyTenant(Router):
    """Key -> replica fixed at first sight, balancing how many keys each replica owns."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self._owner: dict[str, int] = {}
        self._load = [0] * n

    def route(self, key: str) -> int:
        r = self._owner.get(key)
        if r is None:
            r = min(range(self.n), key=lambda i: (self._load[i], i))
            self._owner[key] = r
            self._load[r] += 1
        return r


def make_router(policy: str, n: int) -> Router:
    """Build a router by policy name (one of POLICIES)."""
    classes = {
        "round_robin": RoundRobin,
        "hash_mod": HashMod,
        "consistent_hash": ConsistentHash,
        "sticky_tenant": StickyTenant,
    }
    if policy not in classes:
        raise ValueError(f"unknown routing policy {policy!r}; choose from {', '.join(POLICIES)}")
    return classes[policy](n)
