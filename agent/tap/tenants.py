"""Who sent a request, and a bounded label set for it.

The tenant comes from, in order: a configured header (e.g. `X-Tenant`), the OpenAI `user` body
field, or a hash of the API key (`key-` + 12 hex chars of SHA-256). The key itself is never kept.
Labels are bounded: the first `max_tenants` distinct tenants keep their own label and every later
one is counted as `other`, so a caller cannot blow up the series count by inventing tenants.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from typing import Any

OTHER = "other"
UNKNOWN = "unknown"
_SAFE = re.compile(r"[^A-Za-z0-9_.:@/-]")


def parse_tenant(headers: Mapping[str, str], body: Mapping[str, Any] | None, tenant_header: str | None) -> str:
    """The tenant id of one request (pure). `unknown` when nothing identifies the caller."""
    if tenant_header and (v := headers.get(tenant_header)):
        return _clean(v)
    if body and isinstance(body.get("user"), str) and body["user"]:
        return _clean(body["user"])
    auth = headers.get("Authorization") or headers.get("authorization") or ""
    if auth.lower().startswith("bearer ") and len(auth) > 7:
        return "key-" + hashlib.sha256(auth[7:].strip().encode()).hexdigest()[:12]
    if key := headers.get("api-key") or headers.get("x-api-key"):
        return "key-" + hashlib.sha256(key.strip().encode()).hexdigest()[:12]
    return UNKNOWN


def _clean(v: str) -> str:
    return _SAFE.sub("_", v.strip())[:64] or UNKNOWN


class TenantLimiter:
    """Maps tenant ids to at most `max_tenants` labels plus `other` (sticky, first come)."""

    def __init__(self, max_tenants: int = 50) -> None:
        self.max_tenants = max_tenants
        self._admitted: set[str] = set()
        self._lock = threading.Lock()
        self.folded = 0           # requests counted as `other`

    def label(self, tenant: str) -> str:
        with self._lock:
            if tenant in self._admitted:
                return tenant
            if len(self._admitted) < self.max_tenants:
                self._admitted.add(tenant)
                return tenant
            self.folded += 1
            return OTHER
