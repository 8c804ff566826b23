"""Subcommands of `kvscope`; one module each, discovered by kvscope.cli."""
