"""Guarded ratios: absent or zero denominators give None."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvscope.agent.derive.ratios import fraction, ratio


def test_ratio_of_known_values():
    assert ratio(3.0, 4.0) == 0.75


def test_zero_or_absent_denominator_gives_none_not_zero():
    assert ratio(3.0, 0.0) is None and ratio(3.0, None) is None and ratio(None, 4.0) is None
    assert ratio(1.0, float("inf")) is None


def test_fraction_clamps_scrape_skew_and_rejects_non_positive_wholes():
    assert fraction(101.0, 100.0) == 1.0
    assert fraction(-1.0, 100.0) == 0.0
    assert fraction(1.0, 0.0) is None and fraction(1.0, -5.0) is None


finite = st.floats(min_value=0, max_value=1e15, allow_nan=False)


@given(finite, finite)
def test_fraction_of_a_part_not_above_its_whole_is_in_unit_interval(a, b):
    part, whole = sorted((a, b))
    got = ratio(part, whole)
    if whole == 0:
        assert got is None
    else:
        assert 0.0 <= got <= 1.0
