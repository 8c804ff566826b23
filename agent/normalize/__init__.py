"""Normalize: the catalog of upstream names (catalog.yaml), the dialects that map an engine's
exposition to canonical samples, and the per-target memo that re-normalizes only changed blocks."""
