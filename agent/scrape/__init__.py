"""Scrape path: fetch a target's /metrics, parse the exposition, memo by family block."""
