import math

from kvscope.agent.scrape.exposition import format_labels, format_value, parse_exposition


def value_of(expo, name, **labels):
    want = tuple(sorted(labels.items()))
    hits = [s.value for s in expo.samples if s.name == name and all(p in s.labels for p in want)]
    assert len(hits) == 1, f"{name}{labels}: {hits}"
    return hits[0]


def test_parse_real_vllm_capture_reads_every_sample(load_fixture):
    expo = parse_exposition(load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt"))
    assert expo.issues == []
    assert expo.complete
    assert value_of(expo, "vllm:num_preemptions_total") == 47.0
    assert value_of(expo, "vllm:prefix_cache_hits_total") == 1152.0
    assert expo.types["vllm:time_to_first_token_seconds"] == "histogram"
    assert value_of(expo, "vllm:time_to_first_token_seconds_bucket", le="+Inf") > 0


def test_parse_exposition_handles_escapes_and_special_values():
    text = (
        'm{a="x\\"y",b="line\\nbreak",c="back\\\\slash"} NaN\n'
        'm{a="plain"} +Inf\n'
        'm{a="neg"} -Inf\n'
        'm{a="trail",} 1e3 1700000000000\n'
    )
    expo = parse_exposition(text)
    assert expo.issues == []
    labels = dict(expo.samples[0].labels)
    assert labels == {"a": 'x"y', "b": "line\nbreak", "c": "back\\slash"}
    assert math.isnan(expo.samples[0].value)
    assert expo.samples[1].value == math.inf and expo.samples[2].value == -math.inf
    assert expo.samples[3].value == 1000.0 and expo.samples[3].timestamp == 1_700_000_000.0


def test_parse_exposition_skips_bad_lines_and_keeps_the_rest():
    text = (
        "good 1\n"
        'bad{a="1" 2\n'          # unterminated label body
        "bad_value abc\n"
        '{a="1"} 3\n'            # no name
        'dup{a="1"} 1\n'
        'dup{a="1"} 2\n'
        'dup2{a="1",a="2"} 2\n'  # repeated label name
        "# TYPE x nonsense\n"
        "after 5\n"
    )
    expo = parse_exposition(text)
    assert [s.name for s in expo.samples] == ["good", "dup", "after"]
    reasons = sorted(i.reason for i in expo.issues)
    assert reasons == ["bad_type", "bad_value", "duplicate_series", "malformed_labels",
                       "malformed_labels", "malformed_line"]


def test_truncated_text_payload_drops_the_cut_line():
    expo = parse_exposition("a 1\nb 2\nc 12")  # no final newline: 'c' may be cut short
    assert [s.name for s in expo.samples] == ["a", "b"]
    assert not expo.complete
    assert [i.reason for i in expo.issues] == ["truncated"]


def test_openmetrics_timestamps_are_seconds_and_eof_marks_complete():
    text = "# TYPE c counter\nc_total 1 1700000000.5\n# EOF\n"
    expo = parse_exposition(text)
    assert expo.openmetrics and expo.complete
    assert expo.samples[0].timestamp == 1_700_000_000.5
    cut = parse_exposition("# TYPE c counter\nc_total 1 1700000000.5\nc_total 2 17", openmetrics=True)
    assert not cut.complete and [s.value for s in cut.samples] == [1.0]


def test_openmetrics_exemplars_are_ignored():
    text = '# TYPE h histogram\nh_bucket{le="1"} 2 # {trace_id="abc"} 0.5 1700000000\n# EOF\n'
    expo = parse_exposition(text)
    assert expo.issues == [] and expo.samples[0].value == 2.0


def test_format_round_trips_labels_and_values():
    labels = (("a", 'q"uote'), ("b", "new\nline"), ("c", "\\"))
    line = f"m{format_labels(labels)} {format_value(float('nan'))}\n"
    back = parse_exposition(line).samples[0]
    assert back.labels == labels and math.isnan(back.value)


def test_a_label_cache_kept_across_payloads_changes_nothing(load_fixture):
    """A target's label cache (agent/normalize/blockcache.py keeps one) gives the same samples and issues,
    a malformed label set included, payload after payload."""
    text = load_fixture("scrapes/vllm-0.32.0-cpu-after-load.txt")
    bad = 'vllm:num_requests_running{engine="0",=broken"} 1\n'
    cache: dict = {}
    for i in range(3):
        payload = text.replace(" 0.0\n", f" {i}.5\n") + bad
        got, want = parse_exposition(payload, label_cache=cache), parse_exposition(payload)
        assert got.samples == want.samples and got.types == want.types
        assert [(x.line, x.reason) for x in got.issues] == [(x.line, x.reason) for x in want.issues]
        assert [x.reason for x in got.issues] == ["malformed_labels"]
    assert cache
