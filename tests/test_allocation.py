import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redpack import allocation
from redpack.allocation import Allocation, AllocationError, draw, split

KINDS = st.sampled_from(list(Allocation))


@st.composite
def total_and_count(draw_: st.DrawFn) -> tuple[int, int]:
    count = draw_(st.integers(min_value=1, max_value=10_000))
    total = draw_(st.integers(min_value=count, max_value=max(count, 100_000_000)))
    return total, count


@settings(max_examples=150)
@given(KINDS, total_and_count(), st.integers(min_value=0))
def test_split_is_exact_and_every_packet_has_a_cent(kind, total_count, seed):
    total, count = total_count
    amounts = split(kind, total, count, random.Random(seed))
    assert len(amounts) == count
    assert sum(amounts) == total
    assert min(amounts) >= 1


@settings(max_examples=150)
@given(KINDS, total_and_count(), st.integers(min_value=0))
def test_draws_until_empty_consume_the_total_exactly(kind, total_count, seed):
    total, count = total_count
    rng = random.Random(seed)
    remaining, left, drawn = total, count, []
    for _ in range(min(count, 300)):  # the first draws, then the rest in one go
        amount = draw(kind, remaining, left, rng)
        assert 1 <= amount <= remaining - (left - 1)
        drawn.append(amount)
        remaining, left = remaining - amount, left - 1
    if left:
        drawn.extend(split(kind, remaining, left, rng))
    assert sum(drawn) == total and len(drawn) == count and min(drawn) >= 1


@given(total_and_count(), st.integers(min_value=0))
def test_double_average_never_exceeds_twice_the_average(total_count, seed):
    total, count = total_count
    amount = draw(Allocation.DOUBLE_AVERAGE, total, count, random.Random(seed))
    if count > 1:
        assert amount <= max(1, 2 * total // count)


@given(total_and_count())
def test_equal_split_differs_by_at_most_one_cent(total_count):
    total, count = total_count
    amounts = split(Allocation.EQUAL, total, count)
    assert max(amounts) - min(amounts) <= 1


def test_last_packet_takes_the_rest():
    for kind in Allocation:
        assert draw(kind, 1234, 1) == 1234


@pytest.mark.parametrize(("total", "count"), [(99, 100), (0, 1), (10, 0), (10, -3), (-5, 1)])
def test_invalid_inputs_raise_a_clear_error(total, count):
    for kind in Allocation:
        with pytest.raises(AllocationError):
            split(kind, total, count)
        with pytest.raises(AllocationError):
            draw(kind, total, count)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="lottery"):
        split("lottery", 100, 2)


def test_line_segment_first_cut_has_the_exact_distribution():
    """The O(log n) draw against the exact law of the smallest of k points out of 1..n."""
    n, k, draws = 12, 4, 60_000
    rng = random.Random(20261123)
    seen = Counter(allocation.first_cut(n, k, rng) for _ in range(draws))

    def survival(m: int) -> float:
        return math.comb(n - m, k) / math.comb(n, k)

    chi_square = 0.0
    for m in range(1, n - k + 2):
        expected = draws * (survival(m - 1) - survival(m))
        chi_square += (seen[m] - expected) ** 2 / expected
    assert set(seen) <= set(range(1, n - k + 2))
    assert chi_square < 27.9  # 8 degrees of freedom, p = 0.0005


class CountingRandom(random.Random):
    """Counts the uniform numbers a draw asks for, and refuses the O(k) ways of drawing."""

    calls = 0

    def random(self) -> float:
        self.calls += 1
        return super().random()

    def sample(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("sampled every cut point")


def test_a_line_segment_draw_costs_the_same_at_ten_thousand_packets():
    rng = CountingRandom(7)
    for remaining, count in [(1_000_000, 10_000), (10_000, 10_000), (10_001, 2)]:
        rng.calls = 0
        cents = allocation.draw("line_segment", remaining, count, rng)
        assert 1 <= cents <= remaining - (count - 1)
        assert rng.calls == 1
