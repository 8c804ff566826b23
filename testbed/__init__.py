"""kvscope's test bed: real vLLM on CPU as pytest fixtures, a tenant load driver, the incident
recorder and the fleet scenario generator. Test tooling, not product code: it is not installed
with kvscope; tests reach it through tests/conftest.py."""
