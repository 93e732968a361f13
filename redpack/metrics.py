"""The service's Prometheus instruments (prometheus-client), counted where things happen.

Each is a counter increment or a histogram observation in this process's memory (under
gunicorn, in a file of its own that /metrics sums over the server's workers: prometheus-client's
multiprocess mode, set up in gunicorn.conf.py); nothing here costs a round trip. What can be
read from MySQL and Redis instead (persist and refund lag, dead letters, the worker heartbeat)
is read when /metrics is scraped (redpack/exposition.py).

- `redpack_grabs_total{strategy, outcome}`: every grab answer, counted once where it is decided
  (services.activity_grab): the contract's outcomes, `shed` (a `contended` the process gave at
  once, its line full), `outcome_unknown` (503: a store's reply was lost) and `error` (500).
- `redpack_grab_seconds{strategy}`: the time services.activity_grab took (fast answers from
  memory, the line, the strategy; not the HTTP request's gate round trip).
- `redpack_batch_size`: grabs per batch of the batched strategies (strategies/combiner.py).
- `redpack_throttled_total{scope}`: requests over their rate (grab, send, login-ip, login-user).
- `redpack_store_errors_total{store, where}`: MySQL and Redis errors the service met (and
  survived or answered): `where` names the step.
"""

import functools
from typing import Any

from django.db import DatabaseError
from prometheus_client import Counter, Histogram
from redis.exceptions import RedisError

from strategies.base import GrabResult, Outcome

# Seconds: from a fast answer from memory (well under a millisecond) to a grab queued behind a
# hot row lock (seconds).
GRAB_SECONDS_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# Grabs per batch: powers of two up to beyond REDPACK_BATCH_MAX's default (64).
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

GRABS = Counter(
    "redpack_grabs",
    "Grab answers by strategy and outcome (counted once, where the answer is decided).",
    ["strategy", "outcome"],
)
GRAB_SECONDS = Histogram(
    "redpack_grab_seconds",
    "Seconds a grab took in the service (fast answers, the line, the strategy).",
    ["strategy"],
    buckets=GRAB_SECONDS_BUCKETS,
)
BATCH_SIZE = Histogram(
    "redpack_batch_size",
    "Grabs per batch of the batched strategies (one Redis script run, one MySQL transaction).",
    buckets=BATCH_SIZE_BUCKETS,
)
THROTTLED = Counter(
    "redpack_throttled", "Requests refused 429 by a rate limit, by scope.", ["scope"]
)
STORE_ERRORS = Counter(
    "redpack_store_errors",
    "MySQL and Redis errors met by the service, by store and by the step that met them.",
    ["store", "where"],
)


def outcome_label(result: GrabResult) -> str:
    """The `outcome` label of an answer: its outcome, or `shed` for a line that was full."""
    if result.outcome is Outcome.CONTENDED and result.reason == "shed":
        return "shed"
    return result.outcome.value


def grab_answered(strategy: str, outcome: str, seconds: float) -> None:
    _grabs(strategy, outcome).inc()
    _grab_seconds(strategy).observe(seconds)


# Every answer looks its labelled children up: prometheus-client builds and checks the label
# tuple under a lock on each `labels()`, so the children are kept here once found (a handful:
# strategies × outcomes).
@functools.cache
def _grabs(strategy: str, outcome: str) -> Any:
    return GRABS.labels(strategy, outcome)


@functools.cache
def _grab_seconds(strategy: str) -> Any:
    return GRAB_SECONDS.labels(strategy)


def store_error(exc: BaseException, where: str) -> None:
    """Count `exc` (or the store error that caused it) against its store; others are not
    store errors and are not counted."""
    store = store_of(exc)
    if store is not None:
        STORE_ERRORS.labels(store, where).inc()


def store_of(exc: BaseException | None) -> str | None:
    """`mysql` or `redis` for an error of that store (followed through its causes), else None."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, DatabaseError):
            return "mysql"
        if isinstance(exc, RedisError):
            return "redis"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None
