"""Amount allocation: pure functions on integer cents.

Each kind works two ways with the same distribution:
- `split(kind, total, count)` cuts a whole activity at send time (pre-allocating strategies);
- `draw(kind, remaining, count)` takes one amount at grab time from what is left.
Every amount is at least 1 cent and the amounts of one activity always sum to its total.
"""

import math
import random
from enum import StrEnum

_system_random = random.SystemRandom()


class Allocation(StrEnum):
    DOUBLE_AVERAGE = "double_average"  # 二倍均值: uniform in [1, 2 × remaining average]
    LINE_SEGMENT = "line_segment"  # 线段切割: random cut points on [0, total]
    EQUAL = "equal"


class AllocationError(ValueError):
    """The total cannot be cut into `count` packets of at least 0.01."""


def validate(total_cents: int, count: int) -> None:
    if count < 1:
        raise AllocationError(f"count must be at least 1, got {count}")
    if total_cents < count:
        raise AllocationError(
            f"total of {total_cents} cents cannot give {count} packets of at least 1 cent"
        )


def draw(
    kind: Allocation | str,
    remaining_cents: int,
    remaining_count: int,
    rng: random.Random = _system_random,
) -> int:
    """One amount taken from (remaining amount, remaining count); the last packet takes the rest."""
    validate(remaining_cents, remaining_count)
    if remaining_count == 1:
        return remaining_cents
    kind = Allocation(kind)
    # Leave at least one cent for every packet still to come.
    ceiling = remaining_cents - (remaining_count - 1)
    if kind is Allocation.DOUBLE_AVERAGE:
        return rng.randint(1, max(1, min(2 * remaining_cents // remaining_count, ceiling)))
    if kind is Allocation.LINE_SEGMENT:
        # The first segment of a random cutting of the remaining line into remaining_count parts.
        return first_cut(remaining_cents - 1, remaining_count - 1, rng)
    return -(-remaining_cents // remaining_count)  # equal: ceiling division, cents spread evenly


def first_cut(n: int, k: int, rng: random.Random = _system_random) -> int:
    """The smallest of k distinct points drawn uniformly from 1..n (1 ≤ k ≤ n), in O(log n).

    Sampling the k points costs O(k), paid under the activity's row lock by every grab at
    10,000 packets. Instead, one uniform u and its inverse: no point is at or below m with
    probability S(m) = C(n−m, k) / C(n, k), so the answer is the smallest m with S(m) ≤ 1 − u,
    found by bisection over 1..n−k+1 (S falls from 1 to 0 there), with S in logarithms
    (math.lgamma) so that no binomial coefficient is ever formed. The distribution is the same
    as sampling, up to float rounding of S (relative error ~1e-12).
    """
    target = math.log(1.0 - rng.random())  # log(1 − u), u in [0, 1)
    whole = math.lgamma(n + 1) - math.lgamma(n - k + 1)

    def log_survival(m: int) -> float:
        left = n - m - k + 1
        return -math.inf if left <= 0 else math.lgamma(n - m + 1) - math.lgamma(left) - whole

    low, high = 1, n - k + 1
    while low < high:
        middle = (low + high) // 2
        if log_survival(middle) <= target:
            high = middle
        else:
            low = middle + 1
    return low


def split(
    kind: Allocation | str, total_cents: int, count: int, rng: random.Random = _system_random
) -> list[int]:
    """All the packets of an activity, in the order they would be drawn."""
    validate(total_cents, count)
    kind = Allocation(kind)
    if kind is Allocation.LINE_SEGMENT:
        cuts = sorted(rng.sample(range(1, total_cents), count - 1))
        return [b - a for a, b in zip([0, *cuts], [*cuts, total_cents], strict=True)]
    amounts = []
    remaining = total_cents
    for left in range(count, 0, -1):
        amount = draw(kind, remaining, left, rng)
        amounts.append(amount)
        remaining -= amount
    return amounts
