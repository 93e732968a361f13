"""The lab's one definition of each figure (redpack/lab/stats.py)."""

from collections import Counter

import pytest

from redpack.lab.stats import percentile, percentile_of_counts, share, success_rate


@pytest.mark.parametrize(
    ("q", "expected"), [(0.01, 1), (0.5, 50), (0.95, 95), (0.99, 99), (1.0, 100)]
)
def test_nearest_rank_percentile(q, expected):
    values = list(range(100, 0, -1))  # any order
    assert percentile(values, q) == expected


def test_percentile_of_a_histogram_is_the_percentile_of_its_values():
    values = [3, 3, 3, 7, 7, 10, 12, 12, 12, 12, 40]
    for q in (0.1, 0.25, 0.5, 0.9, 0.99, 1.0):
        assert percentile_of_counts(Counter(values), q) == percentile(values, q)


def test_no_values_no_percentile():
    assert percentile([], 0.5) is None
    assert percentile_of_counts({}, 0.5) is None


def test_success_rate_leaves_out_contended_and_errors():
    assert success_rate(requests=200, contended=30, failed=10) == 0.8
    assert success_rate(requests=0, contended=0, failed=0) is None
    assert share(1, 3) == 0.3333
