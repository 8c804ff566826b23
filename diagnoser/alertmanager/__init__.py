"""The Alertmanager webhook: payload parsing, the receiver server, its store."""
