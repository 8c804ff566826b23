"""What the agent serves: its HTTP API, the /metrics renderer and the shared site binder."""
