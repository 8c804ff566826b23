"""Scrape path: the keep-alive HTTP client, fetching a target's /metrics within bounds, and parsing
the exposition."""
