"""Recordings: write/read OpenMetrics recordings and replay them as canonical samples."""
