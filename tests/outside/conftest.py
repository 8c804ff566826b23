"""The outside corpus' marker: `-m outside_logs` selects the log cases (`kvscope diagnose --log`)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "outside_logs: outside-corpus log cases, judged by `kvscope diagnose --log`")
