"""The node store: change-point SQLite store (in a file or in memory) and its retention."""
