"""Build hook for the one native module: everything else is declared in pyproject.toml.

`kvscope.agent.tap._relay` is the tap's forwarding loop for streamed answers in C
(agent/tap/_relay.c). It is optional: where no C compiler or Python headers are available the
install still succeeds and the tap uses its pure-Python path (agent/tap/native.py says which).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kvscope.agent.tap._relay", ["agent/tap/_relay.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"])])
