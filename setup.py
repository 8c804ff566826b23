"""Build hook for the native modules: everything else is declared in pyproject.toml.

`kvscope.agent.tap._relay` is the tap's forwarding loop for streamed answers in C
(agent/tap/_relay.c), `kvscope.agent.tap._front` its request side for the common case
(agent/tap/_front.c). Both are optional: where no C compiler or Python headers are available the
install still succeeds and the tap uses its pure-Python path (agent/tap/native.py says which).
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]

setup(ext_modules=[Extension(f"kvscope.agent.tap.{name}", [f"agent/tap/{name}.c"], optional=True,
                             extra_compile_args=FLAGS) for name in ("_relay", "_front")])
