"""Peer conformance suites as tests (../shared/reference/peer-testdata, README there has provenance).

The rule (issue 25): every valid case parses with every sample kept (compared with the case's own
count of sample lines); every invalid case is rejected or flagged with a `ParseIssue` (or marked
incomplete), never read as a different number. The invalid cases kvscope still accepts are listed
below with why; each of them reads the numbers exactly as written. The test fails when a listed
case starts being flagged too, so the list stays true.

Agreement, cases agreeing of all (before -> after the linear-time parser, issue 25):
OpenMetrics 94/211 -> 142/211 (valid with every sample 40/44 -> 43/44, 10 -> 3 samples lost;
invalid flagged 54/167 -> 99/167, the 68 others listed below); prometheus/common text 60/93 ->
74/93 (valid 12/25 -> 25/25; invalid flagged 48/68 -> 49/68, the 19 others listed below).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvscope.agent.scrape.exposition import parse_exposition

PEER = Path(__file__).resolve().parents[3] / "shared" / "reference" / "peer-testdata"
pytestmark = pytest.mark.skipif(not PEER.is_dir(), reason=f"{PEER} not present")

_SEMANTIC = "a rule across samples of a family (kvscope reads each sample as exposed; numbers unchanged)"
_COUNTER = "a value rule by family type (negative/NaN counts): kept as exposed; kvscope's rates treat a drop as a reset"
_PLACE = "metadata placement/clashes across families: no sample changes, so the parser does not check it"
_EXEMPLAR = "exemplars are read for syntax and dropped, so which sample types may carry one is not checked"
_NUMLABEL = "le/quantile label values are kept as label strings, not checked as numbers at parse time"
_VALID_DIVERGENCES = {
    (
        "om",
        "duplicate_timestamps_1",
    ): "two values of one series at one timestamp: the first is kept, the rest flagged duplicate_series "
    "(a recording or the store cannot hold two values for one instant)",
}
_INVALID_DIVERGENCES: dict[tuple[str, str], str] = {
    **{("om", f"bad_counter_values_{i}"): _COUNTER for i in range(20)},
    **{("om", f"bad_grouping_or_ordering_{i}"): _SEMANTIC for i in (0, 2, 3, 4, 5, 6, 7, 8, 9, 10)},
    **{("om", f"bad_histograms_{i}"): _SEMANTIC for i in (0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14)},
    **{("om", f"bad_missing_or_invalid_labels_for_a_type_{i}"): _SEMANTIC for i in range(8)},
    **{("om", f"bad_stateset_info_values_{i}"): _SEMANTIC for i in range(4)},
    **{("om", f"bad_info_and_stateset_values_{i}"): _SEMANTIC for i in range(2)},
    **{("om", f"bad_exemplars_on_unallowed_metric_types_{i}"): _EXEMPLAR for i in range(3)},
    **{("om", f"bad_exemplars_on_unallowed_samples_{i}"): _EXEMPLAR for i in range(4)},
    **{("om", f"bad_metadata_in_wrong_place_{i}"): _PLACE for i in range(3)},
    ("om", "bad_clashing_names_2"): _PLACE,
    **{
        ("text", n): _PLACE
        for n in (
            "text_parse_test.go:1083",
            "text_parse_test.go:1091",
            "text_parse_test.go:1099",
            "corpus/from_test_parse_error_12",
            "corpus/from_test_parse_error_13",
            "corpus/from_test_parse_error_14",
        )
    },
    **{
        ("text", n): _NUMLABEL
        for n in (
            "text_parse_test.go:1052",
            "text_parse_test.go:1131",
            "text_parse_test.go:1199",
            "text_parse_test.go:1207",
            "corpus/from_test_parse_error_7",
            "corpus/from_test_parse_error_19",
        )
    },
    **{("text", f"text_parse_test.go:{n}"): _COUNTER for n in (1277, 1292, 1307, 1322)},
    (
        "text",
        "text_parse_test.go:1139",
    ): "the JSON extract holds U+FFFD where the Go test has an invalid UTF-8 byte; kvscope refuses a body that "
    "is not UTF-8 before parsing (agent/scrape/fetch.py, decode_error)",
    (
        "text",
        "text_parse_test.go:1263",
    ): "runs under the legacy name validation in the Go test; Prometheus 3 reads quoted UTF-8 names, as kvscope does",
    (
        "text",
        "text_parse_test.go:1270",
    ): "runs under the legacy name validation in the Go test; Prometheus 3 reads quoted UTF-8 names, as kvscope does",
}


def _cases() -> list[tuple[str, str, str, bool]]:
    if not PEER.is_dir():
        return []
    out = []
    for d in sorted((PEER / "openmetrics-parsers").iterdir()):
        meta = json.loads((d / "test.json").read_text())
        raw = (d / meta.get("file", "metrics")).read_bytes()
        out.append(("om", d.name, raw.decode("utf-8", "replace"), meta["shouldParse"]))
    for c in json.loads((PEER / "prometheus-common-expfmt-text-cases.json").read_text())["cases"]:
        out.append(("text", c["name"], c["input"], c["shouldParse"]))
    return out


CASES = _cases()


def sample_lines(text: str, om: bool) -> int:
    """The case's own sample count: lines that are neither blank nor comments (before `# EOF`)."""
    n = 0
    for line in text.split("\n"):
        s = line.strip(" \t")
        if om and s == "# EOF":
            break
        n += bool(s) and not s.startswith("#")
    return n


def verdict(suite: str, text: str) -> tuple[bool, int, int]:
    """(flagged, samples kept, sample lines)."""
    om = suite == "om"
    expo = parse_exposition(text, openmetrics=om)
    return bool(expo.issues) or not expo.complete, len(expo.samples), sample_lines(text, om)


@pytest.mark.parametrize(("suite", "name", "text"), [c[:3] for c in CASES if c[3]], ids=lambda v: str(v)[:40])
def test_a_valid_case_keeps_every_sample(suite, name, text):
    flagged, kept, lines = verdict(suite, text)
    if (suite, name) in _VALID_DIVERGENCES:
        assert flagged, f"{name} is listed as a divergence but now passes: take it off the list"
        return
    assert not flagged and kept == lines


def _expected_numbers(text: str, om: bool) -> list[float]:
    """Each sample line's value token as written (for 'never a different number')."""
    out = []
    for line in text.split("\n"):
        s = line.strip(" \t")
        if om and s == "# EOF":
            break
        if s and not s.startswith("#"):
            head = s.split(" # ", 1)[0]
            out.append((head.rsplit("}", 1)[-1] if "}" in head else head.split(None, 1)[-1]).split()[0])
    return out


@pytest.mark.parametrize(("suite", "name", "text"), [c[:3] for c in CASES if not c[3]], ids=lambda v: str(v)[:40])
def test_an_invalid_case_is_flagged_or_a_listed_divergence(suite, name, text):
    flagged, _, _ = verdict(suite, text)
    if (suite, name) in _INVALID_DIVERGENCES:
        assert not flagged, f"{name} is flagged now: take it off the divergence list"
        expo = parse_exposition(text, openmetrics=suite == "om")
        written = {float(v) for v in _expected_numbers(text, suite == "om")}
        for s in expo.samples:  # accepted, but with the numbers exactly as written
            assert s.value in written or (math.isnan(s.value) and any(map(math.isnan, written)))
        return
    assert flagged, f"{suite} {name}: accepted without a flag"


def test_agreement_is_measured():
    """The numbers the module docstring and the issue note quote."""
    agree = {"om": 0, "text": 0}
    total = {"om": 0, "text": 0}
    for suite, _name, text, ok in CASES:
        flagged, kept, lines = verdict(suite, text)
        total[suite] += 1
        agree[suite] += (not flagged and kept == lines) if ok else flagged
    assert agree == {"om": 142, "text": 74}, (agree, total)
