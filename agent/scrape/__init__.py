"""Scrape path: the keep-alive HTTP client, fetching a target's /metrics within bounds, parsing
the exposition, and the per-scrape carrier of canonical blocks (Stamped/Parts)."""
