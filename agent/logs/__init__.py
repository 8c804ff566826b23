"""Engine logs as a source: vLLM (V0, V1) and SGLang periodic stats lines and their preemption /
retraction warnings, read into canonical samples (lines.py parses one line, series.py turns the
lines into timestamped canonical series). Formats and the releases they come from: docs/logs.md."""
