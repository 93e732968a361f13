"""The lab's one definition of each figure: percentiles, success rate, shares.

Every report (the direct bench, the Locust scenarios, the expiry storm) computes them here, so a
p99 or a success rate means the same thing in every column it appears in.
"""

import math
from collections.abc import Iterable, Mapping, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile: the smallest value at or above a share `q` of the values
    (0 < q ≤ 1). None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def percentile_of_counts(counts: Mapping[float, int], q: float) -> float | None:
    """The same nearest-rank percentile over a histogram {value: how many times} (Locust keeps
    response times that way)."""
    total = sum(counts.values())
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= rank:
            return float(value)
    raise AssertionError("unreachable: the ranks add up to the total")


def success_rate(*, requests: int, contended: int, failed: int) -> float | None:
    """Share of the requests that got a final answer: not `contended`, not an error."""
    return share(requests - contended - failed, requests)


def run_rates(
    *, requests: int, answered: int, grabbed: int, contended: int, seconds: float
) -> dict[str, float | None]:
    """An HTTP run's rates and shares over its `seconds` (Locust's runs and wrk's alike)."""
    return {
        "seconds": round(seconds, 3),
        "requests_per_s": round(requests / seconds, 1) if seconds else None,
        "grabs_per_s": round(grabbed / seconds, 1) if seconds else None,
        "success_rate": success_rate(
            requests=requests, contended=contended, failed=requests - answered
        ),
        "contended_share": share(contended, requests),
    }


def share(part: float, whole: float) -> float | None:
    """part / whole to four places; None when there is no whole."""
    return round(part / whole, 4) if whole else None


# Why an HTTP grab request ended as it did (the Locust scenarios count every request under one).
# The first six are answers of the contract (`shed`: a `contended` the server gave at once, the
# activity's line in that web process full); the others are not. `cut_off`: in flight when a
# timed run's clock stopped it (at most one per connection or user; its grab, if any, is in
# MySQL and checked there), which no client waited for: not unanswered. A burst has no clock
# of its own: a request it still waited for at its cap is unanswered.
CAUSES = (
    "grabbed",
    "already_grabbed",
    "sold_out",
    "closed",
    "contended",
    "shed",
    "throttled",
    "outcome_unknown",
    "5xx",
    "other_http",
    "client_timeout",
    "connection_error",
    "cut_off",
)
ANSWERS = frozenset(CAUSES[:5])  # the contract's outcomes, as the API names them
UNANSWERED = ("client_timeout", "connection_error")  # no HTTP answer reached the client
GENERATOR_BOUND = 0.9  # share of its cores above which the load generator is the limit


def cause_of(status: int, body: Mapping[str, object], failure: BaseException | None) -> str:
    """The cause of one grab request: its HTTP status (0: none came), JSON body and the
    client's error."""
    answered = body.get("outcome")
    if status in (200, 409) and answered in ANSWERS:
        return "shed" if body.get("reason") == "shed" else str(answered)
    if status == 429:
        return "throttled"
    error = body.get("error")
    if status == 503 and isinstance(error, dict) and error.get("code") == "outcome_unknown":
        return "outcome_unknown"
    if status >= 500:
        return "5xx"
    if status:
        return "other_http"
    timed_out = isinstance(failure, TimeoutError) or type(failure).__name__ == "Timeout"
    return "client_timeout" if timed_out or "timed out" in str(failure) else "connection_error"


# Upper bounds (ms) of the HTTP runs' latency histogram; the last bucket is open.
HISTOGRAM_MS = (10, 50, 100, 250, 500, 1000, 2000, 5000, 10000, 30000)
HISTOGRAM_LABELS = (*(f"≤{b} ms" for b in HISTOGRAM_MS), f"> {HISTOGRAM_MS[-1]} ms")


def histogram_of_counts(counts: Mapping[float, int]) -> dict[str, int]:
    """Requests per latency bucket from {ms: how many} (Locust's response times), in bucket
    order, empty buckets left out."""
    found: dict[str, int] = dict.fromkeys(HISTOGRAM_LABELS, 0)
    for ms, count in counts.items():
        index = next((i for i, bound in enumerate(HISTOGRAM_MS) if ms <= bound), -1)
        found[HISTOGRAM_LABELS[index]] += count
    return {label: count for label, count in found.items() if count}


def histogram_buckets(histograms: Iterable[Mapping[str, int]]) -> list[str]:
    """The buckets any of these histograms has, in bucket order (the columns of a table)."""
    present = {label for histogram in histograms for label in histogram}
    return [label for label in HISTOGRAM_LABELS if label in present]
