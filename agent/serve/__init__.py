"""Serving primitives every server in the agent uses (its API, the tap's pages, the OTLP receiver):
binding an aiohttp site, and rendering canonical samples as the `kvscope_*` exposition."""
