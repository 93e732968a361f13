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
from redis.exceptions import RedisError

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


def hit(scope: str, who: str, rate: Rate) -> float | None:
    """Count one request; None when allowed, else the seconds until the window ends."""
    now = clock()
    window = int(now // rate.seconds)
    key = f"rp:rate:{scope}:{who}:{window}"
    try:
        count = _count_in_redis(key, rate.seconds)
    except RedisError as exc:
        count = _local.count(key, now + rate.seconds, now)
        _local.warn(exc)
    if count <= rate.limit:
        return None
    return max(1.0, math.ceil((window + 1) * rate.seconds - now))


def _count_in_redis(key: str, seconds: int) -> int:
    pipe = get_redis_connection("default").pipeline(transaction=True)
    pipe.incr(key)
    pipe.expire(key, seconds + 1, nx=True)
    count, _ = pipe.execute()
    return int(count)


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
