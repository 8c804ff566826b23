"""Agent configuration: layering (flag > env > file > default) and validation messages."""

from __future__ import annotations

import pytest

from kvscope import cli
from kvscope.agent.config import (
    ConfigError,
    build_config,
    parse_bytes,
    parse_config_yaml,
    read_config_file,
    register_section,
)
from kvscope.core.scalars import parse_duration

KNOWN = {"engine": True, "nvml": True, "host": True}


def build(doc=None, env=None, flags=None):
    return build_config(doc or {}, environ=env or {}, flags=flags or [], known_collectors=KNOWN)


def test_defaults_bind_loopback_and_scrape_every_15s():
    cfg = build()
    assert cfg.listen_address == "127.0.0.1:9464"
    assert (cfg.interval_s, cfg.timeout_s, cfg.max_body_bytes) == (15.0, 5.0, 16 << 20)
    assert cfg.targets == []
    assert cfg.collector_enabled("nvml", True) is True


def test_file_values_are_read():
    cfg = build(
        {
            "scrape": {"interval_s": 30, "timeout_s": 3, "max_body_bytes": "4MiB"},
            "store": {"path": "/tmp/x.db", "retention_s": "2d"},
        }
    )
    assert (cfg.interval_s, cfg.timeout_s, cfg.max_body_bytes) == (30.0, 3.0, 4 << 20)
    assert (cfg.store_path, cfg.retention_s) == ("/tmp/x.db", 2 * 86400.0)


def test_env_overrides_file_and_flag_overrides_env():
    doc = {"scrape": {"interval_s": 30, "timeout_s": 3}}
    env = {"KVSCOPE_SCRAPE_TIMEOUT_S": "4", "KVSCOPE_SCRAPE_INTERVAL_S": "20"}
    cfg = build(doc, env)
    assert (cfg.interval_s, cfg.timeout_s) == (20.0, 4.0)
    cfg = build(doc, env, [("scrape.interval_s", "10s", "--scrape.interval")])
    assert (cfg.interval_s, cfg.timeout_s) == (10.0, 4.0)


def test_bad_timeout_names_the_key_the_rule_and_the_value():
    with pytest.raises(ConfigError) as info:
        build({"scrape": {"timeout_s": "abc"}})
    assert str(info.value) == 'scrape.timeout_s: must be a number > 0 and < scrape.interval_s, got "abc"'


def test_bad_env_value_says_which_variable_it_came_from():
    with pytest.raises(ConfigError, match=r"got \"abc\" \(from KVSCOPE_SCRAPE_TIMEOUT_S\)"):
        build(env={"KVSCOPE_SCRAPE_TIMEOUT_S": "abc"})


def test_timeout_not_below_interval_is_rejected():
    with pytest.raises(ConfigError, match=r"scrape.timeout_s: must be a number > 0 and < scrape.interval_s, got 10"):
        build({"scrape": {"interval_s": 10, "timeout_s": 10}})


def test_default_timeout_follows_a_short_interval():
    assert build(flags=[("scrape.interval_s", "1s", "--scrape.interval")]).timeout_s == pytest.approx(0.8)


@pytest.mark.parametrize(
    "doc, message",
    [
        (
            {"scrape": {"intervall_s": 5}},
            "scrape.intervall_s: unknown key (allowed: interval_s, label_limit, "
            "label_name_length_limit, label_value_length_limit, max_body_bytes, sample_limit, timeout_s)",
        ),
        (
            {"scrape": {"max_body_bytes": "lots"}},
            'scrape.max_body_bytes: must be a size from 1024 bytes to 1GiB, got "lots"',
        ),
        ({"scrape": 5}, "scrape: must be a mapping, got 5"),
        ({"listen_address": "9464"}, 'listen_address: must be host:port (e.g. 127.0.0.1:9464), got "9464"'),
        ({"listen_address": "h:\u00b2"}, 'listen_address: must be host:port (e.g. 127.0.0.1:9464), got "h:\u00b2"'),
        (
            {"listen_address": "h:" + "9" * 5000},
            f'listen_address: must be host:port (e.g. 127.0.0.1:9464), got "h:{"9" * 5000}"',
        ),
        ({"collectors": {"nvlm": True}}, "collectors.nvlm: unknown collector (known: engine, host, nvml)"),
        (
            {"collectors": {"nvml": "maybe"}},
            'collectors.nvml: must be true or false (or a mapping with enabled), got "maybe"',
        ),
        (
            {"targets": [{"url": "localhost:8000"}]},
            'targets[0].url: must be an http:// or https:// URL with a host, got "localhost:8000"',
        ),
        (
            {"targets": [{"url": "http://a:1/metrics", "engine": "trtllm"}]},
            'targets[0].engine: must be one of dcgm, dynamo, epp, llamacpp, lmcache, sglang, sglang_router, tgi, vllm (or absent to detect), got "trtllm"',
        ),
        (
            {"targets": [{"url": "http://a:1/metrics", "port": 1}]},
            "targets[0].port: unknown key (allowed: url, job, engine, labels, "
            "sample_limit, label_limit, label_name_length_limit, label_value_length_limit)",
        ),
        (
            {"targets": [{"url": "http://a:1/metrics", "labels": {"bad-name": "x"}}]},
            'targets[0].labels: "bad-name" is not a valid label name',
        ),
        (
            {"targets": [{"url": "http://a:1/metrics", "labels": {"job": "x"}}]},
            "targets[0].labels.job: set it with targets[0].job instead",
        ),
        ({"gpu_mapping": {"GPU-1": 3}}, "gpu_mapping.GPU-1: expected an instance name or a list of them, got 3"),
    ],
)
def test_invalid_values_name_the_key_and_what_is_allowed(doc, message):
    with pytest.raises(ConfigError) as info:
        build(doc)
    assert str(info.value) == message


def test_targets_get_instance_job_engine_and_labels():
    cfg = build(
        {
            "targets": [
                {"url": "http://10.0.0.5:8000/metrics", "job": "vllm", "labels": {"node": "n1"}},
                {"url": "http://10.0.0.5:9400/metrics", "job": "dcgm", "engine": "dcgm"},
                "http://10.0.0.6:8000/metrics",
            ]
        }
    )
    a, b, c = cfg.targets
    assert a.target_labels() == {"job": "vllm", "instance": "10.0.0.5:8000", "node": "n1"}
    assert (b.engine, b.instance) == ("dcgm", "10.0.0.5:9400")
    assert (c.job, c.engine) == ("engine", None)


def test_duplicate_targets_are_rejected_unless_the_instance_is_relabelled():
    url = "http://10.0.0.5:8000/metrics"
    with pytest.raises(
        ConfigError, match=r"targets\[1\]: instance '10.0.0.5:8000' repeats targets\[0\]; set labels.instance"
    ):
        build({"targets": [url, url]})
    cfg = build({"targets": [url, {"url": url, "labels": {"instance": "replica-b"}}]})
    assert [t.instance for t in cfg.targets] == ["10.0.0.5:8000", "replica-b"]


def test_flag_targets_replace_file_targets():
    cfg = build(
        {"targets": ["http://a:1/metrics"]},
        flags=[("targets", [{"url": "http://b:2/metrics", "job": "x"}], "--target")],
    )
    assert [(t.instance, t.job) for t in cfg.targets] == [("b:2", "x")]


def test_env_targets_and_collector_switches():
    cfg = build(env={"KVSCOPE_TARGETS": "http://a:1/metrics, http://b:2/metrics", "KVSCOPE_COLLECTOR_NVML": "false"})
    assert [t.instance for t in cfg.targets] == ["a:1", "b:2"]
    assert cfg.collector_enabled("nvml", True) is False
    cfg = build({"collectors": {"nvml": False}}, flags=[("collectors.nvml", True, "--collector.nvml")])
    assert cfg.collector_enabled("nvml", False) is True


def test_collector_options_are_handed_through():
    cfg = build({"collectors": {"host": {"enabled": True, "interfaces": ["eth0"]}}})
    assert cfg.collector_options("host") == {"interfaces": ["eth0"]}


def test_a_switch_and_options_from_different_layers_merge():
    # env switches host off: the file's options survive; a flag option keeps the env switch
    cfg = build(
        {"collectors": {"host": {"node": "n1", "process_patterns": ["vllm"]}}},
        env={"KVSCOPE_COLLECTOR_HOST": "false"},
        flags=[("collectors.host.node", "n2", "--collector.host.node")],
    )
    assert cfg.collector_enabled("host", True) is False
    assert cfg.collector_options("host") == {"node": "n2", "process_patterns": ["vllm"]}
    cfg = build({"collectors": {"nvml": False}}, flags=[("collectors.nvml.retry_s", "5", "--collector.nvml.retry_s")])
    assert cfg.collector_enabled("nvml", True) is False
    assert cfg.collector_options("nvml") == {"retry_s": "5"}


def test_collector_option_flags_reach_the_collector_config():
    import argparse

    from kvscope.agent.runtime import known_collectors
    from kvscope.commands._flags import add_agent_flags, add_scrape_flags, config_from_args

    known = known_collectors()
    parser = argparse.ArgumentParser()
    add_scrape_flags(parser)
    add_agent_flags(parser, known)
    args = parser.parse_args(
        [
            "--collector.host.node",
            "gpu-7",
            "--collector.host.process_patterns",
            "vllm",
            "--collector.host.process_patterns",
            "sglang",
            "--no-collector.nvml",
        ]
    )
    cfg = config_from_args(args, known)
    assert cfg.collector_options("host") == {"node": "gpu-7", "process_patterns": ["vllm", "sglang"]}
    assert cfg.collector_enabled("nvml", True) is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--collector.host.nosuch", "x"])


def test_a_bad_switch_under_an_option_flag_is_still_rejected():
    with pytest.raises(ConfigError, match='collectors.host: must be true or false .*got "maybe"'):
        build({"collectors": {"host": "maybe"}}, flags=[("collectors.host.node", "n", "--collector.host.node")])


def test_unknown_sections_are_kept_for_extensions_with_a_warning():
    cfg = build({"future_section": {"listen_address": "127.0.0.1:4318"}, "gpu_mapping": {"mode": "nvml"}})
    assert cfg.extensions["future_section"] == {"listen_address": "127.0.0.1:4318"}
    assert cfg.gpu_mapping == {"mode": "nvml"}
    assert any(w.startswith("future_section: unknown section") for w in cfg.warnings)


def test_registered_sections_are_validated_by_their_owner():
    def check(raw):
        if not isinstance(raw, dict):
            raise ConfigError(f"tap_test_section: must be a mapping, got {raw!r}")
        return raw

    register_section("tap_test_section", check)
    assert build({"tap_test_section": {"a": 1}}).warnings == []
    with pytest.raises(ConfigError, match="tap_test_section: must be a mapping"):
        build({"tap_test_section": 3})


@pytest.mark.parametrize(
    "text, seconds", [("500ms", 0.5), ("15s", 15.0), ("10m", 600.0), ("1h", 3600.0), (2, 2.0), ("2.5", 2.5)]
)
def test_parse_seconds(text, seconds):
    assert parse_duration(text, loose=True) == seconds


@pytest.mark.parametrize("text, size", [("16MiB", 16 << 20), ("1GB", 10**9), (4096, 4096), ("2kib", 2048)])
def test_parse_bytes(text, size):
    assert parse_bytes(text) == size


def test_config_file_must_be_a_mapping(tmp_path):
    path = tmp_path / "kvscope.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="the top level must be a mapping of sections, got list"):
        read_config_file(path)
    path.write_text("scrape: {interval_s: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_config_file(path)


def test_yaml_tags_are_not_executed(tmp_path):
    path = tmp_path / "kvscope.yaml"
    path.write_text("listen_address: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_config_file(path)


BOMB = (
    "\n".join(
        ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    )
    + "\n"
)


@pytest.mark.parametrize(
    "text, message",
    [
        ("scrape:\n  interval_s: 5\nx: &a [1, *a]\n", r"line 3: x\[1\]: .*recursive alias"),
        ("scrape: &s\n  labels: {loop: *s}\n", r"line 1: scrape.labels.loop: .*recursive alias"),
        (BOMB, r"expands to more than 100000 values .*alias bomb"),
        ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "brackets nested deeper than 50 levels"),
        ("a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 60)), "nested deeper than 50 levels"),
    ],
)
def test_recursive_aliases_alias_bombs_and_deep_nesting_are_clean_errors(tmp_path, text, message):
    path = tmp_path / "kvscope.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_config_file(path)


def test_yaml_anchors_and_merge_keys_still_work(tmp_path):
    path = tmp_path / "kvscope.yaml"
    path.write_text("base: &b {interval_s: 5}\nscrape:\n  <<: *b\n  timeout_s: 2\n")
    assert read_config_file(path)["scrape"] == {"interval_s": 5, "timeout_s": 2}


def test_agent_command_stops_at_start_on_a_bad_config(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KVSCOPE_SCRAPE_TIMEOUT_S", raising=False)
    path = tmp_path / "kvscope.yaml"
    path.write_text("scrape:\n  interval_s: 15\n  timeout_s: abc\n")
    assert cli.main(["agent", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert 'scrape.timeout_s: must be a number > 0 and < scrape.interval_s, got "abc"' in err


def test_agent_command_rejects_an_unknown_collector_flag_value(tmp_path, capsys):
    path = tmp_path / "kvscope.yaml"
    path.write_text("collectors: {nosuch: true}\n")
    assert cli.main(["agent", "--config", str(path)]) == 2
    assert "collectors.nosuch: unknown collector" in capsys.readouterr().err


def test_a_target_url_with_an_unbalanced_ipv6_bracket_is_a_config_error():
    """Found by bench/fuzz_inputs.py: urlsplit raised ValueError('Invalid IPv6 URL') out of the config."""
    with pytest.raises(ConfigError, match=r"targets\[0\].url: must be an http"):
        build_config({"targets": [{"url": "http://[::1:8000/metrics"}]}, environ={})


def test_limits_default_bounded_and_set_per_target():
    """scrape.* limits (Prometheus' names, 0 = none) reach every target; a target's own key wins;
    env and bad values follow the other keys' conventions."""
    cfg = build_config(
        {
            "targets": [
                {"url": "http://a:1/metrics"},
                {"url": "http://b:1/metrics", "sample_limit": 0, "label_limit": 30},
            ]
        }
    )
    zero = dict.fromkeys(("sample_limit", "label_limit", "label_name_length_limit", "label_value_length_limit"), 0)
    assert dict(cfg.targets[0].limits) == {**zero, "sample_limit": 50_000}
    assert dict(cfg.targets[1].limits) == {**zero, "label_limit": 30}
    cfg = build_config(
        {"scrape": {"sample_limit": 10}, "targets": ["http://a:1/metrics"]},
        environ={"KVSCOPE_SCRAPE_LABEL_VALUE_LENGTH_LIMIT": "100"},
    )
    assert dict(cfg.targets[0].limits) == {**zero, "sample_limit": 10, "label_value_length_limit": 100}
    with pytest.raises(ConfigError, match=r"scrape.sample_limit: must be an integer >= 0"):
        build_config({"scrape": {"sample_limit": -1}})
    with pytest.raises(ConfigError, match=r"targets\[0\].label_limit: must be an integer >= 0"):
        build_config({"targets": [{"url": "http://a:1/metrics", "label_limit": "x"}]})


@pytest.mark.parametrize(
    "text",
    [
        "scrape:\n  interval_s: " + "9" * 400 + "\n",  # float() of a huge int overflowed
        "scrape:\n  max_body_bytes: " + "9" * 400 + "\n",
        "scrape:\n  interval_s: 1e999\n",
        "scrape:\n  interval_s: " + "1" * 5000 + "\n",  # PyYAML's int() past 4300 digits raised ValueError
    ],
)
def test_huge_numbers_are_config_errors(text):
    """Found by bench/fuzz.py (config-yaml): each escaped as OverflowError or ValueError."""
    with pytest.raises(ConfigError):
        build_config(parse_config_yaml(text.encode(), "kvscope.yaml"), environ={})
