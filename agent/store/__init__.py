"""The node store: change-point SQLite store, its retention, and the in-memory twin."""
