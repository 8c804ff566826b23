"""Guarded ratios: absent or zero denominators give None."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvscope.agent.derive.ratios import fraction, ratio, ratios_by_key, shares


def test_ratio_of_known_values():
    assert ratio(3.0, 4.0) == 0.75


def test_zero_or_absent_denominator_gives_none_not_zero():
    assert ratio(3.0, 0.0) is None and ratio(3.0, None) is None and ratio(None, 4.0) is None
    assert ratio(1.0, float("inf")) is None


def test_fraction_clamps_scrape_skew_and_rejects_non_positive_wholes():
    assert fraction(101.0, 100.0) == 1.0
    assert fraction(-1.0, 100.0) == 0.0
    assert fraction(1.0, 0.0) is None and fraction(1.0, -5.0) is None


def test_ratios_by_key_keeps_missing_numerators_absent():
    assert ratios_by_key({"a": 1.0}, {"a": 2.0, "b": 4.0, "c": 0.0}) == {"a": 0.5, "b": None, "c": None}


def test_shares_ignore_absent_parts():
    assert shares({"t1": 3.0, "t2": 1.0, "t3": None}) == {"t1": 0.75, "t2": 0.25, "t3": None}
    assert shares({"t1": 0.0}) == {"t1": None}


finite = st.floats(min_value=0, max_value=1e15, allow_nan=False)


@given(finite, finite)
def test_fraction_of_a_part_not_above_its_whole_is_in_unit_interval(a, b):
    part, whole = sorted((a, b))
    got = ratio(part, whole)
    if whole == 0:
        assert got is None
    else:
        assert 0.0 <= got <= 1.0


@given(st.dictionaries(st.text(max_size=3), st.one_of(st.none(), finite), max_size=8))
def test_shares_sum_to_at_most_one(parts):
    total = sum(v for v in shares(parts).values() if v is not None)
    assert total <= 1.0 + 1e-9
