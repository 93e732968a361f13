"""Fixed-window rate limits counted atomically in Redis, for the API throttles and the login
endpoints alike.

One window per (scope, who, period): INCR and PEXPIRE NX in one MULTI, so concurrent requests
cannot all read "under the limit" and then all pass (DRF's cache throttle reads a list and writes
it back, which lets a burst through). With Redis away the limits fail open to a per-process
counter of the same shape (logged once a minute): a MySQL strategy keeps answering grabs, and
a login flood still meets a limit in each web process.
"""

import logging
import math
import threading
import time
from dataclasses import dataclass

from django_redis import get_redis_connection
from redis.client import Pipeline
from redis.exceptions import RedisError

from redpack import metrics

logger = logging.getLogger(__name__)

PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
clock = time.time  # the windows' clock (tests set it)


@dataclass(frozen=True)
class Rate:
    limit: int
    seconds: int

    @classmethod
    def parse(cls, text: str) -> "Rate":
        """DRF's notation: "120/min", "10/m", "1000/hour", "5/s"."""
        count, _, period = text.partition("/")
        return cls(int(count), PERIODS[period.strip()[:1]])


@dataclass(frozen=True)
class Window:
    """The current window of one (scope, who, rate): its Redis key and when it ends."""

    scope: str
    key: str
    rate: Rate
    ends_at: float

    def wait(self, count: int, now: float) -> float | None:
        """None when `count` requests fit the window, else the seconds until it ends (the one
        place a request is found over its rate: counted in metrics.THROTTLED)."""
        if count <= self.rate.limit:
            return None
        metrics.THROTTLED.labels(self.scope).inc()
        return max(1.0, math.ceil(self.ends_at - now))


def window(scope: str, who: str, rate: Rate, now: float) -> Window:
    index = int(now // rate.seconds)
    return Window(scope, f"rp:rate:{scope}:{who}:{index}", rate, (index + 1) * rate.seconds)


def count(pipe: Pipeline, current: Window) -> None:
    """Queue one request's count on a MULTI pipeline: its first result is the count so far
    (two results in all)."""
    pipe.incr(current.key)
    pipe.expire(current.key, current.rate.seconds + 1, nx=True)


def count_locally(current: Window, now: float, error: RedisError) -> int:
    """The count when Redis did not answer: this process's own (logged once a minute)."""
    _local.warn(error)
    return _local.count(current.key, current.ends_at + 1, now)


def hit(scope: str, who: str, rate: Rate) -> float | None:
    """Count one request; None when allowed, else the seconds until the window ends."""
    now = clock()
    current = window(scope, who, rate, now)
    try:
        pipe = get_redis_connection("default").pipeline(transaction=True)
        count(pipe, current)
        so_far = int(pipe.execute()[0])
    except RedisError as exc:
        so_far = count_locally(current, now, exc)
    return current.wait(so_far, now)


class _LocalCounters:
    """The fallback while Redis is away: the same windows, in this process only."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, tuple[int, float]] = {}  # key -> (count, forget after)
        self.warned_at = 0.0

    def count(self, key: str, forget_after: float, now: float) -> int:
        with self.lock:
            if len(self.counts) > 100_000:
                self.counts = {k: v for k, v in self.counts.items() if v[1] > now}
            count = self.counts.get(key, (0, forget_after))[0] + 1
            self.counts[key] = (count, forget_after)
            return count

    def warn(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self.warned_at >= 60:
            self.warned_at = now
            logger.warning("rate limits counted in this process only: Redis is away (%s)", exc)


_local = _LocalCounters()
