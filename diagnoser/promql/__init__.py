"""PromQL generation: canonical-signal selectors, recording/alert rule files, runbooks."""
