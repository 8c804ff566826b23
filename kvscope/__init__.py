"""kvscope: observability and diagnostics for LLM inference fleets (vLLM, SGLang)."""

__version__ = "0.1.0"
